#include "rdmaring/record_reader.hpp"

#include "rdmaring/checksum.hpp"

namespace rdmaring {

RecordView read_record(std::span<const std::byte> ring, const RingGeometry& geometry, std::uint64_t head,
                       std::uint64_t published, wire::PayloadCheck check) noexcept {
  using Status = RecordView::Status;
  const std::uint64_t offset = geometry.offset(head);
  const auto header = wire::decode_record_header(ring.subspan(offset).first<wire::kRecordHeaderSize>());
  if (!header) return {Status::bad_header, 0, 0, {}};

  const std::uint64_t span = wire::record_span(header->payload_len);
  const std::uint64_t limit = std::min(geometry.to_end(head), published - head);
  if (header->kind == wire::RecordKind::padding) {
    // Padding fills exactly to the ring's end; anything else would misalign every later record.
    if (span != geometry.to_end(head) || span > published - head) return {Status::bad_length, 0, 0, {}};
    return {Status::padding, header->sequence, span, {}};
  }
  if (header->payload_len > geometry.max_record || span > limit) return {Status::bad_length, 0, 0, {}};
  const auto payload = ring.subspan(offset + wire::kRecordHeaderSize, header->payload_len);
  if (check == wire::PayloadCheck::crc32c && crc32c(payload) != header->payload_crc) return {Status::bad_payload, 0, 0, {}};
  return {Status::data, header->sequence, span, payload};
}

}  // namespace rdmaring
