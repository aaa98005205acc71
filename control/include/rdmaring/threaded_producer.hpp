// The multi-thread front of a producer: any number of application threads call send(); one
// poster thread, named "rdmaring-post" (what top -H, ps -L and /proc/PID/task/*/comm show), is
// the only caller of the single-threaded Sink (a Producer).
//
// The hand-off is lock-free and bounded. A record is copied into a slot of a preallocated pool
// (the free list is a boost::lockfree::stack of slot indices) and the slot index is pushed into a
// boost::lockfree::queue that the poster drains. Both are fixed-sized, so the hot path never
// allocates and never takes a mutex; an empty free list is back-pressure (errc::would_block),
// returned at once so the caller decides whether to wait.
//
// Order: the records of one thread reach the Sink in that thread's send order; records of
// different threads are interleaved in no promised order (see send()).
#pragma once

#include <pthread.h>

#include <atomic>
#include <bit>
#include <boost/assert.hpp>
#include <boost/lockfree/policies.hpp>
#include <boost/lockfree/queue.hpp>
#include <boost/lockfree/stack.hpp>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>

#include "rdmaring/error.hpp"
#include "rdmaring/idle_strategy.hpp"

namespace rdmaring {

// The data path of a single-threaded producer, as rdmaring::Producer has it. send() returns
// errc::would_block when the ring is full; progress() makes room (completions, credit).
template <class S>
concept RecordSink = requires(S& s, std::span<const std::byte> payload) {
  { s.send(payload) } -> std::same_as<Result<void>>;
  { s.progress() } -> std::same_as<Result<void>>;
  { s.flush() } -> std::same_as<Result<void>>;
};

// A Sink that can say when nothing it was given is still in flight (every record released by the
// consumer). Only then may the poster sleep without a time limit: while anything is published
// and not yet released it keeps reading the Sink's credit (protocol-spec/wakeup.md, the
// producer's part). quiescent() asks the consumer for the credit that settles it, when needed.
template <class S>
concept QuiescentSink = RecordSink<S> && requires(S& s) {
  { s.quiescent() } -> std::same_as<bool>;
};

// A Sink that can heal its own connection (Producer::recover()). The poster heals it when an
// error calls for it (needs_recover()): the application's threads see back-pressure while it
// heals, never a dead connection.
template <class S>
concept RecoverableSink = RecordSink<S> && requires(S& s) { s.recover(); };

struct ThreadedProducerOptions {
  // Records accepted but not yet handed to the Sink. A power of two, at most 32768: the
  // fixed-size Boost.Lockfree pools address nodes with 16-bit indices (65535 at most), and the
  // queue needs one node beyond the slots for its dummy head.
  std::uint32_t slot_count = 1024;
  // The largest payload send() accepts; every slot reserves this much.
  std::uint32_t slot_bytes = 4096;
  // How the poster waits when it has nothing to post or the Sink is full: spin, yield, then
  // sleep for growing periods (IdleStrategy). Spinning keeps a lone record's latency low;
  // sleeping stops an idle connection from burning a core. A QuiescentSink's poster with
  // nothing in flight goes further: it sleeps until the next send() wakes it.
  IdlePolicy poster_idle;
  // The same for the calling threads in send(payload, timeout), drain() and stop().
  IdlePolicy retry_idle{16, 16, std::chrono::microseconds(1), std::chrono::microseconds(100)};
  // How long stop() (and so the destructor) waits for queued records to reach the Sink before
  // it counts the rest as not sent.
  std::chrono::nanoseconds stop_timeout = std::chrono::seconds(1);
  // A RecoverableSink: how often the poster tries recover() after a failure that calls for it,
  // and how long it waits between tries, before the failure becomes sticky.
  std::uint32_t recover_attempts = 50;
  std::chrono::nanoseconds recover_interval = std::chrono::milliseconds(100);
};

struct ThreadedProducerStats {
  std::uint64_t accepted = 0;        // send() returned success
  std::uint64_t handed_to_sink = 0;  // Sink::send() took the record
  std::uint64_t not_sent = 0;        // accepted, then dropped: the Sink failed or stop() gave up
  std::uint64_t would_block = 0;     // send() refused for want of a free slot
  std::uint64_t sink_retries = 0;    // Sink::send() returned would_block; retried after progress()
  std::uint64_t max_queue_depth = 0; // most accepted records seen waiting for the poster at once
  std::uint64_t recoveries = 0;      // the poster healed the Sink's connection
  std::uint64_t poster_parks = 0;    // the poster slept until a send() woke it (QuiescentSink)
};

template <RecordSink Sink>
class ThreadedProducer {
 public:
  // Starts the poster. From here until stop() returns, only the poster may call `sink`; the
  // caller keeps it alive past stop() (records handed over but not flushed by a stop() that
  // timed out are still in it). The Sink must not throw: the poster has nowhere to rethrow.
  // Throws: SetupError (bad_config) for options out of range.
  ThreadedProducer(Sink& sink, const ThreadedProducerOptions& options)
      : sink_(sink),
        opts_(checked(options)),
        stride_(slot_stride(opts_.slot_bytes)),
        slots_(std::make_unique<Line[]>(std::size_t{opts_.slot_count} * stride_ / kLine)),
        free_(opts_.slot_count),
        pending_(opts_.slot_count) {
    // Pushed in reverse so the first sends take the lowest slots; the stack then hands back the
    // most recently freed slot, whose lines are still in cache.
    for (std::uint32_t i = opts_.slot_count; i-- > 0;) BOOST_VERIFY(free_.bounded_push(i));
    poster_ = std::thread([this] { run(); });
    // From here rather than from the poster, so the name is set when the constructor returns.
    pthread_setname_np(poster_.native_handle(), "rdmaring-post");
  }

  ThreadedProducer(const ThreadedProducer&) = delete;
  ThreadedProducer& operator=(const ThreadedProducer&) = delete;

  ~ThreadedProducer() { (void)stop(); }

  // Copies `payload` into a free slot and queues it for the poster. Callable from any number of
  // threads at once.
  // Errors: record_too_large (payload > slot_bytes), would_block (every slot is queued: retry
  // later, or use the timed overload), the Sink's error once it failed (sticky),
  // closed after stop().
  //
  // Per-thread order: boost::lockfree::queue is a Michael-Scott queue, whose push is
  // linearizable: it takes effect at the CAS that links its node behind the last node, inside the
  // push call. Two pushes of one thread are sequenced, so the second node is linked behind the
  // first. The poster is the queue's only consumer and pops nodes in link order, and it hands
  // each record to the Sink (retrying that same record on would_block) before it pops the next.
  // Pushes of different threads race for the tail, hence no order across threads.
  Result<void> send(std::span<const std::byte> payload) {
    if (payload.size() > opts_.slot_bytes) {
      return make_error(errc::record_too_large, "ThreadedProducer::send(" + std::to_string(payload.size()) +
                                                    " bytes, slot_bytes " + std::to_string(opts_.slot_bytes) + ")");
    }
    if (failed_.load(std::memory_order_acquire)) return error_;
    std::uint32_t slot = 0;
    if (!free_.pop(slot)) {
      would_block_.fetch_add(1, std::memory_order_relaxed);
      // No context: this is the back-pressure path callers spin on, it must not allocate.
      return make_error(errc::would_block);
    }
    std::byte* const base = slot_base(slot);
    const auto len = static_cast<std::uint32_t>(payload.size());
    std::memcpy(base, &len, sizeof len);
    if (!payload.empty()) std::memcpy(base + kHeader, payload.data(), payload.size());
    if (!admit()) {
      release_slot(slot);
      return make_error(errc::closed, "ThreadedProducer::send after stop()");
    }
    // Cannot fail: a queued index holds a slot, so at most slot_count nodes are in use besides
    // the dummy, and a popped node is back in the pool before its slot is back in the free list.
    BOOST_VERIFY(pending_.bounded_push(slot));
    wake_poster();
    return success();
  }

  // send(), retried with a backoff while it returns would_block, until `timeout` passes
  // (errc::timed_out).
  Result<void> send(std::span<const std::byte> payload, std::chrono::nanoseconds timeout) {
    const auto deadline = Clock::now() + timeout;
    IdleStrategy backoff(opts_.retry_idle);
    for (;;) {
      auto r = send(payload);
      if (r || r.error() != errc::would_block) return r;
      if (Clock::now() >= deadline) return make_error(errc::timed_out, "ThreadedProducer::send");
      backoff.idle(0);
    }
  }

  // Waits until every record whose send() returned before this call has been handed to the Sink
  // and flushed. Errors: timed_out, the Sink's error.
  Result<void> drain(std::chrono::nanoseconds timeout) {
    const std::uint64_t target = admitted(admission_.load(std::memory_order_acquire));
    request_settle(target);
    return wait_settled(target, Clock::now() + timeout, "ThreadedProducer::drain");
  }

  // Refuses further sends, waits up to stop_timeout for the queued records to reach the Sink
  // and be flushed, counts any left as not sent, and joins the poster. Call it from one thread;
  // later calls return at once. Errors: as drain().
  Result<void> stop() {
    if (!poster_.joinable()) {
      if (failed_.load(std::memory_order_acquire)) return error_;
      return success();
    }
    const std::uint64_t target = admitted(admission_.fetch_or(kClosed, std::memory_order_seq_cst));
    wake_poster();
    request_settle(target);
    auto r = wait_settled(target, Clock::now() + opts_.stop_timeout, "ThreadedProducer::stop");
    abandon_.store(true, std::memory_order_release);
    poster_.join();
    return r;
  }

  ThreadedProducerStats stats() const noexcept {
    return ThreadedProducerStats{
        .accepted = admitted(admission_.load(std::memory_order_relaxed)),
        .handed_to_sink = handed_.load(std::memory_order_relaxed),
        .not_sent = not_sent_.load(std::memory_order_relaxed),
        .would_block = would_block_.load(std::memory_order_relaxed),
        .sink_retries = sink_retries_.load(std::memory_order_relaxed),
        .max_queue_depth = max_depth_.load(std::memory_order_relaxed),
        .recoveries = recoveries_.load(std::memory_order_relaxed),
        .poster_parks = parks_.load(std::memory_order_relaxed),
    };
  }

 private:
  using Clock = std::chrono::steady_clock;

  static constexpr std::size_t kLine = 64;
  // The payload starts 8 bytes into its slot so the Sink's copy reads aligned words.
  static constexpr std::size_t kHeader = 8;
  static constexpr std::uint32_t kMaxSlots = 32768;
  // admission_ counts accepted records in its low bits; this bit closes it (stop()).
  static constexpr std::uint64_t kClosed = std::uint64_t{1} << 63;

  // Each slot spans whole cache lines, so two senders filling neighbouring slots do not share one.
  struct alignas(kLine) Line {
    std::byte bytes[kLine];
  };

  static const ThreadedProducerOptions& checked(const ThreadedProducerOptions& o) {
    if (o.slot_count == 0 || !std::has_single_bit(o.slot_count) || o.slot_count > kMaxSlots) {
      throw SetupError(make_error(errc::bad_config, "ThreadedProducer slot_count " + std::to_string(o.slot_count) +
                                                        " (a power of two, at most 32768)"));
    }
    if (o.slot_bytes == 0) throw SetupError(make_error(errc::bad_config, "ThreadedProducer slot_bytes 0"));
    return o;
  }

  static std::size_t slot_stride(std::uint32_t slot_bytes) noexcept {
    return (kHeader + slot_bytes + kLine - 1) / kLine * kLine;
  }

  static std::uint64_t admitted(std::uint64_t admission) noexcept { return admission & ~kClosed; }

  std::byte* slot_base(std::uint32_t slot) const noexcept {
    return reinterpret_cast<std::byte*>(slots_.get()) + std::size_t{slot} * stride_;
  }

  // Cannot fail: the stack has a node for every slot and only slots go in.
  void release_slot(std::uint32_t slot) { BOOST_VERIFY(free_.bounded_push(slot)); }

  // Counts the record in unless stop() closed admission. Counting happens before the push, so
  // a record whose send() returned is in every later count (drain's target), and stop() learns
  // exactly how many records the poster must still see.
  bool admit() noexcept {
    std::uint64_t cur = admission_.load(std::memory_order_relaxed);
    do {
      if ((cur & kClosed) != 0) return false;
    } while (!admission_.compare_exchange_weak(cur, cur + 1, std::memory_order_seq_cst, std::memory_order_relaxed));
    return true;
  }

  // The parked poster's handshake (io_uring's SQ_NEED_WAKEUP, in one process): the poster
  // stores kParked and then reads admission_; a sender changes admission_ and then reads wake_
  // (all sequentially consistent). So either the poster sees the new record and stays up, or the
  // sender sees kParked and wakes it: no record waits for a poster that sleeps on. A sender pays
  // one load unless the poster is parked.
  void wake_poster() noexcept {
    if (wake_.load(std::memory_order_seq_cst) == kParked && wake_.exchange(0, std::memory_order_seq_cst) == kParked)
      wake_.notify_one();
  }

  void park(std::uint64_t popped) {
    wake_.store(kParked, std::memory_order_seq_cst);
    const std::uint64_t admission = admission_.load(std::memory_order_seq_cst);
    if (admitted(admission) == popped && (admission & kClosed) == 0) {
      parks_.fetch_add(1, std::memory_order_relaxed);
      wake_.wait(kParked, std::memory_order_acquire);
    }
    wake_.store(0, std::memory_order_relaxed);
  }

  // Asks the poster to flush once it has taken `target` records, even if the queue never runs
  // empty under a steady load.
  void request_settle(std::uint64_t target) noexcept {
    std::uint64_t cur = settle_request_.load(std::memory_order_relaxed);
    while (cur < target && !settle_request_.compare_exchange_weak(cur, target, std::memory_order_relaxed)) {
    }
  }

  // settled_ counts the records the poster has taken off the queue, in queue order, and flushed
  // (or dropped). A record is counted in admission_ before it is pushed, so every record queued
  // ahead of one whose send() returned before `target` was read is in `target` too: that record
  // is among the first `target` taken, and settled_ >= target means it is done.
  Result<void> wait_settled(std::uint64_t target, Clock::time_point deadline, const char* what) {
    IdleStrategy backoff(opts_.retry_idle);
    for (;;) {
      if (failed_.load(std::memory_order_acquire)) return error_;
      if (settled_.load(std::memory_order_acquire) >= target) return success();
      if (Clock::now() >= deadline) return make_error(errc::timed_out, what);
      backoff.idle(0);
    }
  }

  void run() noexcept {
    std::uint64_t popped = 0;
    std::uint64_t settled = 0;
    std::uint64_t max_depth = 0;
    IdleStrategy idle(opts_.poster_idle);
    for (;;) {
      std::uint32_t slot = 0;
      if (pending_.pop(slot)) {
        idle.reset();
        // Admission is counted before the push this pop saw, so depth >= 1.
        const std::uint64_t depth = admitted(admission_.load(std::memory_order_relaxed)) - popped;
        if (depth > max_depth) {
          max_depth = depth;
          max_depth_.store(depth, std::memory_order_relaxed);
        }
        hand_over(slot);
        release_slot(slot);
        ++popped;
        const std::uint64_t want = settle_request_.load(std::memory_order_relaxed);
        if (settled < want && popped >= want) settled = settle(popped);
        continue;
      }
      // The queue ran empty: publish now, so a lone record does not wait for the Sink's
      // coalescing thresholds.
      if (settled != popped) {
        settled = settle(popped);
        continue;
      }
      const std::uint64_t admission = admission_.load(std::memory_order_acquire);
      if ((admission & kClosed) != 0 && popped == admitted(admission)) return;
      if (!failed_.load(std::memory_order_relaxed)) {
        auto r = sink_.progress();
        if (!r) on_sink_error(std::move(r).error());
      }
      if constexpr (QuiescentSink<Sink>) {
        // Nothing in flight: nothing to read credit for, so nothing but a send() can need us.
        if (failed_.load(std::memory_order_relaxed) || sink_.quiescent()) {
          park(popped);
          idle.reset();
          continue;
        }
      }
      idle.idle(0);
    }
  }

  // Hands one record to the Sink, retrying it on would_block rather than taking the next one:
  // a record is never dropped while the Sink works, and never overtaken by a later one.
  void hand_over(std::uint32_t slot) {
    IdleStrategy full(opts_.poster_idle);
    for (;;) {
      if (failed_.load(std::memory_order_relaxed) || abandon_.load(std::memory_order_acquire)) {
        not_sent_.fetch_add(1, std::memory_order_relaxed);
        return;
      }
      const std::byte* const base = slot_base(slot);
      std::uint32_t len = 0;
      std::memcpy(&len, base, sizeof len);
      auto r = sink_.send(std::span<const std::byte>(base + kHeader, len));
      if (r) {
        handed_.fetch_add(1, std::memory_order_relaxed);
        return;
      }
      if (r.error() != errc::would_block) {
        on_sink_error(std::move(r).error());
        continue;
      }
      sink_retries_.fetch_add(1, std::memory_order_relaxed);
      auto p = sink_.progress();
      if (!p) {
        on_sink_error(std::move(p).error());
        continue;
      }
      full.idle(0);
    }
  }

  // Flushes what was handed over and marks the first `popped` records settled. After a failure
  // there is nothing to flush; the dropped records settle so drain() and stop() return.
  std::uint64_t settle(std::uint64_t popped) {
    if (!failed_.load(std::memory_order_relaxed)) {
      auto r = sink_.flush();
      if (!r) on_sink_error(std::move(r).error());
    }
    settled_.store(popped, std::memory_order_release);
    return popped;
  }

  // Heals a RecoverableSink when the error calls for it (the record being handed over is then
  // retried: the Sink did not take it), else makes the error sticky. A sticky error after failed
  // recoveries keeps the failure's code and says how often recover() failed and why, last: that,
  // not the failure, is what the application must act on.
  void on_sink_error(Error e) {
    if constexpr (RecoverableSink<Sink>) {
      if (needs_recover(e)) {
        std::uint32_t attempt = 0;
        std::optional<Error> last;
        for (; attempt < opts_.recover_attempts; ++attempt) {
          if (abandon_.load(std::memory_order_acquire)) break;
          auto resumed = sink_.recover();
          if (resumed) {
            recoveries_.fetch_add(1, std::memory_order_relaxed);
            return;
          }
          last = std::move(resumed).error();
          std::this_thread::sleep_for(opts_.recover_interval);
        }
        if (last)
          e.context += "; recover() failed " + std::to_string(attempt) + " time(s), the last with: " + last->message();
      }
    }
    fail(std::move(e));
  }

  // The poster is the only writer of error_, and writes it once, before the release store of
  // failed_ that every reader acquires first.
  void fail(Error e) {
    if (failed_.load(std::memory_order_relaxed)) return;
    error_ = std::move(e);
    failed_.store(true, std::memory_order_release);
  }

  Sink& sink_;
  const ThreadedProducerOptions opts_;
  const std::size_t stride_;
  const std::unique_ptr<Line[]> slots_;
  boost::lockfree::stack<std::uint32_t, boost::lockfree::fixed_sized<true>> free_;
  boost::lockfree::queue<std::uint32_t, boost::lockfree::fixed_sized<true>> pending_;

  // Written by every sender.
  alignas(kLine) std::atomic<std::uint64_t> admission_{0};
  alignas(kLine) std::atomic<std::uint64_t> would_block_{0};
  // Written by drain() and stop(), read by the poster after every record.
  alignas(kLine) std::atomic<std::uint64_t> settle_request_{0};
  // Written by the poster.
  alignas(kLine) std::atomic<std::uint64_t> settled_{0};
  std::atomic<std::uint64_t> handed_{0};
  std::atomic<std::uint64_t> not_sent_{0};
  std::atomic<std::uint64_t> sink_retries_{0};
  std::atomic<std::uint64_t> max_depth_{0};
  std::atomic<std::uint64_t> recoveries_{0};
  // Read on every send: kept off the lines above so their writes do not evict it.
  alignas(kLine) std::atomic<bool> failed_{false};
  Error error_;
  std::atomic<bool> abandon_{false};
  static constexpr std::uint32_t kParked = 1;
  alignas(kLine) std::atomic<std::uint32_t> wake_{0};
  std::atomic<std::uint64_t> parks_{0};

  // Last: the poster starts in the constructor and uses every member above.
  std::thread poster_;
};

}  // namespace rdmaring
