// How `rdmaring listen` and `rdmaring send` cut a byte stream into records and back: one record
// per line (text: the newline is not part of the record), or each record behind its length as a
// 4-byte little-endian unsigned integer (any bytes, newlines included).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace rdmaring::tools {

enum class Framing { lines, length_prefixed };

// A stream that cannot be cut into records: the input ends inside a length-prefixed record.
class FramingError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Reads the records of `in` one at a time, without reading ahead of the one it returns.
class RecordInput {
 public:
  RecordInput(std::FILE* in, Framing framing) : in_(in), framing_(framing) {}
  // The next record, valid until the next call; nullopt at the end of the input. A last line
  // without a newline is a record. Throws FramingError (a truncated record) and
  // std::system_error (a read that failed).
  std::optional<std::span<const std::byte>> next();
  std::uint64_t records() const { return records_; }

 private:
  std::FILE* in_;
  Framing framing_;
  std::vector<std::byte> record_;
  std::uint64_t records_ = 0;
};

// Writes one record in `framing` (buffered: fflush decides when it leaves). Returns false when
// the write failed (errno says why: EPIPE for a reader that went away).
bool write_record(std::FILE* out, Framing framing, std::span<const std::byte> record);

}  // namespace rdmaring::tools
