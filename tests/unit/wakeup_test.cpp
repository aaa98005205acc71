// The wake-up protocol in the cores (protocol-spec/wakeup.md): the doorbell flag in the credit
// record, the producer's doorbells and repair rule, the owner's flag writes and their
// confirmation; and the idle strategy. The interleavings are model-checked in
// protocol-spec/model (runs 25 on); the Soft-RoCE tests show it on a device.
#include <catch2/catch.hpp>

#include <atomic>
#include <thread>

#include <fcntl.h>
#include <unistd.h>

#include "../fabric/loopback.hpp"
#include "rdmaring/idle_strategy.hpp"
#include "rdmaring/ring_owner.hpp"
#include "rdmaring/waiter.hpp"

using namespace rdmaring;
using rdmaring::test::LoopbackFabric;

namespace {

const std::vector<std::byte> kPayload(100, std::byte{7});

std::size_t doorbells_in(const PostBatch& b) {
  std::size_t n = 0;
  for (const WorkRequest& wr : b.requests())
    if (wr.kind == WorkRequest::Kind::write_with_imm && wr.length == 0) ++n;
  return n;
}

// The owner takes what arrived (immediates, doorbells, tail records), delivers and releases it,
// and posts the credit due; the producer reads its credit MR.
void owner_round(LoopbackFabric& f) {
  f.deliver_publishes();
  f.deliver(SIZE_MAX, [](const Delivery&) {});
  f.return_credit();
}

// Mode tail: one round trip clears the flag a new epoch starts with; from here no write sets it.
void clear_doorbell_flag(LoopbackFabric& f) {
  if (f.mode() != wire::PublishMode::tail) return;
  REQUIRE(f.producer->send(kPayload, Clock::now()));
  f.flush();
  owner_round(f);
}

}  // namespace

TEST_CASE("tail mode: a new epoch's publishes ring until the owner clears the flag", "[core][wakeup]") {
  LoopbackFabric f(wire::PublishMode::tail, 1 << 16, 1024);
  // Nothing heard from the consumer in this epoch: it may be asleep.
  CHECK(f.producer->doorbell());
  REQUIRE(f.producer->send(kPayload, Clock::now()));
  auto batch = f.producer->take_batch();
  REQUIRE(batch);
  REQUIRE(batch->count == 3);  // payload, tail, doorbell: in that order on one QP
  CHECK(batch->wrs[1].kind == WorkRequest::Kind::write_tail);
  CHECK(doorbells_in(*batch) == 1);
  const auto imm = wire::decode_immediate(batch->wrs[2].imm);
  CHECK(imm.epoch_low == 1);
  CHECK(!imm.credit_request);
  for (const WorkRequest& wr : batch->requests()) f.place(wr);

  // The awake owner hears the doorbell and clears the flag at once, with nothing released yet.
  f.deliver_publishes();
  CHECK(f.consumer().counters().doorbells == 1);
  f.return_credit();
  CHECK(f.consumer().counters().doorbell_flag_writes == 1);
  CHECK(!f.producer->doorbell());

  // While the owner spins, publishes carry no doorbell.
  REQUIRE(f.producer->send(kPayload, Clock::now()));
  batch = f.producer->take_batch();
  REQUIRE(batch);
  CHECK(doorbells_in(*batch) == 0);
  CHECK(f.producer->counters().doorbells == 1);
}

TEST_CASE("tail mode: the owner's sleep flag is confirmed only by its write's completion", "[core][wakeup]") {
  LoopbackFabric f(wire::PublishMode::tail, 1 << 16, 1024);
  REQUIRE(f.producer->send(kPayload, Clock::now()));
  f.flush();
  owner_round(f);  // the first doorbell clears the flag
  REQUIRE(!f.producer->doorbell());

  OwnerCore& core = f.owner().core();
  core.prepare_sleep();
  CHECK(!f.consumer().doorbell_confirmed());
  // The flag write is signaled: the owner may sleep now, its completion wakes it for the re-check.
  f.owner().post_credits();
  CHECK(!f.consumer().doorbell_confirmed());
  f.producer->on_credit(std::span<const std::byte, wire::kCreditRecordSize>(f.credit_mr()));
  CHECK(f.producer->doorbell());
  // With an immediate: a producer asleep with publishes in flight wakes to look at the flag.
  CHECK(f.stats().credit_notifications == 1);
  f.owner().poll();  // the write's completion
  CHECK(f.consumer().doorbell_confirmed());

  // The next publish rings: a sleeping owner wakes on the doorbell and finds the tail.
  REQUIRE(f.producer->send(kPayload, Clock::now()));
  f.flush();
  CHECK(f.immediates_queued() == 1);
  std::size_t got = 0;
  f.deliver_publishes();
  f.deliver(SIZE_MAX, [&](const Delivery&) { ++got; });
  CHECK(got == 1);
}

TEST_CASE("tail mode: the flag is confirmed by its own write's completion, never by one of a write before it",
          "[core][wakeup]") {
  // wakeup.md §3.1. An RC send queue completes in order: the completion of a write posted just
  // before the flag write says nothing of the flag, which may still be on the wire. Taken for
  // the flag's own, the owner's last look would come before the flag lands in the producer's
  // memory. Credit writes (a 64th of the ring released each, none read by the producer) go out
  // before and after the flag write, one in `interval` signaled: the signaled ones take every
  // position around it.
  bool signaled_just_before = false;
  for (std::uint32_t interval = 1; interval <= 4; ++interval) {
    for (int before = 1; before <= 5; ++before) {
      for (int after = 0; after <= 4; ++after) {
        INFO("one credit write in " << interval << " signaled, " << before << " before the flag write, " << after
                                    << " after");
        ConsumerConfig cc;
        cc.credit_fraction = 64;
        cc.signal_interval = interval;
        LoopbackFabric f(wire::PublishMode::tail, 4096, 1024, {}, cc);
        clear_doorbell_flag(f);
        f.owner().poll();
        const auto credit_write = [&f] {
          const auto writes = f.consumer().counters().credit_writes;
          REQUIRE(f.producer->send(kPayload, Clock::now()));
          f.flush();
          REQUIRE(f.take_publishes(0));  // the tail MR only: the completions wait in the CQ
          f.deliver(SIZE_MAX, [](const Delivery&) {});
          REQUIRE(f.consumer().counters().credit_writes == writes + 1);
        };
        for (int i = 0; i < before; ++i) credit_write();
        const auto& cq = f.owner().completions();
        f.owner().core().prepare_sleep();
        f.owner().post_credits();
        REQUIRE(f.consumer().counters().doorbell_flag_writes == 2);  // the first clear, then this
        REQUIRE(!cq.empty());
        const std::uint64_t flag_wr = cq.back().wr_id;  // signaled, whatever the interval
        for (int i = 0; i < after; ++i) credit_write();
        signaled_just_before |=
            std::any_of(cq.begin(), cq.end(), [&](const auto& c) { return c.wr_id + 1 == flag_wr; });
        while (!cq.empty()) {
          const std::uint64_t wr = cq.front().wr_id;
          f.owner().poll(1);
          CHECK(f.consumer().doorbell_confirmed() == (wr >= flag_wr));
        }
        CHECK(f.consumer().doorbell_confirmed());
      }
    }
  }
  CHECK(signaled_just_before);
}

TEST_CASE("tail mode: a flag that lands after a publish it did not see makes the producer ring again",
          "[core][wakeup]") {
  LoopbackFabric f(wire::PublishMode::tail, 1 << 16, 1024);
  REQUIRE(f.producer->send(kPayload, Clock::now()));
  f.flush();
  owner_round(f);
  REQUIRE(!f.producer->doorbell());

  // The owner decides to sleep and writes the flag; before it lands the producer publishes
  // (without a doorbell: the flag it reads is still clear) ...
  f.owner().core().prepare_sleep();
  REQUIRE(f.producer->send(kPayload, Clock::now()));
  auto batch = f.producer->take_batch();
  REQUIRE(batch);
  CHECK(doorbells_in(*batch) == 0);
  // ... and its publish is still on the wire when the flag lands, carrying a `released` below
  // what the producer published. The producer owes a doorbell and sends it with nothing new.
  f.owner().post_credits();
  f.producer->on_credit(std::span<const std::byte, wire::kCreditRecordSize>(f.credit_mr()));
  CHECK(f.producer->publish_pending());
  auto repair = f.producer->take_batch();
  REQUIRE(repair);
  REQUIRE(repair->count == 2);  // the same tail again, then the doorbell
  CHECK(repair->wrs[0].kind == WorkRequest::Kind::write_tail);
  CHECK(doorbells_in(*repair) == 1);
  CHECK(!f.producer->take_batch());  // once
  for (const WorkRequest& wr : batch->requests()) f.place(wr);
  for (const WorkRequest& wr : repair->requests()) f.place(wr);
  std::size_t got = 0;
  f.deliver_publishes();
  f.deliver(SIZE_MAX, [&](const Delivery&) { ++got; });
  CHECK(got == 1);
}

TEST_CASE("tail mode: a doorbell taken at the sleep's re-check keeps the owner up, and its next try sets the flag",
          "[core][wakeup]") {
  // Found on the device (a producer short of credit slept out its 60 s): a doorbell whose tail
  // the owner had already read lands between its first look and its re-check. Taken there, it
  // clears the flag (O2) with nothing new to read; had the owner slept, the producer would have
  // published on without ringing, to a sleeper.
  LoopbackFabric f(wire::PublishMode::tail, 1 << 16, 1024);
  REQUIRE(f.producer->send(kPayload, Clock::now()));
  auto batch = f.producer->take_batch();
  REQUIRE(batch);
  REQUIRE(doorbells_in(*batch) == 1);  // a new epoch rings (P1)
  for (const WorkRequest& wr : batch->requests())
    if (wr.kind != WorkRequest::Kind::write_with_imm) f.place(wr);
  owner_round(f);  // the owner reads the tail and delivers; the doorbell is still on the wire
  // The sleep procedure: nothing to take; the flag, set since the epoch began, stays as it is.
  f.deliver_publishes();
  f.owner().core().prepare_sleep();
  f.owner().post_credits();
  CHECK_FALSE(f.owner().core().doorbell_since_prepare());
  for (const WorkRequest& wr : batch->requests())
    if (wr.kind == WorkRequest::Kind::write_with_imm) f.place(wr);
  f.deliver_publishes();  // the re-check takes the doorbell ...
  f.owner().post_credits();  // ... and writes the clear, as OwnerDataPlane's re-check does
  CHECK(f.owner().core().doorbell_since_prepare());  // so the owner does not sleep
  f.producer->on_credit(std::span<const std::byte, wire::kCreditRecordSize>(f.credit_mr()));
  REQUIRE_FALSE(f.producer->doorbell());
  // The producer publishes without a doorbell; the owner's next try sets the flag again, over
  // `released` below that publish: the producer owes the doorbell that wakes the sleeper.
  REQUIRE(f.producer->send(kPayload, Clock::now()));
  auto silent = f.producer->take_batch();
  REQUIRE(silent);
  CHECK(doorbells_in(*silent) == 0);
  f.owner().core().prepare_sleep();
  CHECK_FALSE(f.owner().core().doorbell_since_prepare());
  f.owner().post_credits();
  f.producer->on_credit(std::span<const std::byte, wire::kCreditRecordSize>(f.credit_mr()));
  CHECK(f.producer->doorbell());
  auto repair = f.producer->take_batch();
  REQUIRE(repair);
  CHECK(doorbells_in(*repair) == 1);
}

// ---- parking a quiet session (wakeup.md §3.2) ------------------------------------------------

namespace {

constexpr std::uint32_t kParkReads = 3;

// Quiet reads until the session is asked for doorbells, and the flag write posted.
void start_parking(LoopbackFabric& f) {
  const auto writes = f.consumer().counters().doorbell_flag_writes;
  for (std::uint32_t i = 0; i < kParkReads; ++i) f.owner().read_tails();
  REQUIRE(f.owner().core().tail_watched(f.session()));
  f.owner().post_credits();
  REQUIRE(f.consumer().counters().doorbell_flag_writes == writes + 1);
}

void take_credit_record(LoopbackFabric& f) {
  f.producer->on_credit(std::span<const std::byte, wire::kCreditRecordSize>(f.credit_mr()));
}

}  // namespace

TEST_CASE("tail mode: a quiet session is parked once its flag is confirmed, and its next publish rings",
          "[core][wakeup][park]") {
  LoopbackFabric f(wire::PublishMode::tail, 1 << 16, 1024, {}, {}, false, kParkReads);
  clear_doorbell_flag(f);
  const OwnerCore& core = f.owner().core();
  start_parking(f);
  f.owner().read_tails();  // the flag write has not completed: the tail is still read
  CHECK(core.tail_watched(f.session()));
  f.owner().poll();        // its completion
  f.owner().read_tails();  // the read after it, and nothing moved: parked
  CHECK_FALSE(core.tail_watched(f.session()));
  CHECK(core.counters().parks == 1);
  const auto reads = core.counters().tail_reads;
  for (int i = 0; i < 10; ++i) f.owner().read_tails();
  CHECK(core.counters().tail_reads == reads);

  take_credit_record(f);
  CHECK(f.producer->doorbell());
  REQUIRE(f.producer->send(kPayload, Clock::now()));
  f.flush();
  CHECK(f.immediates_queued() == 1);
  f.owner().poll();  // the doorbell: read again, and the flag cleared (O2)
  CHECK(core.tail_watched(f.session()));
  std::size_t got = 0;
  f.owner().read_tails();
  f.deliver(SIZE_MAX, [&](const Delivery&) { ++got; });
  CHECK(got == 1);
  take_credit_record(f);
  CHECK_FALSE(f.producer->doorbell());
}

TEST_CASE("tail mode: a publish racing the park's flag is found by the read after the flag's completion, or repaired",
          "[core][wakeup][park]") {
  // The publish is posted before the producer takes the flag (so it carries no doorbell), and
  // placed: before the flag write completes, between its completion and the owner's read after
  // it, or after that read (then the owner has parked, and only the repair's doorbell brings it).
  for (int placed = 0; placed < 3; ++placed) {
    INFO("placed " << (placed == 0 ? "before the flag's completion" : placed == 1 ? "before the read after it" : "after that read"));
    LoopbackFabric f(wire::PublishMode::tail, 1 << 16, 1024, {}, {}, false, kParkReads);
    clear_doorbell_flag(f);
    const OwnerCore& core = f.owner().core();
    start_parking(f);
    REQUIRE(f.producer->send(kPayload, Clock::now()));
    auto batch = f.producer->take_batch();
    REQUIRE(batch);
    REQUIRE(doorbells_in(*batch) == 0);
    const auto place = [&] {
      for (const WorkRequest& wr : batch->requests()) f.place(wr);
    };
    if (placed == 0) place();
    f.owner().poll();
    if (placed == 1) place();
    f.owner().read_tails();
    CHECK(core.tail_watched(f.session()) == (placed < 2));
    if (placed == 2) place();
    std::size_t got = 0;
    for (int i = 0; i < 5; ++i) {
      f.owner().read_tails();
      f.deliver(SIZE_MAX, [&](const Delivery&) { ++got; });
    }
    CHECK(got == (placed < 2 ? 1u : 0u));
    // The flag reaches the producer over `released` below what it published: it owes a doorbell.
    take_credit_record(f);
    auto repair = f.producer->take_batch();
    REQUIRE(repair);
    CHECK(doorbells_in(*repair) == 1);
    for (const WorkRequest& wr : repair->requests()) f.place(wr);
    f.owner().poll();
    f.owner().read_tails();
    f.deliver(SIZE_MAX, [&](const Delivery&) { ++got; });
    CHECK(got == 1);
    CHECK(core.tail_watched(f.session()));
  }
}

TEST_CASE("tail mode: a session holding records, or with unread ones, is not parked", "[core][wakeup][park]") {
  LoopbackFabric f(wire::PublishMode::tail, 1 << 16, 1024, {}, {}, false, kParkReads);
  clear_doorbell_flag(f);
  REQUIRE(f.producer->send(kPayload, Clock::now()));
  f.flush();
  f.deliver_publishes();
  // Unread: read and quiet many times, never asked for doorbells.
  for (int i = 0; i < 10; ++i) f.owner().read_tails();
  f.owner().post_credits();
  CHECK(f.consumer().counters().doorbell_flag_writes == 1);
  // Taken and held by the application: its flag record's `released` would be below what the
  // producer published, and the producer would ring at once.
  auto held = f.next(Clock::now());
  REQUIRE(held);
  REQUIRE(held.value());
  for (int i = 0; i < 10; ++i) f.owner().read_tails();
  f.owner().post_credits();
  CHECK(f.consumer().counters().doorbell_flag_writes == 1);
  const TakenRecord taken = *held.value();
  f.finish(std::span(&taken, 1), 1);
  for (std::uint32_t i = 0; i < kParkReads; ++i) f.owner().read_tails();
  f.owner().post_credits();
  CHECK(f.consumer().counters().doorbell_flag_writes == 2);
}

TEST_CASE("tail mode: a parked session is read again after a resume and after its link breaks", "[core][wakeup][park]") {
  LoopbackFabric f(wire::PublishMode::tail, 1 << 16, 1024, {}, {}, false, kParkReads);
  clear_doorbell_flag(f);
  const OwnerCore& core = f.owner().core();
  const auto park = [&] {
    start_parking(f);
    f.owner().poll();
    f.owner().read_tails();
    REQUIRE_FALSE(core.tail_watched(f.session()));
  };
  park();
  // A publish whose doorbell the break lost: its tail record landed, the doorbell did not.
  take_credit_record(f);
  REQUIRE(f.producer->send(kPayload, Clock::now()));
  auto batch = f.producer->take_batch();
  REQUIRE(batch);
  for (const WorkRequest& wr : batch->requests())
    if (wr.kind != WorkRequest::Kind::write_with_imm) f.place(wr);
  f.drop();
  CHECK(core.tail_watched(f.session()));
  std::size_t got = 0;
  f.owner().read_tails();
  f.deliver(SIZE_MAX, [&](const Delivery&) { ++got; });
  CHECK(got == 1);
  REQUIRE(f.resume());
  clear_doorbell_flag(f);
  park();
  REQUIRE(f.resume());
  CHECK(core.tail_watched(f.session()));
}

TEST_CASE("tail mode: a flag over everything published asks for no doorbell", "[core][wakeup]") {
  LoopbackFabric f(wire::PublishMode::tail, 1 << 16, 1024);
  REQUIRE(f.producer->send(kPayload, Clock::now()));
  f.flush();
  owner_round(f);
  f.owner().core().prepare_sleep();
  f.owner().post_credits();
  f.producer->on_credit(std::span<const std::byte, wire::kCreditRecordSize>(f.credit_mr()));
  CHECK(f.producer->doorbell());
  CHECK(!f.producer->publish_pending());
}

TEST_CASE("tail mode: a doorbell with wrong epoch bits closes its session", "[core][wakeup]") {
  LoopbackFabric f(wire::PublishMode::tail, 1 << 16, 1024);
  f.inject_immediate(wire::encode(wire::Immediate{0, false, 2}));
  const auto r = f.take_publishes();
  REQUIRE(!r);
  CHECK(r.error() == errc::protocol_violation);
  CHECK_THAT(r.error().message(), Catch::Contains("doorbell with epoch bits 2"));
}

TEST_CASE("imm mode: no flag, no doorbell: every publish is an immediate already", "[core][wakeup]") {
  LoopbackFabric f(wire::PublishMode::imm, 1 << 16, 1024);
  CHECK(!f.producer->doorbell());
  REQUIRE(f.producer->send(kPayload, Clock::now()));
  f.flush();
  owner_round(f);
  f.owner().core().prepare_sleep();
  f.owner().post_credits();
  CHECK(f.consumer().counters().doorbell_flag_writes == 0);
  CHECK(f.consumer().doorbell_confirmed());
  REQUIRE(f.producer->send(kPayload, Clock::now()));
  auto batch = f.producer->take_batch();
  REQUIRE(batch);
  CHECK(batch->count == 1);
  CHECK(batch->wrs[0].kind == WorkRequest::Kind::write_with_imm);
  CHECK(f.producer->counters().doorbells == 0);
}

TEST_CASE("the idle strategy spins, yields, then sleeps for doubling periods, and work starts it over", "[wakeup]") {
  using namespace std::chrono_literals;
  IdleStrategy idle(IdlePolicy{2, 1, 10us, 35us});
  using S = IdleStrategy::Step;
  CHECK(idle.next(0) == S::spin);
  CHECK(idle.next(0) == S::spin);
  CHECK(idle.next(0) == S::yield);
  CHECK(idle.next(0) == S::sleep);
  CHECK(idle.sleep_period() == 10us);
  CHECK(idle.next(0) == S::sleep);
  CHECK(idle.sleep_period() == 20us);
  CHECK(idle.next(0) == S::sleep);
  CHECK(idle.sleep_period() == 35us);
  CHECK(idle.next(0) == S::sleep);
  CHECK(idle.sleep_period() == 35us);
  CHECK(idle.next(3) == S::spin);
  CHECK(idle.next(0) == S::spin);
  CHECK(idle.sleep_period() == 10us);
}

TEST_CASE("a credit record that answers a request comes with an immediate, lazy credit does not", "[core][wakeup]") {
  for (const auto mode : {wire::PublishMode::imm, wire::PublishMode::tail}) {
    INFO((mode == wire::PublishMode::imm ? "imm" : "tail"));
    LoopbackFabric f(mode, 4096, 1024);
    clear_doorbell_flag(f);
    const auto notified = f.stats().credit_notifications;
    // A quarter of the ring released with nobody asking: a plain WRITE.
    for (int i = 0; i < 10; ++i) REQUIRE(f.producer->send(kPayload, Clock::now()));
    f.flush();
    owner_round(f);
    CHECK(f.consumer().counters().credit_writes >= 1);
    CHECK(f.stats().credit_notifications == notified);
    // The producer runs out of room and asks: the answer is an RDMA_WRITE_WITH_IMM.
    while (f.producer->send(kPayload, Clock::now())) {
    }
    f.flush();
    owner_round(f);
    CHECK(f.producer->counters().credit_requests >= 1);
    CHECK(f.stats().credit_notifications == notified + 1);
  }
}

TEST_CASE("a credit request that crosses lazy credit carrying its room is answered with an immediate all the same",
          "[core][wakeup]") {
  // protocol-spec/model run 43/44: the owner releases everything and writes it back plainly; the
  // producer, which has not read that record yet, asks for credit and may arm and sleep before
  // the record lands. Nothing more will be released, so "the first record that moves released"
  // never comes: the owner writes the same record again, notifying.
  for (const auto mode : {wire::PublishMode::imm, wire::PublishMode::tail}) {
    INFO((mode == wire::PublishMode::imm ? "imm" : "tail"));
    LoopbackFabric f(mode, 4096, 1024);
    clear_doorbell_flag(f);
    const auto free = [&] {
      const auto l = f.producer->ledger();
      return l.released + 4096 - l.committed;
    };
    while (free() >= wire::record_span(kPayload.size())) REQUIRE(f.producer->send(kPayload, Clock::now()));
    f.flush();
    CHECK(f.producer->counters().credit_requests == 0);
    const auto notified = f.stats().credit_notifications;
    f.deliver_publishes();
    f.deliver(1000, [](const Delivery&) {});  // all released; the credit goes out plain, unread
    CHECK(f.stats().credit_notifications == notified);
    const auto writes = f.consumer().counters().credit_writes;
    REQUIRE_FALSE(f.producer->send(kPayload, Clock::now()));  // refused: it asks
    f.flush();
    f.deliver_publishes();
    f.return_credit();
    CHECK(f.consumer().counters().credit_writes == writes + 1);
    CHECK(f.stats().credit_notifications == notified + 1);
    CHECK(f.producer->send(kPayload, Clock::now()));
    // Once notified, a later request with nothing new waits for room, as before.
    while (f.producer->send(kPayload, Clock::now())) {
    }
    f.flush();
    f.deliver_publishes();
    f.return_credit();
    CHECK(f.stats().credit_notifications == notified + 1);
  }
}

TEST_CASE("a record that only clears the flag leaves the producer's credit request pending", "[core][wakeup]") {
  LoopbackFabric f(wire::PublishMode::tail, 4096, 1024);
  while (f.producer->send(kPayload, Clock::now())) {
  }
  f.flush();               // payload, the tail with the request, the doorbell of a new epoch
  f.deliver_publishes();   // the owner hears both, and has released nothing yet
  f.return_credit();       // the flag is cleared; that is no answer
  CHECK(!f.producer->doorbell());
  CHECK(f.stats().credit_notifications == 0);
  CHECK(f.producer->ledger().released == 0);
  f.deliver(1, [](const Delivery&) {});
  f.return_credit();       // space: now the request is answered, with an immediate
  CHECK(f.stats().credit_notifications == 1);
  CHECK(f.producer->ledger().released > 0);
}

TEST_CASE("bad input: a send queue too shallow for a batch beside unsignaled WRs, a receive queue too small for doorbells",
          "[core][wakeup]") {
  // A batch of 4 WRs (two payload segments, the tail, the doorbell) must fit beside the up to
  // interval - 1 unsignaled WRs that no completion will retire: depth 4 with interval 2 wedges.
  ProducerConfig pc;
  pc.sq_depth = 4;
  pc.signal_interval = 2;
  const auto shallow = pc.validate();
  REQUIRE(!shallow);
  CHECK(shallow.error() == errc::bad_config);
  CHECK_THAT(shallow.error().message(), Catch::Contains("at least the interval + 3"));
  pc.sq_depth = 5;
  CHECK(pc.validate());

  // Mode tail takes receives too now: doorbells.
  RingOwnerOptions o;
  o.address = "169.254.0.1";
  o.mode = wire::PublishMode::tail;
  o.recv_depth = 16;
  const auto few = o.validate();
  REQUIRE(!few);
  CHECK(few.error() == errc::bad_config);
  CHECK_THAT(few.error().message(), Catch::Contains("recv_depth 16 below 32"));
}

TEST_CASE("a waiter wakes for a descriptor only while it watches it, and for wake() until taken back", "[wakeup]") {
  using namespace std::chrono_literals;
  int fds[2];
  REQUIRE(pipe2(fds, O_CLOEXEC | O_NONBLOCK) == 0);
  const Waiter w;
  CHECK_FALSE(w.wait(0ms).value());
  {
    const Watched watched(w, fds[0]);
    CHECK_FALSE(w.wait(0ms).value());
    REQUIRE(write(fds[1], "x", 1) == 1);
    CHECK(w.wait(10s).value());
    CHECK(w.wait(0ms).value());  // level-triggered: until the byte is read
  }
  CHECK_FALSE(w.wait(0ms).value());  // still readable, no longer watched
  w.wake();
  w.wake();
  CHECK(w.wait(0ms).value());
  CHECK(w.take_wake());
  CHECK_FALSE(w.take_wake());
  CHECK_FALSE(w.wait(0ms).value());
  // Bad input: the errno and the call, as data-path errors.
  const auto bad = w.watch(-1);
  REQUIRE_FALSE(bad);
  CHECK(bad.error() == errc::system_failure);
  CHECK_THAT(bad.error().message(), Catch::Contains("epoll_ctl"));
  CHECK_THROWS_AS(Watched(w, -1), SetupError);
  close(fds[0]);
  close(fds[1]);
}

TEST_CASE("a wake() from another thread is never lost, and once taken leaves fd() quiet", "[wakeup]") {
  using namespace std::chrono_literals;
  // The sleeper's loop of an owner's arm(): take the wakes, else sleep. However a wake()'s write
  // and flag interleave with take_wake(), the loop ends (no wake lost: the last one ends a sleep
  // or is taken) and, once everything is taken, fd() is not readable (a sleeper would spin).
  for (int round = 0; round < 3000; ++round) {
    const Waiter w;
    std::atomic<bool> done{false};
    std::thread waker([&] {
      for (int i = 0; i < 50; ++i) w.wake();
      done.store(true);
    });
    std::uint64_t taken = 0;
    while (!done.load()) taken += w.take_wake() ? 1 : 0;
    waker.join();
    taken += w.take_wake() ? 1 : 0;
    REQUIRE(taken > 0);
    REQUIRE_FALSE(w.wait(0ms).value());
    REQUIRE_FALSE(w.take_wake());
  }
}

TEST_CASE("a waiter wakes at the time set by wake_at, and not once it is replaced or unset", "[wakeup]") {
  using namespace std::chrono_literals;
  const Waiter w;
  const auto now = std::chrono::steady_clock::now();
  REQUIRE(w.wake_at(now + 50ms));
  CHECK_FALSE(w.wait(0ms).value());
  CHECK(w.wait(10s).value());
  CHECK(std::chrono::steady_clock::now() >= now + 50ms);
  CHECK(w.wait(0ms).value());  // level-triggered: until replaced
  REQUIRE(w.wake_at(std::nullopt));
  CHECK_FALSE(w.wait(0ms).value());
  REQUIRE(w.wake_at(now - 1s));  // a time past: readable at once
  CHECK(w.wait(0ms).value());
  REQUIRE(w.wake_at(std::chrono::steady_clock::now() + 1h));
  CHECK_FALSE(w.wait(0ms).value());
  CHECK_FALSE(w.take_wake());  // the timer is not a wake(): an owner's arm() still sleeps after it
}
