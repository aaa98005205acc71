// Who gets in, on a real verbs device (protocol-spec/sessions.md §2.1, §2.8, §3, §7, §10): the
// control channel's mutual TLS, allow rules and quotas, proofs bound to their connection, and
// the durable epoch floor of a restarted owner. The test PKI is tests/pki/make-test-pki's.
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <sys/socket.h>
#include <unistd.h>


#include "owner_harness.hpp"
#include "producer_test_access.hpp"
#include "raw_control.hpp"
#include "rdmaring/producer.hpp"
#include "rdmaring/ring_owner.hpp"

using namespace rdmaring;
using namespace rdmaring::testing;
using namespace std::chrono_literals;

namespace {

template <class F>
Error setup_error(F&& f) {
  try {
    f();
  } catch (const SetupError& e) {
    WARN("refused: " << e.what());
    return e.error();
  }
  FAIL("it was let in");
  return {};
}

ProducerOptions as(const RingOwner& owner, ControlSecurity security) {
  ProducerOptions o = producer_options(owner);
  o.security = std::move(security);
  o.connect_timeout = 5s;
  return o;
}

}  // namespace

TEST_CASE("the control channel lets in only producers whose certificates the owner's CA signed", "[softroce][security]") {
  const auto owner = RingOwner::start(owner_options(wire::PublishMode::imm));
  CHECK_FALSE(owner->stats().insecure_plaintext);

  SECTION("plain TCP to a TLS owner: cut in the handshake, no Cap'n Proto message read") {
    RawControl raw;
    CHECK_THROWS(raw.hello(raw.connect(device_address(), owner->control_port(), std::nullopt)));
    CHECK(wait_for([&] { return owner->stats().handshakes_failed == 1; }, 15s));
    CHECK(owner->stats().control_calls == 0);
  }
  SECTION("TLS without a client certificate: refused in the handshake") {
    RawControl raw;
    bool refused = false;
    try {
      (void)raw.hello(raw.connect(device_address(), owner->control_port(), test_pki::producer(), false));
    } catch (const kj::Exception& e) {
      refused = true;
      INFO(e.getDescription().cStr());
    }
    CHECK(refused);
    CHECK(wait_for([&] { return owner->stats().handshakes_failed == 1; }, 15s));
    CHECK(owner->stats().control_calls == 0);
  }
  SECTION("a certificate from another CA: refused in the handshake") {
    const Error e = setup_error([&] { (void)Producer::attach(as(*owner, test_pki::producer("stranger"))); });
    CHECK(e == errc::control_failure);
    CHECK(wait_for([&] { return owner->stats().handshakes_failed == 1; }, 15s));
    CHECK(owner->stats().sessions.attaches == 0);
  }
  SECTION("a producer that does not trust the owner's certificate stops before sending anything") {
    ControlSecurity s = test_pki::producer();
    s.ca = test_pki::path("other-ca.pem");
    const Error e = setup_error([&] { (void)Producer::attach(as(*owner, s)); });
    CHECK(e == errc::control_failure);
    CHECK_THAT(e.message(), Catch::Contains("TLS handshake"));
    CHECK(owner->stats().control_calls == 0);
  }
  SECTION("an owner certificate that does not name the server name the producer expects") {
    ControlSecurity s = test_pki::producer();
    s.server_name = "some-other-owner";
    const Error e = setup_error([&] { (void)Producer::attach(as(*owner, s)); });
    CHECK(e == errc::control_failure);
    CHECK_THAT(e.message(), Catch::Contains("some-other-owner"));
  }
  SECTION("a certificate without a subject common name: unauthenticated") {
    const Error e = setup_error([&] { (void)Producer::attach(as(*owner, test_pki::producer("nameless"))); });
    CHECK(e == errc::unauthenticated);
  }
  SECTION("the producer's certificate: attached, its records delivered") {
    Auditor audit(*owner);
    Producer p = Producer::attach(as(*owner, test_pki::producer()));
    CHECK(owner->session_count() == 1);
    REQUIRE(send_records(p, 100));
    const auto detached = p.detach(30s);
    INFO((detached ? std::string() : detached.error().message()));
    REQUIRE(detached);
    audit.stop();
    CHECK(audit.wrong() == 0);
    CHECK(audit.delivered() == 100);
  }
}

TEST_CASE("allow rules and quotas decide who may attach and how much", "[softroce][security]") {
  auto o = owner_options(wire::PublishMode::imm);
  o.allow = {IdentityRule{"producer-a", 2, 0}};
  const auto owner = RingOwner::start(o);

  const Error b = setup_error([&] { (void)Producer::attach(as(*owner, test_pki::producer("producer-b"))); });
  CHECK(b == errc::unauthorized);
  CHECK_THAT(b.message(), Catch::Contains("producer-b"));

  Producer first = Producer::attach(as(*owner, test_pki::producer()));
  std::optional<Producer> second = Producer::attach(as(*owner, test_pki::producer()));
  const Error third = setup_error([&] { (void)Producer::attach(as(*owner, test_pki::producer())); });
  CHECK(third == errc::quota_exceeded);
  CHECK_THAT(third.message(), Catch::Contains("producer-a"));
  CHECK(owner->session_count() == 2);

  // A session is its identity's: another identity cannot take it over, even with its secret.
  auto o2 = owner_options(wire::PublishMode::imm);
  o2.allow = {IdentityRule{"producer-*", 0, 0}};
  const auto shared = RingOwner::start(o2);
  SessionCredentials a_session;
  {
    Producer a = Producer::attach(as(*shared, test_pki::producer()));
    a_session = a.credentials();
  }
  const Error taken = setup_error([&] { (void)Producer::rejoin(as(*shared, test_pki::producer("producer-b")), a_session); });
  CHECK(taken == errc::unauthorized);

  // The quota frees with the session.
  REQUIRE(second->detach(30s));
  second.reset();
  REQUIRE(wait_for([&] { return owner->session_count() == 1; }, 10s));
  Producer again = Producer::attach(as(*owner, test_pki::producer()));
  CHECK(owner->session_count() == 2);
}

TEST_CASE("captured control messages replayed on another connection or twice are refused, and the live session goes on",
          "[softroce][security]") {
  const auto owner = RingOwner::start(owner_options(wire::PublishMode::imm));
  Auditor audit(*owner);
  Producer p = Producer::attach(producer_options(*owner));
  REQUIRE(send_records(p, 500));
  const SessionCredentials c = p.credentials();

  // What a capture holds: messages the producer sent on its connection A (their proofs cover
  // A's nonce and counters). The "replayer" sends the same bytes on its own connection B.
  RawControl raw;
  const auto a = raw.connect(device_address(), owner->control_port(), test_pki::producer());
  const auto channel_a = raw.hello(a);
  REQUIRE(channel_a);
  CHECK(channel_a.value().identity == "producer-a");
  const auto resume = RawControl::sign(c.secret, ProofPurpose::resume, c.session, c.epoch, channel_a.value(), 1);
  const auto beat = RawControl::sign(c.secret, ProofPurpose::heartbeat, c.session, c.epoch, channel_a.value(), 2);
  const auto bye = RawControl::sign(c.secret, ProofPurpose::detach, c.session, c.epoch, channel_a.value(), 3);

  const auto b = raw.connect(device_address(), owner->control_port(), test_pki::producer());
  REQUIRE(raw.hello(b));
  const auto proof_refusals = owner->stats().sessions.refused_proof;
  auto r1 = raw.resume(b, resume);
  REQUIRE_FALSE(r1);
  CHECK(r1.error() == errc::bad_proof);
  auto r2 = raw.heartbeat(b, beat);
  REQUIRE_FALSE(r2);
  CHECK(r2.error() == errc::bad_proof);
  auto r3 = raw.detach(b, bye);
  REQUIRE_FALSE(r3);
  CHECK(r3.error() == errc::bad_proof);
  CHECK(owner->stats().sessions.refused_proof == proof_refusals + 3);

  // On A itself: the heartbeat is taken once; the same bytes again are a replay.
  REQUIRE(raw.heartbeat(a, beat));
  auto again = raw.heartbeat(a, beat);
  REQUIRE_FALSE(again);
  CHECK(again.error() == errc::bad_proof);
  CHECK_THAT(again.error().message(), Catch::Contains("replay"));
  // A message without a hello on its connection proves nothing.
  const auto c3 = raw.connect(device_address(), owner->control_port(), test_pki::producer());
  auto no_hello = raw.heartbeat(c3, beat);
  REQUIRE_FALSE(no_hello);
  CHECK(no_hello.error() == errc::unauthenticated);

  // The session never moved: same epoch, its QP never fenced, its records all delivered.
  CHECK(owner->stats().sessions.resumes == 0);
  CHECK(p.credentials().epoch == c.epoch);
  REQUIRE(send_records(p, 1000));
  REQUIRE(p.detach(30s));
  audit.stop();
  INFO(audit.error());
  CHECK(audit.wrong() == 0);
  CHECK(audit.delivered() == 1000);
}

TEST_CASE("a producer of another protocol version is refused by name at hello and attach, and the owner goes on",
          "[softroce][security]") {
  // v4's records are 64-byte aligned behind a 24-byte header: a v4 producer admitted to a v5
  // ring would write records the owner reads as lies. It must hear why, before any ring is cut.
  const auto owner = RingOwner::start(owner_options(wire::PublishMode::imm));
  RawControl raw;
  const auto c = raw.connect(device_address(), owner->control_port(), test_pki::producer());
  for (const std::uint32_t version : {wire::kVersion - 1, wire::kVersion + 1, 0u}) {
    INFO("version " << version);
    const std::string why = "producer speaks rdmaring v" + std::to_string(version) + ", this owner v" +
                            std::to_string(wire::kVersion);
    const auto hello = raw.hello(c, version);
    REQUIRE_FALSE(hello);
    CHECK(hello.error() == errc::protocol_violation);
    CHECK_THAT(hello.error().message(), Catch::Contains(why));
    const auto attach = raw.attach(c, version);
    REQUIRE_FALSE(attach);
    CHECK(attach.error() == errc::protocol_violation);
    CHECK_THAT(attach.error().message(), Catch::Contains(why));
  }
  CHECK(owner->stats().sessions.attaches == 0);
  // The same connection, at this version, is served.
  REQUIRE(raw.hello(c));
  REQUIRE(raw.attach(c));
  CHECK(owner->stats().sessions.attaches == 1);
}

TEST_CASE("a restarted owner refuses a resume from below the session's durable epoch floor", "[softroce][security]") {
  DurableStore store;
  auto o = owner_options(wire::PublishMode::imm);
  store.serve(o);
  auto owner = RingOwner::start(o);
  o.control_port = owner->control_port();
  o.data_port = owner->data_port();
  SessionCredentials first;
  {
    Producer p = Producer::attach(producer_options(*owner));
    first = p.credentials();
    // Two recoveries: epoch 3 connects, so the floor rises to 3.
    for (int i = 0; i < 2; ++i) {
      REQUIRE(ProducerTestAccess::force_error(p));
      REQUIRE(p.recover());
    }
    CHECK(p.credentials().epoch == 3);
    REQUIRE(wait_for([&] { return store.find(first.session).value_or(DurableSession{}).min_epoch == 3; }, 10s));
  }
  REQUIRE(store.find(first.session));
  CHECK(store.find(first.session)->identity == "producer-a");
  owner.reset();
  owner = RingOwner::start(o);
  // The holder of the secret, resuming from epoch 1 (a capture from long ago, made valid for this
  // connection): below the floor.
  const Error stale = setup_error([&] { (void)Producer::rejoin(producer_options(*owner), first); });
  CHECK(stale == errc::stale_epoch);
  // Another identity with the right secret and epoch: not its session.
  SessionCredentials current = first;
  current.epoch = 3;
  auto b = producer_options(*owner);
  b.security = test_pki::producer("producer-b");
  CHECK(setup_error([&] { (void)Producer::rejoin(b, current); }) == errc::unauthorized);
  // The producer itself, from its epoch: restored.
  Producer back = Producer::rejoin(producer_options(*owner), current);
  CHECK(back.credentials().epoch == 4);
  CHECK(owner->stats().sessions.restores == 1);
}

TEST_CASE("without TLS material an owner or producer refuses to start unless plain TCP is asked for by name",
          "[softroce][security][readme]") {
  auto o = owner_options(wire::PublishMode::imm);
  o.security = {};
  const Error e = setup_error([&] { (void)RingOwner::start(o); });
  CHECK(e == errc::bad_config);
  CHECK_THAT(e.message(), Catch::Contains("insecure_plaintext"));
  o.security.insecure_plaintext = true;
  const auto plain = RingOwner::start(o);
  CHECK(plain->stats().insecure_plaintext);
  CHECK_THAT(plain->metrics(), Catch::Contains("rdmaring_owner_control_insecure_plaintext 1"));
  ProducerOptions p = producer_options(*plain);
  p.security = {};
  CHECK(setup_error([&] { (void)Producer::attach(p); }) == errc::bad_config);
  // A TLS producer against a plain owner: the handshake fails; it never speaks plain by itself.
  CHECK(setup_error([&] { (void)Producer::attach(producer_options(*plain)); }) == errc::control_failure);
  p.security.insecure_plaintext = true;
  Producer ok = Producer::attach(p);
  CHECK(plain->session_count() == 1);
  // Material that does not load is named.
  auto bad = owner_options(wire::PublishMode::imm);
  bad.security.private_key = test_pki::path("producer-a.key");
  const Error mismatch = setup_error([&] { (void)RingOwner::start(bad); });
  CHECK(mismatch == errc::bad_config);
  CHECK_THAT(mismatch.message(), Catch::Contains("does not belong to the certificate"));
  bad.security.private_key = "/no/such/key.pem";
  CHECK_THAT(setup_error([&] { (void)RingOwner::start(bad); }).message(), Catch::Contains("/no/such/key.pem"));
}
