// The ring owner's session rules without a device: admission by epoch and proof, replay fencing,
// the retry window after a lost resume reply, leases.
#include <catch2/catch.hpp>

#include "rdmaring/session_table.hpp"

using namespace rdmaring;
using namespace std::chrono_literals;

namespace {

struct Signed {
  SessionId id;
  std::uint64_t epoch;
  Proof proof;
  Credentials who() const { return Credentials{id, epoch, proof}; }
};

Signed sign(const SessionEntry& s, ProofPurpose p, std::uint64_t epoch) {
  return Signed{s.id, epoch, make_proof(s.secret, p, s.id, epoch)};
}

wire::ConnectData connect_for(const SessionEntry& s, std::uint64_t epoch) {
  return wire::ConnectData{s.id, epoch, make_proof(s.secret, ProofPurpose::connect, s.id, epoch), 0x1000, 7};
}

}  // namespace

TEST_CASE("a session admits one QP for its current epoch only", "[sessions]") {
  SessionTable t(4, 0ns);
  const auto now = SessionTable::Clock::now();
  const SessionEntry s = t.attach(now).value();
  CHECK(s.epoch == 1);
  CHECK(s.id != 0);
  REQUIRE(t.admit_connect(connect_for(s, 1), now));
  t.on_connected(s.id);
  // The same request again (a replay) finds the epoch's QP connected.
  CHECK(t.admit_connect(connect_for(s, 1), now).error() == errc::invalid_argument);
  CHECK(t.counters().refused_state == 1);
  // Epoch 2 does not exist yet.
  CHECK(t.admit_connect(connect_for(s, 2), now).error() == errc::stale_epoch);

  // A proof made with another secret, or for another purpose, is refused.
  auto forged = connect_for(s, 1);
  forged.proof[0] ^= std::byte{1};
  CHECK(t.admit_connect(forged, now).error() == errc::bad_proof);
  auto wrong_purpose = connect_for(s, 1);
  wrong_purpose.proof = make_proof(s.secret, ProofPurpose::resume, s.id, 1);
  CHECK(t.admit_connect(wrong_purpose, now).error() == errc::bad_proof);
  CHECK(t.counters().refused_proof == 2);
  CHECK(t.admit_connect(wire::ConnectData{s.id + 1, 1, {}, 0, 0}, now).error() == errc::unknown_session);
}

TEST_CASE("resume fences the epoch, and a replayed resume or connect of an old epoch is refused", "[sessions]") {
  SessionTable t(4, 0ns);
  const auto now = SessionTable::Clock::now();
  const SessionEntry s = t.attach(now).value();
  REQUIRE(t.admit_connect(connect_for(s, 1), now));
  t.on_connected(s.id);
  t.on_broken(s.id, 1);
  CHECK(t.find(s.id)->state == SessionState::broken);

  const auto resume1 = sign(s, ProofPurpose::resume, 1);
  CHECK(t.resume(resume1.who(), now).value() == 2);
  CHECK(t.find(s.id)->state == SessionState::resuming);
  // The reply was lost: the producer asks again from epoch 1, and is let in (epoch 3).
  CHECK(t.resume(resume1.who(), now).value() == 3);
  REQUIRE(t.admit_connect(connect_for(s, 3), now));
  t.on_connected(s.id);
  // Now it has shown it holds epoch 3: the epoch-1 message is a replay.
  CHECK(t.resume(resume1.who(), now).error() == errc::stale_epoch);
  CHECK(t.admit_connect(connect_for(s, 2), now).error() == errc::stale_epoch);
  CHECK(t.counters().refused_stale == 2);
  // A heartbeat or detach of an old epoch does nothing either.
  CHECK(t.heartbeat(sign(s, ProofPurpose::heartbeat, 1).who(), now).error() == errc::stale_epoch);
  CHECK(t.detach(sign(s, ProofPurpose::detach, 2).who()).error() == errc::stale_epoch);
  REQUIRE(t.detach(sign(s, ProofPurpose::detach, 3).who()));
  CHECK(t.resume(sign(s, ProofPurpose::resume, 3).who(), now).error() == errc::unknown_session);
}

TEST_CASE("a restored session continues after the epoch its producer names", "[sessions]") {
  SessionTable before(4, 0ns);
  const auto now = SessionTable::Clock::now();
  const SessionEntry s = before.attach(now).value();
  SessionTable after(4, 0ns);  // the owner restarted: it knows nothing
  const auto who = sign(s, ProofPurpose::resume, 5);
  CHECK(after.resume(who.who(), now).error() == errc::unknown_session);
  SessionSecret wrong = s.secret;
  wrong[3] ^= std::byte{0x80};
  CHECK(after.restore(who.who(), wrong, now).error() == errc::bad_proof);
  CHECK(after.restore(who.who(), s.secret, now).value() == 6);
  CHECK(after.admit_connect(connect_for(s, 6), now));
  CHECK(after.restore(who.who(), s.secret, now).error() == errc::invalid_argument);
}

TEST_CASE("leases expire without publishes or heartbeats, and capacity is bounded", "[sessions]") {
  SessionTable t(2, 100ms);
  const auto t0 = SessionTable::Clock::now();
  const SessionEntry a = t.attach(t0).value();
  const SessionEntry b = t.attach(t0).value();
  CHECK(t.attach(t0).error() == errc::no_capacity);
  t.touch(a.id, t0 + 80ms);
  REQUIRE(t.heartbeat(sign(b, ProofPurpose::heartbeat, 1).who(), t0 + 90ms));
  CHECK(t.expire(t0 + 150ms).empty());
  const auto gone = t.expire(t0 + 185ms);
  REQUIRE(gone.size() == 1);
  CHECK(gone[0] == a.id);
  CHECK(t.expire(t0 + 200ms).size() == 1);
  CHECK(t.size() == 0);
  CHECK(t.counters().expired == 2);
  CHECK(t.attach(t0 + 200ms));
}
