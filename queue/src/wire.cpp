#include "rdmaring/wire.hpp"

#include <algorithm>
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

namespace {

std::uint32_t record_check(std::span<const std::byte, kRecordHeaderSize> header, std::span<const std::byte> covered) noexcept {
  return crc32c_prefixed(header.first<12>(), covered);
}

}  // namespace

void encode(const RecordHeader& h, std::span<const std::byte> covered, std::span<std::byte, kRecordHeaderSize> out) noexcept {
  put(out, 0, (h.payload_len & kRecordLenMask) | std::uint32_t{static_cast<std::uint8_t>(h.kind)} << kRecordKindShift);
  put(out, 4, h.sequence);
  put(out, 12, record_check(out, covered));
}

std::optional<RecordHeader> decode_record_header(std::span<const std::byte, kRecordHeaderSize> in) noexcept {
  const auto word = get<std::uint32_t>(in, 0);
  const auto kind = static_cast<std::uint8_t>(word >> kRecordKindShift);
  if (kind != static_cast<std::uint8_t>(RecordKind::data) && kind != static_cast<std::uint8_t>(RecordKind::padding))
    return std::nullopt;
  return RecordHeader{word & kRecordLenMask, static_cast<RecordKind>(kind), get<std::uint64_t>(in, 4)};
}

bool record_check_matches(std::span<const std::byte, kRecordHeaderSize> header, std::span<const std::byte> covered) noexcept {
  return get<std::uint32_t>(header, 12) == record_check(header, covered);
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
  put(out, 24, c.flags);
  seal(out);
}

std::optional<CreditRecord> decode_credit_record(std::span<const std::byte, kCreditRecordSize> in) noexcept {
  if (!sealed(in)) return std::nullopt;
  return CreditRecord{get<std::uint64_t>(in, 0), get<std::uint64_t>(in, 8), get<std::uint64_t>(in, 16),
                      get<std::uint32_t>(in, 24)};
}

namespace {

// The prefix both private-data formats share.
template <std::size_t N>
std::array<std::byte, N> stamped() noexcept {
  std::array<std::byte, N> out{};
  put(std::span{out}, 0, kMagic);
  put(std::span{out}, 4, static_cast<std::uint16_t>(kVersion));
  return out;
}

// rdma_cm may hand over more bytes than were sent (zero-padded): only the prefix counts.
bool stamped(std::span<const std::byte> in, std::size_t size) noexcept {
  return in.size() >= size && get<std::uint32_t>(in, 0) == kMagic && get<std::uint16_t>(in, 4) == kVersion &&
         get<std::uint16_t>(in, 6) == 0;
}

}  // namespace

std::array<std::byte, kConnectDataSize> encode(const ConnectData& c) noexcept {
  auto out = stamped<kConnectDataSize>();
  put(std::span{out}, 8, c.session);
  put(std::span{out}, 16, c.epoch);
  std::copy(c.proof.begin(), c.proof.end(), out.begin() + 24);
  put(std::span{out}, 40, c.credit_addr);
  put(std::span{out}, 48, c.credit_rkey);
  return out;
}

std::optional<ConnectData> decode_connect_data(std::span<const std::byte> in) noexcept {
  if (!stamped(in, kConnectDataSize)) return std::nullopt;
  ConnectData c{get<std::uint64_t>(in, 8), get<std::uint64_t>(in, 16), {}, get<std::uint64_t>(in, 40),
                get<std::uint32_t>(in, 48)};
  std::copy_n(in.begin() + 24, kProofSize, c.proof.begin());
  return c;
}

std::array<std::byte, kAcceptDataSize> encode(const AcceptData& a) noexcept {
  auto out = stamped<kAcceptDataSize>();
  put(std::span{out}, 8, a.epoch);
  return out;
}

std::optional<AcceptData> decode_accept_data(std::span<const std::byte> in) noexcept {
  if (!stamped(in, kAcceptDataSize)) return std::nullopt;
  return AcceptData{get<std::uint64_t>(in, 8)};
}

}  // namespace rdmaring::wire
