// Reading one record at a ring position, from bytes that may be hostile or half placed.
// Pure: it never trusts a length before checking it against the ring and the publish mark.
#pragma once

#include <cstdint>
#include <span>

#include "rdmaring/ring_geometry.hpp"
#include "rdmaring/wire.hpp"

namespace rdmaring {

struct RecordView {
  enum class Status : std::uint8_t {
    data,        // a valid data record: payload, sequence, span
    padding,     // a valid padding record reaching exactly the ring's end
    bad_header,  // the kind is neither data nor padding (torn, unplaced, garbage)
    bad_length,  // length runs past the ring's end or the publish mark, or above max_record
    bad_check,   // the record's check failed: its header, or its payload where the ring checks payloads
  };
  Status status = Status::bad_header;
  std::uint64_t sequence = 0;
  std::uint64_t span = 0;  // bytes the record occupies, for data and padding
  std::span<const std::byte> payload;
};

const char* to_string(RecordView::Status s) noexcept;

// Reads the record at position `head`, where [head, published) is the published stretch; with
// PayloadCheck::none a data record's payload is taken unchecked.
// Assumes ring.size() == geometry.bytes, head < published, both wire::kRecordAlign aligned.
RecordView read_record(std::span<const std::byte> ring, const RingGeometry& geometry, std::uint64_t head,
                       std::uint64_t published, wire::PayloadCheck check = wire::PayloadCheck::crc32c) noexcept;

}  // namespace rdmaring
