// What the chaos harness writes and reads, shared by its processes: the records producers send,
// the owner's delivery log (its durable store and the audit's input) and its sessions file (the
// durable SessionRecords).
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "../softroce/session_records.hpp"
#include "rdmaring/checksum.hpp"

namespace rdmaring::chaos {

// ---- Records --------------------------------------------------------------------------------
// Record `seq` of producer `p`: a 16-byte tag {producer u32, body CRC-32C u32, sequence u64}
// (little-endian) and then session_records.hpp's body for `seq` (0..699 B). The producer is part
// of the bytes, so a record delivered in the wrong session fails the audit's checksum even where
// two producers are at the same sequence.
inline constexpr std::size_t kTagSize = 16;

inline void put32(std::byte* p, std::uint32_t v) { std::memcpy(p, &v, 4); }
inline void put64(std::byte* p, std::uint64_t v) { std::memcpy(p, &v, 8); }
inline std::uint32_t get32(const std::byte* p) {
  std::uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
inline std::uint64_t get64(const std::byte* p) {
  std::uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

inline std::uint32_t record_length(std::uint64_t seq) {
  return static_cast<std::uint32_t>(kTagSize + testing::record_size(seq));
}

inline void record_fill(std::uint32_t producer, std::uint64_t seq, std::span<std::byte> out) {
  const auto body = out.subspan(kTagSize);
  testing::record_fill(seq, body);
  put32(out.data(), producer);
  put32(out.data() + 4, crc32c(body));
  put64(out.data() + 8, seq);
}

inline std::vector<std::byte> record_bytes(std::uint32_t producer, std::uint64_t seq) {
  std::vector<std::byte> b(record_length(seq));
  record_fill(producer, seq, b);
  return b;
}

inline std::uint32_t record_crc(std::uint32_t producer, std::uint64_t seq) {
  return crc32c(record_bytes(producer, seq));
}

// ---- The delivery log -----------------------------------------------------------------------
// One 32-byte entry per record the owner delivered, appended in delivery order by every owner
// incarnation in turn. Written in the poll handler, before the record is released (the owner
// releases it when the handler returns), into a MAP_SHARED mapping: a store is in the page cache
// at once, so an owner killed with SIGKILL loses no entry it finished. The check is stored last;
// an entry torn by a kill (or read while being written) fails it and ends the log there, and the
// next incarnation writes over it.
//   [0,8) session  [8,16) sequence  [16,24) time_ns (CLOCK_MONOTONIC, 48 bits) | length << 48
//   [24,28) CRC-32C of the payload  [28,32) check = CRC-32C of [0,28) ^ kLogSalt
inline constexpr std::size_t kLogEntrySize = 32;
inline constexpr std::uint32_t kLogSalt = 0x6c6f6721;

struct LogEntry {
  std::uint64_t session = 0;
  std::uint64_t sequence = 0;
  std::uint64_t time_ns = 0;  // steady_clock (CLOCK_MONOTONIC) of the guest, low 48 bits
  std::uint32_t length = 0;   // payload bytes, < 65536
  std::uint32_t crc = 0;      // CRC-32C of the payload
};

inline void encode(const LogEntry& e, std::byte* out) {
  std::array<std::byte, kLogEntrySize> b{};
  put64(b.data(), e.session);
  put64(b.data() + 8, e.sequence);
  put64(b.data() + 16, (e.time_ns & ((std::uint64_t{1} << 48) - 1)) | (std::uint64_t{e.length} << 48));
  put32(b.data() + 24, e.crc);
  const std::uint32_t check = crc32c(std::span<const std::byte>(b.data(), 28)) ^ kLogSalt;
  // The body first, the check last: a kill between them leaves an entry that fails its check.
  std::memcpy(out, b.data(), 28);
  std::atomic_signal_fence(std::memory_order_release);
  std::memcpy(out + 28, &check, 4);
}

inline std::optional<LogEntry> decode(const std::byte* in) {
  const std::uint32_t check = crc32c(std::span<const std::byte>(in, 28)) ^ kLogSalt;
  if (get32(in + 28) != check) return std::nullopt;
  LogEntry e;
  e.session = get64(in);
  e.sequence = get64(in + 8);
  const std::uint64_t t = get64(in + 16);
  e.time_ns = t & ((std::uint64_t{1} << 48) - 1);
  e.length = static_cast<std::uint32_t>(t >> 48);
  e.crc = get32(in + 24);
  return e;
}

// ---- The sessions file ----------------------------------------------------------------------
// The owner's durable SessionRecords (owner_core.hpp), one 128-byte entry appended with one
// write() in every RingOwnerOptions::on_session call: at attach (before the producer gets its
// grant), at a restore, and whenever a resumed epoch's QP is established (its floor rises). The
// file is a log of upserts: the last valid entry of a session is its record.
//   [0,8) session  [8,40) secret  [40,48) min_epoch  [48,112) identity, NUL-padded (at most 64
//   bytes: X.509's bound on a common name)  [112,124) zero  [124,128) check = CRC-32C of
//   [0,124) ^ kLogSalt
// An entry that fails its check (a short write) ends the file: the next owner cuts it there.
inline constexpr std::size_t kSessionEntrySize = 128;
inline constexpr std::size_t kIdentityBytes = 64;

struct SessionEntry {
  std::uint64_t session = 0;
  std::array<std::byte, 32> secret{};
  std::uint64_t min_epoch = 1;
  std::string identity;  // at most kIdentityBytes
};

// False when the identity does not fit.
inline bool encode(const SessionEntry& e, std::byte* out) {
  if (e.identity.size() > kIdentityBytes) return false;
  std::array<std::byte, kSessionEntrySize> b{};
  put64(b.data(), e.session);
  std::memcpy(b.data() + 8, e.secret.data(), 32);
  put64(b.data() + 40, e.min_epoch);
  std::memcpy(b.data() + 48, e.identity.data(), e.identity.size());
  put32(b.data() + 124, crc32c(std::span<const std::byte>(b.data(), 124)) ^ kLogSalt);
  std::memcpy(out, b.data(), b.size());
  return true;
}

inline std::optional<SessionEntry> decode_session(const std::byte* in) {
  if (get32(in + 124) != (crc32c(std::span<const std::byte>(in, 124)) ^ kLogSalt)) return std::nullopt;
  SessionEntry e;
  e.session = get64(in);
  std::memcpy(e.secret.data(), in + 8, 32);
  e.min_epoch = get64(in + 40);
  const char* id = reinterpret_cast<const char*>(in + 48);
  e.identity.assign(id, strnlen(id, kIdentityBytes));
  return e;
}

}  // namespace rdmaring::chaos
