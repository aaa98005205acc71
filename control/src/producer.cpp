#include "rdmaring/producer.hpp"

#include <array>
#include <thread>

#include "control_client.hpp"
#include "producer_test_access.hpp"
#include "rdmaring/dma.hpp"
#include "rdmaring/post.hpp"
#include "rdmaring/metrics_text.hpp"
#include "rdmaring/verbs/async_events.hpp"
#include "rdmaring/verbs/cm_id.hpp"
#include "rdmaring/verbs/context.hpp"
#include "rdmaring/verbs/cq.hpp"
#include "rdmaring/verbs/event_channel.hpp"
#include "rdmaring/verbs/mr.hpp"
#include "rdmaring/verbs/pd.hpp"
#include "rdmaring/verbs/qp.hpp"

namespace rdmaring {

namespace {

constexpr std::uint32_t kAsyncEventInterval = 64;

// The verbs objects of one connection (one epoch). Replaced whole by recover().
struct Link {
  verbs::EventChannel channel;
  verbs::CmId id{channel};
  std::optional<verbs::QueuePair> qp;
};

Credentials who(const control::RingGrant& session, std::uint64_t epoch, const Proof& proof) {
  return Credentials{session.session, epoch, proof};
}

}  // namespace

// Member order is destruction order reversed: the link's QP goes before the CQ, MRs and PD it
// uses; the first link's rdma_cm id (which holds the device context open) lives as long as the PD.
struct Producer::Connection {
  ProducerOptions options;
  std::unique_ptr<control::ControlClient> control;
  control::RingGrant session;  // the last grant: session id and secret, the ring, the epoch
  std::unique_ptr<Link> first;  // keeps the device context of the PD alive
  std::optional<verbs::ProtectionDomain> pd;
  std::optional<verbs::CompletionQueue> cq;
  std::optional<verbs::AsyncEvents> async;
  std::uint32_t progress_calls = 0;
  std::map<std::string, std::uint64_t> completion_errors;
  verbs::AlignedBuffer credit_buf{4096};
  std::optional<verbs::MemoryRegion> credit_mr;
  std::optional<verbs::AlignedBuffer> staging;
  std::optional<verbs::MemoryRegion> staging_mr;
  std::optional<ProducerCore> core;
  std::unique_ptr<Link> link;  // the current connection, when it is not `first`
  WriteTarget target;
  std::uint64_t post_send_calls = 0;
  std::uint64_t completions = 0;
  std::uint64_t stale_completions = 0;
  std::uint64_t recoveries = 0;
  std::string device;
  Clock::time_point claimed_at;  // the last claim()'s clock reading, for its commit()

  // The QPs go before the CQ and PD they use (destroying either while a QP uses it fails with
  // EBUSY and leaks it); the first link's rdma_cm id, which holds the device open, after them.
  ~Connection() {
    link.reset();
    if (first) first->qp.reset();
  }

  Link& current() { return link ? *link : *first; }
  Proof proof(ProofPurpose purpose, std::uint64_t epoch) const {
    return make_proof(session.secret, purpose, session.session, epoch);
  }
  // Resolves the owner's data port and connects `l` (QP on the shared PD and CQ) for the
  // granted epoch.
  void connect(Link& l, const control::RingGrant& grant);
  // The first connection and everything it needs: PD, CQ, credit MR, staging mirror.
  void connect_first(const control::RingGrant& grant);
  void resolve(Link& l, const control::RingGrant& grant) {
    l.id.resolve(options.address, grant.data_port, options.connect_timeout, options.source_address);
  }
  void granted(std::uint64_t epoch) const {
    if (options.on_credentials) options.on_credentials(SessionCredentials{session.session, session.secret, epoch});
  }
  void keep_alive(const control::RingGrant& grant) {
    const auto interval = options.heartbeat_interval.value_or(grant.lease / 3);
    control->keep_alive(session.session, session.secret, grant.at.epoch, interval);
  }
  // The sequence of the record at `released`: what an owner restored after its restart resumes
  // from when it has no record of its own.
  std::uint64_t released_sequence() {
    const auto l = core->ledger();
    if (l.released == l.committed) return core->next_sequence();
    const auto off = core->peer().geometry.offset(l.released);
    const auto h = wire::decode_record_header(staging->bytes().subspan(off).first<wire::kRecordHeaderSize>());
    return h ? h->sequence : core->next_sequence();
  }
};

void Producer::Connection::connect(Link& l, const control::RingGrant& grant) {
  verbs::QueuePairCaps caps;
  caps.max_send_wr = options.core.sq_depth;
  caps.max_recv_wr = 1;
  caps.max_inline_data = wire::kTailRecordSize;
  l.qp.emplace(l.id, *pd, *cq, *cq, caps);
  if (l.qp->max_inline_data() < wire::kTailRecordSize)
    throw SetupError(make_error(errc::bad_config, l.qp->describe() + ": device grants " +
                                                      std::to_string(l.qp->max_inline_data()) +
                                                      " B of inline data, the tail record needs " +
                                                      std::to_string(wire::kTailRecordSize)));
  const auto bytes = wire::encode(wire::ConnectData{session.session, grant.at.epoch,
                                                    proof(ProofPurpose::connect, grant.at.epoch),
                                                    reinterpret_cast<std::uintptr_t>(credit_buf.data()),
                                                    credit_mr->rkey()});
  rdma_conn_param param{};
  param.private_data = bytes.data();
  param.private_data_len = static_cast<std::uint8_t>(bytes.size());
  param.retry_count = 7;
  param.rnr_retry_count = 7;  // 7 = retry for ever: the owner re-posts receives as it polls
  const auto reply = l.id.connect(param, options.connect_timeout);
  const auto accept = wire::decode_accept_data(reply);
  if (!accept || accept->epoch != grant.at.epoch)
    throw SetupError(make_error(errc::protocol_violation, l.id.describe() + ": the accept is not for epoch " +
                                                              std::to_string(grant.at.epoch) + " of rdmaring v" +
                                                              std::to_string(wire::kVersion)));
}

Producer Producer::attach(const ProducerOptions& options) { return open(options, nullptr); }

Producer Producer::rejoin(const ProducerOptions& options, const SessionCredentials& credentials) {
  return open(options, &credentials);
}

Producer Producer::open(const ProducerOptions& options, const SessionCredentials* rejoining) {
  if (auto ok = options.core.validate(); !ok) throw SetupError(ok.error());
  auto c = std::make_unique<Connection>();
  c->options = options;
  c->control = std::make_unique<control::ControlClient>(options.address, options.control_port, options.connect_timeout);
  Result<control::RingGrant> grant = make_error(errc::invalid_argument);
  if (rejoining) {
    const Proof p = make_proof(rejoining->secret, ProofPurpose::resume, rejoining->session, rejoining->epoch);
    grant = c->control->resume(Credentials{rejoining->session, rejoining->epoch, p}, true, 0, 0);
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
      (void)c->control->detach(who(c->session, epoch, c->proof(ProofPurpose::detach, epoch)));
    }
    throw;
  }
  return Producer(std::move(c));
}

void Producer::Connection::connect_first(const control::RingGrant& g) {
  first = std::make_unique<Link>();
  resolve(*first, g);
  const verbs::Context ctx = first->id.context();
  device = ctx.name();
  pd.emplace(ctx);
  async.emplace(ctx);
  // One CQ entry per SQ slot is enough: only signaled WRs complete, at most one per interval.
  cq.emplace(ctx, static_cast<int>(options.core.sq_depth));
  credit_mr.emplace(*pd, credit_buf.data(), credit_buf.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  // The staging buffer mirrors the ring: registered once, here, never per record.
  staging.emplace(g.ring_bytes);
  staging_mr.emplace(*pd, staging->data(), staging->size(), IBV_ACCESS_LOCAL_WRITE);
  target = WriteTarget{staging->data(), staging_mr->lkey(), g.ring_addr, g.ring_rkey, g.tail_addr, g.tail_rkey};
  connect(*first, g);
  core.emplace(staging->bytes(),
               PeerRing{g.mode, RingGeometry::make(g.ring_bytes, g.max_record).value(), g.at, g.payload_check},
               options.core);
}

Result<ResumePoint> Producer::recover() {
  Connection& c = *c_;
  const std::uint64_t epoch = c.core->epoch();
  const auto l = c.core->ledger();
  BOOST_OUTCOME_TRY(grant, c.control->resume(who(c.session, epoch, c.proof(ProofPurpose::resume, epoch)), false,
                                             l.released, c.released_sequence()));
  if (grant.ring_bytes != c.core->peer().geometry.bytes || grant.mode != c.core->peer().mode ||
      grant.max_record != c.core->peer().geometry.max_record || grant.payload_check != c.core->peer().payload_check) {
    // An owner restarted with other options restored the session; it cannot go on, so it
    // should not hold a ring until its lease runs out.
    const std::uint64_t e = grant.at.epoch;
    (void)c.control->detach(who(c.session, e, c.proof(ProofPurpose::detach, e)));
    return make_error(errc::ring_changed, "resume of session " + std::to_string(c.session.session) +
                                              ": the owner's ring is no longer the one staging mirrors");
  }
  BOOST_OUTCOME_TRYV(c.core->resume(grant.at));
  c.granted(grant.at.epoch);
  // The new rkeys (the old ones were revoked by the owner's re-registration) and, after an owner
  // restart, a new ring address.
  c.target.remote_base = grant.ring_addr;
  c.target.rkey = grant.ring_rkey;
  c.target.tail_addr = grant.tail_addr;
  c.target.tail_rkey = grant.tail_rkey;
  c.session.at = grant.at;
  c.keep_alive(grant);
  try {
    auto link = std::make_unique<Link>();
    c.resolve(*link, grant);
    // The dead connection's QP goes now; the first link's id stays, it holds the device open.
    if (c.link) c.link.reset();
    else c.first->qp.reset();
    c.connect(*link, grant);
    c.link = std::move(link);
  } catch (const SetupError& e) {
    return e.error();
  }
  ++c.recoveries;
  return grant.at;
}

Producer::Producer(std::unique_ptr<Connection> c) noexcept : c_(std::move(c)) {}
Producer::Producer(Producer&&) noexcept = default;
Producer& Producer::operator=(Producer&&) noexcept = default;
Producer::~Producer() = default;

Result<void> Producer::post_due(bool force, Clock::time_point now) {
  ProducerCore& core = *c_->core;
  if (!force && !core.flush_due(now)) return success();
  while (auto batch = core.take_batch()) {
    ++c_->post_send_calls;
    if (auto posted = post_chain(*c_->current().qp, batch->requests(), c_->target); !posted) {
      core.on_post_error(posted.error());
      return posted;
    }
  }
  return success();
}

Result<void> Producer::progress() {
  ProducerCore& core = *c_->core;
  if (auto alarm = c_->control->alarm()) return *alarm;
  std::array<ibv_wc, 16> wcs;
  BOOST_OUTCOME_TRY(n, c_->cq->poll(wcs));
  const std::uint32_t qp_num = c_->current().qp->qp_num();
  for (std::size_t i = 0; i < n; ++i) {
    if (wcs[i].qp_num != qp_num) {
      ++c_->stale_completions;  // the flushed work of a connection recover() replaced
      continue;
    }
    ++c_->completions;
    if (wcs[i].status != IBV_WC_SUCCESS) ++c_->completion_errors[ibv_wc_status_str(wcs[i].status)];
    core.on_completion(wcs[i].wr_id, wcs[i].status == IBV_WC_SUCCESS, wcs[i].status);
  }
  // Async events cost a system call to look for: every so many calls is soon enough for what
  // completions do not report (a QP gone fatal while nothing is posted).
  // pending(): another reader of this process's device context queued events for this one.
  if (++c_->progress_calls % kAsyncEventInterval == 0 || c_->async->pending()) {
    BOOST_OUTCOME_TRYV(c_->async->drain([&](const verbs::AsyncEvent& e) {
      if (e.qp_dead() && e.qp_num == qp_num)
        core.on_post_error(make_error(errc::completion_error, std::string("async event ") +
                                                                  ibv_event_type_str(e.type) + " on qp " +
                                                                  std::to_string(e.qp_num)));
    }));
  }
  std::array<std::byte, wire::kCreditRecordSize> credit;
  read_dma(c_->credit_buf.data(), std::span{credit});
  core.on_credit(credit);
  if (core.failure()) return *core.failure();
  // No clock read while nothing waits: drain() and a starved claim() spin through here.
  if (!core.publish_pending()) return success();
  return post_due(false, Clock::now());
}

Result<void> Producer::send(std::span<const std::byte> payload) {
  const auto now = Clock::now();
  auto r = c_->core->send(payload, now);
  if (!r) {
    if (r.error() == errc::would_block) {
      BOOST_OUTCOME_TRYV(progress());
    }
    return r;
  }
  // The record is accepted: a failed post breaks the connection (reported by the next call),
  // and the record goes out again after recover(). An error here would read as "not sent".
  (void)post_due(false, now);
  return success();
}

Result<void> Producer::send(std::span<const std::byte> payload, std::chrono::nanoseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    auto r = send(payload);
    if (r || r.error() != errc::would_block) return r;
    if (Clock::now() >= deadline)
      return make_error(errc::timed_out, "send(" + std::to_string(payload.size()) + " B): no ring space; " + ledger_dump());
  }
}

Result<std::span<std::byte>> Producer::claim(std::uint32_t len) {
  c_->claimed_at = Clock::now();
  auto r = c_->core->claim(len, c_->claimed_at);
  if (!r && r.error() == errc::would_block) {
    BOOST_OUTCOME_TRYV(progress());
  }
  return r;
}

Result<void> Producer::commit(std::optional<std::uint32_t> len) {
  BOOST_OUTCOME_TRYV(c_->core->commit(len));
  // The claim's clock reading serves: the record's age counts from it anyway, and under
  // emulation a clock read costs as much as the rest of a small record's commit.
  (void)post_due(false, c_->claimed_at);  // as in send(): the record is committed whatever the post does
  return success();
}

void Producer::abort() noexcept { c_->core->abort(); }

Result<void> Producer::flush() { return post_due(true, {}); }

Result<void> Producer::drain(std::chrono::nanoseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  // The consumer writes credit lazily: ask with the publish itself, one post per round trip.
  c_->core->request_credit();
  BOOST_OUTCOME_TRYV(flush());
  for (std::uint32_t spins = 1;; ++spins) {
    BOOST_OUTCOME_TRYV(progress());
    const auto l = c_->core->ledger();
    if (l.released == l.committed) return success();
    // The deadline is read every so many spins: a clock read would delay noticing the credit.
    if (spins % 64 == 0 && Clock::now() >= deadline) return make_error(errc::timed_out, "drain: " + ledger_dump());
    // The consumer writes credit lazily; a drain must not wait for a quarter ring.
    c_->core->request_credit();
    BOOST_OUTCOME_TRYV(flush());
  }
}

Result<void> Producer::detach(std::chrono::nanoseconds timeout) {
  Connection& c = *c_;
  BOOST_OUTCOME_TRYV(drain(timeout));
  const std::uint64_t epoch = c.core->epoch();
  c.control->keep_alive(c.session.session, c.session.secret, epoch, std::chrono::milliseconds(0));
  BOOST_OUTCOME_TRYV(c.control->detach(who(c.session, epoch, c.proof(ProofPurpose::detach, epoch))));
  // The owner tore the connection down with the session; what is left here is the QP's flush.
  c.link.reset();
  c.first->qp.reset();
  return success();
}

Result<void> ProducerTestAccess::force_error(Producer& p) { return p.c_->current().qp->force_error(); }

ProducerStats Producer::stats() const {
  RegistrationFootprint registered;
  registered.add(c_->staging_mr);
  registered.add(c_->credit_mr);
  return ProducerStats{c_->device,           registered,          c_->core->counters(),
                       c_->post_send_calls,  c_->completions,     c_->stale_completions,
                       c_->recoveries,       c_->completion_errors, c_->async->counts().by_type,
                       c_->core->ledger()};
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
