// Every decoder of bytes that come from the peer: record headers, immediates (and the widening
// of their tail), tail and credit records, rdma_cm private data. None may crash or read out of
// bounds on any input, and whatever decodes must encode back to the same meaning.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "rdmaring/wire.hpp"

using namespace rdmaring;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> in(reinterpret_cast<const std::byte*>(data), size);
  if (in.size() >= wire::kRecordHeaderSize) {
    const auto header = in.first<wire::kRecordHeaderSize>();
    if (auto h = wire::decode_record_header(header)) {
      // The fields encode back to the same bytes; the check too, when it matches with nothing covered.
      std::array<std::byte, wire::kRecordHeaderSize> again{};
      wire::encode(*h, {}, again);
      const std::size_t same = wire::record_check_matches(header, {}) ? again.size() : again.size() - 4;
      if (std::memcmp(again.data(), in.data(), same) != 0) __builtin_trap();
    }
  }
  if (in.size() >= wire::kTailRecordSize) (void)wire::decode_tail_record(in.first<wire::kTailRecordSize>());
  if (in.size() >= wire::kCreditRecordSize) (void)wire::decode_credit_record(in.first<wire::kCreditRecordSize>());
  // rdma_cm private data: accepted exactly when the prefix carries the magic, this version and a
  // zero reserved field (rdma_cm may pad: bytes past the format are ignored), and then encodes
  // back to the same bytes.
  auto stamped = [&](std::size_t n) {
    if (in.size() < n) return false;
    std::uint32_t magic;
    std::uint16_t version, reserved;
    std::memcpy(&magic, in.data(), 4);
    std::memcpy(&version, in.data() + 4, 2);
    std::memcpy(&reserved, in.data() + 6, 2);
    return magic == wire::kMagic && version == wire::kVersion && reserved == 0;
  };
  const auto connect = wire::decode_connect_data(in);
  if (connect.has_value() != stamped(wire::kConnectDataSize)) __builtin_trap();
  if (connect && std::memcmp(wire::encode(*connect).data(), in.data(), wire::kConnectDataSize) != 0) __builtin_trap();
  const auto accept = wire::decode_accept_data(in);
  if (accept.has_value() != stamped(wire::kAcceptDataSize)) __builtin_trap();
  if (accept && std::memcmp(wire::encode(*accept).data(), in.data(), wire::kAcceptDataSize) != 0) __builtin_trap();
  if (in.size() >= 20) {
    std::uint32_t raw;
    std::uint64_t known, released;
    std::memcpy(&raw, in.data(), 4);
    std::memcpy(&known, in.data() + 4, 8);
    std::memcpy(&released, in.data() + 12, 8);
    // Positions never get near 2^64 (protocol-spec: a connection ends long before), so neither here.
    known &= (std::uint64_t{1} << 62) - wire::kRecordAlign;
    const auto imm = wire::decode_immediate(raw);
    if (wire::encode(imm) != raw) __builtin_trap();
    if (released <= known && known - released <= wire::kMaxRingBytes) {
      if (auto t = wire::widen_tail(imm.tail_units, known, released, wire::kMaxRingBytes)) {
        if (*t < known || *t - released > wire::kMaxRingBytes) __builtin_trap();
      }
    }
  }
  return 0;
}
