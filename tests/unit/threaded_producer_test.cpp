#include "rdmaring/threaded_producer.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "../thread_names.hpp"

using namespace rdmaring;
using namespace std::chrono_literals;


namespace {

constexpr std::uint32_t kMaxThreads = 16;

// Record `seq` of thread `tid`: the pair, then a length and filler that are functions of the
// pair, so the sink checks every byte the slot carried.
std::vector<std::byte> encode(std::uint32_t tid, std::uint32_t seq) {
  std::vector<std::byte> p(8 + seq % 23);
  std::memcpy(p.data(), &tid, 4);
  std::memcpy(p.data() + 4, &seq, 4);
  for (std::size_t i = 8; i < p.size(); ++i) p[i] = static_cast<std::byte>(tid * 31 + seq + i);
  return p;
}

struct Seen {
  std::uint32_t tid;
  std::uint32_t seq;
};

// Stands in for the single-threaded Producer. The members the poster alone writes are read by
// the test only after stop() or destruction joined it; the atomics may be read at any time.
struct FakeSink {
  // Set before the producer starts.
  std::uint32_t would_block_one_in = 0;  // 0: never refuse at random
  std::optional<std::uint64_t> fail_after;  // fail the send after this many were taken
  std::chrono::nanoseconds send_delay{0};

  // Flipped by the test while the poster runs.
  std::atomic<bool> full{false};      // send() returns would_block while set
  std::atomic<bool> fail_now{false};  // every call fails from the next one on

  std::vector<Seen> seen;
  std::uint64_t bad_payloads = 0;
  std::array<std::uint64_t, kMaxThreads> taken_per_thread{};
  std::atomic<std::uint64_t> flush_calls{0};
  std::array<std::atomic<std::uint64_t>, kMaxThreads> flushed_per_thread{};
  std::atomic<std::uint64_t> flushed{0};

  Result<void> send(std::span<const std::byte> p) {
    if (fail_now.load() || (fail_after && seen.size() == *fail_after)) return failure();
    if (full.load()) return make_error(errc::would_block);
    if (would_block_one_in != 0 && rng() % would_block_one_in == 0) return make_error(errc::would_block);
    if (send_delay.count() > 0) std::this_thread::sleep_for(send_delay);
    std::uint32_t tid = 0;
    std::uint32_t seq = 0;
    if (p.size() < 8) {
      ++bad_payloads;
      return success();
    }
    std::memcpy(&tid, p.data(), 4);
    std::memcpy(&seq, p.data() + 4, 4);
    const auto want = encode(tid, seq);
    if (tid >= kMaxThreads || want.size() != p.size() || !std::equal(want.begin(), want.end(), p.begin())) {
      ++bad_payloads;
      return success();
    }
    seen.push_back({tid, seq});
    ++taken_per_thread[tid];
    return success();
  }

  Result<void> progress() {
    if (fail_now.load()) return failure();
    return success();
  }

  Result<void> flush() {
    if (fail_now.load()) return failure();
    flush_calls.fetch_add(1);
    for (std::uint32_t t = 0; t < kMaxThreads; ++t) flushed_per_thread[t].store(taken_per_thread[t]);
    flushed.store(seen.size());
    return success();
  }

  static Error failure() { return make_error(errc::completion_error, "fake sink"); }

  std::mt19937 rng{12345};
};

// Every thread's records arrived exactly once and in its send order.
void check_per_thread_order(const FakeSink& sink, std::uint32_t threads, std::uint32_t per_thread) {
  REQUIRE(sink.bad_payloads == 0);
  REQUIRE(sink.seen.size() == std::uint64_t{threads} * per_thread);
  std::vector<std::uint32_t> next(threads, 0);
  std::uint64_t unexpected = 0;  // a foreign thread id, a duplicate, a gap or a reordering
  for (const auto& s : sink.seen) {
    if (s.tid >= threads || s.seq != next[s.tid]) {
      ++unexpected;
      continue;
    }
    ++next[s.tid];
  }
  REQUIRE(unexpected == 0);
  CHECK(next == std::vector<std::uint32_t>(threads, per_thread));
}

ThreadedProducerOptions small_options(std::uint32_t slots, std::uint32_t bytes = 64) {
  ThreadedProducerOptions o;
  o.slot_count = slots;
  o.slot_bytes = bytes;
  return o;
}

}  // namespace

TEST_CASE("ThreadedProducer: many threads, every record once, per-thread order kept", "[threaded_producer]") {
  constexpr std::uint32_t kThreads = 8;
  constexpr std::uint32_t kPerThread = 20'000;
  FakeSink sink;
  sink.would_block_one_in = 97;
  ThreadedProducer<FakeSink> tp(sink, small_options(1024));

  std::atomic<std::uint64_t> failures{0};
  std::vector<std::thread> senders;
  for (std::uint32_t t = 0; t < kThreads; ++t) {
    senders.emplace_back([&, t] {
      for (std::uint32_t s = 0; s < kPerThread; ++s) {
        if (!tp.send(encode(t, s), 10s)) failures.fetch_add(1);
      }
    });
  }
  for (auto& th : senders) th.join();
  REQUIRE(failures.load() == 0);
  REQUIRE(tp.drain(10s));
  REQUIRE(tp.stop());

  check_per_thread_order(sink, kThreads, kPerThread);
  const auto st = tp.stats();
  CHECK(st.accepted == std::uint64_t{kThreads} * kPerThread);
  CHECK(st.handed_to_sink == st.accepted);
  CHECK(st.not_sent == 0);
  CHECK(st.sink_retries > 0);
  CHECK(st.max_queue_depth >= 1);
  CHECK(st.max_queue_depth <= 1024);
}

TEST_CASE("ThreadedProducer: back-pressure with a tiny slot pool loses nothing", "[threaded_producer]") {
  SECTION("four threads hammering four slots, the sink refusing at random") {
    constexpr std::uint32_t kThreads = 4;
    constexpr std::uint32_t kPerThread = 5'000;
    FakeSink sink;
    sink.would_block_one_in = 3;
    ThreadedProducer<FakeSink> tp(sink, small_options(4));

    std::atomic<std::uint64_t> refusals{0};
    std::atomic<std::uint64_t> other_errors{0};
    std::vector<std::thread> senders;
    for (std::uint32_t t = 0; t < kThreads; ++t) {
      senders.emplace_back([&, t] {
        for (std::uint32_t s = 0; s < kPerThread;) {
          auto r = tp.send(encode(t, s));
          if (r) {
            ++s;
          } else if (r.error() == errc::would_block) {
            refusals.fetch_add(1);
            std::this_thread::yield();
          } else {
            other_errors.fetch_add(1);
            return;
          }
        }
      });
    }
    for (auto& th : senders) th.join();
    REQUIRE(other_errors.load() == 0);
    REQUIRE(tp.stop());

    check_per_thread_order(sink, kThreads, kPerThread);
    const auto st = tp.stats();
    CHECK(st.would_block == refusals.load());
    CHECK(st.handed_to_sink == std::uint64_t{kThreads} * kPerThread);
    CHECK(st.sink_retries > 0);
    CHECK(st.max_queue_depth <= 4);
  }

  SECTION("a full sink fills the pool, then send refuses at once and the timed send times out") {
    FakeSink sink;
    sink.full = true;
    ThreadedProducer<FakeSink> tp(sink, small_options(4));
    for (std::uint32_t s = 0; s < 4; ++s) REQUIRE(tp.send(encode(0, s)));

    auto r = tp.send(encode(0, 4));
    REQUIRE_FALSE(r);
    CHECK(r.error() == errc::would_block);
    const auto t0 = std::chrono::steady_clock::now();
    auto timed = tp.send(encode(0, 4), 20ms);
    REQUIRE_FALSE(timed);
    CHECK(timed.error() == errc::timed_out);
    CHECK(std::chrono::steady_clock::now() - t0 >= 20ms);
    CHECK(tp.stats().would_block >= 2);
    CHECK(tp.stats().handed_to_sink == 0);

    // The poster may not have been scheduled yet on a loaded machine: open the sink only once it
    // has met the full one, so the retry path is what hands the records over.
    for (const auto deadline = std::chrono::steady_clock::now() + 10s;
         tp.stats().sink_retries == 0 && std::chrono::steady_clock::now() < deadline;) {
      std::this_thread::sleep_for(1ms);
    }
    REQUIRE(tp.stats().sink_retries > 0);
    sink.full = false;
    REQUIRE(tp.send(encode(0, 4), 5s));
    REQUIRE(tp.drain(5s));
    REQUIRE(tp.stop());
    check_per_thread_order(sink, 1, 5);
  }
}

TEST_CASE("ThreadedProducer: the poster thread is named rdmaring-post", "[threaded_producer]") {
  const auto before = test::threads_named("rdmaring-post");
  FakeSink sink;
  ThreadedProducer<FakeSink> tp(sink, small_options(8, 16));
  INFO("threads: " << Catch::Detail::stringify(test::thread_names()));
  CHECK(test::threads_named("rdmaring-post") == before + 1);
}

TEST_CASE("ThreadedProducer: a record larger than a slot is refused", "[threaded_producer]") {
  FakeSink sink;
  ThreadedProducer<FakeSink> tp(sink, small_options(8, 16));
  const std::vector<std::byte> big(17);
  auto r = tp.send(big);
  REQUIRE_FALSE(r);
  CHECK(r.error() == errc::record_too_large);

  REQUIRE(tp.send(encode(0, 0)));  // 8 bytes
  REQUIRE(tp.send(encode(0, 1)));  // 9 bytes
  REQUIRE(tp.send(std::span<const std::byte>()));
  REQUIRE(tp.send(std::vector<std::byte>(16)));
  REQUIRE(tp.stop());
  CHECK(tp.stats().accepted == 4);
  CHECK(tp.stats().handed_to_sink == 4);
  CHECK(sink.seen.size() == 2);
  CHECK(sink.bad_payloads == 2);  // the empty and the all-zero record do not decode
}

TEST_CASE("ThreadedProducer: a failing sink makes later sends fail with its error", "[threaded_producer]") {
  SECTION("told to fail while idle") {
    FakeSink sink;
    ThreadedProducer<FakeSink> tp(sink, small_options(64));
    for (std::uint32_t s = 0; s < 100; ++s) REQUIRE(tp.send(encode(0, s), 5s));
    REQUIRE(tp.drain(5s));

    sink.fail_now = true;
    auto d = tp.drain(5s);  // nothing to wait for, but the poster's idle progress() fails
    for (auto deadline = std::chrono::steady_clock::now() + 5s; d && std::chrono::steady_clock::now() < deadline;) {
      std::this_thread::sleep_for(1ms);
      d = tp.drain(5s);
    }
    REQUIRE_FALSE(d);
    CHECK(d.error() == errc::completion_error);

    auto r = tp.send(encode(0, 100));
    REQUIRE_FALSE(r);
    CHECK(r.error() == errc::completion_error);
    CHECK(r.error().context == "fake sink");
    auto st = tp.stop();
    REQUIRE_FALSE(st);
    CHECK(st.error() == errc::completion_error);
    CHECK(sink.seen.size() == 100);
  }

  SECTION("fails mid-stream under several senders: every accepted record is sent or counted") {
    constexpr std::uint32_t kThreads = 4;
    FakeSink sink;
    sink.fail_after = 1000;
    ThreadedProducer<FakeSink> tp(sink, small_options(32));

    std::atomic<std::uint64_t> wrong_error{0};
    std::vector<std::thread> senders;
    for (std::uint32_t t = 0; t < kThreads; ++t) {
      senders.emplace_back([&, t] {
        for (std::uint32_t s = 0;; ++s) {
          auto r = tp.send(encode(t, s), 5s);
          if (r) continue;
          if (!(r.error() == errc::completion_error) || r.error().context != "fake sink") wrong_error.fetch_add(1);
          return;
        }
      });
    }
    for (auto& th : senders) th.join();
    CHECK(wrong_error.load() == 0);
    auto d = tp.drain(5s);
    REQUIRE_FALSE(d);
    CHECK(d.error() == errc::completion_error);
    REQUIRE_FALSE(tp.stop());

    const auto st = tp.stats();
    CHECK(st.handed_to_sink == 1000);
    CHECK(sink.seen.size() == 1000);
    CHECK(st.accepted == st.handed_to_sink + st.not_sent);
    CHECK(st.not_sent >= 1);  // the record the sink refused
  }
}

namespace {

// A connection that breaks once, after `break_after` records, and heals on the `heals_at`th
// recover() (never if 0); the failed recoveries say the owner is away.
struct BreakingSink : FakeSink {
  std::uint64_t break_after = 0;
  std::uint32_t heals_at = 0;
  std::uint32_t recover_calls = 0;  // poster only
  bool broken = false;              // poster only

  Result<void> send(std::span<const std::byte> p) {
    if (!broken && seen.size() == break_after && recover_calls == 0) broken = true;
    if (broken) return failure();
    return FakeSink::send(p);
  }
  Result<void> progress() { return broken ? Result<void>(failure()) : success(); }
  Result<void> flush() { return broken ? Result<void>(failure()) : FakeSink::flush(); }
  Result<void> recover() {
    ++recover_calls;
    if (heals_at != 0 && recover_calls >= heals_at) {
      broken = false;
      return success();
    }
    return make_error(errc::control_failure, "owner away " + std::to_string(recover_calls));
  }
};

ThreadedProducerOptions recovering_options(std::uint32_t attempts) {
  ThreadedProducerOptions o = small_options(64);
  o.recover_attempts = attempts;
  o.recover_interval = 1ms;
  return o;
}

}  // namespace

TEST_CASE("ThreadedProducer: the poster heals a RecoverableSink, and says why when it cannot",
          "[threaded_producer]") {
  SECTION("healed on the third try: every record once, in order") {
    BreakingSink sink;
    sink.break_after = 40;
    sink.heals_at = 3;
    ThreadedProducer<BreakingSink> tp(sink, recovering_options(5));
    for (std::uint32_t s = 0; s < 100; ++s) REQUIRE(tp.send(encode(0, s), 5s));
    REQUIRE(tp.drain(5s));
    REQUIRE(tp.stop());
    CHECK(tp.stats().recoveries == 1);
    CHECK(sink.recover_calls == 3);
    check_per_thread_order(sink, 1, 100);
  }

  SECTION("never healed: the sticky error keeps the failure's code and names the last recover() error") {
    BreakingSink sink;
    sink.break_after = 10;
    ThreadedProducer<BreakingSink> tp(sink, recovering_options(4));
    for (std::uint32_t s = 0; s < 20; ++s) REQUIRE(tp.send(encode(0, s), 5s));
    auto d = tp.drain(5s);
    REQUIRE_FALSE(d);
    CHECK(d.error() == errc::completion_error);
    CHECK(d.error().context == "fake sink; recover() failed 4 time(s), the last with: " +
                                   make_error(errc::control_failure, "owner away 4").message());
    REQUIRE_FALSE(tp.stop());
    CHECK(tp.stats().recoveries == 0);
    CHECK(sink.seen.size() == 10);
  }
}

TEST_CASE("ThreadedProducer: drain returns once everything sent before it is handed over and flushed",
          "[threaded_producer]") {
  SECTION("a lone record is flushed, not left to the sink's coalescing") {
    FakeSink sink;
    ThreadedProducer<FakeSink> tp(sink, small_options(16));
    REQUIRE(tp.send(encode(0, 0)));
    REQUIRE(tp.drain(5s));
    CHECK(sink.flushed.load() == 1);
    CHECK(sink.flushed_per_thread[0].load() == 1);
  }

  SECTION("times out while the sink is full, succeeds once it has room") {
    FakeSink sink;
    sink.full = true;
    ThreadedProducer<FakeSink> tp(sink, small_options(16));
    REQUIRE(tp.send(encode(0, 0)));
    auto d = tp.drain(10ms);
    REQUIRE_FALSE(d);
    CHECK(d.error() == errc::timed_out);
    sink.full = false;
    REQUIRE(tp.drain(5s));
    CHECK(sink.flushed_per_thread[0].load() == 1);
  }

  SECTION("under a steady load from other threads") {
    // A slow sink and busy background senders keep the queue from running empty, so the
    // flush has to come from drain's request.
    constexpr std::uint32_t kBackground = 3;
    constexpr std::uint32_t kMine = 500;
    FakeSink sink;
    sink.send_delay = 2us;
    ThreadedProducer<FakeSink> tp(sink, small_options(64));

    std::atomic<bool> stop_background{false};
    std::vector<std::thread> background;
    for (std::uint32_t t = 1; t <= kBackground; ++t) {
      background.emplace_back([&, t] {
        for (std::uint32_t s = 0; !stop_background.load(); ++s) {
          if (!tp.send(encode(t, s), 5s)) return;
        }
      });
    }
    for (std::uint32_t s = 0; s < kMine; ++s) REQUIRE(tp.send(encode(0, s), 5s));
    REQUIRE(tp.drain(10s));
    CHECK(sink.flushed_per_thread[0].load() == kMine);

    stop_background = true;
    for (auto& th : background) th.join();
    REQUIRE(tp.stop());
    REQUIRE(sink.bad_payloads == 0);
  }
}

TEST_CASE("ThreadedProducer: stop and destruction with records queued", "[threaded_producer]") {
  SECTION("destruction hands every queued record to a slow sink and flushes") {
    FakeSink sink;
    sink.send_delay = 20us;
    {
      ThreadedProducer<FakeSink> tp(sink, small_options(256));
      for (std::uint32_t s = 0; s < 200; ++s) REQUIRE(tp.send(encode(0, s)));
    }
    check_per_thread_order(sink, 1, 200);
    CHECK(sink.flushed.load() == 200);
  }

  SECTION("stop gives up on a stuck sink after stop_timeout and counts the rest as not sent") {
    FakeSink sink;
    sink.full = true;
    auto o = small_options(8);
    o.stop_timeout = 20ms;
    ThreadedProducer<FakeSink> tp(sink, o);
    for (std::uint32_t s = 0; s < 3; ++s) REQUIRE(tp.send(encode(0, s)));

    const auto t0 = std::chrono::steady_clock::now();
    auto st = tp.stop();
    CHECK(std::chrono::steady_clock::now() - t0 < 2s);
    REQUIRE_FALSE(st);
    CHECK(st.error() == errc::timed_out);
    const auto stats = tp.stats();
    CHECK(stats.accepted == 3);
    CHECK(stats.handed_to_sink == 0);
    CHECK(stats.not_sent == 3);
    CHECK(sink.seen.empty());

    auto late = tp.send(encode(0, 3));
    REQUIRE_FALSE(late);
    CHECK(late.error() == errc::closed);
    CHECK(tp.stats().accepted == 3);
  }

  SECTION("destruction in front of a stuck sink is bounded") {
    FakeSink sink;
    sink.full = true;
    auto o = small_options(8);
    o.stop_timeout = 20ms;
    const auto t0 = std::chrono::steady_clock::now();
    {
      ThreadedProducer<FakeSink> tp(sink, o);
      for (std::uint32_t s = 0; s < 8; ++s) REQUIRE(tp.send(encode(0, s)));
    }
    CHECK(std::chrono::steady_clock::now() - t0 < 2s);
    CHECK(sink.seen.empty());
  }
}

TEST_CASE("ThreadedProducer: options out of range are a set-up error", "[threaded_producer]") {
  FakeSink sink;
  auto refused = [&](ThreadedProducerOptions o) {
    try {
      ThreadedProducer<FakeSink> tp(sink, o);
    } catch (const SetupError& e) {
      return e.error() == errc::bad_config;
    }
    return false;
  };
  CHECK(refused(small_options(0)));
  CHECK(refused(small_options(3)));
  CHECK(refused(small_options(65536)));
  CHECK(refused(small_options(8, 0)));
  CHECK_FALSE(refused(small_options(32768)));
}

namespace {

// A Sink that says when nothing it took is in flight: after a flush, once `settles` more
// progress() calls have gone by (the credit coming back).
struct QuietSink : FakeSink {
  std::uint32_t settle_after = 3;
  std::uint32_t since_flush = 0;
  Result<void> flush() {
    since_flush = 0;
    return FakeSink::flush();
  }
  Result<void> progress() {
    ++since_flush;
    return FakeSink::progress();
  }
  bool quiescent() { return since_flush >= settle_after; }
};
static_assert(QuiescentSink<QuietSink>);

}  // namespace

TEST_CASE("ThreadedProducer: the poster parks when nothing is in flight, and every send wakes it", "[threaded_producer]") {
  // Bursts from several threads with lulls between them: the poster parks in each lull, and a
  // send racing its parking is never left waiting (the handshake of wake_poster() and park()).
  constexpr std::uint32_t kThreads = 4;
  constexpr std::uint32_t kBursts = 40;
  constexpr std::uint32_t kPerBurst = 25;
  QuietSink sink;
  ThreadedProducer<QuietSink> tp(sink, small_options(256));
  std::vector<std::uint32_t> next(kThreads, 0);
  std::atomic<std::uint64_t> failures{0};
  for (std::uint32_t b = 0; b < kBursts; ++b) {
    std::vector<std::thread> senders;
    for (std::uint32_t t = 0; t < kThreads; ++t) {
      senders.emplace_back([&, t] {
        for (std::uint32_t s = 0; s < kPerBurst; ++s)
          if (!tp.send(encode(t, next[t]++), 10s)) failures.fetch_add(1);
      });
    }
    for (auto& th : senders) th.join();
    REQUIRE(failures.load() == 0);
    // Every record reaches the sink without anything but the sends to wake the poster.
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    while (sink.flushed.load() < std::uint64_t{kThreads} * kPerBurst * (b + 1) && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(100us);
    REQUIRE(sink.flushed.load() == std::uint64_t{kThreads} * kPerBurst * (b + 1));
    if (b % 4 == 0) std::this_thread::sleep_for(2ms);  // a lull long enough to park in
  }
  const auto parks = tp.stats().poster_parks;
  REQUIRE(tp.stop());
  check_per_thread_order(sink, kThreads, kBursts * kPerBurst);
  CHECK(parks > 0);
}
