// One session's protocol violation must close that session only. An honest producer streams small
// records, one publish each, while hand-built attackers (raw_producer.hpp) send one bad immediate
// apiece in the middle of its stream; the honest session must never be failed and every one of its
// records must arrive exactly once, in order, intact.
//
// The owner's poll thread is held while the honest stream and the attack land, as an owner busy
// in its application's handler would be: the completion queue then holds the honest producer's
// immediates on both sides of the attacker's, in the batches take_completions() polls. Closing
// the attacker's session from inside that loop must not dispatch the honest session's
// completions out of order (an older immediate after a newer one reads as a tail more than a ring
// ahead, and the honest session is failed in the attacker's place).
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <iostream>
#include <mutex>
#include <sstream>
#include <thread>

#include "device_address.hpp"
#include "owner_harness.hpp"
#include "raw_producer.hpp"
#include "rdmaring/producer.hpp"
#include "rdmaring/ring_owner.hpp"
#include "session_records.hpp"

using namespace rdmaring;
using namespace std::chrono_literals;

namespace {

constexpr std::uint32_t kPayload = 64;        // record span 128 B: 2048 records fill the ring
constexpr std::uint64_t kRingBytes = 1 << 18;  // the ring of the report
constexpr int kAttacks = 12;
// Honest records to let through while the owner is held, before and after the attack: many
// 32-completion batches after it, within the 2048 records of the ring. Past the 1024 receives of
// the shared queue the honest QP waits out RNR NAKs (it retries them for ever); the attacker's,
// which retries once, has posted before.
constexpr std::uint64_t kBefore = 64;
constexpr std::uint64_t kAfter = 1536;

// Finer than the harness's default: the tests line completions up while they wait.
template <class Pred>
bool wait_for(Pred pred, std::chrono::seconds limit) {
  return testing::wait_for(pred, limit, 1ms);
}

// Polls the owner on a thread of its own, checking every delivery against the honest stream; it
// can be held outside poll() while the test lines completions up in the queue.
class HeldPoller {
 public:
  HeldPoller(RingOwner& owner, SessionId honest) : owner_(owner), honest_(honest), thread_([this] { loop(); }) {}
  ~HeldPoller() { stop(); }
  void stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  // Returns once the poll thread is outside poll() and stays there until release().
  bool hold() {
    hold_ = true;
    return wait_for([this] { return held_.load(); }, 30s);
  }
  void release() { hold_ = false; }
  std::uint64_t delivered() const { return next_; }
  std::uint64_t wrong() const { return wrong_; }
  std::string error() const {
    std::lock_guard lock(m_);
    return error_;
  }

 private:
  void note(const std::string& what) {
    std::lock_guard lock(m_);
    if (error_.empty()) error_ = what;
  }
  void loop() {
    std::array<std::byte, kPayload> expected;
    while (!stop_) {
      if (hold_) {
        held_ = true;
        std::this_thread::sleep_for(100us);
        continue;
      }
      held_ = false;
      auto n = owner_.poll(
          [&](const Delivery& d) {
            const std::uint64_t seq = next_;
            testing::record_fill(d.sequence, expected);
            const bool right = d.session == honest_ && d.sequence == seq && d.payload.size() == kPayload &&
                               std::memcmp(d.payload.data(), expected.data(), kPayload) == 0;
            if (!right && wrong_++ == 0)
              note("session " + std::to_string(d.session) + ": record " + std::to_string(d.sequence) + " (" +
                   std::to_string(d.payload.size()) + " B) where honest session " + std::to_string(honest_) +
                   "'s record " + std::to_string(seq) + " was due");
            if (d.session == honest_) next_ = d.sequence + 1;
          },
          256);
      if (!n) {
        note("poll: " + n.error().message());
        return;
      }
      if (n.value() == 0) std::this_thread::yield();
    }
  }

  RingOwner& owner_;
  const SessionId honest_;
  mutable std::mutex m_;
  std::string error_;
  std::atomic<std::uint64_t> next_{0};
  std::atomic<std::uint64_t> wrong_{0};
  std::atomic<bool> stop_{false}, hold_{false}, held_{false};
  std::thread thread_;
};

// The honest producer: the library's Producer, one publish per record, at full speed, until told
// how many records to end at.
class HonestStream {
 public:
  explicit HonestStream(Producer p) : p_(std::move(p)), thread_([this] { loop(); }) {}
  // A test that ended early must not wait for the rest of the stream.
  ~HonestStream() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  void join() { thread_.join(); }
  void end_at(std::uint64_t records) { records_ = records; }
  // Stops sending new records (returns once the thread has); resume() goes on.
  bool pause() {
    pause_ = true;
    return wait_for([this] { return paused_now_.load() || done_.load(); }, 60s);
  }
  void resume() { pause_ = false; }
  std::uint64_t sent() const { return sent_; }
  bool done() const { return done_; }
  std::string error() const {
    std::lock_guard lock(m_);
    return error_;
  }
  std::uint64_t recoveries() const { return recoveries_; }

 private:
  void loop() {
    std::array<std::byte, kPayload> payload;
    auto last_progress = std::chrono::steady_clock::now();
    for (std::uint64_t seq = 0; seq < records_ && !stop_;) {
      // Paused: what is committed still goes out and credit still comes back.
      paused_now_ = pause_.load();
      if (paused_now_) {
        if (auto r = p_.progress(); !r) return finish("progress: " + r.error().message());
        std::this_thread::sleep_for(100us);
        last_progress = std::chrono::steady_clock::now();
        continue;
      }
      testing::record_fill(seq, payload);
      auto r = p_.send(payload);
      if (r) {
        sent_ = ++seq;
        last_progress = std::chrono::steady_clock::now();
        continue;
      }
      if (r.error() == errc::would_block) {
        if (std::chrono::steady_clock::now() - last_progress > 120s) return finish("ring full for 120 s");
        r = p_.progress();
        if (r) continue;
      }
      // A connection error is recoverable for an honest producer; the owner's failing its
      // session is not (the resume is refused), and the test reports it.
      std::string why = r.error().message();
      if (needs_recover(r.error())) {
        ++recoveries_;
        auto resumed = p_.recover();
        if (resumed) {
          seq = p_.next_sequence();
          continue;
        }
        why += "; recover: " + resumed.error().message();
      }
      return finish("record " + std::to_string(seq) + ": " + why);
    }
    if (stop_) return finish("stopped");
    if (auto d = p_.drain(120s); !d) return finish("drain: " + d.error().message());
    finish({});
  }
  void finish(const std::string& error) {
    {
      std::lock_guard lock(m_);
      error_ = error;
    }
    done_ = true;
  }

  Producer p_;
  std::atomic<std::uint64_t> records_{~std::uint64_t{0}};
  mutable std::mutex m_;
  std::string error_;
  std::atomic<std::uint64_t> sent_{0}, recoveries_{0};
  std::atomic<bool> done_{false}, stop_{false}, pause_{false}, paused_now_{false};
  std::thread thread_;
};

enum class Attack { wrong_epoch_bits, mark_below_credit };

// The immediate a broken peer sends in its first epoch, credit at the grant's position.
std::uint32_t bad_immediate(Attack attack, const control::RingGrant& g) {
  const auto epoch_low = static_cast<std::uint32_t>(g.at.epoch & 7);
  if (attack == Attack::wrong_epoch_bits) return wire::encode(wire::Immediate{0, false, (epoch_low + 1) & 7});
  // Two units below the credit given: widened from the tail seen (the credit), it reads as
  // almost 2^32 B ahead, more than a ring past the credit.
  const std::uint64_t mark = g.at.released - 2 * wire::kRecordAlign;
  return wire::encode(
      wire::Immediate{static_cast<std::uint32_t>((mark / wire::kRecordAlign) & wire::kImmTailMask), false, epoch_low});
}

bool has_session(const RingOwnerStats& s, SessionId id) {
  for (const auto& p : s.per_session)
    if (p.session == id) return true;
  return false;
}

// What the owner made of the sessions, for a failure's report.
std::string owner_state(const RingOwner& owner) {
  const RingOwnerStats s = owner.stats();
  std::ostringstream out;
  out << "owner: sessions_failed " << s.sessions_failed << ", recv_completions " << s.recv_completions
      << ", recv_posts " << s.recv_posts << ", credit_posts " << s.credit_posts << ", stale_completions "
      << s.stale_completions << ", error_completions " << s.error_completions;
  for (const auto& [status, n] : s.completion_errors) out << ", " << status << " " << n;
  for (const auto& [event, n] : s.async_events) out << ", " << event << " " << n;
  out << "\n" << owner.ledger_dump();
  return out.str();
}

// Waits while the honest stream makes progress, until it has sent `target` records; a stream
// held back (its ring full, its QP waiting out RNR NAKs) only weakens this attack.
void let_stream_run(const HonestStream& stream, std::uint64_t target) {
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  std::uint64_t last = stream.sent();
  auto last_progress = std::chrono::steady_clock::now();
  while (stream.sent() < target && !stream.done()) {
    const auto now = std::chrono::steady_clock::now();
    if (now > deadline || now - last_progress > 1s) return;
    if (stream.sent() != last) {
      last = stream.sent();
      last_progress = now;
    }
    std::this_thread::sleep_for(1ms);
  }
}

void attacks_beside_an_honest_stream(Attack attack) {
  // At least this many honest records, and as many more as stream while the attacks go on.
  constexpr std::uint64_t kRecords = 200000;
  RingOwnerOptions o;
  o.address = device_address();
  o.security = test_pki::owner();
  o.mode = wire::PublishMode::imm;
  o.ring_bytes = kRingBytes;
  o.max_record = 1024;
  // An attacker waiting, idle, through a long hold of the poll thread must not lose its lease
  // before its immediate is read.
  o.lease = 0ms;
  const auto owner = RingOwner::start(o);

  ProducerOptions po;
  po.address = device_address();

  po.security = test_pki::producer();
  po.control_port = owner->control_port();
  // One immediate per record, and a send queue deep enough that records waiting for it are not
  // coalesced into one publish: as many completions as possible around each attack.
  po.core.coalesce.records = 1;
  po.core.sq_depth = 1024;
  Producer honest_producer = Producer::attach(po);
  const SessionId honest = honest_producer.credentials().session;
  HeldPoller poller(*owner, honest);
  const auto started = std::chrono::steady_clock::now();
  HonestStream stream(std::move(honest_producer));

  std::ostringstream log;
  log << "honest session " << honest << "\n";
  int attacks = 0;
  for (int a = 0; a < kAttacks; ++a) {
    REQUIRE(wait_for([&] { return stream.sent() >= kBefore || stream.done(); }, 120s));
    REQUIRE_FALSE(stream.done());
    testing::RawProducer raw(device_address(), owner->control_port());
    const auto connects = owner->stats().sessions.connects;
    raw.attach_and_connect();
    REQUIRE(wait_for([&] { return owner->stats().sessions.connects > connects; }, 30s));
    const RingOwnerStats before = owner->stats();
    REQUIRE(has_session(before, honest));

    // The stream pauses until the owner has caught up, so that the ring has room for it to run
    // on after the attack while the owner is held.
    REQUIRE(stream.pause());
    REQUIRE(wait_for([&] { return poller.delivered() >= stream.sent(); }, 60s));
    REQUIRE(poller.hold());
    const std::uint64_t s0 = stream.sent();
    stream.resume();
    let_stream_run(stream, s0 + kBefore);
    const std::uint64_t s1 = stream.sent();
    const auto status = raw.write_with_imm(raw.grant.ring_rkey, bad_immediate(attack, raw.grant), 30s);
    let_stream_run(stream, s1 + kAfter);
    const std::uint64_t s2 = stream.sent();
    poller.release();
    ++attacks;
    log << "attack " << a + 1 << ": attacker session " << raw.grant.session << ", honest records held " << s1 - s0
        << " before and " << s2 - s1 << " after it\n";
    INFO(log.str());
    INFO("poller: " << poller.error() << "; honest producer: " << stream.error());
    REQUIRE(status == IBV_WC_SUCCESS);
    const bool attacker_failed =
        wait_for([&] { return owner->stats().sessions_failed > before.sessions_failed; }, 60s);
    const RingOwnerStats after = owner->stats();
    INFO(owner_state(*owner));
    INFO("last_session_failure: " << after.last_session_failure);
    INFO("stale_completions " << before.stale_completions << " -> " << after.stale_completions);
    REQUIRE(attacker_failed);
    CHECK(after.sessions_failed == before.sessions_failed + 1);
    CHECK(after.last_session_failure.rfind("session " + std::to_string(raw.grant.session) + ": ", 0) == 0);
    CHECK_FALSE(has_session(after, raw.grant.session));
    // Failed in the attacker's place: the rest of the stream cannot go on.
    REQUIRE(has_session(after, honest));
  }
  CHECK(attacks == kAttacks);

  stream.end_at(std::max(stream.sent(), kRecords));
  const bool finished = wait_for([&] { return stream.done(); }, 300s);
  stream.join();
  const std::uint64_t sent = stream.sent();
  const bool all_delivered = wait_for([&] { return poller.delivered() >= sent; }, 60s);
  poller.stop();
  const auto elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  const RingOwnerStats end = owner->stats();
  INFO(log.str());
  INFO("honest producer: " << stream.error() << ", " << stream.recoveries() << " recoveries; poller: "
                           << poller.error() << "; " << poller.delivered() << " of " << sent << " delivered in "
                           << elapsed << " s");
  INFO(owner_state(*owner));
  INFO("last_session_failure: " << end.last_session_failure);
  CHECK(finished);
  CHECK(stream.error().empty());
  CHECK(stream.recoveries() == 0);
  CHECK(all_delivered);
  CHECK(poller.wrong() == 0);
  CHECK(poller.error().empty());
  CHECK(sent >= kRecords);
  CHECK(poller.delivered() == sent);
  CHECK(end.sessions_failed == static_cast<std::uint64_t>(attacks));
  CHECK(has_session(end, honest));
  std::cout << "isolation: " << attacks << " attacks, " << sent << " honest records in " << elapsed << " s, "
            << end.recv_completions << " immediates\n"
            << log.str();
}

}  // namespace

TEST_CASE("an immediate with wrong epoch bits closes its own session only, an honest stream beside it goes on",
          "[softroce][sessions][isolation]") {
  attacks_beside_an_honest_stream(Attack::wrong_epoch_bits);
}

TEST_CASE("a publish mark 128 B below the credit closes its own session only, an honest stream beside it goes on",
          "[softroce][sessions][isolation]") {
  attacks_beside_an_honest_stream(Attack::mark_below_credit);
}
