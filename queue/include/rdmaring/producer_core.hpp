// The producer's protocol, sans I/O: it turns application calls (claim, commit, send, flush),
// completions and credit records into work requests to post. It writes record headers into
// the staging buffer it is given, and never calls verbs: the verbs adapter (producer.hpp) and
// the test fabric drive the same core.
//
// The staging buffer mirrors the remote ring byte for byte (position p is staged at
// offset(p)). So the ledger of the ring is also the ledger of staging: a record stays in
// staging until the consumer's credit write-back releases it, which is exactly what recovery
// after a reconnect needs to re-send it.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

#include "rdmaring/error.hpp"
#include "rdmaring/ledger.hpp"
#include "rdmaring/ring_geometry.hpp"
#include "rdmaring/send_queue_budget.hpp"
#include "rdmaring/wire.hpp"

namespace rdmaring {

using Clock = std::chrono::steady_clock;

// When the producer turns committed records into a publish: whichever threshold is hit first.
struct CoalescePolicy {
  std::uint64_t bytes = 64 * 1024;                  // written-not-published bytes
  std::uint32_t records = 256;                      // written-not-published records
  std::chrono::nanoseconds delay = std::chrono::microseconds(50);  // age of the oldest one
};

struct ProducerConfig {
  CoalescePolicy coalesce;
  std::uint32_t sq_depth = kDefaultSqDepth;
  std::uint32_t signal_interval = kDefaultSignalInterval;

  // errc::bad_config with the reason when the values cannot work together.
  Result<void> validate() const;
};

// Where a connection (re)starts, as the consumer states it: the epoch, the position of the
// next record it will read and that record's sequence, and how far it has released the ring.
// A first connection starts at {1, 0, 0, 0}.
struct ResumePoint {
  std::uint64_t epoch = 1;
  std::uint64_t position = 0;       // consumer's read head: the next record starts here
  std::uint64_t released = 0;       // below this the producer may write (released <= position)
  std::uint64_t next_sequence = 0;  // the sequence of the record at `position`
};

// What the consumer told us at connect time.
struct PeerRing {
  wire::PublishMode mode = wire::PublishMode::imm;
  RingGeometry geometry;
  ResumePoint start;
  wire::PayloadCheck payload_check = wire::PayloadCheck::crc32c;
};

// One work request for the adapter to post, in order, on the connection's RC QP.
struct WorkRequest {
  enum class Kind : std::uint8_t {
    write,           // staging[local_offset, +length) -> ring[remote_offset, +length)
    write_with_imm,  // the same, then the consumer receives `imm`: mode imm's publish, or
                     // (zero-length, after the tail) mode tail's doorbell
    write_tail,      // publish: `tail` (inline) -> the consumer's tail MR
  };
  Kind kind = Kind::write;
  std::uint64_t local_offset = 0;
  std::uint64_t remote_offset = 0;
  std::uint32_t length = 0;
  std::uint32_t imm = 0;
  std::array<std::byte, wire::kTailRecordSize> tail{};
  SendQueueBudget::Slot slot{};
};

// Everything one ibv_post_send carries: at most two payload segments (a batch crosses the ring's
// end at most once), the publish and, in mode tail, a doorbell.
struct PostBatch {
  std::array<WorkRequest, 4> wrs{};
  std::size_t count = 0;
  std::span<const WorkRequest> requests() const noexcept { return {wrs.data(), count}; }
};

struct ProducerCounters {
  std::uint64_t records = 0;          // data records committed
  std::uint64_t payload_bytes = 0;
  std::uint64_t padding_records = 0;
  std::uint64_t batches = 0;          // publishes
  std::uint64_t wrs = 0;
  std::uint64_t signaled = 0;
  std::uint64_t wire_bytes = 0;       // bytes written to the ring, headers and padding included
  std::uint64_t credit_updates = 0;   // credit records that moved `released`
  std::uint64_t credit_requests = 0;  // publishes that asked for credit
  std::uint64_t torn_credit_reads = 0;
  std::uint64_t stale_credit = 0;     // credit records from another epoch, ignored
  std::uint64_t would_block = 0;      // claims refused for lack of ring space
  std::uint64_t sq_full = 0;          // batches held back for lack of send-queue slots
  std::uint64_t doorbells = 0;        // mode tail: publishes followed by a doorbell
};

class ProducerCore {
 public:
  // Assumes staging.size() == peer.geometry.bytes and `config` validated. A producer that lost
  // its staging (a restart) starts empty at peer.start: the application re-sends from
  // peer.start.next_sequence.
  ProducerCore(std::span<std::byte> staging, const PeerRing& peer, const ProducerConfig& config) noexcept;

  // Opens a claim of `len` payload bytes and returns them, in staging, for the caller to fill.
  // Errors: record_too_large (len > max_record); would_block (ring space is not yet released:
  // flush, take credit and retry); claim_open; the connection's error once broken.
  Result<std::span<std::byte>> claim(std::uint32_t len, Clock::time_point now);
  // Seals the open claim as a record of `len` bytes (at most the claimed length; default: all).
  // Errors: no_claim; record_too_large when len exceeds the claim.
  Result<void> commit(std::optional<std::uint32_t> len = std::nullopt);
  // Drops the open claim; nothing of it is sent.
  void abort() noexcept;
  // claim + copy + commit.
  Result<void> send(std::span<const std::byte> payload, Clock::time_point now);

  // True when a coalescing threshold is reached or credit must be asked for.
  bool flush_due(Clock::time_point now) const noexcept;
  // Whether the next claim() or send() looks at the time it is given: the record that starts a
  // batch stamps the batch with it, and the batch's age is held against coalesce.delay at its
  // 2nd, 4th, 8th ... record (and at every flush_due() of progress()). Elsewhere it may be given
  // Clock::time_point{}, which reads as "no time": a clock read per doubling of the batch
  // instead of one per record (a third of a small record's cost), at the price of a steady
  // trickle's publish coming up to twice the delay late (see time_for_send()).
  bool clock_due() const noexcept {
    // The 1st, 2nd, 4th ... record: pending + 1 a power of two. Not std::has_single_bit, a
    // libgcc call per record where the build may not assume the popcnt instruction.
    return committed_ == published_ || ((pending_records_ + 1) & pending_records_) == 0 ||
           config_.coalesce.delay <= Clock::duration::zero();
  }
  // Whether anything waits to be posted at all (flush_due's cheap part, needing no clock).
  bool publish_pending() const noexcept {
    return !failure_ && (want_credit_ || ring_ || committed_ != published_);
  }
  // The next batch to post, regardless of thresholds; nullopt when nothing is waiting or the
  // send queue has no room (then retry after completions).
  std::optional<PostBatch> take_batch();

  // Continues over a new connection from where the consumer stands. Staging still holds every
  // unreleased record, so the records from `at.position` on go out again, unchanged, with the
  // next batch: none lost, none delivered twice (the consumer reads from that very position).
  // Errors: stale_epoch (at.epoch not newer); protocol_violation when `at` is not a record
  // boundary this producer wrote with that sequence (then it must restart from `at`).
  Result<void> resume(const ResumePoint& at);
  // Where an owner restored after its restart starts this producer's records: the first
  // position whose record this producer still holds, and that record's sequence (the resume
  // request's `released` and `releasedSequence`, protocol-spec/resume.md §3 step 1). That is
  // `released`, except after a restart: the staging of a core started at peer.start holds
  // nothing below it, while the owner may not yet have released the records it was consuming
  // there (its own to finish, and not this producer's to send again).
  struct ResendPoint {
    std::uint64_t position = 0;
    std::uint64_t sequence = 0;
  };
  ResendPoint resend_point() const noexcept;

  // Asks the consumer for a credit write-back with the next publish (once until credit moves).
  void request_credit() noexcept { want_credit_ = !credit_asked_; }

  // Posting a batch failed (ibv_post_send): the connection is broken, as by a failed completion.
  // The batch's records stay committed in staging and go out again after resume().
  void on_post_error(Error e) { fail(std::move(e)); }

  // A signaled send completion. A failed one breaks the connection (errc::completion_error).
  void on_completion(std::uint64_t wr_id, bool success, int wc_status = 0);
  // The bytes of the credit MR, as read now (possibly torn; then ignored and counted). Called
  // whenever the producer waits for anything: a credit record that raises the doorbell flag
  // while part of what was published may be unseen needs a doorbell to be sent
  // (protocol-spec/wakeup.md).
  void on_credit(std::span<const std::byte, wire::kCreditRecordSize> bytes);
  // Mode tail: publishes are followed by a doorbell (the consumer may be asleep).
  bool doorbell() const noexcept { return doorbell_; }
  // Mode tail: the repair rule owes the consumer a doorbell; the next take_batch sends it.
  bool doorbell_owed() const noexcept { return ring_; }

  // Set when the connection failed; claim(), send() and take_batch() then refuse.
  const std::optional<Error>& failure() const noexcept { return failure_; }
  ProducerLedger ledger() const noexcept;
  const ProducerCounters& counters() const noexcept { return counters_; }
  std::uint64_t next_sequence() const noexcept { return next_sequence_; }
  std::uint64_t delivered() const noexcept { return delivered_; }
  std::uint64_t epoch() const noexcept { return epoch_; }
  const PeerRing& peer() const noexcept { return peer_; }
  std::uint64_t send_queue_outstanding() const noexcept { return sq_.outstanding(); }

 private:
  struct Claim {  // its header is at committed_: nothing is committed while a claim is open
    std::uint32_t len;
    Clock::time_point when;  // the coalescing delay of a record counts from its claim
  };
  std::uint64_t free_bytes() const noexcept { return released_ + peer_.geometry.bytes - committed_; }
  // Room at committed_ for a record of `len` bytes, padding the ring's end first where the
  // record would cross it; refuses while broken, with a claim open, or past max_record.
  Result<void> reserve(std::uint64_t len, Clock::time_point now);
  // Writes the header of the record of `len` bytes at committed_ (its payload in place) and
  // commits it; `when` starts a batch's coalescing delay.
  void seal(std::uint32_t len, Clock::time_point when);
  std::span<std::byte, wire::kRecordHeaderSize> header_at(std::uint64_t pos) noexcept;
  std::span<std::byte> payload_at(std::uint64_t pos, std::uint32_t len) noexcept;
  void append_padding(std::uint64_t next_sequence);
  void mark_committed(std::uint64_t bytes, Clock::time_point now);
  void fail(Error e);
  Error starved();
  Error too_large(std::uint64_t len) const;

  std::span<std::byte> staging_;
  PeerRing peer_;
  ProducerConfig config_;
  std::uint64_t epoch_;
  SendQueueBudget sq_;

  std::uint64_t released_ = 0;
  std::uint64_t published_ = 0;
  std::uint64_t committed_ = 0;
  std::optional<Claim> claim_;
  std::uint64_t next_sequence_;
  std::uint64_t delivered_;
  std::uint32_t pending_records_ = 0;
  Clock::time_point oldest_pending_{};
  bool want_credit_ = false;
  bool credit_asked_ = false;
  bool doorbell_;      // mode tail: the consumer's flag, assumed set until it says otherwise
  bool ring_ = false;  // a doorbell is owed for a publish made before the flag was seen
  std::uint32_t credit_requests_ = 0;
  std::array<std::byte, wire::kCreditRecordSize> last_credit_{};  // polled often, decoded when it changes
  std::optional<Error> failure_;
  ProducerCounters counters_;
};

// The time to give the next claim() or send(): read only when the core will look at it.
inline Clock::time_point time_for_send(const ProducerCore& core) noexcept {
  return core.clock_due() ? Clock::now() : Clock::time_point{};
}

}  // namespace rdmaring
