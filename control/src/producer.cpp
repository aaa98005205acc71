#include "rdmaring/producer.hpp"

#include <algorithm>
#include <thread>

#include "control_client.hpp"
#include "producer_test_access.hpp"
#include "rdmaring/metrics_text.hpp"
#include "rdmaring/producer_data_plane.hpp"

namespace rdmaring {

// The control channel's side of a producer; the verbs are the data plane's. Member order is
// destruction order reversed: the core, which builds in the data plane's staging mirror, goes
// first; the waiter last, since the control thread and the data plane's descriptors use it.
struct Producer::Connection {
  ProducerOptions options;
  // What ends a sleep: the data plane's descriptors, and the control thread's alarm.
  Waiter waiter;
  std::unique_ptr<control::ControlClient> control;
  control::RingGrant session;  // the last grant: session id and secret, the ring, the epoch
  std::optional<ProducerDataPlane> data;
  std::optional<ProducerCore> core;
  std::uint64_t recoveries = 0;
  Clock::time_point claimed_at;  // the last claim()'s clock reading, for its commit()

  // The session in `epoch`, as the control channel's calls name it.
  SessionCredentials who(std::uint64_t epoch) const { return SessionCredentials{session.session, session.secret, epoch}; }
  ProducerEpoch epoch_of(const control::RingGrant& g) const {
    return ProducerEpoch{g.session, g.at.epoch, make_proof(session.secret, ProofPurpose::connect, g.session, g.at.epoch),
                         g.data_port,
                         RingKeys{g.ring_addr, g.ring_rkey, g.tail_addr, g.tail_rkey}};
  }
  // The first connection and everything it needs: device, PD, CQ, credit MR, staging mirror.
  void connect_first(const control::RingGrant& g) {
    data.emplace(ProducerDataPlaneOptions{options.address, options.source_address, options.connect_timeout,
                                          options.core.sq_depth},
                 g.ring_bytes, epoch_of(g), waiter);
    core.emplace(data->staging(),
                 PeerRing{g.mode, RingGeometry::make(g.ring_bytes, g.max_record).value(), g.at, g.payload_check},
                 options.core);
  }
  void granted(std::uint64_t epoch) const {
    if (options.on_credentials) options.on_credentials(who(epoch));
  }
  void keep_alive(const control::RingGrant& grant) {
    const auto interval = options.heartbeat_interval.value_or(grant.lease / 3);
    control->keep_alive(who(grant.at.epoch), interval);
  }
};

Producer Producer::attach(const ProducerOptions& options) { return open(options, nullptr); }

Producer Producer::rejoin(const ProducerOptions& options, const SessionCredentials& credentials) {
  return open(options, &credentials);
}

Producer Producer::open(const ProducerOptions& options, const SessionCredentials* rejoining) {
  if (auto ok = options.core.validate(); !ok) throw SetupError(ok.error());
  auto c = std::make_unique<Connection>();
  c->options = options;
  c->control = std::make_unique<control::ControlClient>(options.address, options.control_port, options.connect_timeout,
                                                         options.security, [&w = c->waiter] { w.wake(); });
  Result<control::RingGrant> grant = make_error(errc::invalid_argument);
  if (rejoining) {
    grant = c->control->resume(*rejoining, true, 0, 0);
    if (grant) grant.value().secret = rejoining->secret;
  } else {
    grant = c->control->attach();
  }
  if (!grant) throw SetupError(grant.error());
  const control::RingGrant& g = grant.value();
  c->session = g;
  c->granted(g.at.epoch);
  // Heartbeats from the grant on: the lease must not run out while the QP connects.
  c->keep_alive(g);
  try {
    c->connect_first(g);
  } catch (const SetupError&) {
    // A new session's ring goes back now rather than at lease expiry; a rejoined one stays for
    // the next attempt.
    if (!rejoining) {
      const std::uint64_t epoch = g.at.epoch;
      (void)c->control->detach(c->who(epoch));
    }
    throw;
  }
  return Producer(std::move(c));
}

Result<ResumePoint> Producer::recover() {
  Connection& c = *c_;
  const std::uint64_t epoch = c.core->epoch();
  const auto from = c.core->resend_point();
  BOOST_OUTCOME_TRY(grant, c.control->resume(c.who(epoch), false, from.position, from.sequence));
  if (grant.ring_bytes != c.core->peer().geometry.bytes || grant.mode != c.core->peer().mode ||
      grant.max_record != c.core->peer().geometry.max_record || grant.payload_check != c.core->peer().payload_check) {
    // An owner restarted with other options restored the session; it cannot go on, so it
    // should not hold a ring until its lease runs out.
    const std::uint64_t e = grant.at.epoch;
    (void)c.control->detach(c.who(e));
    return make_error(errc::ring_changed, "resume of session " + std::to_string(c.session.session) +
                                              ": the owner's ring is no longer the one staging mirrors");
  }
  BOOST_OUTCOME_TRYV(c.core->resume(grant.at));
  c.granted(grant.at.epoch);
  c.session.at = grant.at;
  c.keep_alive(grant);
  BOOST_OUTCOME_TRYV(c.data->reconnect(c.epoch_of(grant)));
  ++c.recoveries;
  return grant.at;
}

Producer::Producer(std::unique_ptr<Connection> c) noexcept : c_(std::move(c)) {}
Producer::Producer(Producer&&) noexcept = default;
Producer& Producer::operator=(Producer&&) noexcept = default;
Producer::~Producer() = default;

Result<void> Producer::post_due(bool force, Clock::time_point now) { return c_->data->post_due(*c_->core, force, now); }

Result<void> Producer::progress() {
  ProducerCore& core = *c_->core;
  if (auto alarm = c_->control->alarm()) return *alarm;
  BOOST_OUTCOME_TRYV(c_->data->poll(core));
  if (core.failure()) return *core.failure();
  // No clock read while nothing waits: drain() and a starved claim() spin through here.
  if (!core.publish_pending()) return success();
  return post_due(false, Clock::now());
}

Result<bool> Producer::progress_for_space() {
  const std::uint64_t released = c_->core->ledger().released;
  BOOST_OUTCOME_TRYV(progress());
  return c_->core->ledger().released != released;
}

Result<void> Producer::send(std::span<const std::byte> payload) {
  ProducerCore& core = *c_->core;
  auto now = time_for_send(core);
  auto r = core.send(payload, now);
  if (!r && r.error() == errc::would_block) {
    BOOST_OUTCOME_TRY(moved, progress_for_space());
    if (moved) r = core.send(payload, now = time_for_send(core));
  }
  if (!r) return r;
  // The record is accepted: a failed post breaks the connection (reported by the next call),
  // and the record goes out again after recover(). An error here would read as "not sent".
  (void)post_due(false, now);
  return success();
}

namespace {

// How long send(timeout) and drain() sleep: what is left of the deadline, at least 1 ms
// (rounding must never make it spin). An owner that goes away ends the sleep sooner: its
// disconnect and the control thread's alarm wake the waiter.
std::chrono::milliseconds left(Clock::time_point deadline, Clock::time_point now) {
  return std::max(std::chrono::ceil<std::chrono::milliseconds>(deadline - now), std::chrono::milliseconds(1));
}

}  // namespace

Result<void> Producer::send(std::span<const std::byte> payload, std::chrono::nanoseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  IdleStrategy idle(c_->options.idle);
  for (;;) {
    auto r = send(payload);
    if (r || r.error() != errc::would_block) return r;
    const auto now = Clock::now();
    if (now >= deadline)
      return make_error(errc::timed_out, "send(" + std::to_string(payload.size()) + " B): no ring space; " + ledger_dump());
    // send() asked for credit; the answer comes with an immediate.
    BOOST_OUTCOME_TRYV(pause(idle, deadline, now));
  }
}

Result<void> Producer::pause(IdleStrategy& idle, Clock::time_point deadline, Clock::time_point now) {
  switch (idle.next(0)) {
    case IdleStrategy::Step::spin: return success();
    case IdleStrategy::Step::yield: std::this_thread::yield(); return success();
    case IdleStrategy::Step::sleep: break;
  }
  BOOST_OUTCOME_TRYV(wait(left(deadline, now)));
  return success();
}

Result<bool> Producer::arm() {
  ProducerCore& core = *c_->core;
  // The wakes so far are alarms, looked at next; one raised after this look ends the sleep.
  (void)c_->waiter.take_wake();
  if (auto alarm = c_->control->alarm()) return *alarm;
  // Nothing may sit out its coalescing delay while the producer sleeps.
  BOOST_OUTCOME_TRYV(flush());
  BOOST_OUTCOME_TRY(sleep, c_->data->arm(core));
  if (core.failure()) return *core.failure();
  // The credit read may owe the owner a doorbell (protocol-spec/wakeup.md, the repair rule).
  if (core.publish_pending()) {
    BOOST_OUTCOME_TRYV(flush());
  }
  return sleep;
}

Result<bool> Producer::wait(std::chrono::milliseconds timeout) {
  BOOST_OUTCOME_TRY(sleep, arm());
  if (!sleep) return true;
  BOOST_OUTCOME_TRY(woke, c_->waiter.wait(timeout));
  if (woke) {
    BOOST_OUTCOME_TRYV(c_->data->take_ready(*c_->core));
  }
  return woke;
}

int Producer::fd() const { return c_->waiter.fd(); }

Result<std::span<std::byte>> Producer::claim(std::uint32_t len) {
  ProducerCore& core = *c_->core;
  c_->claimed_at = time_for_send(core);
  auto r = core.claim(len, c_->claimed_at);
  if (!r && r.error() == errc::would_block) {
    BOOST_OUTCOME_TRY(moved, progress_for_space());
    if (moved) r = core.claim(len, c_->claimed_at = time_for_send(core));
  }
  return r;
}

Result<void> Producer::commit(std::optional<std::uint32_t> len) {
  BOOST_OUTCOME_TRYV(c_->core->commit(len));
  // The claim's clock reading serves (or its absence, where the core did not want one): the
  // record's age counts from it anyway.
  (void)post_due(false, c_->claimed_at);  // as in send(): the record is committed whatever the post does
  return success();
}

void Producer::abort() noexcept { c_->core->abort(); }

Result<void> Producer::flush() { return post_due(true, {}); }

bool Producer::quiescent() {
  ProducerCore& core = *c_->core;
  const ProducerLedger l = core.ledger();
  if (l.released == l.claimed) return true;
  // Credit comes back lazily, a quarter ring at a time: ask for what settles the rest.
  if (!core.publish_pending() && !core.failure()) {
    core.request_credit();
    (void)post_due(true, {});  // a failed post breaks the connection: the next progress() says so
  }
  return false;
}

Result<void> Producer::drain(std::chrono::nanoseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  IdleStrategy idle(c_->options.idle);
  // The consumer writes credit lazily: ask with the publish itself, one post per round trip.
  c_->core->request_credit();
  BOOST_OUTCOME_TRYV(flush());
  for (;;) {
    BOOST_OUTCOME_TRYV(progress());
    const auto l = c_->core->ledger();
    if (l.released == l.committed) return success();
    const auto now = Clock::now();
    if (now >= deadline) return make_error(errc::timed_out, "drain: " + ledger_dump());
    // The consumer writes credit lazily; a drain must not wait for a quarter ring. It answers a
    // request with an immediate, which ends a wait.
    c_->core->request_credit();
    BOOST_OUTCOME_TRYV(flush());
    BOOST_OUTCOME_TRYV(pause(idle, deadline, now));
  }
}

Result<void> Producer::detach(std::chrono::nanoseconds timeout) {
  Connection& c = *c_;
  BOOST_OUTCOME_TRYV(drain(timeout));
  const std::uint64_t epoch = c.core->epoch();
  c.control->keep_alive(c.who(epoch), std::chrono::milliseconds(0));
  BOOST_OUTCOME_TRYV(c.control->detach(c.who(epoch)));
  // The owner tore the connection down with the session; what is left here is the QP's flush.
  c.data->disconnect();
  return success();
}

Result<void> ProducerTestAccess::force_error(Producer& p) { return p.c_->data->force_error(); }

ProducerStats Producer::stats() const {
  const ProducerDataPlaneCounters& d = c_->data->counters();
  return ProducerStats{c_->data->device(),   c_->data->registered(), c_->core->counters(),
                       d.post_send_calls,    d.completions,          d.stale_completions,
                       c_->recoveries,       d.credit_notifications, d.sleeps,
                       d.completion_errors,  c_->data->async_event_counts(), c_->core->ledger()};
}

std::string Producer::metrics() const {
  const ProducerStats s = stats();
  const auto& k = s.core;
  MetricsText m;
  m.counter("producer_records_total", "Records committed", k.records);
  m.counter("producer_payload_bytes_total", "Payload bytes committed", k.payload_bytes);
  m.counter("producer_post_send_calls_total", "ibv_post_send calls", s.post_send_calls);
  m.counter("producer_work_requests_total", "Work requests posted", k.wrs);
  m.counter("producer_signaled_total", "Signaled work requests", k.signaled);
  m.counter("producer_wire_bytes_total", "Bytes written to the ring (headers, padding, fill included)", k.wire_bytes);
  m.counter("producer_publishes_total", "Publishes posted", k.batches);
  m.counter("producer_credit_updates_total", "Credit write-backs seen", k.credit_updates);
  m.counter("producer_credit_requests_total", "Publishes that asked for credit", k.credit_requests);
  m.counter("producer_would_block_total", "Claims refused for lack of ring space", k.would_block);
  m.counter("producer_stale_credit_total", "Credit records of another epoch, ignored", k.stale_credit);
  m.counter("producer_recoveries_total", "Resumes into a new epoch", s.recoveries);
  m.counter("producer_stale_completions_total", "Completions of a replaced connection", s.stale_completions);
  m.counter("producer_credit_notifications_total", "Credit records written with an immediate", s.credit_notifications);
  m.counter("producer_sleeps_total", "Waits that armed the completion queue and slept", s.sleeps);
  m.counter("producer_doorbells_total", "Publishes followed by a doorbell (mode tail)", k.doorbells);
  m.counters("producer_completion_errors_total", "Error completions by status", s.completion_errors, "status");
  m.counters("producer_async_events_total", "Asynchronous device events, acknowledged", s.async_events, "type");
  m.registrations("producer", s.device, s.registered.regions, s.registered.bytes);
  const auto& l = s.ledger;
  for (const auto& [state, bytes] : {std::pair{"producer_writable", l.released + l.ring_bytes - l.claimed},
                                     {"claimed", l.claimed - l.committed},
                                     {"written_not_published", l.committed - l.published},
                                     {"published_not_released", l.published - l.released}})
    m.gauge("producer_ring_bytes", "Ring bytes by owner, as the producer sees them", static_cast<double>(bytes),
            {{"state", state}});
  return m.str();
}

std::uint64_t Producer::next_sequence() const { return c_->core->next_sequence(); }

SessionCredentials Producer::credentials() const {
  return SessionCredentials{c_->session.session, c_->session.secret, c_->core->epoch()};
}

std::string Producer::ledger_dump() const { return to_string(c_->core->ledger()); }

wire::PublishMode Producer::mode() const { return c_->core->peer().mode; }

}  // namespace rdmaring
