#include "rdmaring/owner_data_plane.hpp"

#include <arpa/inet.h>

#include <algorithm>
#include <array>
#include <cstring>

#include "rdmaring/checksum.hpp"
#include "rdmaring/dma.hpp"
#include "rdmaring/post.hpp"
#include "rdmaring/verbs/context.hpp"
#include "rdmaring/verbs/qp.hpp"

namespace rdmaring {
namespace {

constexpr std::size_t kTailBufferBytes = 4096;

// A ring that could not be made or registered (memlock, device, memory): the precise reason, so
// a producer told memlock_too_low or odp_unsupported knows what to fix.
Error ring_failure(const char* call, const std::exception& e) {
  if (const auto* setup = dynamic_cast<const SetupError*>(&e)) {
    Error err = setup->error();
    err.context = std::string(call) + ": " + err.context;
    return err;
  }
  if (dynamic_cast<const std::bad_alloc*>(&e))
    return make_error(errc::no_capacity, std::string(call) + ": out of memory for the ring");
  return make_error(errc::verbs_failure, std::string(call) + ": " + e.what());
}

}  // namespace

// One epoch's connection of a session. The QP goes before its id.
struct OwnerDataPlane::Link {
  verbs::CmId id;
  std::optional<verbs::QueuePair> qp;
  wire::ConnectData producer;  // where credit goes
};

// A session's ring and what reaches it. The buffer lives as long as the session (and any poll
// holding its records); its MRs are registered again at every epoch, which revokes the last
// epoch's rkeys.
struct OwnerDataPlane::SessionRing {
  verbs::AlignedBuffer ring;
  std::optional<verbs::MemoryRegion> ring_mr;
  verbs::AlignedBuffer tail_buf{kTailBufferBytes};
  std::optional<verbs::MemoryRegion> tail_mr;
  std::unique_ptr<Link> link;

  explicit SessionRing(std::uint64_t bytes) : ring(bytes) {}
};

OwnerDataPlane::OwnerDataPlane(const OwnerDataPlaneOptions& options) : options_(options), core_(options.core) {
  listener_.bind_and_listen(options.address, options.data_port, 64);
  const verbs::Context ctx = [&] {
    try {
      return listener_.context();
    } catch (const SetupError& e) {
      if (e.error() != errc::no_device) throw;
      throw SetupError(make_error(errc::no_device, "RingOwner: address " + options.address +
                                                       " is on no RDMA device (rdma_cm bound it to none); give the "
                                                       "address of an RDMA netdev (rdmaring doctor lists them)"));
    }
  }();
  counters_.device = ctx.name();
  pd_.emplace(ctx);
  async_.emplace(ctx);
  cq_channel_.emplace(ctx);
  cq_.emplace(ctx, static_cast<int>(options.core.core.sq_depth * options.core.max_sessions + options.recv_depth),
              &*cq_channel_);
  srq_.emplace(*pd_, options.recv_depth);
  recv_chain_.assign(options.recv_depth, ibv_recv_wr{});
  for (auto& wr : recv_chain_) wr.wr_id = kRecvWrId;  // no scatter list: an immediate carries no payload
  if (auto r = post_receives(options.recv_depth); !r) throw SetupError(r.error());
  waiter_.emplace({cq_channel_->fd()});
}

OwnerDataPlane::~OwnerDataPlane() {
  Notices notices;
  {
    std::lock_guard lock(m_);
    for (SessionId id : core_.session_ids()) core_.close(id, CloseReason::owner_stopped, "the owner stopped");
    apply_actions(notices);
  }
  notify(notices);
}

int OwnerDataPlane::cm_fd() const noexcept { return channel_.get()->fd; }

// ---- rings --------------------------------------------------------------------------------------

Result<std::shared_ptr<OwnerDataPlane::SessionRing>> OwnerDataPlane::new_ring(const char* call) const {
  try {
    auto r = std::make_shared<SessionRing>(options_.core.ring_bytes);
    register_ring(*r);
    return r;
  } catch (const std::exception& e) {
    return ring_failure(call, e);
  }
}

// (Re-)registers the ring and tail MRs. Re-registration is what revokes the old rkeys at a
// resume: a write still carrying one fails with a remote access error and places no byte.
void OwnerDataPlane::register_ring(SessionRing& r) const {
  int ring_access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  if (options_.relaxed_ordering) ring_access |= IBV_ACCESS_RELAXED_ORDERING;
  r.ring_mr.emplace(*pd_, r.ring.data(), r.ring.size(), ring_access, options_.on_demand_paging);
  if (options_.core.mode == wire::PublishMode::tail)
    r.tail_mr.emplace(*pd_, r.tail_buf.data(), r.tail_buf.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
}

RingKeys OwnerDataPlane::keys(const SessionRing& r) const noexcept {
  RingKeys k;
  k.ring_addr = reinterpret_cast<std::uintptr_t>(r.ring.data());
  k.ring_rkey = r.ring_mr->rkey();
  if (r.tail_mr) {
    k.tail_addr = reinterpret_cast<std::uintptr_t>(r.tail_buf.data());
    k.tail_rkey = r.tail_mr->rkey();
  }
  return k;
}

OwnerDataPlane::SessionRing* OwnerDataPlane::ring_of(SessionId id) const {
  const auto it = rings_.find(id);
  return it == rings_.end() ? nullptr : it->second.get();
}

void OwnerDataPlane::drop_link(SessionRing& r) {
  if (!r.link) return;
  if (r.link->qp) by_qp_.erase(r.link->qp->qp_num());
  by_cm_.erase(r.link->id.get());
  r.link.reset();
}

void OwnerDataPlane::apply_actions(Notices& notices) {
  // Twice per poll: what the guest's profile showed on top of the owner's own code (three empty
  // vectors made and destroyed each time) when nothing ended.
  while (core_.has_actions()) {
    for (SessionId id : core_.take_broken()) {
      SessionRing* r = ring_of(id);
      if (r && r->link) (void)r->link->id.start_disconnect();  // already gone: nothing to tell
    }
    auto records = core_.take_records();
    notices.records.insert(notices.records.end(), std::make_move_iterator(records.begin()),
                           std::make_move_iterator(records.end()));
    auto ended = core_.take_closed();
    if (ended.empty()) return;
    for (const ClosedSession& c : ended) {
      const auto it = rings_.find(c.session);
      if (it == rings_.end()) continue;
      drop_link(*it->second);
      if (it->second.use_count() > 1) {
        std::erase_if(outliving_, [](const auto& w) { return w.expired(); });
        outliving_.push_back(it->second);
      }
      rings_.erase(it);  // freed now, or by whatever holds it: a poll, a held batch, a share
    }
    notices.closed.insert(notices.closed.end(), std::make_move_iterator(ended.begin()), std::make_move_iterator(ended.end()));
    // The QPs are destroyed: every completion they will ever make is in the CQ now. Drained
    // before any new QP exists, so a reused QP number cannot inherit them. Their sessions are
    // gone, so they count as stale; a failure shows at the next poll.
    std::array<ibv_wc, 32> wcs;
    for (;;) {
      auto n = cq_->poll(wcs);
      if (!n) break;
      for (std::size_t i = 0; i < n.value(); ++i) dispatch(wcs[i]);
      if (n.value() < wcs.size()) break;
    }
  }
}

void OwnerDataPlane::notify(const Notices& notices) const {
  if (options_.on_session)
    for (const SessionRecord& r : notices.records) options_.on_session(r);
  if (notices.closed.empty()) return;
  if (options_.on_session_closed)
    for (const ClosedSession& c : notices.closed) options_.on_session_closed(c.session, c.reason, c.message);
  // An application asleep in wait() (or on fd()) until its producers are gone learns it now,
  // after on_session_closed has told it which (wakeup.md O4).
  waiter_->wake();
}

OwnerDataPlane::Registered OwnerDataPlane::registered() const {
  // Declared before the lock, so released after it: one of these may be a ring's last holder,
  // and a ring is not freed under the lock.
  std::vector<std::shared_ptr<SessionRing>> looked_at;
  std::lock_guard lock(m_);
  Registered out;
  const auto add = [&out](const SessionRing& r) {
    out.footprint.add(r.ring_mr);
    out.footprint.add(r.tail_mr);
  };
  for (const auto& [id, r] : rings_) add(*r);
  std::erase_if(outliving_, [](const auto& w) { return w.expired(); });
  for (const auto& w : outliving_) {
    if (auto r = w.lock()) {
      add(*r);
      ++out.outliving;
      looked_at.push_back(std::move(r));
    }
  }
  return out;
}

std::map<std::string, std::uint64_t> OwnerDataPlane::async_event_counts() const {
  std::lock_guard lock(m_);
  return async_->counts().by_type;
}

std::optional<std::uint32_t> OwnerDataPlane::ring_checksum(SessionId session) const {
  std::lock_guard lock(m_);
  const SessionRing* r = ring_of(session);
  if (!r) return std::nullopt;
  return crc32c(r->ring.bytes());
}

// ---- completions --------------------------------------------------------------------------------

Result<void> OwnerDataPlane::post_receives(std::uint32_t n) {
  for (std::uint32_t i = 0; i < n; ++i) recv_chain_[i].next = i + 1 < n ? &recv_chain_[i + 1] : nullptr;
  ++counters_.recv_posts;
  return srq_->post_recv(recv_chain_[0]);
}

void OwnerDataPlane::dispatch(const ibv_wc& wc) {
  // A receive is consumed whichever QP it completed for: the SRQ needs it back.
  if (wc.wr_id == kRecvWrId) {
    ++counters_.recv_completions;
    ++recv_owed_;
  }
  const auto it = by_qp_.find(wc.qp_num);
  if (it == by_qp_.end()) {
    ++counters_.stale_completions;  // of a QP that is gone
    return;
  }
  const SessionId id = it->second;
  std::uint32_t imm = ntohl(wc.imm_data);
  if (!faults_.empty()) {
    const auto f = faults_.find(id);
    if (f != faults_.end() && wc.status == IBV_WC_SUCCESS) {
      if (f->second == Fault::drop_credit_completions && wc.wr_id != kRecvWrId) return;
      if (f->second == Fault::corrupt_next_immediate && wc.wr_id == kRecvWrId) {
        imm ^= 1u << wire::kImmEpochShift;  // the low epoch bit (wire-formats.md §3)
        faults_.erase(f);
      }
    }
  }
  if (wc.status != IBV_WC_SUCCESS) {
    // The connection is dead (the producer left, or a credit write ran out of retries): what is
    // published stays deliverable, and the producer may resume.
    ++counters_.completion_errors[ibv_wc_status_str(wc.status)];
    core_.on_error_completion(id);
  } else if (wc.wr_id == kRecvWrId) {
    core_.on_immediate(id, imm);
  } else {
    core_.on_credit_completion(id, wc.wr_id);
  }
}

Result<void> OwnerDataPlane::take_completions(Notices& notices) {
  std::array<ibv_wc, 32> wcs;
  for (;;) {
    BOOST_OUTCOME_TRY(n, cq_->poll(wcs));
    for (std::size_t i = 0; i < n; ++i) dispatch(wcs[i]);
    if (n < wcs.size()) break;
  }
  // Sessions the batch ended are torn down only now, after the whole batch was dispatched in
  // order: tearing one down mid-batch would drain (and dispatch) later completions before the
  // batch's earlier ones, and another session would see its immediates out of order.
  apply_actions(notices);
  if (recv_owed_ >= kRecvRepostBatch) {
    BOOST_OUTCOME_TRYV(post_receives(recv_owed_));
    recv_owed_ = 0;
  }
  return success();
}

void OwnerDataPlane::post_credits() {
  credit_scratch_.clear();
  core_.take_credits(credit_scratch_);
  for (const CreditPost& c : credit_scratch_) {
    SessionRing* r = ring_of(c.session);
    bool refused = !r || !r->link || !r->link->qp;  // the core and this side disagree: treat as refused
    if (!faults_.empty() && !refused) {
      const auto f = faults_.find(c.session);
      if (f != faults_.end() && f->second == Fault::refuse_next_credit_post) {
        refused = true;
        faults_.erase(f);
      }
    }
    if (refused || !post_inline_write(*r->link->qp, c.write.bytes, r->link->producer.credit_addr,
                                      r->link->producer.credit_rkey, c.write.slot, c.write.notify)) {
      // This session's QP refused the post: its link is broken; the others go on.
      ++counters_.credit_post_failures;
      core_.on_link_broken(c.session);
    }
  }
}

// A QP gone fatal with nothing posted on it reports no completion: only its async event tells.
void OwnerDataPlane::take_async_events() {
  (void)async_->drain([this](const verbs::AsyncEvent& e) {
    if (!e.qp_dead()) return;
    if (const auto it = by_qp_.find(e.qp_num); it != by_qp_.end()) core_.on_link_broken(it->second);
  });
}

// ---- the polling thread -------------------------------------------------------------------------

Result<void> OwnerDataPlane::take_events(Notices& notices) {
  // Events a producer of this process read off the shared descriptor wake no observer here.
  if (async_->pending()) take_async_events();
  BOOST_OUTCOME_TRYV(take_completions(notices));
  core_.read_tails([this](SessionId id, std::span<std::byte, wire::kTailRecordSize> into) {
    const SessionRing* r = ring_of(id);
    if (r) read_dma(r->tail_buf.data(), into);
    return r != nullptr;
  });
  return success();
}

Result<bool> OwnerDataPlane::work_waiting(Notices& notices) {
  BOOST_OUTCOME_TRYV(take_events(notices));
  // Completions may have freed the send-queue slots a credit (or a doorbell flag) waited for.
  post_credits();
  apply_actions(notices);
  return core_.work_due(Clock::now());
}

void OwnerDataPlane::disarm() {
  if (!std::exchange(armed_, false)) return;
  // A failed read leaves the channel readable: the next arm() or poll takes it again.
  (void)cq_channel_->take_events();
}

Result<bool> OwnerDataPlane::arm() {
  Notices notices;
  Result<bool> out = false;
  {
    std::lock_guard lock(m_);
    if (polling_) return make_error(errc::invalid_argument, "arm() or wait() while a poll is open: from inside a handler");
    out = [&]() -> Result<bool> {
      disarm();
      // A wake() is taken only here, where it stops a sleep, never by a poll: one that came
      // while the caller was polling still ends its next wait.
      if (waiter_->take_wake()) return false;
      BOOST_OUTCOME_TRY(work, work_waiting(notices));
      if (work) return false;
      // The doorbell flags go out, then the CQ is armed, then everything is looked at again: a
      // publish placed before the arming is found now, one after it raises a completion (an
      // immediate, or the flag write's own completion, after which the next arm() looks again).
      core_.prepare_sleep();
      post_credits();
      BOOST_OUTCOME_TRYV(cq_->arm());
      armed_ = true;
      BOOST_OUTCOME_TRY(again, work_waiting(notices));
      if (again || core_.doorbell_since_prepare()) return false;
      // A record that fails its checks is looked at again at its time: the sleep ends then.
      if (const auto at = core_.next_recheck(); at != wake_at_) {
        BOOST_OUTCOME_TRYV(waiter_->wake_at(at));
        wake_at_ = at;
      }
      ++counters_.sleeps;
      return true;
    }();
  }
  notify(notices);
  return out;
}

Result<bool> OwnerDataPlane::wait(std::chrono::milliseconds timeout) {
  BOOST_OUTCOME_TRY(sleep, arm());
  if (!sleep) return true;
  return waiter_->wait(timeout);
}

Result<void> OwnerDataPlane::take_into(std::size_t max, std::vector<TakenRecord>& taken,
                                       std::vector<std::shared_ptr<void>>& pinned, Notices& notices) {
  disarm();
  BOOST_OUTCOME_TRYV(take_events(notices));
  // The clock only when something was published: an idle consumer polls in a tight loop, and
  // under emulation a clock read costs more than the rest of an empty poll.
  if (core_.wants_clock()) core_.take_deliveries(max, Clock::now(), taken);
  apply_actions(notices);
  for (const TakenRecord& t : taken) {
    if (!pinned.empty() && pinned.back().get() == ring_of(t.delivery.session)) continue;
    if (const auto it = rings_.find(t.delivery.session); it != rings_.end()) pinned.push_back(it->second);
  }
  return success();
}

Result<std::span<const TakenRecord>> OwnerDataPlane::begin_poll(std::size_t max) {
  Notices notices;
  {
    std::lock_guard lock(m_);
    if (polling_)
      return make_error(errc::invalid_argument,
                        "poll() while a poll is open: from inside a handler, or from a second thread");
    if (!held_.empty())
      return make_error(errc::invalid_argument, "poll() while " + std::to_string(held_.size()) +
                                                    " batches are held: finish() them first");
    taken_.clear();
    BOOST_OUTCOME_TRYV(take_into(max, taken_, pinned_, notices));
    polling_ = true;
  }
  notify(notices);
  return std::span<const TakenRecord>(taken_);
}

std::size_t OwnerDataPlane::end_poll(std::size_t handled) noexcept {
  Notices notices;
  std::vector<std::shared_ptr<void>> unpin;
  {
    std::lock_guard lock(m_);
    core_.finish_deliveries(taken_, handled);
    post_credits();
    apply_actions(notices);
    polling_ = false;
    unpin.swap(pinned_);
  }
  // A ring whose session closed during the poll is freed here, outside the lock.
  unpin.clear();
  pinned_.swap(unpin);  // keeps the vector's capacity for the next poll
  notify(notices);
  return std::min(handled, taken_.size());
}

Result<std::vector<TakenRecord>> OwnerDataPlane::take(std::size_t max) {
  Notices notices;
  std::vector<TakenRecord> taken;
  {
    std::lock_guard lock(m_);
    if (polling_) return make_error(errc::invalid_argument, "take() while a poll is open: from inside a handler");
    std::vector<std::shared_ptr<void>> pinned;
    BOOST_OUTCOME_TRYV(take_into(max, taken, pinned, notices));
    // What the events asked for goes out now, as end_poll would post it: a credit request read
    // here (a producer waiting to drain) is answered even when nothing is taken.
    post_credits();
    held_.hold(taken, std::move(pinned));
  }
  notify(notices);
  return taken;
}

Result<void> OwnerDataPlane::finish(std::span<const TakenRecord> batch, std::size_t handled) {
  Notices notices;
  std::vector<std::shared_ptr<void>> unpin;
  {
    std::lock_guard lock(m_);
    BOOST_OUTCOME_TRY(h, held_.remove(batch, handled));
    core_.finish_deliveries(h.taken, handled);
    post_credits();
    apply_actions(notices);
    unpin = std::move(h.pins);
  }
  // A ring whose session closed while the batch was held is freed here, outside the lock.
  unpin.clear();
  notify(notices);
  return success();
}

Result<RingShare> OwnerDataPlane::ring_of(const TakenRecord& held) const {
  // By address, not by session: a held record's session may have ended, and its ring left
  // rings_, while the batch's pin keeps it.
  const std::byte* header = held.delivery.payload.data() - wire::kRecordHeaderSize;
  std::lock_guard lock(m_);
  const std::shared_ptr<void> pin = held_.find_pin([header](const void* p) {
    const auto& ring = static_cast<const SessionRing*>(p)->ring;
    return header >= ring.data() && header < ring.data() + ring.size();
  });
  if (!pin)
    return make_error(errc::invalid_argument, "ring_of(): record " + std::to_string(held.delivery.sequence) +
                                                  " of session " + std::to_string(held.delivery.session) +
                                                  " is in no held batch");
  const verbs::AlignedBuffer& ring = static_cast<const SessionRing*>(pin.get())->ring;
  return RingShare{ring.bytes(), std::shared_ptr<const void>(pin, ring.data())};
}

// ---- the control thread -------------------------------------------------------------------------

void OwnerDataPlane::on_connect_request(verbs::ConnectRequest request, Notices& notices) {
  const auto hello = wire::decode_connect_data(request.private_data);
  if (!hello) {
    ++counters_.malformed_connects;
    return;  // destroying the request's id rejects it
  }
  if (!core_.admit_connect(*hello, Clock::now())) return;
  SessionRing* r = ring_of(hello->session);
  if (!r) {
    core_.connect_failed(hello->session);
    return;
  }
  // A new QP for this epoch replaces any earlier one; the old QP's completions are drained
  // before the new QP exists, so its number cannot inherit them.
  drop_link(*r);
  (void)take_completions(notices);
  auto link = std::make_unique<Link>(Link{std::move(request.id), {}, *hello});
  try {
    verbs::QueuePairCaps caps;
    caps.max_send_wr = options_.core.core.sq_depth;
    caps.max_recv_wr = 1;
    caps.max_inline_data = wire::kCreditRecordSize;
    link->qp.emplace(link->id, *pd_, *cq_, *cq_, caps, &*srq_);
    if (link->qp->max_inline_data() < wire::kCreditRecordSize) {
      core_.connect_failed(hello->session);
      return;
    }
    const auto reply = wire::encode(wire::AcceptData{hello->epoch});
    rdma_conn_param param{};
    param.private_data = reply.data();
    param.private_data_len = static_cast<std::uint8_t>(reply.size());
    param.retry_count = 7;
    param.rnr_retry_count = 7;
    link->id.start_accept(param);
  } catch (const SetupError&) {
    core_.connect_failed(hello->session);
    return;
  }
  by_qp_[link->qp->qp_num()] = hello->session;
  by_cm_[link->id.get()] = hello->session;
  r->link = std::move(link);
}

void OwnerDataPlane::on_cm_readable() {
  Notices notices;
  {
    std::lock_guard lock(m_);
    for (;;) {
      auto event = verbs::next_event(channel_.get(), std::chrono::milliseconds(0));
      if (!event) break;  // none left (or the channel failed: the next readable edge retries)
      if (event.value().type() == RDMA_CM_EVENT_CONNECT_REQUEST) {
        // The request's id is destroyed (rejecting it) or kept only after its event is acked.
        std::optional<verbs::ConnectRequest> request;
        {
          const verbs::CmEvent e = std::move(event).value();
          request.emplace(verbs::CmId::adopt_request(e));
        }
        on_connect_request(std::move(*request), notices);
        continue;
      }
      const auto it = by_cm_.find(event.value().id());
      if (it == by_cm_.end()) continue;  // an id already replaced or closed
      switch (event.value().type()) {
        case RDMA_CM_EVENT_ESTABLISHED:
          core_.on_established(it->second);
          break;
        case RDMA_CM_EVENT_DISCONNECTED:
        case RDMA_CM_EVENT_CONNECT_ERROR:
        case RDMA_CM_EVENT_UNREACHABLE:
        case RDMA_CM_EVENT_REJECTED:
        case RDMA_CM_EVENT_DEVICE_REMOVAL:
          core_.on_link_broken(it->second);
          break;
        default:
          break;
      }
    }
    apply_actions(notices);
  }
  // A new or broken link: a sleeping poller arms again, which asks the new link's producer for
  // doorbells or takes the broken one's completions.
  waiter_->wake();
  notify(notices);
}

void OwnerDataPlane::on_async_readable() {
  std::lock_guard lock(m_);
  take_async_events();
}

void OwnerDataPlane::tick(Clock::time_point now) {
  Notices notices;
  {
    std::lock_guard lock(m_);
    core_.tick(now);
    apply_actions(notices);
  }
  notify(notices);
}

Result<Granted> OwnerDataPlane::attach(std::string_view identity, Clock::time_point now) {
  {
    std::lock_guard lock(m_);
    BOOST_OUTCOME_TRYV(core_.can_attach(identity));
  }
  BOOST_OUTCOME_TRY(ring, new_ring("attach"));
  Notices notices;
  Result<Granted> out = make_error(errc::no_capacity);
  {
    std::lock_guard lock(m_);
    BOOST_OUTCOME_TRY(entry, core_.attach(identity, ring->ring.bytes(), now));
    rings_[entry.id] = ring;
    out = Granted{entry, ResumePoint{}, keys(*ring)};
    apply_actions(notices);
  }
  // The durable record is the application's before the attach reply leaves (sessions.md §10.1).
  notify(notices);
  waiter_->wake();  // wakeup.md O4: an application waiting for its producers to come
  return out;
}

bool OwnerDataPlane::knows(SessionId id) const {
  std::lock_guard lock(m_);
  return core_.table().find(id) != nullptr;
}

Result<Granted> OwnerDataPlane::restore(const Credentials& who, const DurableSession& durable, bool restarted,
                                        std::uint64_t released, std::uint64_t first, Clock::time_point now) {
  BOOST_OUTCOME_TRY(ring, new_ring("restore"));
  Notices notices;
  Result<Granted> out = make_error(errc::unknown_session);
  {
    std::lock_guard lock(m_);
    BOOST_OUTCOME_TRY(at, core_.restore(who, durable, restarted, released, first, ring->ring.bytes(), now));
    rings_[who.session] = ring;
    out = Granted{*core_.table().find(who.session), at, keys(*ring)};
    apply_actions(notices);
  }
  notify(notices);
  waiter_->wake();
  return out;
}

Result<Granted> OwnerDataPlane::resume(const Credentials& who, Clock::time_point now) {
  Notices notices;
  std::shared_ptr<SessionRing> ring;
  std::optional<verbs::MemoryRegion> old_ring_mr, old_tail_mr;
  Fence fence;
  {
    std::lock_guard lock(m_);
    BOOST_OUTCOME_TRY(f, core_.resume(who, now));
    fence = f;
    const auto it = rings_.find(who.session);
    if (it == rings_.end()) return make_error(errc::unknown_session, "session " + std::to_string(who.session) + " has no ring");
    ring = it->second;
    // Ends the epoch: its QP is gone and its completions dispatched before anything else.
    drop_link(*ring);
    (void)take_completions(notices);
    // The tail record is read by the polling thread under the lock: zeroed here, not below.
    std::fill(ring->tail_buf.bytes().begin(), ring->tail_buf.bytes().end(), std::byte{0});
    old_ring_mr = std::move(ring->ring_mr);
    old_tail_mr = std::move(ring->tail_mr);
    ring->ring_mr.reset();
    ring->tail_mr.reset();
  }
  notify(notices);
  notices = {};
  // Outside the lock, the other sessions deliver on: the old rkeys die with their MRs, then the
  // unread ring is zeroed (no QP of the session exists and the core reads nothing past the read
  // head), then the ring is registered again. Until fence_done no QP is admitted for it.
  old_ring_mr.reset();
  old_tail_mr.reset();
  for (const ByteRange& z : fence.zero) std::memset(ring->ring.data() + z.offset, 0, z.length);
  std::optional<Error> failed;
  try {
    register_ring(*ring);
  } catch (const std::exception& e) {
    failed = ring_failure("resume", e);
  }
  Result<Granted> out = make_error(errc::unknown_session, "session " + std::to_string(who.session) + " closed while fenced");
  {
    std::lock_guard lock(m_);
    const SessionEntry* e = core_.table().find(who.session);
    if (failed) {
      core_.close(who.session, CloseReason::ring_failure, failed->message());
      out = *failed;
    } else if (e && ring_of(who.session) == ring.get()) {
      core_.fence_done(who.session);
      out = Granted{*e, fence.at, keys(*ring)};
    }
    apply_actions(notices);
  }
  notify(notices);
  waiter_->wake();
  return out;
}

void OwnerDataPlane::inject(SessionId session, Fault fault) {
  Notices notices;
  {
    std::lock_guard lock(m_);
    if (fault != Fault::qp_error) {
      faults_[session] = fault;
      return;
    }
    // As a QP the device put into the error state, with the QP-fatal async event a device raises
    // for it (a QP moved to error by hand raises none): its posts flush, the peer's writes go
    // unanswered, and the link breaks as take_async_events() would break it.
    SessionRing* r = ring_of(session);
    if (!r || !r->link || !r->link->qp) return;
    (void)r->link->qp->force_error();
    core_.on_link_broken(session);
    apply_actions(notices);
  }
  notify(notices);
}

Result<void> OwnerDataPlane::heartbeat(const Credentials& who, Clock::time_point now) {
  std::lock_guard lock(m_);
  return core_.heartbeat(who, now);
}

Result<void> OwnerDataPlane::detach(const Credentials& who) {
  Notices notices;
  Result<void> ok = success();
  {
    std::lock_guard lock(m_);
    ok = core_.detach(who);
    apply_actions(notices);
  }
  notify(notices);
  return ok;
}

}  // namespace rdmaring
