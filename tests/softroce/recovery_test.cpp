// Recovery on a real verbs device: the producer's QP is forced into the error state in the middle
// of batches, the producer resumes its session through the ring owner's control channel in the
// next epoch (ring re-registered, old rkey revoked) and reconnects, and every record still arrives
// exactly once, in order, with its bytes.
#include <catch2/catch.hpp>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <future>
#include <set>
#include <string>

#include "device_address.hpp"
#include "test_pki.hpp"
#include "producer_test_access.hpp"
#include "rdmaring/producer.hpp"
#include "rdmaring/ring_owner.hpp"

using namespace rdmaring;

namespace {


std::uint32_t size_of(std::uint64_t seq) { return static_cast<std::uint32_t>((seq * 2654435761u) % 700); }

void fill(std::uint64_t seq, std::span<std::byte> out) {
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<std::byte>(seq * 31 + i * 7);
}

struct Received {
  std::uint64_t records = 0;
  std::uint64_t wrong = 0;
  std::set<SessionId> sessions;
  std::string error;
  RingOwnerStats stats{};
  std::string ledger;
};

void run(wire::PublishMode mode) {
  constexpr std::uint64_t kRecords = 100000;
  constexpr std::uint64_t kFaultEvery = 10000;
  RingOwnerOptions oo;
  oo.address = device_address();
  oo.security = test_pki::owner();
  oo.mode = mode;
  oo.ring_bytes = 1 << 16;
  oo.max_record = 1024;
  const auto owner = RingOwner::start(oo);
  std::atomic<bool> abandoned{false};

  // Catch2 assertions are not thread-safe: the polling thread reports, the test asserts. It polls
  // until every record has arrived and the producer has detached (the session is gone): until
  // then the producer's drain and detach want credit, which poll() writes.
  auto delivered = std::async(std::launch::async, [&]() -> Received {
    Received d;
    std::vector<std::byte> want(1024);
    const auto deadline = Clock::now() + std::chrono::seconds(300);
    while ((d.records < kRecords || owner->session_count() > 0) && !abandoned && Clock::now() < deadline) {
      auto n = owner->poll(
          [&](const Delivery& r) {
            const auto len = size_of(d.records);
            fill(d.records, std::span(want).first(len));
            if (r.sequence != d.records || r.payload.size() != len || std::memcmp(r.payload.data(), want.data(), len) != 0)
              ++d.wrong;
            d.sessions.insert(r.session);
            ++d.records;
          },
          256);
      if (!n) {
        d.error = n.error().message();
        break;
      }
    }
    d.stats = owner->stats();
    d.ledger = owner->ledger_dump();
    return d;
  });
  // A failed REQUIRE below leaves the scope: stop the polling thread rather than wait for its
  // deadline.
  struct Abandon {
    std::atomic<bool>& flag;
    ~Abandon() { flag = true; }
  } abandon{abandoned};

  ProducerOptions po;
  po.address = oo.address;

  po.security = test_pki::producer();
  po.control_port = owner->control_port();
  Producer producer = Producer::attach(po);
  const SessionId session = producer.credentials().session;
  std::uint64_t faults = 0, recoveries = 0;
  auto heal = [&](const Error& e) {
    INFO("producer: " << e.message());
    REQUIRE(e == errc::completion_error);
    // Through the control channel: the owner fences the epoch, re-registers the ring and grants
    // the next epoch from its last delivered record; then the QP connects again.
    auto at = producer.recover();
    INFO("recover: " << (at ? std::string("ok") : at.error().message()));
    REQUIRE(at);
    ++recoveries;
  };
  for (std::uint64_t seq = 0; seq < kRecords;) {
    if (seq > 0 && seq % kFaultEvery == 0 && faults < seq / kFaultEvery) {
      // Mid-batch: committed records are in flight or waiting when the QP dies.
      REQUIRE(ProducerTestAccess::force_error(producer));
      ++faults;
    }
    auto span = producer.claim(size_of(seq));
    if (!span) {
      if (span.error() == errc::would_block) continue;
      heal(span.error());
      continue;
    }
    fill(seq, span.value());
    if (auto r = producer.commit(); !r) heal(r.error());
    ++seq;
  }
  for (;;) {
    auto r = producer.drain(std::chrono::seconds(60));
    if (r) break;
    heal(r.error());
  }
  const auto detached = producer.detach(std::chrono::seconds(60));
  INFO("detach: " << (detached ? std::string("ok") : detached.error().message()));
  CHECK(detached);
  const Received d = delivered.get();
  INFO("owner error: " << d.error);
  INFO("owner: error_completions " << d.stats.error_completions << ", stale_completions "
                                   << d.stats.stale_completions << ", connects " << d.stats.sessions.connects
                                   << ", refused_stale " << d.stats.sessions.refused_stale << ", connect_refused "
                                   << d.stats.connect_refused << ", sessions_failed " << d.stats.sessions_failed << " "
                                   << d.stats.last_session_failure << "\n"
                                   << d.ledger);
  CHECK(d.error.empty());
  CHECK(d.records == kRecords);
  CHECK(d.wrong == 0);
  CHECK(d.sessions == std::set<SessionId>{session});
  CHECK(faults == kRecords / kFaultEvery - 1);
  CHECK(recoveries >= faults);
  CHECK(d.stats.sessions.attaches == 1);
  CHECK(d.stats.sessions.resumes == recoveries);
  CHECK(d.stats.sessions.detaches == 1);
  CHECK(d.stats.sessions_failed == 0);
  // The closed ring's counters are kept in the sum: each record consumed once, none twice.
  CHECK(d.stats.rings.records == kRecords);
  CHECK(d.stats.rings.duplicates_dropped == 0);
  CHECK(d.stats.per_session.empty());
  CHECK(owner->session_count() == 0);
  CHECK(producer.stats().recoveries == recoveries);
}

}  // namespace

TEST_CASE("QP forced to error mid-batch, resumed: exactly once, in order (imm)", "[softroce][recovery]") {
  run(wire::PublishMode::imm);
}

TEST_CASE("QP forced to error mid-batch, resumed: exactly once, in order (tail)", "[softroce][recovery]") {
  run(wire::PublishMode::tail);
}
