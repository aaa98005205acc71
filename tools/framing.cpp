#include "framing.hpp"

#include <cerrno>
#include <system_error>

namespace rdmaring::tools {

namespace {

[[noreturn]] void read_failed() { throw std::system_error(errno, std::generic_category(), "reading the input"); }

}  // namespace

std::optional<std::span<const std::byte>> RecordInput::next() {
  record_.clear();
  if (framing_ == Framing::lines) {
    int c;
    while ((c = getc_unlocked(in_)) != EOF && c != '\n') record_.push_back(static_cast<std::byte>(c));
    if (c == EOF) {
      if (std::ferror(in_)) read_failed();
      if (record_.empty()) return std::nullopt;
    }
  } else {
    unsigned char prefix[4];
    const std::size_t got = std::fread(prefix, 1, sizeof prefix, in_);
    if (got == 0 && !std::ferror(in_)) return std::nullopt;
    if (got < sizeof prefix) {
      if (std::ferror(in_)) read_failed();
      throw FramingError("the input ends inside the length prefix of record " + std::to_string(records_ + 1) +
                         " (" + std::to_string(got) + " of 4 bytes)");
    }
    const std::uint32_t len = std::uint32_t{prefix[0]} | std::uint32_t{prefix[1]} << 8 |
                              std::uint32_t{prefix[2]} << 16 | std::uint32_t{prefix[3]} << 24;
    record_.resize(len);
    const std::size_t body = std::fread(record_.data(), 1, len, in_);
    if (body < len) {
      if (std::ferror(in_)) read_failed();
      throw FramingError("the input ends inside record " + std::to_string(records_ + 1) + " (" +
                         std::to_string(body) + " of its " + std::to_string(len) + " bytes)");
    }
  }
  ++records_;
  return std::span<const std::byte>(record_);
}

bool write_record(std::FILE* out, Framing framing, std::span<const std::byte> record) {
  if (framing == Framing::length_prefixed) {
    const auto len = static_cast<std::uint32_t>(record.size());
    const unsigned char prefix[4] = {static_cast<unsigned char>(len), static_cast<unsigned char>(len >> 8),
                                     static_cast<unsigned char>(len >> 16), static_cast<unsigned char>(len >> 24)};
    if (std::fwrite(prefix, 1, sizeof prefix, out) != sizeof prefix) return false;
  }
  if (std::fwrite(record.data(), 1, record.size(), out) != record.size()) return false;
  return framing == Framing::length_prefixed || std::fputc('\n', out) != EOF;
}

}  // namespace rdmaring::tools
