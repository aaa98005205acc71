// The consumer on a ring full of hostile bytes: bad and wrapping lengths, torn headers, forged
// padding, tails that jump. The input is the ring's content followed by a list of publish
// marks; the consumer must never deliver a record that fails its checks, never read outside the
// ring, and never move backwards. The first mark's top bit picks the ring's payload check: with
// `none` only the payload's CRC goes unchecked, every other bound still holds.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "rdmaring/consumer_core.hpp"

using namespace rdmaring;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  constexpr std::size_t kRing = 4096;
  if (size < kRing) return 0;
  std::vector<std::byte> ring(reinterpret_cast<const std::byte*>(data), reinterpret_cast<const std::byte*>(data) + kRing);
  const auto geometry = RingGeometry::make(kRing, 2048).value();
  ConsumerConfig config;
  const bool unchecked = size >= kRing + 8 && (data[kRing + 7] & 0x80) != 0;
  if (unchecked) config.payload_check = wire::PayloadCheck::none;
  ConsumerCore core(ring, geometry, wire::PublishMode::tail, ResumePoint{}, 0, config);
  std::uint64_t last_head = 0;
  for (std::size_t at = kRing; at + 8 <= size; at += 8) {
    std::uint64_t mark;
    std::memcpy(&mark, data + at, 8);
    std::array<std::byte, wire::kTailRecordSize> tail{};
    wire::encode(wire::TailRecord{1, mark & ((kRing * 4) - wire::kRecordAlign), 0, static_cast<std::uint32_t>(mark >> 60)}, tail);
    if (!core.on_tail(tail)) return 0;
    for (int i = 0; i < 64; ++i) {
      auto r = core.next(Clock::now() + std::chrono::hours(1));
      if (!r || !r.value()) break;
      const auto& rec = *r.value();
      if (rec.payload.data() < ring.data() + wire::kRecordHeaderSize ||
          rec.payload.data() + rec.payload.size() > ring.data() + ring.size())
        __builtin_trap();
      // Delivered means checked: the header before it holds this payload's length, and its check
      // covers the payload unless the ring checks none.
      const std::span<const std::byte, wire::kRecordHeaderSize> header(rec.payload.data() - wire::kRecordHeaderSize,
                                                                      wire::kRecordHeaderSize);
      const auto h = wire::decode_record_header(header);
      if (!h || h->payload_len != rec.payload.size() ||
          !wire::record_check_matches(header, unchecked ? std::span<const std::byte>{} : rec.payload) ||
          h->sequence != rec.sequence)
        __builtin_trap();
      if (!core.release(rec.end)) __builtin_trap();
    }
    const auto l = core.ledger();
    if (l.head < last_head || l.head > l.published) __builtin_trap();
    last_head = l.head;
    if (auto credit = core.take_credit()) core.on_completion(credit->slot.wr_id, true);
  }
  return 0;
}
