// The ring owner's session rules without a device: admission by epoch, proof, channel binding
// and identity, replay fencing, the retry window after a lost resume reply, the durable floor of
// a restore, leases.
#include <catch2/catch.hpp>

#include <string>

#include "rdmaring/control_connection.hpp"
#include "rdmaring/session_table.hpp"

using namespace rdmaring;
using namespace std::chrono_literals;

namespace {

constexpr std::string_view kProducer = "producer";

// A control message as it reaches the table: from `identity`, its proof bound to `binding`.
struct Signed {
  SessionId id;
  std::uint64_t epoch;
  Proof proof;
  std::string identity;
  std::optional<ChannelBinding> binding;
  Credentials who() const { return Credentials{id, epoch, proof, identity, binding}; }
};

// The first message on a fresh connection of `identity`.
Signed sign(const SessionEntry& s, ProofPurpose p, std::uint64_t epoch, std::string_view identity = kProducer) {
  const ChannelBinding b{random_nonce(), 1};
  return Signed{s.id, epoch, make_control_proof(s.secret, p, s.id, epoch, b), std::string(identity), b};
}

wire::ConnectData connect_for(const SessionEntry& s, std::uint64_t epoch) {
  return wire::ConnectData{s.id, epoch, make_proof(s.secret, ProofPurpose::connect, s.id, epoch), 0x1000, 7};
}

}  // namespace

TEST_CASE("a session admits one QP for its current epoch only", "[sessions]") {
  SessionTable t(4, 0ns);
  const auto now = SessionTable::Clock::now();
  const SessionEntry s = t.attach(kProducer, now).value();
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
  const SessionEntry s = t.attach(kProducer, now).value();
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
  const SessionEntry s = before.attach(kProducer, now).value();
  SessionTable after(4, 0ns);  // the owner restarted: it knows nothing
  const auto who = sign(s, ProofPurpose::resume, 5);
  CHECK(after.resume(who.who(), now).error() == errc::unknown_session);
  SessionSecret wrong = s.secret;
  wrong[3] ^= std::byte{0x80};
  CHECK(after.restore(who.who(), wrong, kProducer, 1, now).error() == errc::bad_proof);
  CHECK(after.restore(who.who(), s.secret, kProducer, 1, now).value() == 6);
  CHECK(after.find(s.id)->identity == kProducer);
  CHECK(after.admit_connect(connect_for(s, 6), now));
  CHECK(after.restore(who.who(), s.secret, kProducer, 1, now).error() == errc::invalid_argument);
  CHECK(after.counters().restores == 1);
}

TEST_CASE("a restore is admitted only from the durable record's identity, from its floor up", "[sessions]") {
  SessionTable before(4, 0ns);
  const auto now = SessionTable::Clock::now();
  const SessionEntry s = before.attach(kProducer, now).value();
  SessionTable after(4, 0ns);
  // Resumes the record's floor refuses: below it, the epochs the session left before the
  // owner restarted.
  const auto below = after.restore(sign(s, ProofPurpose::resume, 4).who(), s.secret, kProducer, 5, now);
  REQUIRE_FALSE(below);
  CHECK(below.error() == errc::stale_epoch);
  CHECK_THAT(below.error().message(), Catch::Contains("resume from epoch 4 below the durable floor 5"));
  CHECK(after.counters().refused_stale == 1);
  // Another identity with the secret: refused, after the proof (which holds).
  const auto other = after.restore(sign(s, ProofPurpose::resume, 5, "intruder").who(), s.secret, kProducer, 5, now);
  REQUIRE_FALSE(other);
  CHECK(other.error() == errc::unauthorized);
  CHECK_THAT(other.error().message(), Catch::Contains("belongs to 'producer', not 'intruder'"));
  CHECK(after.counters().refused_identity == 1);
  // A resume bound to no channel, or proved without its binding (a v3 producer's).
  Signed unbound = sign(s, ProofPurpose::resume, 5);
  unbound.binding.reset();
  CHECK(after.restore(unbound.who(), s.secret, kProducer, 5, now).error() == errc::unauthenticated);
  Signed plain = sign(s, ProofPurpose::resume, 5);
  plain.proof = make_proof(s.secret, ProofPurpose::resume, s.id, 5);
  CHECK(after.restore(plain.who(), s.secret, kProducer, 5, now).error() == errc::bad_proof);
  CHECK(after.size() == 0);
  // From the floor: in.
  CHECK(after.restore(sign(s, ProofPurpose::resume, 5).who(), s.secret, kProducer, 5, now).value() == 6);
  CHECK(after.find(s.id)->unconfirmed == 5u);
}

TEST_CASE("a control message proves its channel, and only the session's identity may send it", "[sessions]") {
  SessionTable t(4, 0ns);
  const auto now = SessionTable::Clock::now();
  const SessionEntry s = t.attach(kProducer, now).value();
  CHECK(s.identity == kProducer);
  REQUIRE(t.admit_connect(connect_for(s, 1), now));
  t.on_connected(s.id);

  SECTION("no binding: unauthenticated, whatever the proof") {
    Signed m = sign(s, ProofPurpose::heartbeat, 1);
    m.binding.reset();
    const auto got = t.heartbeat(m.who(), now);
    REQUIRE_FALSE(got);
    CHECK(got.error() == errc::unauthenticated);
    CHECK_THAT(got.error().message(), Catch::Contains("heartbeat without a channel binding: call hello first"));
    m.proof = make_proof(s.secret, ProofPurpose::heartbeat, s.id, 1);
    CHECK(t.heartbeat(m.who(), now).error() == errc::unauthenticated);
    CHECK(t.counters().refused_proof == 2);
  }
  SECTION("a proof over another nonce, another counter, or none: bad_proof") {
    const Signed m = sign(s, ProofPurpose::resume, 1);
    Signed other_nonce = m;
    other_nonce.binding->nonce[15] ^= std::byte{1};
    Signed other_counter = m;
    ++other_counter.binding->counter;
    Signed plain = m;
    plain.proof = make_proof(s.secret, ProofPurpose::resume, s.id, 1);
    for (const Signed* bad : {&other_nonce, &other_counter, &plain})
      CHECK(t.resume(bad->who(), now).error() == errc::bad_proof);
    // A connect proof is not a control proof, nor the other way round.
    auto bound_connect = connect_for(s, 1);
    bound_connect.proof = make_control_proof(s.secret, ProofPurpose::connect, s.id, 1, *m.binding);
    CHECK(t.admit_connect(bound_connect, now).error() == errc::bad_proof);
    CHECK(t.counters().refused_proof == 4);
    CHECK(t.find(s.id)->epoch == 1);
    CHECK(t.resume(m.who(), now).value() == 2);
  }
  SECTION("another identity: unauthorized, once its proof holds") {
    const auto got = t.detach(sign(s, ProofPurpose::detach, 1, "producer-2").who());
    REQUIRE_FALSE(got);
    CHECK(got.error() == errc::unauthorized);
    CHECK_THAT(got.error().message(),
               Catch::Contains("session " + std::to_string(s.id) + " belongs to 'producer', not 'producer-2'"));
    CHECK(t.counters().refused_identity == 1);
    // Without the proof it learns nothing of the session's owner.
    Signed forged = sign(s, ProofPurpose::detach, 1, "producer-2");
    forged.proof[0] ^= std::byte{1};
    CHECK(t.detach(forged.who()).error() == errc::bad_proof);
    CHECK(t.counters().refused_identity == 1);
    // The plaintext channel's identity is "" and is someone else's too.
    CHECK(t.heartbeat(sign(s, ProofPurpose::heartbeat, 1, "").who(), now).error() == errc::unauthorized);
    CHECK(t.size() == 1);
    REQUIRE(t.detach(sign(s, ProofPurpose::detach, 1).who()));
  }
}

TEST_CASE("a control connection refuses every counter it has passed", "[sessions]") {
  const ChannelNonce nonce = random_nonce();
  ControlConnection c("producer-7", nonce);
  CHECK(c.identity() == "producer-7");
  CHECK(c.nonce() == nonce);
  const auto first = c.bind(1);
  REQUIRE(first);
  CHECK(first.value().nonce == nonce);
  CHECK(first.value().counter == 1);
  CHECK(c.bind(1).error() == errc::bad_proof);
  REQUIRE(c.bind(5));
  const auto replay = c.bind(3);
  REQUIRE_FALSE(replay);
  CHECK(replay.error() == errc::bad_proof);
  CHECK_THAT(replay.error().message(), Catch::Contains("counter 3 after 5: a replay"));
  CHECK_FALSE(c.bind(5));
  CHECK(c.bind(6).value().counter == 6);
  ControlConnection fresh("", random_nonce());
  CHECK_FALSE(fresh.bind(0));  // counters start at 1
  CHECK(fresh.bind(1));
}

TEST_CASE("sessions held are counted per identity", "[sessions]") {
  SessionTable t(4, 100ms);
  const auto t0 = SessionTable::Clock::now();
  const SessionEntry a1 = t.attach("a", t0).value();
  const SessionEntry a2 = t.attach("a", t0 + 50ms).value();
  t.attach("b", t0).value();
  CHECK(t.held("a") == 2);
  CHECK(t.held("b") == 1);
  CHECK(t.held("") == 0);
  REQUIRE(t.detach(sign(a1, ProofPurpose::detach, 1, "a").who()));
  CHECK(t.held("a") == 1);
  t.touch(a2.id, t0 + 100ms);
  CHECK(t.expire(t0 + 150ms).size() == 1);  // b's
  CHECK(t.held("b") == 0);
  t.remove(a2.id);
  CHECK(t.held("a") == 0);
}

TEST_CASE("leases expire without publishes or heartbeats, and capacity is bounded", "[sessions]") {
  SessionTable t(2, 100ms);
  const auto t0 = SessionTable::Clock::now();
  const SessionEntry a = t.attach(kProducer, t0).value();
  const SessionEntry b = t.attach(kProducer, t0).value();
  CHECK(t.attach(kProducer, t0).error() == errc::no_capacity);
  t.touch(a.id, t0 + 80ms);
  REQUIRE(t.heartbeat(sign(b, ProofPurpose::heartbeat, 1).who(), t0 + 90ms));
  CHECK(t.expire(t0 + 150ms).empty());
  const auto gone = t.expire(t0 + 185ms);
  REQUIRE(gone.size() == 1);
  CHECK(gone[0] == a.id);
  CHECK(t.expire(t0 + 200ms).size() == 1);
  CHECK(t.size() == 0);
  CHECK(t.counters().expired == 2);
  CHECK(t.attach(kProducer, t0 + 200ms));
}
