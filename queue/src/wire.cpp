#include "rdmaring/wire.hpp"

#include <bit>
#include <cstring>

#include "rdmaring/checksum.hpp"

namespace rdmaring::wire {
namespace {

static_assert(std::endian::native == std::endian::little,
              "the wire is little-endian; a big-endian port needs byte swaps in put/get");

template <class T>
void put(std::span<std::byte> out, std::size_t at, T v) noexcept {
  std::memcpy(out.data() + at, &v, sizeof v);
}
template <class T>
T get(std::span<const std::byte> in, std::size_t at) noexcept {
  T v;
  std::memcpy(&v, in.data() + at, sizeof v);
  return v;
}

// Records ending in a CRC-32C of everything before it (tail and credit records).
template <std::size_t N>
void seal(std::span<std::byte, N> out) noexcept {
  put(out, N - 4, crc32c(out.first(N - 4)));
}
template <std::size_t N>
bool sealed(std::span<const std::byte, N> in) noexcept {
  return get<std::uint32_t>(in, N - 4) == crc32c(in.first(N - 4));
}

}  // namespace

void encode(const RecordHeader& h, std::span<std::byte, kRecordHeaderSize> out) noexcept {
  put(out, 0, h.payload_len);
  put(out, 4, static_cast<std::uint16_t>(h.kind));
  put(out, 6, std::uint16_t{0});
  put(out, 8, h.sequence);
  put(out, 16, h.payload_crc);
  put(out, 20, crc32c(out.first(20)));
}

std::optional<RecordHeader> decode_record_header(std::span<const std::byte, kRecordHeaderSize> in) noexcept {
  if (get<std::uint32_t>(in, 20) != crc32c(in.first(20))) return std::nullopt;
  const auto kind = get<std::uint16_t>(in, 4);
  if (kind != static_cast<std::uint16_t>(RecordKind::data) &&
      kind != static_cast<std::uint16_t>(RecordKind::padding))
    return std::nullopt;
  if (get<std::uint16_t>(in, 6) != 0) return std::nullopt;
  return RecordHeader{get<std::uint32_t>(in, 0), static_cast<RecordKind>(kind), get<std::uint64_t>(in, 8),
                      get<std::uint32_t>(in, 16)};
}

std::uint32_t encode(const Immediate& imm) noexcept {
  return (imm.tail_units & kImmTailMask) | (imm.credit_request ? kImmCreditRequest : 0u) |
         ((imm.epoch_low & 7u) << kImmEpochShift);
}

Immediate decode_immediate(std::uint32_t raw) noexcept {
  return Immediate{raw & kImmTailMask, (raw & kImmCreditRequest) != 0, raw >> kImmEpochShift};
}

std::optional<std::uint64_t> widen_tail(std::uint32_t tail_units, std::uint64_t known, std::uint64_t released,
                                        std::uint64_t ring_bytes) noexcept {
  const std::uint64_t known_units = known / kRecordAlign;
  const std::uint64_t ahead = (tail_units - known_units) & kImmTailMask;
  const std::uint64_t tail = (known_units + ahead) * kRecordAlign;
  if (tail - released > ring_bytes) return std::nullopt;
  return tail;
}

void encode(const TailRecord& t, std::span<std::byte, kTailRecordSize> out) noexcept {
  put(out, 0, t.epoch);
  put(out, 8, t.tail);
  put(out, 16, t.next_sequence);
  put(out, 24, t.credit_requests);
  seal(out);
}

std::optional<TailRecord> decode_tail_record(std::span<const std::byte, kTailRecordSize> in) noexcept {
  if (!sealed(in)) return std::nullopt;
  return TailRecord{get<std::uint64_t>(in, 0), get<std::uint64_t>(in, 8), get<std::uint64_t>(in, 16),
                    get<std::uint32_t>(in, 24)};
}

void encode(const CreditRecord& c, std::span<std::byte, kCreditRecordSize> out) noexcept {
  put(out, 0, c.epoch);
  put(out, 8, c.released);
  put(out, 16, c.delivered);
  put(out, 24, c.credit_requests_seen);
  seal(out);
}

std::optional<CreditRecord> decode_credit_record(std::span<const std::byte, kCreditRecordSize> in) noexcept {
  if (!sealed(in)) return std::nullopt;
  return CreditRecord{get<std::uint64_t>(in, 0), get<std::uint64_t>(in, 8), get<std::uint64_t>(in, 16),
                      get<std::uint32_t>(in, 24)};
}

std::array<std::byte, kConnectDataSize> encode(const ConnectData& c) noexcept {
  std::array<std::byte, kConnectDataSize> out{};
  put(std::span{out}, 0, kMagic);
  put(std::span{out}, 4, static_cast<std::uint16_t>(kVersion));
  put(std::span{out}, 8, c.credit_addr);
  put(std::span{out}, 16, c.credit_rkey);
  put(std::span{out}, 6, c.flags);
  put(std::span{out}, 24, c.epoch);
  return out;
}

std::optional<ConnectData> decode_connect_data(std::span<const std::byte> in) noexcept {
  // rdma_cm may hand over more bytes than were sent (zero-padded): only the prefix counts.
  if (in.size() < kConnectDataSize) return std::nullopt;
  if (get<std::uint32_t>(in, 0) != kMagic || get<std::uint16_t>(in, 4) != kVersion) return std::nullopt;
  const auto flags = get<std::uint16_t>(in, 6);
  if ((flags & ~kConnectResume) != 0 || get<std::uint32_t>(in, 20) != 0) return std::nullopt;
  return ConnectData{get<std::uint64_t>(in, 8), get<std::uint32_t>(in, 16), flags, get<std::uint64_t>(in, 24)};
}

std::array<std::byte, kAcceptDataSize> encode(const AcceptData& a) noexcept {
  std::array<std::byte, kAcceptDataSize> out{};
  const std::span<std::byte> o{out};
  put(o, 0, kMagic);
  put(o, 4, static_cast<std::uint16_t>(kVersion));
  put(o, 6, static_cast<std::uint8_t>(a.mode));
  put(o, 7, a.flags);
  put(o, 8, a.ring_addr);
  put(o, 16, a.ring_rkey);
  put(o, 20, a.max_record);
  put(o, 24, a.ring_bytes);
  put(o, 32, a.tail_addr);
  put(o, 40, a.tail_rkey);
  put(o, 48, a.epoch);
  put(o, 56, a.next_sequence);
  put(o, 64, a.position);
  put(o, 72, a.released);
  return out;
}

std::optional<AcceptData> decode_accept_data(std::span<const std::byte> in) noexcept {
  if (in.size() < kAcceptDataSize) return std::nullopt;
  if (get<std::uint32_t>(in, 0) != kMagic || get<std::uint16_t>(in, 4) != kVersion) return std::nullopt;
  const auto mode = get<std::uint8_t>(in, 6);
  if (mode != static_cast<std::uint8_t>(PublishMode::imm) && mode != static_cast<std::uint8_t>(PublishMode::tail))
    return std::nullopt;
  if ((get<std::uint8_t>(in, 7) & ~kAcceptRelaxedOrdering) != 0 || get<std::uint32_t>(in, 44) != 0) return std::nullopt;
  AcceptData a;
  a.mode = static_cast<PublishMode>(mode);
  a.flags = get<std::uint8_t>(in, 7);
  a.ring_addr = get<std::uint64_t>(in, 8);
  a.ring_rkey = get<std::uint32_t>(in, 16);
  a.max_record = get<std::uint32_t>(in, 20);
  a.ring_bytes = get<std::uint64_t>(in, 24);
  a.tail_addr = get<std::uint64_t>(in, 32);
  a.tail_rkey = get<std::uint32_t>(in, 40);
  a.epoch = get<std::uint64_t>(in, 48);
  a.next_sequence = get<std::uint64_t>(in, 56);
  a.position = get<std::uint64_t>(in, 64);
  a.released = get<std::uint64_t>(in, 72);
  if (a.released > a.position || a.position % kRecordAlign != 0 || a.released % kRecordAlign != 0) return std::nullopt;
  return a;
}

}  // namespace rdmaring::wire
