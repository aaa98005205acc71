// The consumer's protocol, sans I/O: publish events (an immediate, a tail record read from
// memory) move the publish mark; records between the read head and the mark are checked and
// delivered in order; released space goes back to the producer as credit write-backs, lazily.
//
// A record is delivered only when its header check, its sequence (exactly the next one) and its
// payload check all pass. In `imm` mode the immediate's completion guarantees the bytes are
// placed, so a failed check is a protocol violation at once. In `tail` mode the publish rests on
// in-order placement (protocol-spec/publish-modes.md); a failed check below the mark is waited
// out for `ordering_grace`, then reported as a violation: never delivered.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <optional>
#include <span>

#include "rdmaring/error.hpp"
#include "rdmaring/ledger.hpp"
#include "rdmaring/producer_core.hpp"
#include "rdmaring/ring_geometry.hpp"
#include "rdmaring/send_queue_budget.hpp"
#include "rdmaring/wire.hpp"

namespace rdmaring {

struct ConsumerConfig {
  std::uint32_t credit_fraction = 4;  // write credit back once ring/credit_fraction is released
  std::chrono::nanoseconds ordering_grace = std::chrono::seconds(1);
  wire::PayloadCheck payload_check = wire::PayloadCheck::crc32c;  // granted to every producer of the ring
  std::uint32_t sq_depth = kDefaultSqDepth;
  std::uint32_t signal_interval = kDefaultSignalInterval;

  Result<void> validate() const;
};

struct DeliveredRecord {
  std::span<const std::byte> payload;  // in the ring: valid until released
  std::uint64_t sequence = 0;
  std::uint64_t end = 0;               // position after the record: pass to release()
};

struct CreditWrite {
  std::array<std::byte, wire::kCreditRecordSize> bytes{};  // posted inline to the credit MR
  SendQueueBudget::Slot slot{};
  // Posted as an RDMA_WRITE_WITH_IMM, which wakes a producer sleeping on its completion queue:
  // it answers a credit request (the producer may be waiting for it) or sets the doorbell flag
  // (a producer with publishes in flight must look at it: protocol-spec/wakeup.md).
  bool notify = false;
};

struct ConsumerCounters {
  std::uint64_t records = 0;
  std::uint64_t payload_bytes = 0;
  std::uint64_t padding_records = 0;
  std::uint64_t publishes = 0;            // immediates / tail records that moved the mark
  std::uint64_t credit_writes = 0;
  std::uint64_t credit_requests = 0;      // producer asked for credit
  std::uint64_t torn_tail_reads = 0;
  std::uint64_t stale_epoch = 0;          // publishes from another epoch, ignored
  std::uint64_t not_ready = 0;            // tail mode: polls that found a published record failing its checks
  std::uint64_t duplicates_dropped = 0;   // records below deliver_from, consumed without delivery
  std::uint64_t doorbells = 0;            // tail mode: immediates that only said "read the tail"
  std::uint64_t doorbell_flag_writes = 0; // credit records written to set or clear the doorbell flag

  ConsumerCounters& operator+=(const ConsumerCounters& o) noexcept;
};

class ConsumerCore {
 public:
  // Assumes ring.size() == geometry.bytes and `config` validated. The first record starts at
  // start.position (released up to there) with sequence start.next_sequence. Records below
  // `deliver_from` are consumed without delivery and counted as duplicates: an owner restored
  // after a restart has delivered them already (its application's durable record says so), and
  // the producer, which cannot know, sends them again.
  ConsumerCore(std::span<const std::byte> ring, const RingGeometry& geometry, wire::PublishMode mode,
               const ResumePoint& start, std::uint64_t deliver_from, const ConsumerConfig& config) noexcept;

  // Mode imm: a receive completion's immediate. Errors: protocol_violation (tail out of range,
  // wrong epoch bits); the connection's error once broken.
  Result<void> on_immediate(std::uint32_t imm);
  // Mode tail: the tail MR's bytes as read now (torn reads are ignored and counted).
  Result<void> on_tail(std::span<const std::byte, wire::kTailRecordSize> bytes);
  // Mode tail: a doorbell's immediate (protocol-spec/wakeup.md). The tail MR says what is
  // published; the doorbell only says the producer saw the flag, which can be cleared now.
  // Errors: protocol_violation (wrong epoch bits); the connection's error once broken.
  Result<void> on_doorbell(std::uint32_t imm);
  // Mode tail: whether the producer should ring a doorbell with each publish (the owner is
  // about to sleep). A change is written with the next take_credit(). Mode imm: ignored.
  void want_doorbell(bool on) noexcept;
  // The producer has the flag the owner wants: the last write that set it has completed, so a
  // publish the producer makes from now on is followed by a doorbell.
  bool doorbell_confirmed() const noexcept;

  // The next record, now being consumed; nullopt when none is published (or, in tail mode, the
  // next one is not yet valid). Errors: protocol_violation.
  // Tail mode: a record that failed its checks is read again only when recheck_at() has come or
  // the tail moved, so waiting out the grace costs a few reads, not one per poll.
  Result<std::optional<DeliveredRecord>> next(Clock::time_point now);
  // Tail mode: while the record at the read head fails its checks and the tail has not moved
  // since, when to read it again (protocol-spec/wakeup.md O7): its first failure plus the time
  // since, at least kRecheckMin, at most kRecheckMax, never past the grace's end. An owner may
  // sleep until then; nullopt otherwise.
  std::optional<Clock::time_point> recheck_at() const noexcept;
  static constexpr std::chrono::microseconds kRecheckMin{20};
  static constexpr std::chrono::milliseconds kRecheckMax{50};
  // Releases every delivered record up to `end` (a DeliveredRecord::end). Errors:
  // invalid_argument when `end` is not the end of a record delivered since the last release.
  Result<void> release(std::uint64_t end);

  // Gives back the delivered records from `start` on (the position of one's header, and its
  // sequence): they are not released and next() returns them again, in order. For an
  // application that could not handle them now (it aborted, or its handler threw). Assumes they
  // were delivered since the last release.
  void unread(std::uint64_t start, std::uint64_t sequence) noexcept;

  // A new connection for this ring, in epoch `epoch` (newer than the current one). Whatever was
  // published but not yet read is forgotten: the producer sends it again from the returned point,
  // so nothing is delivered twice. Records being consumed stay so until released. Clears a
  // failure: the new connection starts clean. Errors: stale_epoch.
  Result<ResumePoint> begin_epoch(std::uint64_t epoch);

  // The credit write-back due now, if any (a quarter ring released, or the producer asked, or
  // the producer asked after a plain record that moved `released`: protocol-spec/wakeup.md O6).
  std::optional<CreditWrite> take_credit();
  void on_completion(std::uint64_t wr_id, bool success, int wc_status = 0);

  const std::optional<Error>& failure() const noexcept { return failure_; }
  ConsumerLedger ledger() const noexcept;
  const ConsumerCounters& counters() const noexcept { return counters_; }
  std::uint64_t next_sequence() const noexcept { return next_sequence_; }
  std::uint64_t epoch() const noexcept { return epoch_; }

 private:
  Error violation(std::string what);
  void skip(std::uint64_t span);

  std::span<const std::byte> ring_;
  RingGeometry geometry_;
  wire::PublishMode mode_;
  std::uint64_t epoch_;
  ConsumerConfig config_;
  SendQueueBudget sq_;

  std::uint64_t credited_;
  std::uint64_t released_;
  std::uint64_t delivered_;
  std::uint64_t head_;
  std::uint64_t published_;
  std::uint64_t next_sequence_;
  std::uint64_t deliver_from_;
  std::uint32_t credit_requests_seen_ = 0;
  bool credit_asked_ = false;
  // The last record that moved `released` was a plain WRITE and none with an immediate followed:
  // a request may have crossed it, and the producer may sleep with its room already in its MR.
  bool unnotified_ = false;
  // Both start set in mode tail: a producer assumes the flag in an epoch it has no credit from.
  bool doorbell_wanted_;
  bool doorbell_written_;
  std::optional<std::uint64_t> doorbell_wr_;  // the write that set the flag, until it completes
  std::array<std::byte, wire::kTailRecordSize> last_tail_{};  // polled often, decoded when it changes
  // Tail mode: since when the record at the head fails its checks, when to look again, and the
  // publish mark then (a tail that moves is looked at at once).
  std::optional<Clock::time_point> invalid_since_;
  Clock::time_point recheck_at_{};
  std::uint64_t invalid_published_ = 0;
  std::optional<Error> failure_;
  ConsumerCounters counters_;
};

}  // namespace rdmaring
