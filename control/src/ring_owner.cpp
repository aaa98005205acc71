#include "rdmaring/ring_owner.hpp"

#include <capnp/rpc-twoparty.h>
#include <kj/async-unix.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <optional>

#include "control_tls.hpp"
#include "rdmaring/control_connection.hpp"
#include "event_loop_thread.hpp"
#include "messages.hpp"
#include "rdmaring/metrics_text.hpp"
#include "rdmaring/owner_data_plane.hpp"
#include "ring_owner_test_access.hpp"

namespace rdmaring {
namespace {

using Clock = std::chrono::steady_clock;

OwnerConfig core_config(const RingOwnerOptions& o) {
  OwnerConfig c;
  c.ring_bytes = o.ring_bytes;
  c.max_record = o.max_record;
  c.mode = o.mode;
  c.max_sessions = o.max_sessions;
  c.lease = std::chrono::duration_cast<std::chrono::nanoseconds>(o.lease);
  c.quantum_bytes = o.quantum_bytes;
  c.tail_park_reads = o.tail_park_reads;
  c.core = o.core;
  c.allow = o.allow;
  return c;
}

// A TLS handshake that has not finished by then is cut: a peer that stalls in it holds one
// connection, not the owner.
constexpr std::chrono::milliseconds kHandshakeTimeout = std::chrono::seconds(10);

}  // namespace

Result<void> RingOwnerOptions::validate() const {
  BOOST_OUTCOME_TRYV(core_config(*this).validate());
  if (relaxed_ordering && mode == wire::PublishMode::tail)
    return make_error(errc::relaxed_ordering_refused,
                      "relaxed ordering with publish mode tail: the tail record's write may land before the payload "
                      "it publishes, and the consumer would read a record that is not there yet; use mode imm");
  if (relaxed_ordering && core.payload_check == wire::PayloadCheck::none)
    return make_error(errc::relaxed_ordering_refused,
                      "relaxed ordering with payload check none: placement order is then up to the fabric, and the "
                      "payload CRC is the only check that would see a record whose bytes have not all landed; keep "
                      "payload_check crc32c");
  // Both modes: immediates publish in mode imm, doorbells wake the owner in mode tail.
  if (recv_depth < 2 * kRecvRepostBatch)
    return make_error(errc::bad_config, "recv_depth " + std::to_string(recv_depth) + " below " +
                                            std::to_string(2 * kRecvRepostBatch));
  if (address.empty()) return make_error(errc::bad_config, "no address: the owner listens on one RDMA device's address");
  BOOST_OUTCOME_TRYV(security.validate(true));
  if (security.insecure_plaintext && !allow.empty())
    return make_error(errc::bad_config,
                      "allow rules with insecure_plaintext: a plain TCP channel authenticates no identity to match");
  return success();
}

struct RingOwner::State {
  RingOwnerOptions options;
  OwnerDataPlane data;
  std::uint16_t control_port = 0;
  std::atomic<std::uint64_t> control_calls{0};
  std::atomic<std::uint64_t> control_task_failures{0};
  std::atomic<std::uint64_t> handshakes_failed{0};
  mutable std::mutex handshake_mutex;
  std::string last_handshake_failure;  // under handshake_mutex

  // Control-thread objects; the thread is the last member, so it stops before the rest go.
  std::optional<control::ControlTls> tls;  // none: insecure_plaintext
  kj::Own<kj::ConnectionReceiver> control_listener;
  kj::Own<kj::TaskSet> tasks;
  kj::Own<kj::UnixEventPort::FdObserver> cm_observer;
  kj::Own<kj::UnixEventPort::FdObserver> async_observer;
  struct TaskErrors;
  kj::Own<TaskErrors> task_errors;
  std::optional<control::EventLoopThread> loop;

  explicit State(const RingOwnerOptions& o)
      : options(o),
        data(OwnerDataPlaneOptions{o.address, o.data_port, o.relaxed_ordering, o.on_demand_paging, o.recv_depth,
                                   core_config(o), o.on_session_closed, o.on_session}) {}

  control::RingGrant grant(const Granted& g) const;
  kj::Promise<void> watch_cm();
  kj::Promise<void> watch_async();
  kj::Promise<void> accept_control();
  kj::Promise<void> serve(kj::AuthenticatedStream stream);
  kj::Promise<void> serve_channel(kj::Own<kj::AsyncIoStream> stream, std::optional<std::string> identity);
  kj::Promise<void> expire_leases(kj::Timer& timer);
};

struct RingOwner::State::TaskErrors final : kj::TaskSet::ErrorHandler {
  State& s;
  explicit TaskErrors(State& state) : s(state) {}
  void taskFailed(kj::Exception&&) override { s.control_task_failures.fetch_add(1, std::memory_order_relaxed); }
};

control::RingGrant RingOwner::State::grant(const Granted& granted) const {
  control::RingGrant g;
  g.session = granted.session.id;
  g.secret = granted.session.secret;
  g.mode = options.mode;
  g.relaxed_ordering = options.relaxed_ordering;
  g.ring_addr = granted.keys.ring_addr;
  g.ring_rkey = granted.keys.ring_rkey;
  g.ring_bytes = options.ring_bytes;
  g.max_record = options.max_record;
  g.tail_addr = granted.keys.tail_addr;
  g.tail_rkey = granted.keys.tail_rkey;
  g.at = granted.at;
  g.data_port = data.data_port();
  g.lease = options.lease;
  g.payload_check = options.core.payload_check;
  // The shared SRQ's receives, divided among as many sessions as the owner admits
  // (sessions.md §2.4.1); mode tail consumes none.
  if (options.mode == wire::PublishMode::imm) g.recv_budget = std::max<std::uint32_t>(1, options.recv_depth / options.max_sessions);
  return g;
}

kj::Promise<void> RingOwner::State::watch_cm() {
  return cm_observer->whenBecomesReadable().then([this] {
    data.on_cm_readable();
    return watch_cm();
  });
}

kj::Promise<void> RingOwner::State::watch_async() {
  return async_observer->whenBecomesReadable().then([this] {
    data.on_async_readable();
    return watch_async();
  });
}

kj::Promise<void> RingOwner::State::expire_leases(kj::Timer& timer) {
  const auto period = std::max<std::int64_t>(options.lease.count() / 4, 1) * kj::MILLISECONDS;
  return timer.afterDelay(period).then([this, &timer] {
    data.tick(Clock::now());
    return expire_leases(timer);
  });
}

// ---- the control channel (control thread) -----------------------------------------------------

namespace {

// One control connection: who its channel authenticated, and (after hello) the nonce its
// proofs must cover.
class Service final : public control::schema::RingService::Server {
 public:
  Service(RingOwner::State& s, std::optional<std::string> identity) : s_(s), identity_(std::move(identity)) {}

 protected:
  kj::Promise<void> attach(AttachContext context) override;
  kj::Promise<void> resume(ResumeContext context) override;
  kj::Promise<void> heartbeat(HeartbeatContext context) override;
  kj::Promise<void> detach(DetachContext context) override;
  kj::Promise<void> hello(HelloContext context) override;

 private:
  // Errors: unauthenticated (a certificate that names nobody); protocol_violation (version).
  Result<void> admit(std::uint32_t version) const;
  // The caller's credentials with this connection's identity and binding. Errors: read's;
  // unauthenticated (no hello yet); bad_proof (a counter already used: a replay).
  Result<Credentials> caller(control::schema::Credentials::Reader in);

  RingOwner::State& s_;
  std::optional<std::string> identity_;  // nullopt: a TLS certificate without a common name
  std::optional<ControlConnection> channel_;
};

}  // namespace

kj::Promise<void> RingOwner::State::accept_control() {
  return control_listener->acceptAuthenticated().then([this](kj::AuthenticatedStream&& stream) {
    // Served as a task of its own: a peer that stalls its handshake holds only its connection.
    tasks->add(serve(kj::mv(stream)));
    return accept_control();
  });
}

kj::Promise<void> RingOwner::State::serve(kj::AuthenticatedStream stream) {
  if (!tls) return serve_channel(kj::mv(stream.stream), std::string());
  return tls->accept(kj::mv(stream))
      .then(
          [this](kj::AuthenticatedStream&& s) {
            auto identity = control::identity_of(*s.peerIdentity);
            return serve_channel(kj::mv(s.stream), kj::mv(identity));
          },
          [this](kj::Exception&& e) -> kj::Promise<void> {
            // No certificate, one the CA did not sign, an old TLS version, or a stall: nothing
            // was read from this peer.
            {
              std::lock_guard lock(handshake_mutex);
              last_handshake_failure = e.getDescription().cStr();
            }
            handshakes_failed.fetch_add(1, std::memory_order_relaxed);
            return kj::READY_NOW;
          });
}

kj::Promise<void> RingOwner::State::serve_channel(kj::Own<kj::AsyncIoStream> stream,
                                                  std::optional<std::string> identity) {
  struct Client {
    kj::Own<kj::AsyncIoStream> stream;
    capnp::TwoPartyVatNetwork network;
    capnp::RpcSystem<capnp::rpc::twoparty::VatId> rpc;
    Client(kj::Own<kj::AsyncIoStream> s, RingOwner::State& state, std::optional<std::string> identity)
        : stream(kj::mv(s)),
          network(*stream, capnp::rpc::twoparty::Side::SERVER,
                  capnp::ReaderOptions{control::kTraversalLimitWords, control::kNestingLimit}),
          rpc(capnp::makeRpcServer(network, kj::heap<Service>(state, std::move(identity)))) {}
  };
  auto client = kj::heap<Client>(kj::mv(stream), *this, std::move(identity));
  auto ended = client->network.onDisconnect();
  return ended.attach(kj::mv(client));
}

namespace {

template <class Reply>
void refuse(Reply reply, const Error& e) {
  control::write(reply.initRefused(), e);
}

}  // namespace

Result<void> Service::admit(std::uint32_t version) const {
  if (!identity_)
    return make_error(errc::unauthenticated, "the producer's certificate has no subject common name: no identity");
  if (version != wire::kVersion)
    return make_error(errc::protocol_violation, "producer speaks rdmaring v" + std::to_string(version) +
                                                    ", this owner v" + std::to_string(wire::kVersion));
  return success();
}

// A refusal for a version this owner does not speak says so by code, not only by text.
template <class Reply>
void refuse_admission(Reply reply, const Error& e) {
  refuse(reply, e);
  if (e == errc::protocol_violation) reply.getRefused().setCode(control::schema::Refusal::Code::VERSION_MISMATCH);
}

Result<Credentials> Service::caller(control::schema::Credentials::Reader in) {
  BOOST_OUTCOME_TRY(c, control::read(in));
  if (!identity_)
    return make_error(errc::unauthenticated, "the producer's certificate has no subject common name: no identity");
  if (!channel_)
    return make_error(errc::unauthenticated, "no hello on this connection: its nonce is what every proof covers");
  BOOST_OUTCOME_TRY(binding, channel_->bind(in.getCounter()));
  c.identity = *identity_;
  c.binding = binding;
  return c;
}

kj::Promise<void> Service::hello(HelloContext context) {
  auto reply = context.getResults().initReply();
  s_.control_calls.fetch_add(1, std::memory_order_relaxed);
  if (auto ok = admit(context.getParams().getVersion()); !ok) {
    refuse_admission(reply, ok.error());
    return kj::READY_NOW;
  }
  // A second hello starts over: the proofs of the first nonce are no longer accepted here.
  channel_.emplace(*identity_, random_nonce());
  control::write(reply.initChannel(), control::Channel{channel_->nonce(), *identity_});
  return kj::READY_NOW;
}

kj::Promise<void> Service::attach(AttachContext context) {
  const auto params = context.getParams();
  auto reply = context.getResults().initReply();
  s_.control_calls.fetch_add(1, std::memory_order_relaxed);
  if (auto ok = admit(params.getVersion()); !ok) {
    refuse_admission(reply, ok.error());
    return kj::READY_NOW;
  }
  auto granted = s_.data.attach(*identity_, Clock::now());
  if (!granted) {
    refuse(reply, granted.error());
    return kj::READY_NOW;
  }
  control::write(reply.initGrant(), s_.grant(granted.value()), true);
  return kj::READY_NOW;
}

kj::Promise<void> Service::resume(ResumeContext context) {
  const auto params = context.getParams();
  auto reply = context.getResults().initReply();
  s_.control_calls.fetch_add(1, std::memory_order_relaxed);
  auto who = caller(params.getWho());
  if (!who) {
    refuse(reply, who.error());
    return kj::READY_NOW;
  }
  const Credentials c = who.value();
  // The application's store is asked without any lock: it may be slow (a disk, a database).
  std::optional<DurableSession> durable;
  if (s_.options.restore && !s_.data.knows(c.session)) durable = s_.options.restore(c.session);
  const auto granted = durable && !s_.data.knows(c.session)
                           ? s_.data.restore(c, *durable, params.getRestarted(), params.getReleased(),
                                             params.getReleasedSequence(), Clock::now())
                           : s_.data.resume(c, Clock::now());
  if (!granted) {
    refuse(reply, granted.error());
    return kj::READY_NOW;
  }
  control::write(reply.initGrant(), s_.grant(granted.value()), false);
  return kj::READY_NOW;
}

kj::Promise<void> Service::heartbeat(HeartbeatContext context) {
  auto results = context.getResults();
  s_.control_calls.fetch_add(1, std::memory_order_relaxed);
  auto who = caller(context.getParams().getWho());
  const auto ok = who ? s_.data.heartbeat(who.value(), Clock::now()) : Result<void>(who.error());
  results.setOk(bool(ok));
  if (!ok) control::write(results.initRefused(), ok.error());
  return kj::READY_NOW;
}

kj::Promise<void> Service::detach(DetachContext context) {
  auto results = context.getResults();
  s_.control_calls.fetch_add(1, std::memory_order_relaxed);
  auto who = caller(context.getParams().getWho());
  const auto ok = who ? s_.data.detach(who.value()) : Result<void>(who.error());
  results.setOk(bool(ok));
  if (!ok) control::write(results.initRefused(), ok.error());
  return kj::READY_NOW;
}

// ---- life cycle --------------------------------------------------------------------------------

std::unique_ptr<RingOwner> RingOwner::start(const RingOwnerOptions& options) {
  if (auto ok = options.validate(); !ok) throw SetupError(ok.error());
  auto s = std::make_unique<State>(options);
  State& st = *s;
  st.loop.emplace(
      [&st](kj::AsyncIoContext& io) {
        if (!st.options.security.insecure_plaintext)
          st.tls.emplace(st.options.security, true, io.provider->getTimer(), kHandshakeTimeout);
        auto address = io.provider->getNetwork().parseAddress(st.options.address, st.options.control_port).wait(io.waitScope);
        st.control_listener = address->listen();
        st.control_port = static_cast<std::uint16_t>(st.control_listener->getPort());
        st.task_errors = kj::heap<State::TaskErrors>(st);
        st.tasks = kj::heap<kj::TaskSet>(*st.task_errors);
        st.tasks->add(st.accept_control());
        st.cm_observer = kj::heap<kj::UnixEventPort::FdObserver>(io.unixEventPort, st.data.cm_fd(),
                                                                   kj::UnixEventPort::FdObserver::OBSERVE_READ);
        st.tasks->add(st.watch_cm());
        st.async_observer = kj::heap<kj::UnixEventPort::FdObserver>(io.unixEventPort, st.data.async_fd(),
                                                                      kj::UnixEventPort::FdObserver::OBSERVE_READ);
        st.tasks->add(st.watch_async());
        if (st.options.lease.count() > 0) st.tasks->add(st.expire_leases(io.provider->getTimer()));
      },
      [&st] {
        st.tasks = nullptr;
        st.cm_observer = nullptr;
        st.async_observer = nullptr;
        st.control_listener = nullptr;
        st.tls.reset();
      },
      "rdmaring-owner");
  if (options.security.insecure_plaintext)
    std::fprintf(stderr, "rdmaring: ring owner on %s control port %u: PLAIN TCP (insecure_plaintext): anyone who "
                 "reads this channel can act as any producer\n", options.address.c_str(), unsigned(st.control_port));
  return std::unique_ptr<RingOwner>(new RingOwner(std::move(s)));
}

RingOwner::RingOwner(std::unique_ptr<State> s) noexcept : s_(std::move(s)) {}

// The control thread stops first; the data plane then ends every session.
RingOwner::~RingOwner() { s_->loop.reset(); }

std::uint16_t RingOwner::control_port() const { return s_->control_port; }
std::uint16_t RingOwner::data_port() const { return s_->data.data_port(); }

Result<std::span<const TakenRecord>> RingOwner::begin_poll(std::size_t max) { return s_->data.begin_poll(max); }
std::size_t RingOwner::end_poll(std::size_t handled) noexcept { return s_->data.end_poll(handled); }
Result<std::vector<TakenRecord>> RingOwner::take(std::size_t max) { return s_->data.take(max); }
Result<void> RingOwner::finish(std::span<const TakenRecord> batch, std::size_t handled) {
  return s_->data.finish(batch, handled);
}
Result<RingShare> RingOwner::ring_of(const TakenRecord& held) const { return s_->data.ring_of(held); }
Result<bool> RingOwner::wait(std::chrono::milliseconds timeout) { return s_->data.wait(timeout); }
Result<bool> RingOwner::arm() { return s_->data.arm(); }
int RingOwner::fd() const { return s_->data.fd(); }
void RingOwner::wake() const { s_->data.wake(); }

std::size_t RingOwner::session_count() const {
  return s_->data.inspect([](const OwnerCore& core, const DataPlaneCounters&) { return core.table().size(); });
}

RingOwnerStats RingOwner::stats() const {
  RingOwnerStats out = s_->data.inspect([](const OwnerCore& core, const DataPlaneCounters& dp) {
    RingOwnerStats st;
    const OwnerCounters& c = core.counters();
    st.device = dp.device;
    st.sessions = core.table().counters();
    st.restore_gaps = c.restore_gaps;
    st.refused_unauthorized = c.refused_unauthorized;
    st.refused_quota = c.refused_quota;
    st.handler_aborts = c.handler_aborts;
    st.session_visits = c.session_visits;
    st.tail_reads = c.tail_reads;
    st.parks = c.parks;
    st.connect_refused = c.connect_refused + dp.malformed_connects;
    st.sessions_failed = c.sessions_failed;
    st.recv_completions = dp.recv_completions;
    st.recv_posts = dp.recv_posts;
    st.credit_posts = c.credit_posts;
    st.credit_post_failures = dp.credit_post_failures;
    st.sleeps = dp.sleeps;
    st.stale_completions = dp.stale_completions;
    st.error_completions = c.error_completions;
    st.completion_errors = dp.completion_errors;
    st.last_session_failure = c.last_session_failure;
    st.rings = c.closed_rings;
    for (SessionId id : core.session_ids()) {
      const ConsumerCore& ring = *core.consumer(id);
      st.rings += ring.counters();
      const SessionEntry* e = core.table().find(id);
      st.per_session.push_back(SessionStats{id, e ? e->epoch : 0, e ? e->state : SessionState::broken,
                                            ring.counters(), ring.ledger()});
    }
    return st;
  });
  const OwnerDataPlane::Registered registered = s_->data.registered();
  out.registered = registered.footprint;
  out.rings_outliving_sessions = registered.outliving;
  out.async_events = s_->data.async_event_counts();
  out.control_calls = s_->control_calls.load(std::memory_order_relaxed);
  out.control_task_failures = s_->control_task_failures.load(std::memory_order_relaxed);
  out.insecure_plaintext = s_->options.security.insecure_plaintext;
  out.handshakes_failed = s_->handshakes_failed.load(std::memory_order_relaxed);
  {
    std::lock_guard lock(s_->handshake_mutex);
    out.last_handshake_failure = s_->last_handshake_failure;
  }
  return out;
}

std::string RingOwner::metrics() const {
  const RingOwnerStats s = stats();
  MetricsText m;
  const auto& t = s.sessions;
  m.counter("owner_attaches_total", "Sessions attached", t.attaches);
  m.counter("owner_resumes_total", "Resumes admitted (each a new epoch and rkey)", t.resumes);
  m.counter("owner_restores_total", "Sessions restored from the application's durable record", t.restores);
  m.counter("owner_qp_connects_total", "Producer QPs admitted and established", t.connects);
  m.counter("owner_detaches_total", "Sessions detached", t.detaches);
  m.counter("owner_leases_expired_total", "Sessions closed for lack of publishes or heartbeats", t.expired);
  m.counter("owner_sessions_failed_total", "Sessions closed because their producer broke the protocol", s.sessions_failed);
  for (const auto& [reason, n] : {std::pair{"unknown_session", t.refused_unknown}, {"bad_proof", t.refused_proof},
                                  {"stale_epoch", t.refused_stale}, {"already_connected", t.refused_state},
                                  {"no_capacity", t.refused_capacity}, {"unauthorized_identity", t.refused_identity},
                                  {"unauthorized", s.refused_unauthorized}, {"quota_exceeded", s.refused_quota}})
    m.counter("owner_refusals_total", "Control messages and connect requests refused", n, {{"reason", reason}});
  m.counter("owner_connect_refused_total", "Connect requests rejected", s.connect_refused);
  m.counter("owner_handler_give_backs_total", "Give-backs: for each session, each poll that left its records for the next (abort, stop, a handler that threw)",
            s.handler_aborts);
  m.counter("owner_session_visits_total",
            "Sessions the data path looked at for a delivery, a credit or a doorbell flag (grows with busy sessions, not attached ones)",
            s.session_visits);
  m.counter("owner_tail_reads_total", "Mode tail: tail records read (a parked session's only after its doorbell)",
            s.tail_reads);
  m.counter("owner_parks_total", "Mode tail: quiet sessions parked (asked for doorbells, their tails no longer polled)",
            s.parks);
  m.counter("owner_credit_post_failures_total", "Credit posts a session's QP refused (its link broke)",
            s.credit_post_failures);
  m.counter("owner_control_calls_total", "Control-channel calls served", s.control_calls);
  m.gauge("owner_control_insecure_plaintext", "1: the control channel is plain TCP (insecure_plaintext), 0: mutual TLS",
          s.insecure_plaintext ? 1.0 : 0.0);
  m.counter("owner_tls_handshakes_failed_total", "TLS handshakes refused or cut: no certificate, an untrusted one, a timeout",
            s.handshakes_failed);
  m.counter("owner_records_total", "Records delivered", s.rings.records);
  m.counter("owner_payload_bytes_total", "Payload bytes delivered", s.rings.payload_bytes);
  m.counter("owner_publishes_total", "Publish events (immediates, tail records) that moved a mark", s.rings.publishes);
  m.counter("owner_credit_writes_total", "Credit write-backs posted", s.rings.credit_writes);
  m.counter("owner_credit_requests_total", "Credit requests seen", s.rings.credit_requests);
  m.counter("owner_stale_epoch_publishes_total", "Publishes of another epoch, ignored", s.rings.stale_epoch);
  m.counter("owner_duplicates_dropped_total", "Records below a restored session's durable sequence, not delivered",
            s.rings.duplicates_dropped);
  m.counter("owner_recv_completions_total", "Receive completions (immediates, doorbells)", s.recv_completions);
  m.counter("owner_sleeps_total", "Waits that armed the completion queue and slept", s.sleeps);
  m.counter("owner_doorbells_total", "Doorbells received (mode tail: a producer woke the owner)", s.rings.doorbells);
  m.counter("owner_doorbell_flag_writes_total", "Credit records written to set or clear a producer's doorbell flag",
            s.rings.doorbell_flag_writes);
  m.counter("owner_stale_completions_total", "Completions of a QP that is gone", s.stale_completions);
  m.counters("owner_completion_errors_total", "Error completions by status", s.completion_errors, "status");
  m.counters("owner_async_events_total", "Asynchronous device events, acknowledged", s.async_events, "type");
  m.registrations("owner", s.device, s.registered.regions, s.registered.bytes);
  m.gauge("owner_rings_outliving_sessions",
          "Rings kept past their session's end by a held batch, a poll or a ring_of() share (counted in the registered bytes)",
          static_cast<double>(s.rings_outliving_sessions));
  m.gauge("owner_sessions", "Sessions attached now", static_cast<double>(s.per_session.size()));
  for (const auto& ps : s.per_session) {
    const MetricsText::Labels id{{"session", std::to_string(ps.session)}};
    m.gauge("session_epoch", "The session's epoch", static_cast<double>(ps.epoch), id);
    m.counter("session_records_total", "Records delivered from the session", ps.core.records, id);
    const auto& l = ps.ledger;
    for (const auto& [state, bytes] :
         {std::pair{"producer_owned", l.credited + l.ring_bytes - l.published}, {"published", l.published - l.head},
          {"being_consumed", l.delivered - l.released}, {"released_not_credited", l.released - l.credited}}) {
      auto labels = id;
      labels.emplace_back("state", state);
      m.gauge("session_ring_bytes", "Ring bytes by owner (the ownership ledger)", static_cast<double>(bytes), labels);
    }
  }
  return m.str();
}

void RingOwnerTestAccess::inject(RingOwner& owner, SessionId session, OwnerDataPlane::Fault fault) {
  owner.s_->data.inject(session, fault);
}

std::optional<std::uint32_t> RingOwner::ring_checksum(SessionId session) const {
  return s_->data.ring_checksum(session);
}

std::string RingOwner::ledger_dump() const {
  std::string out;
  for (const auto& s : stats().per_session) {
    out += "session " + std::to_string(s.session) + " epoch " + std::to_string(s.epoch) + " " + to_string(s.state) +
           ": " + to_string(s.ledger) + "\n";
  }
  return out;
}

}  // namespace rdmaring
