// Held batches (protocol-spec/owner.md §5.1) over the real OwnerCore: whatever order an
// application tries to finish them in, what HeldBatches lets through keeps every record exactly
// once and in order, its bytes intact until its batch finishes; what it refuses changes nothing.
#include <catch2/catch.hpp>
#include <rapidcheck/catch.h>

#include <cstring>
#include <deque>
#include <vector>

#include "../fabric/loopback.hpp"
#include "rdmaring/held_batches.hpp"

using namespace rdmaring;
using rdmaring::test::LoopbackFabric;

namespace {

// Record `seq`'s payload: 1 to 300 bytes, each a function of the sequence.
std::vector<std::byte> payload(std::uint64_t seq) {
  std::vector<std::byte> p(1 + seq * 7919 % 300);
  for (std::size_t i = 0; i < p.size(); ++i) p[i] = static_cast<std::byte>(seq * 31 + i);
  return p;
}

bool intact(const TakenRecord& t) {
  const auto want = payload(t.delivery.sequence);
  return t.delivery.payload.size() == want.size() &&
         std::memcmp(t.delivery.payload.data(), want.data(), want.size()) == 0;
}

TakenRecord record(std::uint64_t session, std::uint64_t sequence) { return TakenRecord{Delivery{session, {}, sequence}, 0}; }

}  // namespace

TEST_CASE("held batches finish oldest first, or the newest is given back whole, and anything else is refused",
          "[core][held]") {
  HeldBatches h;
  h.hold({record(1, 0), record(1, 1)}, {});
  h.hold({}, {});  // not held
  h.hold({record(2, 0)}, {});
  h.hold({record(1, 2), record(2, 1)}, {});
  REQUIRE(h.size() == 3);
  const std::vector<TakenRecord> oldest{record(1, 0), record(1, 1)}, middle{record(2, 0)},
      newest{record(1, 2), record(2, 1)};
  CHECK(h.remove(middle, 1).error() == errc::invalid_argument);
  CHECK(h.remove(middle, 0).error() == errc::invalid_argument);  // a give-back of any but the newest
  CHECK(h.remove(newest, 1).error() == errc::invalid_argument);  // the newest only whole
  CHECK(h.remove(newest, 2).error() == errc::invalid_argument);  // released before the oldest
  CHECK(h.remove(oldest, 1).error() == errc::invalid_argument);  // the oldest only whole while others are held
  CHECK(h.remove(oldest, 3).error() == errc::invalid_argument);  // past its end
  CHECK(h.remove(std::vector<TakenRecord>{record(1, 0)}, 1).error() == errc::invalid_argument);  // length differs
  CHECK(h.remove(std::vector<TakenRecord>{record(3, 0)}, 0).error().message().find("not a batch") !=
        std::string::npos);
  REQUIRE(h.size() == 3);  // the refusals changed nothing
  REQUIRE(h.remove(std::vector<TakenRecord>{}, 0).value().taken.empty());
  auto back = h.remove(newest, 0);
  REQUIRE(back);
  CHECK(back.value().taken.size() == 2);
  auto first = h.remove(oldest, 2);
  REQUIRE(first);
  CHECK(first.value().taken.front().delivery.sequence == 0);
  REQUIRE(h.remove(middle, 0));  // alone now: any count
  CHECK(h.empty());
}

TEST_CASE("a held batch's pins are found while it is held, and not once it has finished", "[core][held]") {
  HeldBatches h;
  const auto ring = [](int n) { return std::make_shared<int>(n); };
  const auto is = [](int n) { return [n](const void* p) { return *static_cast<const int*>(p) == n; }; };
  const auto a = ring(1), b = ring(2), c = ring(3);
  h.hold({record(1, 0)}, {a, b});
  h.hold({record(2, 0)}, {c});
  CHECK(h.find_pin(is(2)) == b);
  CHECK(h.find_pin(is(3)) == c);
  CHECK(h.find_pin(is(4)) == nullptr);
  REQUIRE(h.remove(std::vector<TakenRecord>{record(1, 0)}, 1));
  CHECK(h.find_pin(is(2)) == nullptr);
  CHECK(h.find_pin(is(3)) == c);
}

TEST_CASE("held batches over the owner core: any order tried, every record once, in order, intact until finished",
          "[property][held]") {
  rc::prop("take, hold, finish or give back any held batch with any count", [] {
    const auto mode = *rc::gen::element(wire::PublishMode::imm, wire::PublishMode::tail);
    LoopbackFabric f(mode, 4096, 300);
    HeldBatches held;
    std::deque<std::vector<TakenRecord>> batches;  // the application's copies, oldest first
    constexpr std::uint64_t kRecords = 300;
    std::uint64_t sent = 0, handled_to = 0, refused = 0, given_back = 0;
    // One step: the producer sends what fits, the owner reads the publishes; the application
    // maybe takes a batch, then tries to end batch `which` with `handled` records handled.
    const auto step = [&](bool take, std::size_t max, std::size_t which, std::size_t handled) {
      while (sent < kRecords && f.producer->send(payload(sent), Clock::now())) ++sent;
      f.flush();
      f.deliver_publishes();
      if (take) {
        auto t = f.take(max);
        if (!t.empty()) batches.push_back(t);
        held.hold(std::move(t), {});
      }
      if (which < batches.size()) {
        const std::vector<TakenRecord>& b = batches[which];
        handled = std::min(handled, b.size());
        auto ok = held.remove(b, handled);
        const bool oldest = which == 0, newest = which + 1 == batches.size();
        RC_ASSERT(bool(ok) == ((oldest && handled == b.size()) || (newest && (handled == 0 || oldest))));
        if (!ok) {
          ++refused;
        } else {
          // What the application handled is checked only now: bytes still as sent prove that
          // nothing of the batch went back to the producer while it was held.
          for (std::size_t i = 0; i < handled; ++i) {
            RC_ASSERT(b[i].delivery.sequence == handled_to);
            RC_ASSERT(intact(b[i]));
            ++handled_to;
          }
          if (handled < b.size()) ++given_back;
          f.finish(ok.value().taken, handled);
          batches.erase(batches.begin() + static_cast<std::ptrdiff_t>(which));
        }
      }
      f.return_credit();
    };
    const int steps = *rc::gen::inRange(0, 200);
    for (int i = 0; i < steps; ++i)
      step(*rc::gen::arbitrary<bool>(), *rc::gen::inRange<std::size_t>(1, 12), *rc::gen::inRange<std::size_t>(0, 4),
           *rc::gen::inRange<std::size_t>(0, 13));
    // Then the application handles everything, oldest first.
    for (int i = 0; handled_to < kRecords && i < 10000; ++i) step(true, 8, 0, SIZE_MAX);
    RC_ASSERT(handled_to == kRecords);
    RC_CLASSIFY(refused > 0, "a finish out of order refused");
    RC_CLASSIFY(given_back > 0, "records given back");
  });
}
