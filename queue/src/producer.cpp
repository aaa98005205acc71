#include "rdmaring/producer.hpp"

#include <array>
#include <thread>

#include "rdmaring/dma.hpp"
#include "rdmaring/post.hpp"
#include "rdmaring/verbs/cm_id.hpp"
#include "rdmaring/verbs/context.hpp"
#include "rdmaring/verbs/cq.hpp"
#include "rdmaring/verbs/event_channel.hpp"
#include "rdmaring/verbs/mr.hpp"
#include "rdmaring/verbs/pd.hpp"
#include "rdmaring/verbs/qp.hpp"

namespace rdmaring {

namespace {

// The verbs objects of one connection (one epoch). Replaced whole by recover().
struct Link {
  verbs::EventChannel channel;
  verbs::CmId id{channel};
  std::optional<verbs::QueuePair> qp;
};

}  // namespace

// Member order is destruction order reversed: the link's QP goes before the CQ, MRs and PD it
// uses; the first link's rdma_cm id (which holds the device context open) lives as long as the PD.
struct Producer::Connection {
  ProducerOptions options;
  std::unique_ptr<Link> first;  // keeps the device context of the PD alive
  std::optional<verbs::ProtectionDomain> pd;
  std::optional<verbs::CompletionQueue> cq;
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

  Link& current() { return link ? *link : *first; }
  // Resolves and connects `l` (QP on the shared PD and CQ) and returns the consumer's answer.
  wire::AcceptData connect(Link& l, const wire::ConnectData& hello);
};

wire::AcceptData Producer::Connection::connect(Link& l, const wire::ConnectData& hello) {
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
  const auto bytes = wire::encode(hello);
  rdma_conn_param param{};
  param.private_data = bytes.data();
  param.private_data_len = static_cast<std::uint8_t>(bytes.size());
  param.retry_count = 7;
  param.rnr_retry_count = 7;  // 7 = retry for ever: the consumer re-posts receives as it polls
  const auto reply = l.id.connect(param, options.connect_timeout);
  const auto accept = wire::decode_accept_data(reply);
  if (!accept)
    throw SetupError(make_error(errc::protocol_violation, l.id.describe() + ": accept private data is not rdmaring v" +
                                                              std::to_string(wire::kVersion)));
  if (accept->mode == wire::PublishMode::tail && (accept->flags & wire::kAcceptRelaxedOrdering))
    throw SetupError(make_error(errc::relaxed_ordering_refused,
                                l.id.describe() + ": the consumer offers tail mode over a relaxed-ordering ring; a tail "
                                                  "write could land before the payload it publishes"));
  if (accept->mode == wire::PublishMode::tail && accept->tail_rkey == 0 && accept->tail_addr == 0)
    throw SetupError(make_error(errc::protocol_violation, l.id.describe() + ": tail mode without a tail MR"));
  return *accept;
}

Producer Producer::connect(const ProducerOptions& options) {
  if (auto ok = options.core.validate(); !ok) throw SetupError(ok.error());
  auto c = std::make_unique<Connection>();
  c->options = options;
  c->first = std::make_unique<Link>();
  c->first->id.resolve(options.address, options.port, options.connect_timeout);
  const verbs::Context ctx = c->first->id.context();
  c->pd.emplace(ctx);
  // One CQ entry per SQ slot is enough: only signaled WRs complete, at most one per interval.
  c->cq.emplace(ctx, static_cast<int>(options.core.sq_depth));
  c->credit_mr.emplace(*c->pd, c->credit_buf.data(), c->credit_buf.size(),
                       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  const auto accept = c->connect(*c->first, wire::ConnectData{reinterpret_cast<std::uintptr_t>(c->credit_buf.data()),
                                                                c->credit_mr->rkey(), 0, 0});
  auto geometry = RingGeometry::make(accept.ring_bytes, accept.max_record);
  if (!geometry) throw SetupError(geometry.error());

  // The staging buffer mirrors the ring: registered once, here, never per record.
  c->staging.emplace(accept.ring_bytes);
  c->staging_mr.emplace(*c->pd, c->staging->data(), c->staging->size(), IBV_ACCESS_LOCAL_WRITE);
  c->target = WriteTarget{c->staging->data(), c->staging_mr->lkey(), accept.ring_addr, accept.ring_rkey,
                          accept.tail_addr, accept.tail_rkey};
  c->core.emplace(c->staging->bytes(),
                  PeerRing{accept.mode, geometry.value(),
                           ResumePoint{accept.epoch, accept.position, accept.released, accept.next_sequence}},
                  options.core);
  return Producer(std::move(c));
}

Result<ResumePoint> Producer::recover() {
  Connection& c = *c_;
  try {
    auto l = std::make_unique<Link>();
    l->id.resolve(c.options.address, c.options.port, c.options.connect_timeout);
    const auto accept =
        c.connect(*l, wire::ConnectData{reinterpret_cast<std::uintptr_t>(c.credit_buf.data()), c.credit_mr->rkey(),
                                        wire::kConnectResume, c.core->epoch()});
    if (accept.ring_bytes != c.core->peer().geometry.bytes || accept.mode != c.core->peer().mode ||
        accept.max_record != c.core->peer().geometry.max_record || accept.ring_addr != c.target.remote_base ||
        accept.tail_addr != c.target.tail_addr)
      return make_error(errc::protocol_violation, l->id.describe() + ": the ring changed across the resume");
    const ResumePoint at{accept.epoch, accept.position, accept.released, accept.next_sequence};
    BOOST_OUTCOME_TRYV(c.core->resume(at));
    // The new rkeys: the old ones were revoked by the consumer's re-registration.
    c.target.rkey = accept.ring_rkey;
    c.target.tail_rkey = accept.tail_rkey;
    // The dead connection's QP goes now; the first link's id stays, it holds the device open.
    if (c.link) c.link.reset();
    else c.first->qp.reset();
    c.link = std::move(l);
    ++c.recoveries;
    return at;
  } catch (const SetupError& e) {
    return e.error();
  }
}

Producer::Producer(std::unique_ptr<Connection> c) noexcept : c_(std::move(c)) {}
Producer::Producer(Producer&&) noexcept = default;
Producer& Producer::operator=(Producer&&) noexcept = default;
Producer::~Producer() = default;

Result<void> Producer::post_due(bool force) {
  ProducerCore& core = *c_->core;
  if (!force && !core.flush_due(Clock::now())) return success();
  while (auto batch = core.take_batch()) {
    ++c_->post_send_calls;
    BOOST_OUTCOME_TRYV(post_chain(*c_->current().qp, batch->requests(), c_->target));
  }
  return success();
}

Result<void> Producer::progress() {
  ProducerCore& core = *c_->core;
  std::array<ibv_wc, 16> wcs;
  BOOST_OUTCOME_TRY(n, c_->cq->poll(wcs));
  const std::uint32_t qp_num = c_->current().qp->qp_num();
  for (std::size_t i = 0; i < n; ++i) {
    if (wcs[i].qp_num != qp_num) {
      ++c_->stale_completions;  // the flushed work of a connection recover() replaced
      continue;
    }
    ++c_->completions;
    core.on_completion(wcs[i].wr_id, wcs[i].status == IBV_WC_SUCCESS, wcs[i].status);
  }
  std::array<std::byte, wire::kCreditRecordSize> credit;
  read_dma(c_->credit_buf.data(), std::span{credit});
  core.on_credit(credit);
  if (core.failure()) return *core.failure();
  return post_due(false);
}

Result<void> Producer::send(std::span<const std::byte> payload) {
  auto r = c_->core->send(payload, Clock::now());
  if (!r) {
    if (r.error() == errc::would_block) {
      BOOST_OUTCOME_TRYV(progress());
    }
    return r;
  }
  return post_due(false);
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
  auto r = c_->core->claim(len, Clock::now());
  if (!r && r.error() == errc::would_block) {
    BOOST_OUTCOME_TRYV(progress());
  }
  return r;
}

Result<void> Producer::commit(std::optional<std::uint32_t> len) {
  BOOST_OUTCOME_TRYV(c_->core->commit(len));
  return post_due(false);
}

void Producer::abort() noexcept { c_->core->abort(); }

Result<void> Producer::flush() { return post_due(true); }

Result<void> Producer::drain(std::chrono::nanoseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  // The consumer writes credit lazily: ask with the publish itself, one post per round trip.
  c_->core->request_credit();
  BOOST_OUTCOME_TRYV(flush());
  for (;;) {
    BOOST_OUTCOME_TRYV(progress());
    const auto l = c_->core->ledger();
    if (l.released == l.committed) return success();
    if (Clock::now() >= deadline) return make_error(errc::timed_out, "drain: " + ledger_dump());
    // The consumer writes credit lazily; a drain must not wait for a quarter ring.
    c_->core->request_credit();
    BOOST_OUTCOME_TRYV(flush());
  }
}

Result<void> Producer::close(std::chrono::nanoseconds timeout) {
  BOOST_OUTCOME_TRYV(drain(timeout));
  try {
    c_->current().id.disconnect(std::chrono::duration_cast<std::chrono::milliseconds>(timeout));
  } catch (const SetupError& e) {
    return e.error();
  }
  return success();
}

Result<void> Producer::force_error() { return c_->current().qp->force_error(); }

ProducerStats Producer::stats() const {
  return ProducerStats{c_->core->counters(), c_->post_send_calls, c_->completions, c_->stale_completions,
                       c_->recoveries, c_->core->ledger()};
}

std::string Producer::ledger_dump() const { return to_string(c_->core->ledger()); }

wire::PublishMode Producer::mode() const { return c_->core->peer().mode; }

}  // namespace rdmaring
