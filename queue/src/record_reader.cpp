#include "rdmaring/record_reader.hpp"

#include <algorithm>

namespace rdmaring {

const char* to_string(RecordView::Status s) noexcept {
  switch (s) {
    case RecordView::Status::data: return "data";
    case RecordView::Status::padding: return "padding";
    case RecordView::Status::bad_header: return "bad_header";
    case RecordView::Status::bad_length: return "bad_length";
    case RecordView::Status::bad_check: return "bad_check";
  }
  return "?";
}

RecordView read_record(std::span<const std::byte> ring, const RingGeometry& geometry, std::uint64_t head,
                       std::uint64_t published, wire::PayloadCheck check) noexcept {
  using Status = RecordView::Status;
  const std::uint64_t offset = geometry.offset(head);
  const auto bytes = ring.subspan(offset).first<wire::kRecordHeaderSize>();
  const auto header = wire::decode_record_header(bytes);
  if (!header) return {Status::bad_header, 0, 0, {}};

  // The length is checked before anything it points at is read: the check covers the payload.
  const std::uint64_t span = wire::record_span(header->payload_len);
  if (header->kind == wire::RecordKind::padding) {
    // Padding fills exactly to the ring's end; anything else would misalign every later record.
    if (span != geometry.to_end(head) || span > published - head) return {Status::bad_length, 0, 0, {}};
    if (!wire::record_check_matches(bytes, {})) return {Status::bad_check, 0, 0, {}};
    return {Status::padding, header->sequence, span, {}};
  }
  if (header->payload_len > geometry.max_record || span > std::min(geometry.to_end(head), published - head))
    return {Status::bad_length, 0, 0, {}};
  const auto payload = ring.subspan(offset + wire::kRecordHeaderSize, header->payload_len);
  if (!wire::record_check_matches(bytes, check == wire::PayloadCheck::crc32c ? payload : std::span<const std::byte>{}))
    return {Status::bad_check, 0, 0, {}};
  return {Status::data, header->sequence, span, payload};
}

}  // namespace rdmaring
