// The wire formats of rdmaring, written once. protocol-spec/wire-formats.md describes these
// bytes for a re-implementer, who reads only the spec: its constants table (§9) and
// protocol-spec/test-vectors.json are checked against this header by
// tests/unit/spec_conformance_test.cpp, so a change here that the spec does not follow fails.
//
// All multi-byte fields are little-endian, except the immediate, which verbs carries in network
// byte order (ibv_send_wr::imm_data is big-endian; the adapters convert). Encoders and decoders copy bytes (no struct
// punning) so they work on memory the peer's NIC may be writing concurrently and on hostile
// input: a decoder never trusts a length before checking it.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

namespace rdmaring::wire {

inline constexpr std::uint32_t kVersion = 5;

// ---- Records in the ring ------------------------------------------------------------------
// Every record starts on a 16-byte boundary: a 16-byte header, the payload, fill (content
// unspecified, never read) to the next boundary. A header therefore never straddles a cache
// line, so a torn header can only come from a partially placed write, which the check catches.
// A 64-byte payload takes 80 ring bytes (v4, with a 24-byte header and 64-byte alignment: 128).
inline constexpr std::size_t kRecordAlign = 16;
inline constexpr std::size_t kRecordHeaderSize = 16;

enum class RecordKind : std::uint8_t {
  data = 1,     // a record for the application
  padding = 2,  // fills the ring from here to its end; the next record starts at offset 0
};

struct RecordHeader {
  std::uint32_t payload_len = 0;   // bytes of payload after the header, below 2^30
  RecordKind kind = RecordKind::data;
  std::uint64_t sequence = 0;      // data: this record's per-producer sequence (from 0);
                                   // padding: the sequence of the data record that follows
};

// Whether a ring's data records' check covers their payload: a property of the ring, granted by
// its owner (protocol-spec/wire-formats.md §2.5). `none` trusts the publish event for placement
// and RC's ICRC for the wire, and saves a pass over every payload byte on each side.
enum class PayloadCheck : std::uint8_t { crc32c = 0, none = 1 };
// Layout: [0,4) payload_len in bits 0..29, kind in bits 30..31; [4,12) sequence;
//         [12,16) check = CRC-32C of bytes [0,12) followed by the covered bytes: a data
//         record's payload on a ring with PayloadCheck::crc32c, nothing otherwise.
inline constexpr unsigned kRecordKindShift = 30;
inline constexpr std::uint32_t kRecordLenMask = (1u << kRecordKindShift) - 1;

// `covered`: what the check covers after the header (above).
void encode(const RecordHeader& h, std::span<const std::byte> covered, std::span<std::byte, kRecordHeaderSize> out) noexcept;
// The fields; nullopt when the kind is neither data nor padding. Says nothing of integrity:
// that is record_check_matches, run once the length is known to be safe to read.
std::optional<RecordHeader> decode_record_header(std::span<const std::byte, kRecordHeaderSize> in) noexcept;
bool record_check_matches(std::span<const std::byte, kRecordHeaderSize> header, std::span<const std::byte> covered) noexcept;

// Bytes a record with `payload_len` bytes of payload occupies in the ring.
constexpr std::uint64_t record_span(std::uint64_t payload_len) noexcept {
  return (kRecordHeaderSize + payload_len + kRecordAlign - 1) & ~std::uint64_t{kRecordAlign - 1};
}

// ---- Publish by immediate (mode `imm`) ----------------------------------------------------
// The 32-bit immediate of the RDMA_WRITE_WITH_IMM that publishes:
//   bits  0..27  new tail, in kRecordAlign (16-byte) units, modulo 2^28 (the consumer widens
//                it: the tail is never more than one ring ahead of what it has seen, and a ring
//                is at most kMaxRingBytes, a quarter of the 2^32 B period, so a backward tail
//                is detectable)
//   bit   28     credit request: the producer is short of space, write credit back soon
//   bits 29..31  epoch, low 3 bits (a write from a fenced epoch cannot land at all because its
//                rkey is revoked; these bits catch a confused peer)
inline constexpr unsigned kImmTailBits = 28;
inline constexpr std::uint32_t kImmTailMask = (1u << kImmTailBits) - 1;
inline constexpr std::uint32_t kImmCreditRequest = 1u << 28;
inline constexpr unsigned kImmEpochShift = 29;
// 1 GiB: every stretch of the ring then fits one RDMA_WRITE (RC messages stop below 2^31 B),
// so a batch is always at most two writes plus the publish.
inline constexpr std::uint64_t kMaxRingBytes = std::uint64_t{1} << 30;
inline constexpr std::uint64_t kMinRingBytes = 4096;

struct Immediate {
  std::uint32_t tail_units = 0;  // tail / kRecordAlign, modulo 2^28
  bool credit_request = false;
  std::uint32_t epoch_low = 0;   // epoch & 7
};
std::uint32_t encode(const Immediate& imm) noexcept;
Immediate decode_immediate(std::uint32_t raw) noexcept;
// Widen a 28-bit tail to the 64-bit byte position nearest at or after `known` (the last tail the
// consumer saw). nullopt when the result would run more than `ring_bytes` ahead of `released`.
std::optional<std::uint64_t> widen_tail(std::uint32_t tail_units, std::uint64_t known,
                                        std::uint64_t released, std::uint64_t ring_bytes) noexcept;

// ---- Publish by tail record (mode `tail`) -------------------------------------------------
// Written by one RDMA_WRITE into the consumer's tail MR, after the payload writes on
// the same RC QP. Layout: [0,8) epoch, [8,16) tail (byte position), [16,24) next_sequence,
// [24,28) credit_requests, [28,32) check = CRC-32C of [0,28).
inline constexpr std::size_t kTailRecordSize = 32;
struct TailRecord {
  std::uint64_t epoch = 0;
  std::uint64_t tail = 0;             // monotonic byte position: everything below is published
  std::uint64_t next_sequence = 0;    // sequence of the first record not yet published
  std::uint32_t credit_requests = 0;  // counts the producer's requests for credit
};
void encode(const TailRecord& t, std::span<std::byte, kTailRecordSize> out) noexcept;
// nullopt: check fails (torn read while the NIC places it, or garbage).
std::optional<TailRecord> decode_tail_record(std::span<const std::byte, kTailRecordSize> in) noexcept;

// ---- Credit write-back --------------------------------------------------------------------
// Written by the consumer with one RDMA_WRITE into the producer's credit MR: space below
// `released` may be overwritten. Layout: [0,8) epoch, [8,16) released (byte position),
// [16,24) delivered = sequence of the next record to deliver, [24,28) flags,
// [28,32) check = CRC-32C of [0,28).
inline constexpr std::size_t kCreditRecordSize = 32;
// Flag: the consumer may sleep, so a tail-mode producer follows each publish with a doorbell (a
// zero-length WRITE_WITH_IMM) until a credit record clears it (protocol-spec/wakeup.md). Other
// bits are reserved: written 0, ignored.
inline constexpr std::uint32_t kCreditDoorbell = 1u << 0;
struct CreditRecord {
  std::uint64_t epoch = 0;
  std::uint64_t released = 0;
  std::uint64_t delivered = 0;
  std::uint32_t flags = 0;
};
void encode(const CreditRecord& c, std::span<std::byte, kCreditRecordSize> out) noexcept;
std::optional<CreditRecord> decode_credit_record(std::span<const std::byte, kCreditRecordSize> in) noexcept;

// ---- rdma_cm private data -----------------------------------------------------------------
inline constexpr std::uint32_t kMagic = 0x474e5252;  // "RRNG"

enum class PublishMode : std::uint8_t { imm = 1, tail = 2 };

// Producer -> ring owner, in the connect request (RC private data is at most 56 bytes). The
// ring itself was granted over the control channel (control/ring_service.capnp); the request
// names the session and epoch the QP is for, with a proof that the producer holds the session
// secret (protocol-spec/sessions.md), and where this connection's credit write-backs go (the
// producer's credit MR: a restarted producer has a new one). The owner admits it for the
// session's current epoch only.
// Layout: [0,4) magic, [4,6) version, [6,8) reserved = 0, [8,16) session, [16,24) epoch,
//         [24,40) proof, [40,48) credit_addr, [48,52) credit_rkey.
inline constexpr std::size_t kProofSize = 16;
inline constexpr std::size_t kConnectDataSize = 52;
struct ConnectData {
  std::uint64_t session = 0;
  std::uint64_t epoch = 0;
  std::array<std::byte, kProofSize> proof{};
  std::uint64_t credit_addr = 0;
  std::uint32_t credit_rkey = 0;
};
std::array<std::byte, kConnectDataSize> encode(const ConnectData& c) noexcept;
std::optional<ConnectData> decode_connect_data(std::span<const std::byte> in) noexcept;

// Ring owner -> producer, in the accept: the epoch the QP was admitted for.
// Layout: [0,4) magic, [4,6) version, [6,8) reserved = 0, [8,16) epoch.
inline constexpr std::size_t kAcceptDataSize = 16;
struct AcceptData {
  std::uint64_t epoch = 0;
};
std::array<std::byte, kAcceptDataSize> encode(const AcceptData& a) noexcept;
std::optional<AcceptData> decode_accept_data(std::span<const std::byte> in) noexcept;

}  // namespace rdmaring::wire
