#include <catch2/catch.hpp>

#include <cstring>
#include <random>

#include "../fabric/loopback.hpp"
#include "rdmaring/checksum.hpp"
#include "rdmaring/record_reader.hpp"

using namespace rdmaring;
using rdmaring::test::LoopbackFabric;

namespace {

// The payload of record `seq`: its length and bytes are a function of the sequence, so the
// receiving side can verify every byte without a side channel.
std::vector<std::byte> payload_for(std::uint64_t seq, std::uint32_t max) {
  std::mt19937_64 rng(seq * 0x9e3779b97f4a7c15ull + 1);
  std::vector<std::byte> p(rng() % (max + 1));
  for (auto& b : p) b = static_cast<std::byte>(rng());
  return p;
}

// Drains the consumer, checking order and content; returns records seen.
std::uint64_t drain(LoopbackFabric& f, std::uint64_t& expect, std::uint32_t max) {
  std::uint64_t n = 0;
  f.deliver_publishes();
  for (;;) {
    const std::size_t got = f.deliver(SIZE_MAX, [&](const Delivery& rec) {
      REQUIRE(rec.sequence == expect);
      const auto want = payload_for(expect, max);
      REQUIRE(rec.payload.size() == want.size());
      REQUIRE(std::equal(want.begin(), want.end(), rec.payload.begin()));
      ++expect;
    });
    REQUIRE(f.alive());
    if (got == 0) break;
    n += got;
  }
  f.return_credit();
  return n;
}

// The application handles a record it took (finish_deliveries): it is released.
void release(LoopbackFabric& f, const TakenRecord& t) { f.finish(std::span(&t, 1), 1); }

void stream(wire::PublishMode mode, std::uint64_t ring, std::uint32_t max, std::uint64_t count) {
  LoopbackFabric f(mode, ring, max);
  std::uint64_t sent = 0, expect = 0;
  while (expect < count) {
    while (sent < count) {
      const auto p = payload_for(sent, max);
      auto r = f.producer->send(p, Clock::now());
      if (!r) {
        REQUIRE(r.error() == errc::would_block);
        break;
      }
      ++sent;
      if (sent % 7 == 0) f.flush();
    }
    f.flush();
    drain(f, expect, max);
    const auto pl = f.producer->ledger();
    REQUIRE(pl.released <= pl.published);
    REQUIRE(pl.published <= pl.committed);
    REQUIRE(pl.committed - pl.released <= ring);
  }
  CHECK(f.consumer().counters().records == count);
  CHECK(f.producer->counters().records == count);
  CHECK(f.producer->counters().would_block > 0);  // the ring was full at times
  CHECK(f.producer->counters().padding_records > 0);  // and wrapped
}

// Sends one record, flips one bit of the ring at `at` after it is placed, publishes it and
// reads: what the consumer makes of a record damaged in place.
Result<std::optional<TakenRecord>> next_after_flip(LoopbackFabric& f, std::size_t at) {
  REQUIRE(f.producer->send(payload_for(1, 100), Clock::now()));
  f.flush();
  f.ring()[at] ^= std::byte{1};
  f.deliver_publishes();
  return f.next(Clock::now());
}

}  // namespace

TEST_CASE("records stream in order through a wrapping ring, imm mode", "[core]") {
  stream(wire::PublishMode::imm, 4096, 1000, 20000);
}

TEST_CASE("records stream in order through a wrapping ring, tail mode", "[core]") {
  stream(wire::PublishMode::tail, 8192, 3000, 20000);
}

TEST_CASE("a record as large as the ring goes through behind padding", "[core]") {
  LoopbackFabric f(wire::PublishMode::imm, 4096, 4096 - wire::kRecordHeaderSize);
  std::vector<std::byte> small(10, std::byte{1}), huge(4096 - wire::kRecordHeaderSize, std::byte{2});
  REQUIRE(f.producer->send(small, Clock::now()));
  f.flush();
  f.deliver_publishes();
  auto r = f.next(Clock::now());
  REQUIRE(r.value());
  release(f, *r.value());
  // The huge record needs the whole ring: first padding goes out, then it waits for credit.
  auto first = f.producer->send(huge, Clock::now());
  REQUIRE_FALSE(first);
  CHECK(first.error() == errc::would_block);
  f.flush();
  f.deliver_publishes();
  REQUIRE_FALSE(f.next(Clock::now()).value());  // padding skipped, nothing delivered
  f.return_credit();
  REQUIRE(f.producer->send(huge, Clock::now()));
  f.flush();
  f.deliver_publishes();
  auto h = f.next(Clock::now());
  REQUIRE(h.value());
  CHECK(h.value()->delivery.payload.size() == huge.size());
  CHECK(h.value()->delivery.sequence == 1);
}

TEST_CASE("a starved producer asks for credit and gets it below the lazy threshold", "[core]") {
  LoopbackFabric f(wire::PublishMode::tail, 1 << 16, 8000);
  std::vector<std::byte> p(8000, std::byte{3});
  int sent = 0;
  while (f.producer->send(p, Clock::now())) ++sent;
  f.flush();
  f.deliver_publishes();
  // Release one record only: far below a quarter ring, so no credit unless asked.
  auto r = f.next(Clock::now());
  release(f, *r.value());
  CHECK(f.consumer().counters().credit_requests == 1);
  f.return_credit();
  CHECK(f.consumer().counters().credit_writes == 1);
  CHECK(f.producer->send(p, Clock::now()));
  CHECK(sent == 8);  // 65536 / 8064
}

TEST_CASE("claim and commit build a record in place, shrinking allowed", "[core]") {
  LoopbackFabric f(wire::PublishMode::imm, 4096, 1024);
  auto span = f.producer->claim(100, Clock::now());
  REQUIRE(span);
  std::fill(span.value().begin(), span.value().end(), std::byte{0x5a});
  CHECK(f.producer->claim(1, Clock::now()).error() == errc::claim_open);
  const std::vector<std::byte> other(8, std::byte{0x11});
  CHECK(f.producer->send(other, Clock::now()).error() == errc::claim_open);  // nothing lands in the claimed place
  CHECK(f.producer->commit(101).error() == errc::record_too_large);
  REQUIRE(f.producer->commit(60));
  CHECK(f.producer->commit().error() == errc::no_claim);
  f.flush();
  f.deliver_publishes();
  auto r = f.next(Clock::now());
  REQUIRE(r.value());
  CHECK(r.value()->delivery.payload.size() == 60);
  CHECK(r.value()->delivery.payload[59] == std::byte{0x5a});
}

TEST_CASE("a record larger than the maximum is refused at the call", "[core]") {
  LoopbackFabric f(wire::PublishMode::imm, 4096, 1024);
  std::vector<std::byte> p(1025);
  auto r = f.producer->send(p, Clock::now());
  REQUIRE_FALSE(r);
  CHECK(r.error() == errc::record_too_large);
  CHECK_THAT(r.error().message(), Catch::Contains("1025 B") && Catch::Contains("max_record 1024 B"));
}

TEST_CASE("coalescing: many records, one write and one publish", "[core]") {
  LoopbackFabric f(wire::PublishMode::imm, 1 << 16, 64);
  std::vector<std::byte> p(40);
  const auto t0 = Clock::now();
  for (int i = 0; i < 100; ++i) REQUIRE(f.producer->send(p, t0));
  CHECK_FALSE(f.producer->flush_due(t0));
  CHECK(f.producer->flush_due(t0 + std::chrono::milliseconds(1)));
  auto batch = f.producer->take_batch();
  REQUIRE(batch);
  CHECK(batch->count == 1);
  CHECK(batch->wrs[0].kind == WorkRequest::Kind::write_with_imm);
  CHECK(batch->wrs[0].length == 100 * wire::record_span(p.size()));
}

TEST_CASE("the producer wants the time at a batch's 1st, 2nd, 4th, 8th ... record, and a trickle is published "
          "within twice its delay", "[core]") {
  ProducerConfig pc;
  pc.coalesce.delay = std::chrono::microseconds(50);
  for (const auto gap : {std::chrono::microseconds(1), std::chrono::microseconds(7), std::chrono::microseconds(30)}) {
    INFO("a record every " << gap.count() << " us");
    LoopbackFabric f(wire::PublishMode::imm, 1 << 16, 64, pc);
    const std::vector<std::byte> p(40);
    const auto t0 = Clock::now();
    std::vector<std::uint32_t> asked;  // the records of the batch at which the time was wanted
    for (std::uint32_t n = 1;; ++n) {
      const auto at = t0 + n * gap;
      // What Producer::send passes: the time where it is wanted, "no time" elsewhere.
      const bool wanted = f.producer->clock_due();
      if (wanted) asked.push_back(n);
      REQUIRE(f.producer->send(p, wanted ? at : Clock::time_point{}));
      if (!f.producer->flush_due(wanted ? at : Clock::time_point{})) continue;
      // Published no later than twice the delay after the first record, and not before the delay.
      CHECK(at - (t0 + gap) >= pc.coalesce.delay);
      CHECK(at - (t0 + gap) <= 2 * pc.coalesce.delay + gap);
      break;
    }
    for (std::size_t i = 0; i < asked.size(); ++i) CHECK(asked[i] == 1u << i);
  }
  // A zero delay publishes every record: the time is wanted each time.
  pc.coalesce.delay = Clock::duration::zero();
  LoopbackFabric f(wire::PublishMode::imm, 1 << 16, 64, pc);
  for (int i = 0; i < 5; ++i) {
    CHECK(f.producer->clock_due());
    REQUIRE(f.producer->send(std::vector<std::byte>(8), Clock::now()));
  }
}

TEST_CASE("time_for_send reads the clock exactly where the producer wants the time", "[core]") {
  ProducerConfig pc;
  pc.coalesce.delay = std::chrono::seconds(10);
  LoopbackFabric f(wire::PublishMode::imm, 1 << 16, 64, pc);
  for (int n = 1; n <= 9; ++n) {
    INFO("record " << n << " of the batch");
    const auto before = Clock::now();
    const auto t = time_for_send(*f.producer);
    if (f.producer->clock_due()) {
      CHECK(t >= before);
      CHECK(t <= Clock::now());
    } else {
      CHECK(t == Clock::time_point{});
    }
    REQUIRE(f.producer->send(std::vector<std::byte>(8), t));
  }
}

TEST_CASE("tail mode: a publish that overtakes its payload is never delivered", "[core]") {
  ConsumerConfig cc;
  cc.ordering_grace = std::chrono::milliseconds(5);
  LoopbackFabric f(wire::PublishMode::tail, 4096, 1024, {}, cc);
  std::uint64_t expect = 0;
  // Fill one lap so stale but well-formed records lie in the ring.
  for (int i = 0; i < 40; ++i) {
    REQUIRE(f.producer->send(payload_for(i, 100), Clock::now()));
    f.flush();
    drain(f, expect, 100);
  }
  f.hold(true);
  REQUIRE(f.producer->send(payload_for(40, 100), Clock::now()));
  f.flush();
  auto held = f.place_publish_first();
  REQUIRE_FALSE(held.empty());
  f.deliver_publishes();
  const auto t0 = Clock::now();
  auto r = f.next(t0);
  REQUIRE(r);
  CHECK_FALSE(r.value());  // not ready: never the stale bytes
  CHECK(f.consumer().counters().not_ready == 1);
  auto late = f.next(t0 + std::chrono::milliseconds(10));
  REQUIRE_FALSE(late);
  CHECK(late.error() == errc::protocol_violation);
  CHECK_THAT(late.error().message(), Catch::Contains("placement order violated"));
}

namespace {

// Mode tail: record 0 sent with its tail record placed and read, its payload held back (returned,
// to place later): the owner sees a publish over bytes that fail every check.
std::vector<WorkRequest> publish_before_payload(LoopbackFabric& f) {
  f.hold(true);
  REQUIRE(f.producer->send(payload_for(0, 100), Clock::now()));
  f.flush();
  auto held = f.place_publish_first();
  REQUIRE_FALSE(held.empty());
  f.deliver_publishes();
  return held;
}

}  // namespace

TEST_CASE("tail mode: a late payload within the grace is delivered", "[core]") {
  LoopbackFabric f(wire::PublishMode::tail, 4096, 1024);
  auto held = publish_before_payload(f);
  const auto t0 = Clock::now();
  CHECK_FALSE(f.next(t0).value());
  for (auto& wr : held) f.place(wr);
  // Read again at its re-read time (wakeup.md O7), not before.
  CHECK_FALSE(f.next(t0 + ConsumerCore::kRecheckMin / 2).value());
  auto r = f.next(t0 + ConsumerCore::kRecheckMin);
  REQUIRE(r.value());
  CHECK(r.value()->delivery.sequence == 0);
}

TEST_CASE("tail mode: a record failing its checks is read again at growing intervals, then refused", "[core]") {
  // A hostile tail over stale bytes must not cost a read per poll for the whole grace.
  const auto grace = GENERATE(std::chrono::milliseconds(5), std::chrono::milliseconds(1000));
  ConsumerConfig cc;
  cc.ordering_grace = grace;
  LoopbackFabric f(wire::PublishMode::tail, 4096, 1024, {}, cc);
  publish_before_payload(f);
  const auto t0 = Clock::now();
  // Polled every 10 us: a read per poll would be grace / 10 us reads.
  Clock::time_point t = t0;
  Result<std::optional<TakenRecord>> r = f.next(t);
  std::uint64_t reads = 0;  // the session closes at the refusal: counted while it lives
  while (r && !r.value()) {
    reads = f.consumer().counters().not_ready;
    const auto due = f.consumer().recheck_at();
    REQUIRE(due);
    CHECK(*due <= t0 + grace);  // never past the grace's end
    // An owner about to sleep sees no work before the re-read time and sets its timer for it.
    CHECK(f.core().next_recheck() == due);
    CHECK_FALSE(f.core().work_due(*due - std::chrono::nanoseconds(1)));
    CHECK(f.core().work_due(*due));
    t += std::chrono::microseconds(10);
    r = f.next(t);
  }
  REQUIRE_FALSE(r);
  CHECK(r.error() == errc::protocol_violation);
  CHECK(t - t0 >= grace);
  CHECK(t - t0 <= grace + std::chrono::microseconds(10));  // refused at the grace's end, not later
  INFO("reads " << reads);
  // Doubling from 20 us up to 50 ms: 9 reads for 5 ms, 30 for 1 s.
  CHECK(reads <= 12 + static_cast<std::uint64_t>(grace / ConsumerCore::kRecheckMax));
}

TEST_CASE("tail mode: a tail that moves has the failing record read again at once", "[core]") {
  LoopbackFabric f(wire::PublishMode::tail, 4096, 1024);
  auto held = publish_before_payload(f);
  const auto t0 = Clock::now();
  CHECK_FALSE(f.next(t0).value());
  CHECK(f.consumer().recheck_at());
  for (auto& wr : held) f.place(wr);
  f.hold(false);
  REQUIRE(f.producer->send(payload_for(1, 100), t0));
  f.flush();
  f.deliver_publishes();  // the second publish moves the tail: no waiting for the re-read time
  CHECK_FALSE(f.consumer().recheck_at());
  auto r = f.next(t0);
  REQUIRE(r.value());
  CHECK(r.value()->delivery.sequence == 0);
}

TEST_CASE("imm mode: a corrupt record below the mark is a protocol violation", "[core]") {
  LoopbackFabric f(wire::PublishMode::imm, 4096, 1024);
  const auto r = next_after_flip(f, wire::kRecordHeaderSize + 6);
  REQUIRE_FALSE(r);
  CHECK(r.error() == errc::protocol_violation);
}

TEST_CASE("payload check none: the check covers the header alone, the payload taken as placed", "[core]") {
  ConsumerConfig unchecked;
  unchecked.payload_check = wire::PayloadCheck::none;
  for (const auto mode : {wire::PublishMode::imm, wire::PublishMode::tail}) {
    LoopbackFabric f(mode, 4096, 1024, {}, unchecked);
    const auto p = payload_for(1, 100);
    REQUIRE(f.producer->send(p, Clock::now()));
    f.flush();
    const auto header = std::span<const std::byte>(f.ring()).first<wire::kRecordHeaderSize>();
    CHECK(wire::record_check_matches(header, {}));
    CHECK_FALSE(wire::record_check_matches(header, p));
    // What the check would have caught goes through: the trade the ring's owner chose.
    f.ring()[30] ^= std::byte{1};
    f.deliver_publishes();
    auto r = f.next(Clock::now());
    REQUIRE(r.value());
    CHECK(r.value()->delivery.payload.size() == p.size());
    CHECK(r.value()->delivery.payload[30 - wire::kRecordHeaderSize] != p[30 - wire::kRecordHeaderSize]);
  }
  // The header keeps its own check whatever the payload check.
  LoopbackFabric f(wire::PublishMode::imm, 4096, 1024, {}, unchecked);
  const auto r = next_after_flip(f, 9);
  REQUIRE_FALSE(r);
  CHECK(r.error() == errc::protocol_violation);
}

TEST_CASE("tail mode: a misaligned tail and a tail past the credit are refused by name", "[core]") {
  // Each rule has its own message: a peer debugging a refusal must learn which one it broke.
  const auto refusal = [](std::uint64_t tail) {
    LoopbackFabric f(wire::PublishMode::tail, 4096, 1024);
    std::array<std::byte, wire::kTailRecordSize> t{};
    wire::encode(wire::TailRecord{f.consumer().epoch(), tail, 0, 0}, t);
    f.core().on_tail(f.session(), t);
    f.owner().collect_closed();
    const auto r = f.alive();
    REQUIRE_FALSE(r);
    CHECK(r.error() == errc::protocol_violation);
    return r.error().message();
  };
  const auto misaligned = refusal(100);
  CHECK_THAT(misaligned, Catch::Contains("not a multiple of 16"));
  CHECK_THAT(misaligned, !Catch::Contains("credit"));
  CHECK_THAT(refusal(4096 + 64), Catch::Contains("outside the credit given"));
}

TEST_CASE("credit from another epoch is ignored and counted", "[core]") {
  // In epoch 2 with a record published: a credit of epoch 1 (the old QP's, still in the credit
  // MR) or of epoch 3 would release it, and must not.
  LoopbackFabric f(wire::PublishMode::imm, 4096, 1024);
  REQUIRE(f.resume());
  REQUIRE(f.producer->send(payload_for(0, 100), Clock::now()));
  f.flush();
  for (std::uint64_t epoch : {1, 3}) {
    std::array<std::byte, wire::kCreditRecordSize> c{};
    wire::encode(wire::CreditRecord{epoch, f.producer->ledger().published, 1, 0}, c);
    f.producer->on_credit(c);
  }
  CHECK(f.producer->counters().stale_credit == 2);
  CHECK(f.producer->ledger().released == 0);
  CHECK_FALSE(f.producer->failure());
}

TEST_CASE("record reader rejects lengths that run past the ring or the mark", "[ring]") {
  const auto g = RingGeometry::make(4096, 4000).value();
  std::vector<std::byte> ring(4096);
  const auto header = std::span(ring).subspan(2048).first<wire::kRecordHeaderSize>();
  wire::encode(wire::RecordHeader{3000, wire::RecordKind::data, 0}, {}, header);
  CHECK(read_record(ring, g, 2048, 4096).status == RecordView::Status::bad_length);
  wire::encode(wire::RecordHeader{100, wire::RecordKind::padding, 0}, {}, header);
  CHECK(read_record(ring, g, 2048, 4096).status == RecordView::Status::bad_length);
  wire::encode(wire::RecordHeader{2048 - wire::kRecordHeaderSize, wire::RecordKind::padding, 5}, {}, header);
  const auto pad = read_record(ring, g, 2048, 4096);
  CHECK(pad.status == RecordView::Status::padding);
  CHECK(pad.span == 2048);
  CHECK(read_record(ring, g, 2048, 2048 + 1024).status == RecordView::Status::bad_length);
}

TEST_CASE("record reader refuses data and padding whose check fails, wherever the bit flipped", "[ring]") {
  const auto g = RingGeometry::make(4096, 4000).value();
  std::vector<std::byte> ring(4096);
  for (std::size_t i = 0; i < ring.size(); ++i) ring[i] = static_cast<std::byte>(i * 7);
  const auto header = std::span(ring).subspan(2048).first<wire::kRecordHeaderSize>();
  const auto payload = std::span<const std::byte>(ring).subspan(2048 + wire::kRecordHeaderSize, 100);
  struct Case {
    wire::RecordKind kind;
    std::uint32_t len;
    std::size_t covered;  // bytes after the header the check covers
  };
  for (const Case c : {Case{wire::RecordKind::data, 100, 100}, Case{wire::RecordKind::padding, 2048 - 16, 0}}) {
    wire::encode(wire::RecordHeader{c.len, c.kind, 5}, payload.first(c.covered), header);
    const auto good = read_record(ring, g, 2048, 4096);
    REQUIRE(good.status == (c.kind == wire::RecordKind::data ? RecordView::Status::data : RecordView::Status::padding));
    CHECK(good.sequence == 5);
    // Bits of the sequence and of the check itself; then of what the check covers (data only).
    for (std::size_t bit = 32; bit < (wire::kRecordHeaderSize + c.covered) * 8; ++bit) {
      INFO((c.kind == wire::RecordKind::data ? "data" : "padding") << ", bit " << bit);
      ring[2048 + bit / 8] ^= std::byte{static_cast<unsigned char>(1u << (bit % 8))};
      CHECK(read_record(ring, g, 2048, 4096).status == RecordView::Status::bad_check);
      ring[2048 + bit / 8] ^= std::byte{static_cast<unsigned char>(1u << (bit % 8))};
    }
  }
}

namespace {

// ConsumerCore's own contracts, below what OwnerCore asks of it: a producer core writes into a
// plain ring, the consumer core reads it directly.
struct TwoCores {
  RingGeometry g = RingGeometry::make(4096, 1024).value();
  std::vector<std::byte> staging = std::vector<std::byte>(4096), ring = std::vector<std::byte>(4096);
  ProducerCore producer{staging, PeerRing{wire::PublishMode::imm, g, {}, wire::PayloadCheck::crc32c}, {}};
  ConsumerCore consumer;

  explicit TwoCores(std::uint64_t deliver_from = 0)
      : consumer(ring, g, wire::PublishMode::imm, ResumePoint{}, deliver_from, {}) {}

  // Records 0..n-1 sent, placed in the ring and published.
  void send(std::uint64_t n) {
    for (std::uint64_t i = 0; i < n; ++i) REQUIRE(producer.send(payload_for(i, 100), Clock::now()));
    auto batch = producer.take_batch();
    REQUIRE(batch);
    for (const WorkRequest& wr : batch->requests()) {
      std::memcpy(ring.data() + wr.remote_offset, staging.data() + wr.local_offset, wr.length);
      if (wr.kind == WorkRequest::Kind::write_with_imm) REQUIRE(consumer.on_immediate(wr.imm));
    }
  }
  DeliveredRecord next() {
    auto r = consumer.next(Clock::now());
    REQUIRE(r);
    REQUIRE(r.value());
    return *r.value();
  }
};

}  // namespace

TEST_CASE("release takes only the end of a delivered record", "[core]") {
  TwoCores c;
  c.send(3);
  std::vector<DeliveredRecord> got;
  for (int i = 0; i < 3; ++i) got.push_back(c.next());
  ConsumerCore& consumer = c.consumer;
  const std::uint64_t inside = got[0].end + wire::kRecordAlign;
  REQUIRE(inside < got[1].end);
  CHECK(consumer.release(inside).error() == errc::invalid_argument);
  CHECK(consumer.release(got[2].end + wire::kRecordAlign).error() == errc::invalid_argument);  // beyond delivery
  REQUIRE(consumer.release(got[1].end));
  CHECK(consumer.release(got[0].end).error() == errc::invalid_argument);  // already released
  REQUIRE(consumer.release(got[2].end));
}

TEST_CASE("a restored ring drops the records the application processed and delivers from its durable point", "[core]") {
  // OwnerCore::restore's deliver_from: the producer still holds records the old owner had
  // delivered; the application's durable point says which.
  TwoCores c(2);
  c.send(5);
  for (std::uint64_t seq = 2; seq < 5; ++seq) CHECK(c.next().sequence == seq);
  CHECK(c.consumer.counters().duplicates_dropped == 2);
  CHECK(c.consumer.counters().records == 3);
}
