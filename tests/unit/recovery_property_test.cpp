// Properties of the producer and consumer cores under adversarial schedules: placements held
// back and done one at a time, publishes delivered late, the connection dropped at any step,
// resumed or with the producer restarted empty, replayed publishes from old epochs. Whatever
// the schedule: every record is delivered exactly once, in order, with the bytes it was sent
// with, and no write ever lands on ring bytes the consumer has not released.
#include <rapidcheck/catch.h>

#include <sstream>

#include "../fabric/loopback.hpp"

using namespace rdmaring;
using rdmaring::test::LoopbackFabric;

namespace {

enum class Step : std::uint8_t { send, flush, place_one, place_all, publish, consume, credit, drop, resume, restart, replay };

const char* name(Step s) {
  static const char* names[] = {"send", "flush", "place_one", "place_all", "publish", "consume",
                                "credit", "drop", "resume", "restart", "replay"};
  return names[static_cast<int>(s)];
}

// Shrunk counterexamples print as a readable schedule.
void showValue(Step s, std::ostream& os) { os << name(s); }

std::vector<std::byte> payload_for(std::uint64_t seq) {
  std::vector<std::byte> p((seq * 37) % 300);
  for (std::size_t i = 0; i < p.size(); ++i) p[i] = static_cast<std::byte>(seq * 131 + i);
  return p;
}

// Ring bytes the consumer has not released and that belong to the current epoch.
bool overlaps_protected(const LoopbackFabric& f, const WorkRequest& wr) {
  if (wr.kind == WorkRequest::Kind::write_tail || wr.length == 0) return false;
  const auto l = f.consumer.ledger();
  const std::uint64_t ring = f.geometry().bytes;
  for (std::uint64_t pos = l.released; pos < l.published; pos += wire::kRecordAlign) {
    const std::uint64_t off = pos & (ring - 1);
    if (off >= wr.remote_offset && off < wr.remote_offset + wr.length) return true;
  }
  return false;
}

void run_schedule(wire::PublishMode mode, const std::vector<Step>& steps) {
  LoopbackFabric f(mode, 4096, 300);
  std::ostringstream trace;
  bool overwrote = false;
  f.on_place = [&](const WorkRequest& wr) { overwrote |= overlaps_protected(f, wr); };
  std::uint64_t next_send = 0, expect = 0;

  auto consume = [&](std::size_t max) {
    for (std::size_t i = 0; i < max; ++i) {
      auto r = f.consumer.next(Clock::now());
      RC_ASSERT(r.has_value());
      if (!r.value()) return;
      const auto& rec = *r.value();
      RC_ASSERT(rec.sequence == expect);
      const auto want = payload_for(expect);
      RC_ASSERT(std::equal(want.begin(), want.end(), rec.payload.begin(), rec.payload.end()));
      RC_ASSERT(f.consumer.release(rec.end).has_value());
      ++expect;
    }
  };

  for (const Step s : steps) {
    trace << name(s) << ' ';
    RC_LOG() << name(s) << ' ';
    switch (s) {
      case Step::send:
        if (f.producer->send(payload_for(next_send), Clock::now())) ++next_send;
        break;
      case Step::flush: f.flush(); break;
      case Step::place_one: f.hold(true), f.place_one(); break;
      case Step::place_all: f.hold(false), f.place_all(); break;
      case Step::publish:
        if (!f.dropped()) f.deliver_publishes();
        break;
      case Step::consume: consume(3); break;
      case Step::credit:
        if (!f.dropped()) f.return_credit();
        break;
      case Step::drop: f.drop(); break;
      case Step::resume:
        if (f.dropped()) RC_ASSERT(f.resume().has_value());
        break;
      case Step::restart:
        if (f.dropped()) next_send = f.restart_producer().next_sequence;
        break;
      case Step::replay:
        if (const auto old = f.old_tail(); mode == wire::PublishMode::tail && old) {
          const auto before = f.consumer.ledger();
          RC_ASSERT(f.consumer.on_tail(*old).has_value());
          const auto after = f.consumer.ledger();
          RC_ASSERT(after.published == before.published && after.head == before.head);  // a stale epoch changes nothing
        }
        break;
    }
    RC_ASSERT(!overwrote);
    const auto p = f.producer->ledger();
    RC_ASSERT(p.released <= p.published && p.published <= p.committed && p.committed - p.released <= 4096);
  }
  // Heal and drain: whatever the schedule, everything sent arrives, once.
  if (f.dropped()) RC_ASSERT(f.resume().has_value());
  for (int round = 0; round < 200 && expect < next_send; ++round) {
    f.hold(false);
    f.place_all();
    f.producer->request_credit();
    f.flush();
    f.deliver_publishes();
    consume(1000);
    f.return_credit();
  }
  RC_ASSERT(expect == next_send);
  RC_ASSERT(!overwrote);
}

rc::Gen<std::vector<Step>> schedules() {
  return rc::gen::container<std::vector<Step>>(rc::gen::weightedElement<Step>({{30, Step::send},
                                                                               {8, Step::flush},
                                                                               {8, Step::place_one},
                                                                               {5, Step::place_all},
                                                                               {8, Step::publish},
                                                                               {8, Step::consume},
                                                                               {6, Step::credit},
                                                                               {2, Step::drop},
                                                                               {2, Step::resume},
                                                                               {1, Step::restart},
                                                                               {1, Step::replay}}));
}

}  // namespace

TEST_CASE("exactly-once in-order delivery under adversarial schedules", "[property]") {
  rc::prop("mode imm", [] { run_schedule(wire::PublishMode::imm, *schedules()); });
  rc::prop("mode tail", [] { run_schedule(wire::PublishMode::tail, *schedules()); });
}
