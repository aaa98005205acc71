// `rdmaring send`'s input cut into records and `rdmaring listen`'s output framed back: what goes in
// as lines or length-prefixed comes out the same, and input that ends inside a record is named.
#include "framing.hpp"

#include <catch2/catch.hpp>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

using rdmaring::tools::Framing;
using rdmaring::tools::FramingError;
using rdmaring::tools::RecordInput;
using rdmaring::tools::write_record;

namespace {

using File = std::unique_ptr<std::FILE, int (*)(std::FILE*)>;

File reading(std::string& bytes) {
  return File(fmemopen(bytes.data(), bytes.size(), "rb"), &std::fclose);
}

std::vector<std::string> records_of(std::string bytes, Framing framing) {
  if (bytes.empty()) return {};  // fmemopen refuses a zero-length buffer
  File f = reading(bytes);
  RecordInput in(f.get(), framing);
  std::vector<std::string> out;
  while (const auto r = in.next()) out.emplace_back(reinterpret_cast<const char*>(r->data()), r->size());
  CHECK(in.records() == out.size());
  return out;
}

std::string framed(const std::vector<std::string>& records, Framing framing) {
  char* buf = nullptr;
  std::size_t size = 0;
  std::FILE* f = open_memstream(&buf, &size);
  for (const std::string& r : records)
    REQUIRE(write_record(f, framing, std::as_bytes(std::span<const char>(r.data(), r.size()))));
  std::fclose(f);
  std::string out(buf, size);
  std::free(buf);
  return out;
}

}  // namespace

TEST_CASE("lines: one record per line, the newline left out, a last line without one kept", "[tools][framing]") {
  CHECK(records_of("a\n\nccc\n", Framing::lines) == std::vector<std::string>{"a", "", "ccc"});
  CHECK(records_of("a\nlast", Framing::lines) == std::vector<std::string>{"a", "last"});
  CHECK(records_of("", Framing::lines).empty());
  CHECK(framed({"a", "", "ccc"}, Framing::lines) == "a\n\nccc\n");
}

TEST_CASE("length-prefixed: any bytes, newlines and NULs included, round trip", "[tools][framing]") {
  const std::vector<std::string> records{"", "x", std::string("a\nb\0c", 5), std::string(70000, 'z')};
  const std::string bytes = framed(records, Framing::length_prefixed);
  CHECK(bytes.substr(4, 4) == std::string("\x01\x00\x00\x00", 4));  // little-endian length of "x"
  CHECK(records_of(bytes, Framing::length_prefixed) == records);
}

TEST_CASE("length-prefixed input that ends inside a record is refused, naming the record", "[tools][framing]") {
  std::string inside_prefix = framed({"one"}, Framing::length_prefixed) + std::string("\x05\x00", 2);
  File f = reading(inside_prefix);
  RecordInput in(f.get(), Framing::length_prefixed);
  REQUIRE(in.next());
  CHECK_THROWS_WITH(in.next(), Catch::Matchers::Contains("length prefix of record 2 (2 of 4 bytes)"));

  std::string inside_body = std::string("\x05\x00\x00\x00", 4) + "abc";
  File g = reading(inside_body);
  RecordInput short_record(g.get(), Framing::length_prefixed);
  CHECK_THROWS_AS(short_record.next(), FramingError);
}
