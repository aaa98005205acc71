// A deterministic in-process fabric for tests: producer cores and the ring owner's OwnerCore
// joined by plain memory. The owner side is an OwnerCore and nothing else (sessions, links,
// fencing, credit decisions, delivery): this file only executes what it decides, the way
// OwnerDataPlane does on verbs, so the tests exercise the very code the library runs.
//
// LoopbackOwner is the owner's process: its OwnerCore, one completion queue shared by every
// session's QPs (receive completions carrying immediates, credit-write completions), dispatched
// in order, and the log of the sessions the core ended. LoopbackFabric is one session: its ring
// and tail MR, its producer core and staging, its QP. A single-session fabric makes its own
// owner; several fabrics can share one (the multi-session mode).
//
// The fabric executes the producer's work requests the way an RC QP does (in order) and places
// them as the ring MR's ordering allows (in order; in any order with relaxed ordering, the
// immediate's completion still after all of its QP's earlier payload). It lets a test hold back
// placements, delay completions and immediates, kill the QP, resume (OwnerCore::resume, zero
// the fence's ranges, fence_done; admit_connect, on_established) and replay old control
// messages, on the producer's control connection or on another one (each a ControlConnection,
// as the owner's adapter keeps them), and it lets a test break the rules on purpose
// (place_publish_first, inject_immediate). A test instrument: the library never links it.
#pragma once

#include <algorithm>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "rdmaring/control_connection.hpp"
#include "rdmaring/delivery_batch.hpp"
#include "rdmaring/owner_core.hpp"
#include "rdmaring/producer_core.hpp"

namespace rdmaring::test {

class LoopbackFabric;

// The owner's side: an OwnerCore and the completion queue its adapter polls.
class LoopbackOwner {
 public:
  explicit LoopbackOwner(const OwnerConfig& config) : config_(config), core_((check(config), config)) {}
  LoopbackOwner(const LoopbackOwner&) = delete;
  LoopbackOwner& operator=(const LoopbackOwner&) = delete;

  // The owner's clock: real time unless a test pins it.
  std::optional<Clock::time_point> pinned_time;
  Clock::time_point now() const { return pinned_time ? *pinned_time : Clock::now(); }

  OwnerCore& core() { return core_; }
  const OwnerCore& core() const { return core_; }
  const OwnerConfig& config() const { return config_; }

  // ---- the completion queue -------------------------------------------------------------------

  struct Completion {
    enum class Kind { receive, credit, error };
    std::uint64_t qp = 0;
    Kind kind = Kind::receive;
    std::uint32_t imm = 0;
    std::uint64_t wr_id = 0;
  };
  void push(const Completion& c) { cq_.push_back(c); }
  std::size_t queued() const { return cq_.size(); }
  // What is queued, oldest first (for tests that complete one WR at a time and watch each).
  const std::deque<Completion>& completions() const { return cq_; }
  std::size_t queued_receives() const {
    return static_cast<std::size_t>(std::count_if(cq_.begin(), cq_.end(), [](const Completion& c) {
      return c.kind == Completion::Kind::receive;
    }));
  }
  std::uint64_t stale_completions() const { return stale_; }

  // Dispatches up to `max` completions in order, as OwnerDataPlane::take_completions does: a
  // completion of a QP that is gone (replaced, fenced, closed) is stale and dropped. Sessions
  // the batch ended are torn down only after the whole batch.
  std::size_t poll(std::size_t max = SIZE_MAX) {
    std::size_t n = 0;
    for (; n < max && !cq_.empty(); ++n) {
      const Completion c = cq_.front();
      cq_.pop_front();
      const auto it = qps_.find(c.qp);
      if (it == qps_.end()) {
        ++stale_;
        continue;
      }
      switch (c.kind) {
        case Completion::Kind::receive: core_.on_immediate(it->second, c.imm); break;
        case Completion::Kind::credit: core_.on_credit_completion(it->second, c.wr_id); break;
        case Completion::Kind::error: core_.on_error_completion(it->second); break;
      }
    }
    collect_closed();
    return n;
  }

  // Mode tail: reads every session's tail MR (OwnerDataPlane::begin_poll).
  void read_tails();

  // ---- delivery -------------------------------------------------------------------------------

  // take_deliveries: up to `max` records, the sessions in turn.
  std::vector<TakenRecord> take(std::size_t max, Clock::time_point now) {
    std::vector<TakenRecord> out;
    core_.take_deliveries(max, now, out);
    collect_closed();
    return out;
  }
  std::vector<TakenRecord> take(std::size_t max) { return take(max, now()); }
  // finish_deliveries, then the credit that became due (OwnerDataPlane::end_poll).
  void finish(std::span<const TakenRecord> taken, std::size_t handled) {
    core_.finish_deliveries(taken, handled);
    post_credits();
    collect_closed();
  }
  // A poll: take up to `max`, hand each to `handler` (returns HandlerAction, or void: consume),
  // finish with what it handled, as RingOwner::poll (a throw releases what came before it).
  // Returns how many were handled.
  template <class Handler>
  std::size_t deliver(std::size_t max, Handler&& handler, Clock::time_point now) {
    return deliver_with(max, now, [&handler](std::span<const TakenRecord> taken, std::size_t& handled) {
             return Result<std::size_t>(hand_each(taken, handler, handled));
           }).value();
  }
  template <class Handler>
  std::size_t deliver(std::size_t max, Handler&& handler) {
    return deliver(max, std::forward<Handler>(handler), now());
  }
  // The same as one batch, as RingOwner::poll_batch: handler(const DeliveryBatch&) returns how
  // many it handled.
  template <class Handler>
  Result<std::size_t> deliver_batch(std::size_t max, Handler&& handler) {
    return deliver_with(max, now(), [&handler](std::span<const TakenRecord> taken, std::size_t& handled) {
      return hand_batch(taken, handler, handled);
    });
  }

  // take_credits, each posted on the session's QP: the credit lands in the producer's credit
  // MR when the QP is the producer's; a signaled one completes in the CQ.
  void post_credits();

  // ---- sessions ended ---------------------------------------------------------------------------

  // take_closed, after each batch of events: the fabric drops the session's QP.
  void collect_closed();
  const std::vector<ClosedSession>& closed() const { return closed_; }
  const ClosedSession* closed(SessionId id) const {
    for (const ClosedSession& c : closed_)
      if (c.session == id) return &c;
    return nullptr;
  }

  std::uint64_t new_qp(SessionId id) {
    qps_[++last_qp_] = id;
    return last_qp_;
  }
  void destroy_qp(std::uint64_t qp) { qps_.erase(qp); }

 private:
  friend class LoopbackFabric;
  template <class HandOver>
  Result<std::size_t> deliver_with(std::size_t max, Clock::time_point now, HandOver&& hand_over) {
    const auto taken = take(max, now);
    std::size_t handled = 0;
    Result<std::size_t> outcome = std::size_t{0};
    try {
      outcome = hand_over(std::span<const TakenRecord>(taken), handled);
    } catch (...) {
      finish(taken, handled);
      throw;
    }
    finish(taken, handled);
    if (!outcome) return std::move(outcome).error();
    return handled;
  }
  static void check(const OwnerConfig& c) {
    if (auto ok = c.validate(); !ok) throw std::invalid_argument("loopback owner: " + ok.error().message());
  }

  OwnerConfig config_;
  OwnerCore core_;
  std::deque<Completion> cq_;
  std::map<std::uint64_t, SessionId> qps_;  // live QPs (dead ones too, until destroyed)
  std::uint64_t last_qp_ = 0;
  std::uint64_t stale_ = 0;
  std::map<SessionId, LoopbackFabric*> fabrics_;
  std::vector<ClosedSession> closed_;
  std::vector<CreditPost> credit_scratch_;
};

class LoopbackFabric {
 public:
  // One session with an owner of its own. `relaxed`: the ring MR has relaxed ordering (mode imm
  // only, as RingOwnerOptions requires). Leases never run out.
  LoopbackFabric(wire::PublishMode mode, std::uint64_t ring_bytes, std::uint32_t max_record, ProducerConfig pc = {},
                 ConsumerConfig cc = {}, bool relaxed = false,
                 std::uint32_t tail_park_reads = OwnerConfig{}.tail_park_reads)
      : own_(std::make_unique<LoopbackOwner>(single_owner(mode, ring_bytes, max_record, cc, tail_park_reads))),
        owner_(*own_),
        relaxed_(relaxed),
        producer_config_(pc) {
    open();
  }
  // One more session of a shared owner, in its mode, ring size and payload check.
  explicit LoopbackFabric(LoopbackOwner& owner, ProducerConfig pc = {}, bool relaxed = false)
      : owner_(owner), relaxed_(relaxed), producer_config_(pc) {
    open();
  }
  LoopbackFabric(const LoopbackFabric&) = delete;
  LoopbackFabric& operator=(const LoopbackFabric&) = delete;
  ~LoopbackFabric() {
    if (link_) owner_.destroy_qp(link_->qp);
    owner_.fabrics_.erase(session_.id);
  }

  // The producer's credit MR: the last credit record that landed.
  const std::array<std::byte, wire::kCreditRecordSize>& credit_mr() const { return credit_mr_; }

  // ---- the data path ------------------------------------------------------------------------

  // Posts what the producer has waiting (if anything) and places it at once unless held. With
  // no live QP the batch fails the way a QP in the error state fails it.
  bool flush() {
    auto batch = producer->take_batch();
    if (!batch) return false;
    // The QP's send queue has sq_depth slots, whatever the core counted: past them, a real
    // ibv_post_send fails, and a core that posts there has a WR it holds no slot for.
    if (producer->send_queue_outstanding() > producer_config_.sq_depth)
      throw std::logic_error("loopback: the producer has " + std::to_string(producer->send_queue_outstanding()) +
                             " WRs outstanding on a send queue of " + std::to_string(producer_config_.sq_depth));
    if (dropped()) {
      producer->on_completion(batch->wrs[0].slot.wr_id, false, 5 /* IBV_WC_WR_FLUSH_ERR */);
      return true;
    }
    std::size_t payload_wrs = 0;
    for (const auto& wr : batch->requests()) {
      in_flight_.push_back(InFlight{wr, std::vector<bool>(wr.kind == WorkRequest::Kind::write_tail ? 1 : chunks(wr))});
      payload_wrs += wr.length > 0;
    }
    if (payload_wrs == 2) ++stats_.wrapped_batches;
    if (!hold_) place_all();
    return true;
  }

  // Places the oldest in-flight work request only (the rest stays on the wire).
  bool place_one() {
    if (in_flight_.empty()) return false;
    InFlight& front = in_flight_.front();
    if (!on_place && std::none_of(front.placed.begin(), front.placed.end(), [](bool b) { return b; }) &&
        front.wr.kind != WorkRequest::Kind::write_tail) {
      // Nobody watches the pieces land: the whole WRITE at once.
      std::memcpy(ring_.data() + front.wr.remote_offset, staging_.data() + front.wr.local_offset, front.wr.length);
      std::fill(front.placed.begin(), front.placed.end(), true);
    }
    for (std::size_t c = 0; c < chunks(front.wr); ++c) place_chunk_of(front, c);
    if (front.wr.kind == WorkRequest::Kind::write_tail) place_tail(front);
    retire();
    return true;
  }

  // Places in-flight work requests in posting order (what RC guarantees).
  void place_all() {
    while (place_one()) {
    }
  }

  // Places one 64-byte piece of an in-flight WRITE, as far as the ring MR's ordering allows:
  // with relaxed ordering any unplaced piece of any in-flight payload WRITE (picked by `pick`),
  // even of a later batch; without it the next piece in posting order. A WRITE_WITH_IMM's
  // immediate is generated only when it and every WRITE before it on the QP is fully placed.
  // Returns what was placed ("" when nothing was in flight).
  std::string place_piece(std::size_t pick) {
    if (in_flight_.empty()) return "";
    if (!relaxed_) {
      InFlight& front = in_flight_.front();
      std::string what;
      if (front.wr.kind == WorkRequest::Kind::write_tail) {
        place_tail(front);
        what = "tail record";
      } else {
        std::size_t c = 0;
        while (c < chunks(front.wr) && front.placed[c]) ++c;
        if (c < chunks(front.wr)) {
          place_chunk_of(front, c);
          what = describe(front.wr, c);
        } else {
          what = "zero-length WRITE_WITH_IMM";
        }
      }
      retire();
      return what;
    }
    std::vector<std::pair<std::size_t, std::size_t>> open;  // (in-flight index, piece)
    for (std::size_t i = 0; i < in_flight_.size(); ++i)
      for (std::size_t c = 0; c < chunks(in_flight_[i].wr); ++c)
        if (!in_flight_[i].placed[c]) open.emplace_back(i, c);
    std::string what = "nothing unplaced (completions only)";
    if (!open.empty()) {
      const auto [i, c] = open[pick % open.size()];
      if (open[0] != std::make_pair(i, c)) ++stats_.out_of_order_pieces;
      place_chunk_of(in_flight_[i], c);
      what = describe(in_flight_[i].wr, c) + " of in-flight WR #" + std::to_string(i);
    }
    retire();
    return what;
  }

  // The producer's QP dies: whatever is still on the wire is lost (a relaxed WRITE may be left
  // half placed), the producer gets a flush error if anything was outstanding, and the owner is
  // told the link broke (OwnerCore::on_link_broken). Receive completions already generated stay
  // in the owner's CQ: it still takes them until the QP is destroyed (replaced or fenced).
  void drop() {
    if (dropped()) return;
    const bool outstanding = !in_flight_.empty() || producer->send_queue_outstanding() > 0;
    in_flight_.clear();
    link_->dead = true;
    owner_.core_.on_link_broken(session_.id);
    if (outstanding) complete_or_queue(Completion{0, false});
  }
  // Whether the producer has no live QP (it never connected in its epoch, or the QP died, or
  // the owner replaced it).
  bool dropped() const { return !(link_ && link_->producer && !link_->dead); }

  // Send completions are queued until complete() when delayed (default: at once).
  void delay_completions(bool on) { delay_completions_ = on; }
  std::size_t complete(std::size_t max = SIZE_MAX) {
    std::size_t n = 0;
    for (; n < max && !completions_.empty(); ++n) {
      const Completion c = completions_.front();
      completions_.pop_front();
      producer->on_completion(c.wr_id, c.ok, c.ok ? 0 : 5 /* IBV_WC_WR_FLUSH_ERR */);
    }
    return n;
  }

  // Places the publish of the oldest batch before its payload: the trap of tail mode with
  // relaxed ordering (it breaks the rules on purpose). Returns the payload WRs still unplaced.
  std::vector<WorkRequest> place_publish_first() {
    std::vector<WorkRequest> held;
    while (!in_flight_.empty()) {
      auto wr = in_flight_.front().wr;
      in_flight_.pop_front();
      if (wr.kind == WorkRequest::Kind::write) {
        held.push_back(wr);
        continue;
      }
      place(wr);
      break;
    }
    return held;
  }

  // Places one whole work request now, whatever its turn (for tests that break the rules).
  void place(const WorkRequest& wr) {
    if (on_place) on_place(wr);
    switch (wr.kind) {
      case WorkRequest::Kind::write:
      case WorkRequest::Kind::write_with_imm:
        std::memcpy(ring_.data() + wr.remote_offset, staging_.data() + wr.local_offset, wr.length);
        if (wr.kind == WorkRequest::Kind::write_with_imm) receive(wr.imm);
        break;
      case WorkRequest::Kind::write_tail:
        std::memcpy(tail_mr_.data(), wr.tail.data(), wr.tail.size());
        break;
    }
    if (wr.slot.signaled) complete_or_queue(Completion{wr.slot.wr_id, true});
  }

  // A receive completion with `imm` on this session's QP, as if the producer had sent it (for
  // tests that break the rules).
  void inject_immediate(std::uint32_t imm) {
    if (!link_) throw std::logic_error("loopback: no QP to inject an immediate on");
    owner_.push({link_->qp, LoopbackOwner::Completion::Kind::receive, imm, 0});
  }

  // The owner takes its completions (the shared CQ) and, in mode tail, reads this session's
  // tail MR; then the credit that is due goes out. REQUIREs that this session survives.
  void deliver_publishes() {
    const auto ok = take_publishes();
    if (!ok) FAIL(ok.error().message());
  }
  // The same without Catch: at most `max` completions (late ones stay queued), then the tail
  // MR. Errors: this session was closed (the core's reason and message).
  Result<void> take_publishes(std::size_t max = SIZE_MAX) {
    owner_.poll(max);
    // A parked session's tail is read only after its doorbell, as RingOwner reads it.
    if (mode() == wire::PublishMode::tail && !closed() && owner_.core_.tail_watched(session_.id))
      owner_.core_.on_tail(session_.id, std::span<const std::byte, wire::kTailRecordSize>(tail_mr_));
    owner_.collect_closed();
    return alive();
  }
  std::size_t immediates_queued() const { return owner_.queued_receives(); }

  // The owner posts the credit due (OwnerCore::take_credits) over whatever QP the core says is
  // live; the producer polls its credit MR either way.
  void return_credit() {
    owner_.post_credits();
    owner_.collect_closed();
    producer->on_credit(credit_mr_);
  }

  // ---- delivery, as the application sees it --------------------------------------------------

  std::vector<TakenRecord> take(std::size_t max, Clock::time_point now) { return owner_.take(max, now); }
  std::vector<TakenRecord> take(std::size_t max) { return owner_.take(max); }
  void finish(std::span<const TakenRecord> taken, std::size_t handled) { owner_.finish(taken, handled); }
  template <class Handler>
  std::size_t deliver(std::size_t max, Handler&& handler, Clock::time_point now) {
    return owner_.deliver(max, std::forward<Handler>(handler), now);
  }
  template <class Handler>
  std::size_t deliver(std::size_t max, Handler&& handler) {
    return owner_.deliver(max, std::forward<Handler>(handler));
  }
  // The next record of this session, taken (being consumed until finished), or none. Errors:
  // the owner closed the session (its reason's message): a protocol violation shows here.
  Result<std::optional<TakenRecord>> next(Clock::time_point now) {
    BOOST_OUTCOME_TRYV(alive());
    auto t = take(1, now);
    BOOST_OUTCOME_TRYV(alive());
    if (t.empty()) return std::optional<TakenRecord>{};
    if (t[0].delivery.session != session_.id)
      throw std::logic_error("loopback: next() on a fabric that shares its owner took another session's record");
    return std::optional<TakenRecord>{t[0]};
  }
  Result<std::optional<TakenRecord>> next() { return next(owner_.now()); }

  // This session's consumer core, in the owner (throws once the session is closed).
  const ConsumerCore& consumer() const {
    const ConsumerCore* c = owner_.core_.consumer(session_.id);
    if (!c) throw std::logic_error("loopback: session " + std::to_string(session_.id) + " is closed");
    return *c;
  }
  bool closed() const { return owner_.core_.consumer(session_.id) == nullptr; }
  // Ok while the session lives; else the owner's verdict (protocol_violation for one).
  Result<void> alive() const {
    if (!closed()) return success();
    const ClosedSession* c = owner_.closed(session_.id);
    if (c && c->reason == CloseReason::protocol_violation) return make_error(errc::protocol_violation, c->message);
    return make_error(errc::unknown_session, "session " + std::to_string(session_.id) + " closed" +
                                                 (c ? std::string(": ") + to_string(c->reason) + " " + c->message : ""));
  }

  // ---- the control plane --------------------------------------------------------------------

  // Who the producer's control channel authenticates.
  static constexpr std::string_view kIdentity = "producer";

  // A control message as the control channel carries it: its proof binds the connection it was
  // sent on (`sent_on`, that connection's nonce: not carried, the proof covers it) and its
  // counter there.
  struct Request {
    SessionId session = 0;
    std::uint64_t epoch = 0;
    std::uint64_t counter = 0;
    Proof proof{};
    ChannelNonce sent_on{};
  };

  // The producer's control message for `purpose` and `epoch`, with the next counter of its
  // control connection.
  Request request(ProofPurpose purpose, std::uint64_t epoch) {
    const ChannelBinding binding{control_->nonce(), ++counter_};
    return Request{session_.id, epoch, binding.counter,
                   make_control_proof(session_.secret, purpose, session_.id, epoch, binding), binding.nonce};
  }
  // Producer::recover signs its core's epoch.
  Request resume_request(std::uint64_t epoch) { return request(ProofPurpose::resume, epoch); }
  wire::ConnectData connect_request(std::uint64_t epoch) const {
    return wire::ConnectData{session_.id, epoch, make_proof(session_.secret, ProofPurpose::connect, session_.id, epoch),
                             0x1000, 7};
  }
  // The owner's side of `r` arriving on `on`: the connection binds its counter (refused there:
  // a replay on it) and names who sent it. Valid while `r` and `on` are.
  static Result<Credentials> arrive(const Request& r, ControlConnection& on) {
    BOOST_OUTCOME_TRY(binding, on.bind(r.counter));
    return Credentials{r.session, r.epoch, r.proof, on.identity(), binding};
  }
  // A fresh heartbeat or detach of the producer's, as the owner receives it (valid until the
  // next call).
  Credentials credentials(ProofPurpose purpose, std::uint64_t epoch) {
    scratch_ = request(purpose, epoch);
    return arrive(scratch_, *control_).value();
  }
  // The producer's control connection, as the owner's adapter keeps it.
  ControlConnection& control() { return *control_; }
  // The producer opens a new control connection (a new process, or the old one cut): a fresh
  // nonce, counters from 1 again.
  void reconnect() {
    control_.emplace(std::string(kIdentity), random_nonce());
    counter_ = 0;
  }

  // OwnerDataPlane::resume, first half: OwnerCore::resume fences the epoch; the QP is destroyed
  // (its completions still in the CQ are stale), the tail MR zeroed (its last record kept here
  // as a replay) and the fence's ranges zeroed. Connect requests stay refused until
  // end_fence(). Every request is logged, for replays. `r` arrives on the producer's control
  // connection, or on `on`.
  Result<Fence> begin_fence(const Request& r) { return begin_fence(r, *control_); }
  Result<Fence> begin_fence(const Request& r, ControlConnection& on) {
    resumes_sent_.push_back(r);
    BOOST_OUTCOME_TRY(who, arrive(r, on));
    BOOST_OUTCOME_TRY(f, owner_.core_.resume(who, owner_.now()));
    drop_link();
    old_tails_.push_back(tail_mr_);
    tail_mr_ = {};
    for (const ByteRange& z : f.zero) std::memset(ring_.data() + z.offset, 0, z.length);
    return f;
  }
  // ... and the second half: re-registered (new rkeys: nothing to do in memory), fence_done.
  void end_fence() { owner_.core_.fence_done(session_.id); }

  // The whole of OwnerDataPlane::resume for a known session. Returns the grant's resume point.
  Result<ResumePoint> owner_resume(const Request& r) { return owner_resume(r, *control_); }
  Result<ResumePoint> owner_resume(const Request& r, ControlConnection& on) {
    BOOST_OUTCOME_TRY(f, begin_fence(r, on));
    end_fence();
    return f.at;
  }

  // OwnerDataPlane::on_connect_request: OwnerCore::admit_connect, then the new QP replaces any
  // earlier one. `from_producer`: false for a replayed request (the QP is someone else's: the
  // producer's link, if any, is dropped and nothing it posts lands). Logged, for replays.
  Result<void> owner_connect(const wire::ConnectData& c, bool from_producer) {
    connects_sent_.push_back(c);
    BOOST_OUTCOME_TRYV(owner_.core_.admit_connect(c, owner_.now()));
    drop_link();
    link_ = Link{owner_.new_qp(session_.id), c.epoch, from_producer, false, false};
    return success();
  }

  // The CM's ESTABLISHED event for the current QP (once per QP; none for a dead one) reaches the
  // owner: OwnerCore::on_established.
  bool established() {
    if (!link_ || link_->dead || link_->established) return false;
    link_->established = true;
    owner_.core_.on_established(session_.id);
    return true;
  }

  // The producer's side of a grant: ProducerCore::resume, then a connect request is due. The
  // old QP's completions are recognised by qp_num and dropped.
  Result<void> producer_resume(const ResumePoint& at) {
    BOOST_OUTCOME_TRYV(producer->resume(at));
    completions_.clear();
    pending_connect_ = connect_request(at.epoch);
    return success();
  }
  // A producer that lost its staging starts again, empty, at the grant.
  void producer_restart(const ResumePoint& at) {
    std::fill(staging_.begin(), staging_.end(), std::byte{0});
    const wire::PayloadCheck check = producer->peer().payload_check;  // the ring's, as granted
    producer.emplace(staging_, PeerRing{mode(), geometry(), at, check}, producer_config_);
    completions_.clear();
    credit_mr_ = {};  // a new process registers a new credit MR
    pending_connect_ = connect_request(at.epoch);
  }
  // The producer's pending connect request reaches the owner. Refused: the producer has no QP.
  Result<void> connect() {
    if (!pending_connect_) return make_error(errc::invalid_argument, "no connect pending");
    const auto c = *pending_connect_;
    pending_connect_.reset();
    return owner_connect(c, true);
  }
  bool connect_pending() const { return pending_connect_.has_value(); }
  // The producer gives up on its connect attempt (its QP died first): the request never arrives.
  void abandon_connect() { pending_connect_.reset(); }

  // A whole recover() as Producer::recover does it: resume from the core's epoch, take the
  // grant, connect; then the owner sees ESTABLISHED.
  Result<ResumePoint> resume() {
    BOOST_OUTCOME_TRY(at, owner_resume(resume_request(producer->epoch())));
    BOOST_OUTCOME_TRYV(producer_resume(at));
    BOOST_OUTCOME_TRYV(connect());
    established();
    return at;
  }
  // As resume(), but the producer process died: a new one rejoins with the credentials it kept
  // (session, secret, last epoch) over a control connection of its own and starts empty at the
  // grant.
  Result<ResumePoint> restart_producer() {
    reconnect();
    BOOST_OUTCOME_TRY(at, owner_resume(resume_request(producer->epoch())));
    producer_restart(at);
    BOOST_OUTCOME_TRYV(connect());
    established();
    return at;
  }

  const std::vector<Request>& resumes_sent() const { return resumes_sent_; }
  const std::vector<wire::ConnectData>& connects_sent() const { return connects_sent_; }
  const SessionTable& table() const { return owner_.core_.table(); }
  SessionId session() const { return session_.id; }
  std::optional<std::uint64_t> link_epoch() const {
    return link_ ? std::optional<std::uint64_t>(link_->epoch) : std::nullopt;
  }

  // A tail record of an earlier epoch, as the consumer would read it if one were replayed. (Its
  // write cannot land in the MR: re-keying at resume revoked the rkey it was sent with.)
  std::optional<std::array<std::byte, wire::kTailRecordSize>> old_tail() const {
    if (old_tails_.empty()) return std::nullopt;
    return old_tails_.front();
  }

  LoopbackOwner& owner() { return owner_; }
  const LoopbackOwner& owner() const { return owner_; }
  OwnerCore& core() { return owner_.core_; }
  const OwnerCore& core() const { return owner_.core_; }
  wire::PublishMode consumer_mode() const { return mode(); }
  wire::PublishMode mode() const { return owner_.config_.mode; }
  bool relaxed() const { return relaxed_; }
  const RingGeometry& geometry() const { return geometry_; }
  // Called with each piece of a work request as it is placed, before its bytes land (for
  // invariant checks): a whole WR, or a WRITE of the 64-byte piece placed.
  std::function<void(const WorkRequest&)> on_place;

  void hold(bool on) { hold_ = on; }
  std::span<std::byte> ring() { return ring_; }
  std::span<const std::byte> ring() const { return ring_; }
  std::size_t in_flight() const { return in_flight_.size(); }

  // What a schedule exercised (for the tests' coverage classes).
  struct Stats {
    std::uint64_t wrapped_batches = 0;      // batches whose payload crossed the ring's end
    std::uint64_t out_of_order_pieces = 0;  // relaxed: a piece placed before an earlier one
    std::uint64_t credit_notifications = 0; // credit records that came with an immediate (would wake a sleeper)
  };
  const Stats& stats() const { return stats_; }

 private:
  friend class LoopbackOwner;
  struct InFlight {
    WorkRequest wr;
    std::vector<bool> placed;  // per 64-byte piece of the payload (the tail record: one piece)
  };
  struct Completion {
    std::uint64_t wr_id;
    bool ok;
  };
  // The session's QP, as the transport knows it (OwnerCore keeps its own view of the link).
  struct Link {
    std::uint64_t qp;
    std::uint64_t epoch;
    bool producer;     // the producer's QP, or one admitted for a replayed request
    bool dead;         // the QP is in the error state
    bool established;  // its ESTABLISHED event was delivered
  };

  static OwnerConfig single_owner(wire::PublishMode mode, std::uint64_t ring_bytes, std::uint32_t max_record,
                                  const ConsumerConfig& cc, std::uint32_t tail_park_reads) {
    OwnerConfig c;
    c.tail_park_reads = tail_park_reads;
    c.ring_bytes = ring_bytes;
    c.max_record = max_record;
    c.mode = mode;
    c.max_sessions = 1;
    c.lease = std::chrono::nanoseconds::zero();
    c.core = cc;
    return c;
  }

  void open() {
    if (relaxed_ && mode() == wire::PublishMode::tail)
      throw std::invalid_argument("relaxed ordering with mode tail: the ring owner refuses it");
    geometry_ = RingGeometry::make(owner_.config_.ring_bytes, owner_.config_.max_record).value();
    staging_.assign(geometry_.bytes, std::byte{0});
    ring_.assign(geometry_.bytes, std::byte{0});
    reconnect();
    auto entry = owner_.core_.attach(control_->identity(), ring_, owner_.now());
    if (!entry) throw std::runtime_error("loopback: attach refused: " + entry.error().message());
    session_ = entry.value();
    owner_.fabrics_[session_.id] = this;
    producer.emplace(staging_, PeerRing{mode(), geometry_, {}, owner_.config_.core.payload_check}, producer_config_);
    // The first connection: the epoch-1 QP is admitted and established.
    pending_connect_ = connect_request(1);
    if (!connect().has_value() || !link_) throw std::logic_error("loopback: the first connect was refused");
    established();
  }

  // A WRITE is placed in pieces of a cache line, in any order under relaxed ordering: records
  // are smaller than that since v5 (16-byte alignment), so a piece may hold parts of several.
  static constexpr std::uint64_t kPlacementUnit = 64;
  static std::size_t chunks(const WorkRequest& wr) {
    if (wr.kind == WorkRequest::Kind::write_tail) return 0;
    return (wr.length + kPlacementUnit - 1) / kPlacementUnit;
  }
  static std::string describe(const WorkRequest& wr, std::size_t c) {
    const std::uint64_t at = wr.remote_offset + c * kPlacementUnit;
    return std::string(wr.kind == WorkRequest::Kind::write ? "WRITE" : "WRITE_WITH_IMM") + " ring[" +
           std::to_string(at) + ", " +
           std::to_string(std::min<std::uint64_t>(at + kPlacementUnit, wr.remote_offset + wr.length)) + ")";
  }

  void place_chunk_of(InFlight& f, std::size_t c) {
    if (f.placed[c]) return;
    f.placed[c] = true;
    WorkRequest piece = f.wr;
    piece.kind = WorkRequest::Kind::write;
    piece.local_offset += c * kPlacementUnit;
    piece.remote_offset += c * kPlacementUnit;
    piece.length = static_cast<std::uint32_t>(std::min<std::uint64_t>(kPlacementUnit, f.wr.length - c * kPlacementUnit));
    if (on_place) on_place(piece);
    std::memcpy(ring_.data() + piece.remote_offset, staging_.data() + piece.local_offset, piece.length);
  }
  void place_tail(InFlight& f) {
    if (on_place) on_place(f.wr);
    std::memcpy(tail_mr_.data(), f.wr.tail.data(), f.wr.tail.size());
    f.placed[0] = true;
  }
  static bool fully_placed(const InFlight& f) { return std::all_of(f.placed.begin(), f.placed.end(), [](bool b) { return b; }); }
  // Completes, in posting order, every WR at the front that is fully placed: a WRITE_WITH_IMM's
  // receive completion (the immediate, into the owner's CQ) and the send completions of
  // signaled WRs.
  void retire() {
    while (!in_flight_.empty() && fully_placed(in_flight_.front())) {
      const WorkRequest wr = in_flight_.front().wr;
      in_flight_.pop_front();
      if (wr.kind == WorkRequest::Kind::write_with_imm) receive(wr.imm);
      if (wr.slot.signaled) complete_or_queue(Completion{wr.slot.wr_id, true});
    }
  }
  void receive(std::uint32_t imm) {
    if (link_) owner_.push({link_->qp, LoopbackOwner::Completion::Kind::receive, imm, 0});
  }
  void complete_or_queue(const Completion& c) {
    if (delay_completions_) {
      completions_.push_back(c);
    } else {
      producer->on_completion(c.wr_id, c.ok, c.ok ? 0 : 5);
    }
  }

  // A credit write the core posted on this session's QP.
  void post_credit(const CreditPost& c) {
    // The core posts only on a live link: the transport's QP must be there and alive.
    if (!link_ || link_->dead) throw std::logic_error("loopback: OwnerCore posted credit on no live QP");
    if (link_->producer) {
      credit_mr_ = c.write.bytes;
      stats_.credit_notifications += c.write.notify;
    }
    if (c.write.slot.signaled) owner_.push({link_->qp, LoopbackOwner::Completion::Kind::credit, 0, c.write.slot.wr_id});
  }

  // OwnerDataPlane::drop_link: the QP is destroyed; what is still on its wire never lands, and
  // its completions still in the CQ are stale.
  void drop_link() {
    if (!link_) return;
    if (link_->producer && !link_->dead) {
      const bool outstanding = !in_flight_.empty() || producer->send_queue_outstanding() > 0;
      if (outstanding) complete_or_queue(Completion{0, false});
    }
    in_flight_.clear();
    owner_.destroy_qp(link_->qp);
    link_.reset();
  }

  std::unique_ptr<LoopbackOwner> own_;
  LoopbackOwner& owner_;
  bool relaxed_;
  ProducerConfig producer_config_;
  RingGeometry geometry_{};
  std::vector<std::byte> staging_;
  std::vector<std::byte> ring_;
  std::array<std::byte, wire::kTailRecordSize> tail_mr_{};
  std::array<std::byte, wire::kCreditRecordSize> credit_mr_{};
  std::deque<InFlight> in_flight_;
  std::deque<Completion> completions_;
  std::vector<std::array<std::byte, wire::kTailRecordSize>> old_tails_;
  bool hold_ = false;
  bool delay_completions_ = false;
  Stats stats_;

  SessionEntry session_;
  std::optional<Link> link_;
  std::optional<wire::ConnectData> pending_connect_;
  std::vector<Request> resumes_sent_;
  std::vector<wire::ConnectData> connects_sent_;
  std::optional<ControlConnection> control_;
  std::uint64_t counter_ = 0;  // the last counter the producer used on control_
  Request scratch_;

 public:
  std::optional<ProducerCore> producer;
};

inline void LoopbackOwner::read_tails() {
  core_.read_tails([this](SessionId id, std::span<std::byte, wire::kTailRecordSize> into) {
    const auto it = fabrics_.find(id);
    if (it == fabrics_.end()) return false;
    std::copy(it->second->tail_mr_.begin(), it->second->tail_mr_.end(), into.begin());
    return true;
  });
  collect_closed();
}

inline void LoopbackOwner::post_credits() {
  credit_scratch_.clear();
  core_.take_credits(credit_scratch_);
  for (const CreditPost& c : credit_scratch_) {
    const auto it = fabrics_.find(c.session);
    if (it == fabrics_.end()) throw std::logic_error("loopback: credit for a session with no fabric");
    it->second->post_credit(c);
  }
}

inline void LoopbackOwner::collect_closed() {
  for (ClosedSession& c : core_.take_closed()) {
    if (const auto it = fabrics_.find(c.session); it != fabrics_.end()) it->second->drop_link();
    closed_.push_back(std::move(c));
  }
}

}  // namespace rdmaring::test
