#include "rdmaring/producer_data_plane.hpp"

#include <array>
#include <utility>

#include "rdmaring/dma.hpp"
#include "rdmaring/verbs/cm_id.hpp"
#include "rdmaring/verbs/context.hpp"
#include "rdmaring/verbs/event_channel.hpp"
#include "rdmaring/verbs/qp.hpp"

namespace rdmaring {

namespace {
// Async events cost a system call to look for: every so many polls is soon enough for what
// completions do not report (a QP gone fatal while nothing is posted).
constexpr std::uint32_t kAsyncEventInterval = 64;
}  // namespace

// The verbs objects of one connection (one epoch). Replaced whole by reconnect().
struct ProducerDataPlane::Link {
  explicit Link(const Waiter& waiter) : watched(waiter, channel.get()->fd) {}
  verbs::EventChannel channel;
  Watched watched;  // the owner's disconnect ends a sleep
  verbs::CmId id{channel};
  std::optional<verbs::QueuePair> qp;
};

ProducerDataPlane::ProducerDataPlane(const ProducerDataPlaneOptions& options, std::uint64_t ring_bytes,
                                     const ProducerEpoch& first, const Waiter& waiter)
    : options_(options), waiter_(&waiter), first_(std::make_unique<Link>(waiter)) {
  first_->id.resolve(options_.address, first.data_port, options_.connect_timeout, options_.source_address);
  const verbs::Context ctx = first_->id.context();
  device_ = ctx.name();
  pd_.emplace(ctx);
  // Another reader of this process's device context may take an event of this one's off the
  // descriptor while this one sleeps on it: it then wakes this one.
  async_.emplace(ctx, [w = waiter_] { w->wake(); });
  async_watched_.emplace(waiter, async_->fd());
  // One CQ entry per SQ slot is plenty (only signaled WRs complete), and one per receive.
  cq_channel_.emplace(ctx);
  cq_watched_.emplace(waiter, cq_channel_->fd());
  cq_.emplace(ctx, static_cast<int>(options_.sq_depth + recv_chain_.size()), &*cq_channel_);
  for (auto& wr : recv_chain_) wr.wr_id = kRecvWrId;
  credit_mr_.emplace(*pd_, credit_buf_.data(), credit_buf_.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  // The staging buffer mirrors the ring: registered once, here, never per record.
  staging_.emplace(ring_bytes);
  staging_mr_.emplace(*pd_, staging_->data(), staging_->size(), IBV_ACCESS_LOCAL_WRITE);
  target_ = WriteTarget{staging_->data(), staging_mr_->lkey(), first.keys};
  try {
    connect(*first_, first);
  } catch (...) {
    disconnect();  // no destructor runs for a constructor that throws: the QP still goes first
    throw;
  }
}

// The QPs go before the CQ and PD they use (destroying either while a QP uses it fails with
// EBUSY and leaks it); the first link's rdma_cm id, which holds the device open, after them.
ProducerDataPlane::~ProducerDataPlane() { disconnect(); }

std::span<std::byte> ProducerDataPlane::staging() noexcept { return staging_->bytes(); }

ProducerDataPlane::Link& ProducerDataPlane::current() noexcept { return link_ ? *link_ : *first_; }

void ProducerDataPlane::connect(Link& l, const ProducerEpoch& e) {
  verbs::QueuePairCaps caps;
  caps.max_send_wr = options_.sq_depth;
  caps.max_recv_wr = static_cast<std::uint32_t>(recv_chain_.size());
  caps.max_inline_data = wire::kTailRecordSize;
  l.qp.emplace(l.id, *pd_, *cq_, *cq_, caps);
  if (l.qp->max_inline_data() < wire::kTailRecordSize)
    throw SetupError(make_error(errc::bad_config, l.qp->describe() + ": device grants " +
                                                      std::to_string(l.qp->max_inline_data()) +
                                                      " B of inline data, the tail record needs " +
                                                      std::to_string(wire::kTailRecordSize)));
  // Before the connect: the owner may write credit with an immediate as soon as it is up. It
  // writes at most one per credit request or doorbell flag it sets, and each receive is posted
  // again at the next poll; should the producer fall behind, the owner's QP retries (RNR) and
  // only this session's credit waits.
  recv_owed_ = 0;
  for (std::size_t i = 0; i < recv_chain_.size(); ++i)
    recv_chain_[i].next = i + 1 < recv_chain_.size() ? &recv_chain_[i + 1] : nullptr;
  if (auto posted = l.qp->post_recv(recv_chain_[0]); !posted) throw SetupError(posted.error());
  const auto bytes = wire::encode(wire::ConnectData{e.session, e.epoch, e.connect_proof,
                                                    reinterpret_cast<std::uintptr_t>(credit_buf_.data()),
                                                    credit_mr_->rkey()});
  // Connection parameters: wire-formats.md §10.
  rdma_conn_param param{};
  param.private_data = bytes.data();
  param.private_data_len = static_cast<std::uint8_t>(bytes.size());
  param.retry_count = 7;
  param.rnr_retry_count = 7;  // 7 = retry for ever: the owner re-posts receives as it polls
  const auto reply = l.id.connect(param, options_.connect_timeout);
  const auto accept = wire::decode_accept_data(reply);
  if (!accept || accept->epoch != e.epoch)
    throw SetupError(make_error(errc::protocol_violation, l.id.describe() + ": the accept is not for epoch " +
                                                              std::to_string(e.epoch) + " of rdmaring v" +
                                                              std::to_string(wire::kVersion)));
}

Result<void> ProducerDataPlane::reconnect(const ProducerEpoch& next) {
  // The new rkeys (the old ones were revoked by the owner's re-registration) and, after an owner
  // restart, a new ring address.
  target_.remote = next.keys;
  try {
    auto link = std::make_unique<Link>(*waiter_);
    link->id.resolve(options_.address, next.data_port, options_.connect_timeout, options_.source_address);
    // The dead connection's QP goes now; the first link's id stays, it holds the device open.
    if (link_) link_.reset();
    else first_->qp.reset();
    connect(*link, next);
    link_ = std::move(link);
  } catch (const SetupError& e) {
    return e.error();
  }
  return success();
}

Result<void> ProducerDataPlane::post_due(ProducerCore& core, bool force, Clock::time_point now) {
  if (!force && !core.flush_due(now)) return success();
  // Mode tail: the doorbell flag as it is now, not as the last poll saw it, so that a publish
  // after a long lull rings for an owner that went to sleep meanwhile. (A flag that lands after
  // this read is the repair rule's: protocol-spec/wakeup.md.)
  if (core.peer().mode == wire::PublishMode::tail) read_credit(core);
  for (bool polled = false;; polled = true) {
    while (auto batch = core.take_batch()) {
      ++counters_.post_send_calls;
      if (auto posted = post_chain(*current().qp, batch->requests(), target_); !posted) {
        core.on_post_error(posted.error());
        return posted;
      }
    }
    // Still due: it waits for send-queue slots, and the completions that free them may be in the
    // CQ already. Without this a producer that only sends and flushes, with ring space to spare,
    // publishes nothing more until its ring is full.
    if (polled || !core.publish_pending() || core.failure()) return success();
    BOOST_OUTCOME_TRYV(poll(core));
  }
}

Result<void> ProducerDataPlane::post_receives(std::uint32_t n) {
  for (std::uint32_t i = 0; i < n; ++i) recv_chain_[i].next = i + 1 < n ? &recv_chain_[i + 1] : nullptr;
  return current().qp->post_recv(recv_chain_[0]);
}

Result<std::size_t> ProducerDataPlane::poll(ProducerCore& core) {
  std::array<ibv_wc, 16> wcs;
  BOOST_OUTCOME_TRY(n, cq_->poll(wcs));
  std::size_t events = n;
  const std::uint32_t qp_num = current().qp->qp_num();
  for (std::size_t i = 0; i < n; ++i) {
    if (wcs[i].qp_num != qp_num) {
      ++counters_.stale_completions;  // the flushed work of a connection reconnect() replaced
      continue;
    }
    const bool ok = wcs[i].status == IBV_WC_SUCCESS;
    if (!ok) ++counters_.completion_errors[ibv_wc_status_str(wcs[i].status)];
    if (wcs[i].wr_id == kRecvWrId) {
      // The credit it announces is read from the credit MR below, as any credit is.
      if (ok) {
        ++counters_.credit_notifications;
        ++recv_owed_;
      } else {
        core.on_post_error(make_error(errc::completion_error, current().qp->describe() + ": receive completed with " +
                                                                  ibv_wc_status_str(wcs[i].status)));
      }
      continue;
    }
    ++counters_.completions;
    core.on_completion(wcs[i].wr_id, ok, wcs[i].status);
  }
  if (recv_owed_ > 0 && !core.failure()) {
    if (auto posted = post_receives(recv_owed_); !posted) {
      core.on_post_error(posted.error());
      return posted.error();
    }
    recv_owed_ = 0;
  }
  if (++poll_calls_ % kAsyncEventInterval == 0) {
    BOOST_OUTCOME_TRYV(check_link(core));
  } else if (async_->pending()) {  // another reader of this process's device context queued events for this one
    BOOST_OUTCOME_TRYV(take_async_events(core, qp_num));
  }
  const std::uint64_t released = core.ledger().released;
  const bool doorbell = core.doorbell();
  const bool owed = core.doorbell_owed();
  read_credit(core);
  // A doorbell owed since an earlier poll is no news: it waits for send-queue slots, and the
  // completion that frees them is the event to wait for.
  if (core.ledger().released != released || core.doorbell() != doorbell || (!owed && core.doorbell_owed())) ++events;
  return events;
}

// What no completion reports: the owner broke the link by disconnecting it (its credit post was
// refused, say), or the QP went fatal with nothing posted. A producer that waits for credit,
// posting nothing, would never see an error completion.
Result<void> ProducerDataPlane::check_link(ProducerCore& core) {
  BOOST_OUTCOME_TRYV(take_cm_event(core));
  return take_async_events(core, current().qp->qp_num());
}

Result<void> ProducerDataPlane::take_ready(ProducerCore& core) {
  if (waiter_->was_ready(current().channel.get()->fd)) {
    BOOST_OUTCOME_TRYV(take_cm_event(core));
  }
  if (waiter_->was_ready(async_->fd()) || async_->pending()) return take_async_events(core, current().qp->qp_num());
  return success();
}

Result<void> ProducerDataPlane::take_cm_event(ProducerCore& core) {
  if (auto event = current().channel.next(std::chrono::milliseconds(0)))
    core.on_post_error(make_error(errc::completion_error, current().id.describe() + ": " + event.value().name() +
                                                              " from the owner: the connection is gone"));
  else if (event.error() != errc::timed_out)
    return event.error();
  return success();
}

Result<void> ProducerDataPlane::take_async_events(ProducerCore& core, std::uint32_t qp_num) {
  BOOST_OUTCOME_TRYV(async_->drain([&](const verbs::AsyncEvent& e) {
    if (e.qp_dead() && e.qp_num == qp_num)
      core.on_post_error(make_error(errc::completion_error, std::string("async event ") + ibv_event_type_str(e.type) +
                                                                " on qp " + std::to_string(e.qp_num)));
  }));
  return success();
}

void ProducerDataPlane::read_credit(ProducerCore& core) const {
  std::array<std::byte, wire::kCreditRecordSize> credit;
  read_dma(credit_buf_.data(), std::span{credit});
  core.on_credit(credit);
}

Result<bool> ProducerDataPlane::arm(ProducerCore& core) {
  if (std::exchange(armed_, false)) {
    BOOST_OUTCOME_TRYV(cq_channel_->take_events());
  }
  // Level-triggered: an event left on either descriptor would end every sleep at once. One look
  // says which has one, instead of a read of each.
  BOOST_OUTCOME_TRYV(waiter_->look());
  BOOST_OUTCOME_TRYV(take_ready(core));
  BOOST_OUTCOME_TRY(before, poll(core));
  if (before > 0 || core.failure()) return false;
  BOOST_OUTCOME_TRYV(cq_->arm());
  armed_ = true;
  // A completion that arrived before the arming raises no event: look once more.
  BOOST_OUTCOME_TRY(after, poll(core));
  if (after > 0 || core.failure()) return false;
  ++counters_.sleeps;
  return true;
}

void ProducerDataPlane::disconnect() noexcept {
  link_.reset();
  if (first_) first_->qp.reset();
}

RegistrationFootprint ProducerDataPlane::registered() const {
  RegistrationFootprint registered;
  registered.add(staging_mr_);
  registered.add(credit_mr_);
  return registered;
}

std::map<std::string, std::uint64_t> ProducerDataPlane::async_event_counts() const { return async_->counts().by_type; }

Result<void> ProducerDataPlane::force_error() { return current().qp->force_error(); }

}  // namespace rdmaring
