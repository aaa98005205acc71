// Sleeping instead of spinning, on a device (protocol-spec/wakeup.md): an idle owner and an idle
// producer use next to no CPU, and the first record after a lull wakes both, in both publish
// modes. The owner's wait has no time limit, so a lost wake-up is a record that never arrives.
// The interleavings themselves are model-checked (protocol-spec/model, runs 25 on) and
// property-tested on the fabric; CPU figures and wake-up latency beside perftest are bench/'s.
#include <catch2/catch.hpp>

#include <dirent.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <future>
#include <mutex>
#include <sstream>
#include <thread>

#include "owner_harness.hpp"
#include "raw_control.hpp"
#include "raw_producer.hpp"
#include "rdmaring/threaded_producer.hpp"
#include "ring_owner_test_access.hpp"

using namespace rdmaring;
using namespace rdmaring::testing;

namespace {

// CPU time of this process's thread named `name` (/proc/self/task/*/comm), from its stat.
std::chrono::nanoseconds thread_cpu(const std::string& name) {
  DIR* dir = opendir("/proc/self/task");
  if (!dir) return {};
  std::chrono::nanoseconds total{};
  while (const dirent* e = readdir(dir)) {
    const std::string task = std::string("/proc/self/task/") + e->d_name;
    std::string comm;
    std::getline(std::ifstream(task + "/comm"), comm);
    if (comm != name) continue;
    std::string stat;
    std::getline(std::ifstream(task + "/stat"), stat);
    // Fields after the parenthesised name: state is field 3, utime 14, stime 15.
    std::istringstream rest(stat.substr(stat.rfind(')') + 2));
    std::string field;
    unsigned long long utime = 0, stime = 0;
    for (int i = 3; i <= 15 && rest >> field; ++i) {
      if (i == 14) utime = std::stoull(field);
      if (i == 15) stime = std::stoull(field);
    }
    total += std::chrono::nanoseconds((utime + stime) * 1'000'000'000ull / sysconf(_SC_CLK_TCK));
  }
  closedir(dir);
  return total;
}

double seconds(std::chrono::nanoseconds d) { return std::chrono::duration<double>(d).count(); }

// Whether this process's thread `tid` is blocked in epoll_wait (/proc's syscall file names the
// system call a blocked thread is in): a producer there sleeps in wait(), whatever the speed.
bool in_epoll_wait(pid_t tid) {
  long nr = -1;
  std::ifstream(std::string("/proc/self/task/") + std::to_string(tid) + "/syscall") >> nr;
  return nr == SYS_epoll_wait || nr == SYS_epoll_pwait;
}

// How long an idle producer sleeps in wait() before its connection's end surfaces, while
// `meanwhile` runs on another thread; and the error. A lost wake-up sleeps out the 120 s: the
// bounds below are for that, not for speed.
std::pair<double, Error> sleep_until_error(Producer& p, const std::function<void()>& meanwhile) {
  std::thread other(meanwhile);
  const auto start = std::chrono::steady_clock::now();
  const auto elapsed = [&] { return seconds(std::chrono::steady_clock::now() - start); };
  Result<void> r = success();
  // Woken by anything else (a last completion of the drain), it looks and sleeps again.
  while (r && elapsed() < 120) {
    const auto woke = p.wait(120s);
    r = woke ? p.progress() : Result<void>(woke.error());
  }
  const double waited = elapsed();
  other.join();
  REQUIRE_FALSE(r);
  return {waited, r.error()};
}

}  // namespace

TEST_CASE("an idle owner and producer sleep, and the first record after a lull wakes both", "[softroce][wakeup]") {
  const auto mode = GENERATE(wire::PublishMode::imm, wire::PublishMode::tail);
  INFO("mode " << (mode == wire::PublishMode::imm ? "imm" : "tail"));
  const auto owner = RingOwner::start(owner_options(mode));
  Producer p = Producer::attach(producer_options(*owner));
  Auditor audit(*owner, {}, {}, Auditor::Idle::sleep);
  ThreadedProducer<Producer> tp(p, {});

  constexpr std::uint64_t kCycles = 3;
  for (std::uint64_t cycle = 0; cycle < kCycles; ++cycle) {
    INFO("cycle " << cycle);
    // Read before the record: both sides may be asleep again before the test looks.
    const auto parks = tp.stats().poster_parks;
    const auto sleeps = owner->stats().sleeps;
    const auto sent_at = std::chrono::steady_clock::now();
    REQUIRE(tp.send(record_bytes(cycle), 30s));
    // Generous: the bound is for a lost wake-up (which never ends), not for speed.
    REQUIRE(wait_for([&] { return audit.delivered() == cycle + 1; }, 60s, 1ms));
    const double latency = seconds(std::chrono::steady_clock::now() - sent_at);
    UNSCOPED_INFO("cycle " << cycle << ": first record after the lull delivered in " << latency * 1e3 << " ms");

    // The lull: the poster settles its credit and parks, the owner arms and sleeps.
    REQUIRE(wait_for([&] { return tp.stats().poster_parks > parks && owner->stats().sleeps > sleeps; }, 60s));
    const auto owner_cpu = audit.cpu_time();
    const auto poster_cpu = thread_cpu("rdmaring-post");
    std::this_thread::sleep_for(1s);
    const double owner_used = seconds(audit.cpu_time() - owner_cpu);
    const double poster_used = seconds(thread_cpu("rdmaring-post") - poster_cpu);
    INFO("over 1 s idle: owner poll thread " << owner_used << " s CPU, poster " << poster_used << " s");
    // A spinning thread uses the whole second (half of it on a loaded machine); a sleeping one
    // a few wake-ups' worth. The bounds hold on a loaded machine: load only lowers them.
    CHECK(owner_used < 0.1);
    CHECK(poster_used < 0.1);
  }
  CHECK(audit.error().empty());
  CHECK(audit.wrong() == 0);
  const RingOwnerStats s = owner->stats();
  if (mode == wire::PublishMode::tail) {
    // Each lull's first record rang: the owner slept with the flag set.
    CHECK(s.rings.doorbells >= kCycles);
    CHECK(s.rings.doorbell_flag_writes >= 2 * (kCycles - 1));
  }
  // Read once the poster has stopped: until then the producer is its thread's (TSan saw the race).
  REQUIRE(tp.stop());
  CHECK(p.stats().sleeps == 0);  // nobody called the producer's own wait: the poster parks instead
}

TEST_CASE("mode tail: a polling owner parks its quiet sessions, reads no tail while idle, and each next record rings",
          "[softroce][wakeup][park]") {
  // wakeup.md §3.2 on a device: the owner polls without pause (the audit yields), so without
  // parking it would read every tail thousands of times a second.
  RingOwnerOptions o = owner_options(wire::PublishMode::tail);
  o.tail_park_reads = 16;
  const auto owner = RingOwner::start(o);
  constexpr std::size_t kProducers = 4;
  constexpr std::uint64_t kCycles = 3;
  std::vector<Producer> producers;
  for (std::size_t i = 0; i < kProducers; ++i) producers.push_back(Producer::attach(producer_options(*owner)));
  Auditor audit(*owner);
  for (std::uint64_t cycle = 0; cycle < kCycles; ++cycle) {
    INFO("cycle " << cycle);
    for (Producer& p : producers) {
      REQUIRE(p.send(record_bytes(p.next_sequence()), 30s));
      REQUIRE(p.drain(60s));
    }
    // Generous: a lost doorbell is a record that never arrives, not a slow one.
    REQUIRE(wait_for([&] { return audit.delivered() == kProducers * (cycle + 1); }, 60s, 1ms));
    // Parked: the reads stop, 200 ms in which the owner polls thousands of times reading none.
    // A session that never parks reads on for ever: the bound is for that.
    std::uint64_t reads = owner->stats().tail_reads;
    REQUIRE(wait_for(
        [&] {
          std::this_thread::sleep_for(200ms);
          const std::uint64_t now = owner->stats().tail_reads;
          return std::exchange(reads, now) == now;
        },
        60s, 1ms));
    CHECK(owner->stats().parks >= kProducers * (cycle + 1));
  }
  CHECK(audit.error().empty());
  CHECK(audit.wrong() == 0);
  const RingOwnerStats s = owner->stats();
  CHECK(s.sessions_failed == 0);
  CHECK(s.rings.doorbells >= kProducers * kCycles);  // each cycle's record rang for its parked session
}

TEST_CASE("a producer short of credit sleeps in wait() until the owner's answer wakes it", "[softroce][wakeup]") {
  const auto mode = GENERATE(wire::PublishMode::imm, wire::PublishMode::tail);
  INFO("mode " << (mode == wire::PublishMode::imm ? "imm" : "tail"));
  auto o = owner_options(mode);
  o.ring_bytes = 4096;  // a few records fill it
  const auto owner = RingOwner::start(o);
  Producer p = Producer::attach(producer_options(*owner));
  // The owner is not polled yet: the ring fills and the producer must wait for credit.
  std::uint64_t sent = 0;
  while (p.send(record_bytes(sent))) ++sent;
  REQUIRE(sent > 0);
  REQUIRE(p.flush());
  // The owner starts only once the producer sleeps on its next record: otherwise a fast owner
  // answers while the producer still spins, and whether it ever sleeps depends on speed.
  std::atomic<pid_t> sender{0};
  auto first = std::async(std::launch::async, [&] {
    sender = gettid();
    return p.send(record_bytes(sent), 60s);
  });
  REQUIRE(wait_for([&] { return sender != 0 && in_epoll_wait(sender); }, 60s, 1ms));
  Auditor audit(*owner, {}, {}, Auditor::Idle::sleep);
  REQUIRE(first.get());
  ++sent;
  constexpr std::uint64_t kRecords = 200;
  for (; sent < kRecords; ++sent) {
    // A lost wake-up sleeps out the whole timeout and then finds the room it was not told of.
    const auto start = std::chrono::steady_clock::now();
    const auto r = p.send(record_bytes(sent), 60s);
    const double took = seconds(std::chrono::steady_clock::now() - start);
    INFO("record " << sent << ": " << p.ledger_dump() << "\nowner: " << owner->ledger_dump());
    if (!r) {
      const ProducerStats ps = p.stats();
      const RingOwnerStats os = owner->stats();
      UNSCOPED_INFO("producer: batches " << ps.core.batches << " doorbells " << ps.core.doorbells << " requests "
                    << ps.core.credit_requests << " credit_updates " << ps.core.credit_updates << " notifications "
                    << ps.credit_notifications << " sleeps " << ps.sleeps << " completions " << ps.completions
                    << " sq_full " << ps.core.sq_full << " signaled " << ps.core.signaled << " wrs " << ps.core.wrs);
      UNSCOPED_INFO("owner: doorbells " << os.rings.doorbells << " flag_writes " << os.rings.doorbell_flag_writes
                    << " sleeps " << os.sleeps << " recv_completions " << os.recv_completions << " credit_posts "
                    << os.credit_posts << " requests " << os.rings.credit_requests << " publishes "
                    << os.rings.publishes << " credit_writes " << os.rings.credit_writes << " not_ready "
                    << os.rings.not_ready << " torn " << os.rings.torn_tail_reads);
    }
    REQUIRE(r);
    REQUIRE(took < 30);
  }
  REQUIRE(p.drain(60s));
  REQUIRE(wait_for([&] { return audit.delivered() == kRecords; }, 60s));
  const ProducerStats ps = p.stats();
  INFO(p.ledger_dump());
  // It slept rather than spun, and the owner's answers woke it.
  CHECK(ps.sleeps > 0);
  CHECK(ps.credit_notifications > 0);
  CHECK(audit.error().empty());
}

TEST_CASE("an owner asleep through a tail published over bytes never written reads them a few times, then refuses",
          "[softroce][wakeup]") {
  // wakeup.md O7: the hostile tail used to keep a sleeping owner polling for the whole grace.
  std::mutex m;
  std::string closed_why;
  auto o = owner_options(wire::PublishMode::tail);
  o.on_session_closed = [&](SessionId, CloseReason r, const std::string& why) {
    std::lock_guard lock(m);
    if (r == CloseReason::protocol_violation) closed_why = why;
  };
  const auto owner = RingOwner::start(o);
  Auditor audit(*owner, {}, {}, Auditor::Idle::sleep);
  testing::RawProducer raw(device_address(), owner->control_port());
  const auto connects = owner->stats().sessions.connects;
  raw.attach_and_connect();
  REQUIRE(wait_for([&] { return owner->stats().sessions.connects > connects; }, 30s));
  // A tail two units ahead, over the 0xEE bytes the doorbell's own write leaves at the ring's
  // start: no header (neither kind), so never valid. The doorbell wakes the owner, which reads the tail.
  const wire::TailRecord forged{raw.grant.at.epoch, raw.grant.at.position + 2 * wire::kRecordAlign,
                                raw.grant.at.next_sequence + 1, 0};
  std::array<std::byte, wire::kTailRecordSize> bytes{};
  wire::encode(forged, bytes);
  REQUIRE(raw.write_bytes(bytes, raw.grant.tail_addr, raw.grant.tail_rkey, 30s) == IBV_WC_SUCCESS);
  const auto before = owner->stats();
  const auto rang = std::chrono::steady_clock::now();
  const auto doorbell = wire::encode(wire::Immediate{0, false, static_cast<std::uint32_t>(raw.grant.at.epoch & 7)});
  REQUIRE(raw.write_with_imm(raw.grant.ring_rkey, doorbell, 30s) == IBV_WC_SUCCESS);
  REQUIRE(wait_for([&] { return owner->stats().sessions_failed > before.sessions_failed; }, 60s));
  const double took = seconds(std::chrono::steady_clock::now() - rang);
  // The counter moves when the core fails the session; on_session_closed runs after, outside the
  // owner's lock, so the reason is waited for on its own (the landing CI read it too soon once).
  const bool told = wait_for([&] {
    std::lock_guard lock(m);
    return !closed_why.empty();
  }, 60s);
  const RingOwnerStats after = owner->stats();
  INFO(owner->ledger_dump());
  INFO("refused after " << took << " s; reads " << after.rings.not_ready - before.rings.not_ready << ", sleeps "
                        << after.sleeps - before.sleeps);
  REQUIRE(told);
  {
    std::lock_guard lock(m);
    CHECK_THAT(closed_why, Catch::Contains("placement order violated"));
  }
  CHECK(took >= 1.0);  // the grace (1 s) from the first failing read, which follows the doorbell
  // Doubling from 20 us to 50 ms apart: about 30 reads in 1 s; a loaded machine only lowers it.
  // One per poll was ~30,000.
  CHECK(after.rings.not_ready - before.rings.not_ready <= 60);
  CHECK(after.sleeps - before.sleeps >= 10);  // it slept between the reads
  CHECK(audit.error().empty());
}

TEST_CASE("a session that ends wakes an owner asleep in wait()", "[softroce][wakeup]") {
  std::atomic<int> closed{0};
  auto o = owner_options(wire::PublishMode::imm);
  o.on_session_closed = [&](SessionId, CloseReason, const std::string&) { closed.fetch_add(1); };
  const auto owner = RingOwner::start(o);
  Producer p = Producer::attach(producer_options(*owner));
  REQUIRE(p.send(record_bytes(0)));
  REQUIRE(p.flush());
  // The producer detaches while the owner's thread sleeps: its drain needs the owner to poll,
  // which the record's immediate and the credit request wake it for; after that only the
  // session's end is left to wake it, so a wait that runs out its 120 s is the bug.
  std::thread producer([&] { CHECK(p.detach(60s)); });
  std::uint64_t delivered = 0, timeouts = 0;
  while (owner->session_count() > 0 && timeouts == 0) {
    auto n = owner->poll([&](const Delivery&) { ++delivered; }, 16);
    REQUIRE(n);
    if (n.value() > 0) continue;
    auto woke = owner->wait(120s);
    REQUIRE(woke);
    if (!woke.value()) ++timeouts;
  }
  producer.join();
  CHECK(timeouts == 0);
  CHECK(delivered == 1);
  // The count falls when the session is dropped; on_session_closed (then the wake) follows it.
  CHECK(wait_for([&] { return closed.load() == 1; }, 60s));
}

TEST_CASE("a producer asleep in wait() wakes when the owner breaks its connection", "[softroce][wakeup]") {
  const auto owner = RingOwner::start(owner_options(wire::PublishMode::imm));
  Auditor audit(*owner, {}, {}, Auditor::Idle::sleep);
  auto po = producer_options(*owner);
  po.heartbeat_interval = 1h;  // so that only the rdma_cm disconnect can end the sleep
  Producer p = Producer::attach(po);
  REQUIRE(send_records(p, 10));
  REQUIRE(p.drain(60s));
  const SessionId session = p.credentials().session;
  const auto sleeps = p.stats().sleeps;
  // Nothing in flight: no completion will come. The owner breaks the link as after a refused
  // credit post (failures.md §1): its QP to error, then rdma_disconnect.
  const auto [waited, error] = sleep_until_error(p, [&] {
    std::this_thread::sleep_for(1s);
    RingOwnerTestAccess::inject(*owner, session, OwnerDataPlane::Fault::qp_error);
  });
  UNSCOPED_INFO("the broken link surfaced " << waited * 1e3 << " ms after the producer went to sleep (broken after 1 s)");
  CHECK(waited < 60);
  CHECK(p.stats().sleeps > sleeps);
  CHECK(error == errc::completion_error);
  UNSCOPED_INFO("as: " << error.message());
  // And it heals: nothing lost, nothing twice.
  REQUIRE(send_records(p, 20));
  REQUIRE(p.drain(60s));
  REQUIRE(wait_for([&] { return audit.delivered() == 20; }, 60s));
  CHECK(audit.wrong() == 0);
  CHECK(audit.error().empty());
}

TEST_CASE("a producer asleep in wait() wakes when its heartbeats go unanswered", "[softroce][wakeup]") {
  // The owner's control thread is held inside an on_session call (another producer's attach):
  // heartbeats go unanswered while its QPs stay up, so only the control thread's alarm
  // (owner_lost) can end the sleep.
  std::atomic<bool> hold{false};
  std::promise<void> release;
  const std::shared_future<void> released = release.get_future().share();
  auto o = owner_options(wire::PublishMode::imm);
  o.on_session = [&hold, released](const SessionRecord&) {
    if (hold.load()) released.wait();
  };
  const auto owner = RingOwner::start(o);
  Auditor audit(*owner, {}, {}, Auditor::Idle::sleep);
  auto po = producer_options(*owner);
  po.connect_timeout = 3s;  // a heartbeat's limit too
  po.heartbeat_interval = 300ms;
  Producer p = Producer::attach(po);
  REQUIRE(send_records(p, 10));
  REQUIRE(p.drain(60s));
  std::thread second;
  const auto [waited, error] = sleep_until_error(p, [&] {
    std::this_thread::sleep_for(1s);
    hold = true;
    second = std::thread([&] {
      try {
        (void)Producer::attach(producer_options(*owner));
      } catch (const SetupError&) {  // its reply waits for the release: it may time out
      }
    });
  });
  release.set_value();
  second.join();
  UNSCOPED_INFO("owner_lost surfaced " << waited * 1e3 << " ms after the producer went to sleep (the control thread stopped after 1 s)");
  CHECK(waited < 60);
  CHECK(error == errc::owner_lost);
}

TEST_CASE("an attach wakes an owner asleep in wait()", "[softroce][wakeup]") {
  auto o = owner_options(wire::PublishMode::imm);
  o.lease = 10min;  // the session's expiry, which wakes it too, must not come first
  const auto owner = RingOwner::start(o);
  // Only the control channel: no QP connects, so no rdma_cm event can be what wakes the owner.
  std::optional<Result<control::RingGrant>> grant;
  std::thread attacher([&] {
    std::this_thread::sleep_for(1s);
    RawControl raw;  // its event loop is this thread's
    const auto c = raw.connect(device_address(), owner->control_port(), test_pki::producer());
    if (raw.hello(c)) grant = raw.attach(c);
  });
  const auto start = std::chrono::steady_clock::now();
  const auto woke = owner->wait(120s);
  const double waited = seconds(std::chrono::steady_clock::now() - start);
  attacher.join();
  REQUIRE(woke);
  CHECK(woke.value());
  UNSCOPED_INFO("woken " << waited * 1e3 << " ms after going to sleep (the attach came after 1 s)");
  CHECK(waited < 60);
  REQUIRE(grant);
  REQUIRE(*grant);
  CHECK(owner->session_count() == 1);
}
