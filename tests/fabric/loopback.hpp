// A deterministic in-process fabric for tests: one producer core and one consumer core joined
// by plain memory, with the ring owner's session table between them. It executes the cores'
// work requests the way an RC QP does (in order) and places them as the ring MR's ordering
// allows (in order; in any order with relaxed ordering, the immediate's completion still after
// all of its QP's earlier payload). It lets a test hold back placements, delay completions and
// immediates, kill the QP, resume through the session table (as RingOwner does: table.resume,
// fence, begin_epoch; table.admit_connect) and replay old control messages, and it lets a test
// break the rules on purpose (place_publish_first). A test instrument: the library never links
// it.
#pragma once

#include <algorithm>
#include <cstring>
#include <deque>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "rdmaring/consumer_core.hpp"
#include "rdmaring/producer_core.hpp"
#include "rdmaring/session_table.hpp"

namespace rdmaring::test {

class LoopbackFabric {
 public:
  // `relaxed`: the ring MR has relaxed ordering (mode imm only, as RingOwnerOptions requires).
  LoopbackFabric(wire::PublishMode mode, std::uint64_t ring_bytes, std::uint32_t max_record,
                 ProducerConfig pc = {}, ConsumerConfig cc = {}, bool relaxed = false)
      : mode_(mode),
        relaxed_(relaxed),
        geometry_(RingGeometry::make(ring_bytes, max_record).value()),
        staging_(ring_bytes),
        ring_(ring_bytes),
        producer_config_(pc),
        table_(1, std::chrono::nanoseconds::zero()),
        session_(table_.attach(SessionTable::Clock::time_point{}).value()),
        producer(std::in_place, staging_, PeerRing{mode, geometry_, {}, cc.payload_check}, pc),
        consumer(ring_, geometry_, mode, ResumePoint{}, 0, cc) {
    if (relaxed && mode == wire::PublishMode::tail)
      throw std::invalid_argument("relaxed ordering with mode tail: the ring owner refuses it");
    // The first connection: the epoch-1 QP is admitted and established.
    pending_connect_ = connect_request(1);
    if (!connect().has_value() || !link_) throw std::logic_error("loopback: the first connect was refused");
    established();
  }

  // ---- the data path ------------------------------------------------------------------------

  // Posts what the producer has waiting (if anything) and places it at once unless held. With
  // no live QP the batch fails the way a QP in the error state fails it.
  bool flush() {
    auto batch = producer->take_batch();
    if (!batch) return false;
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
  // half placed), the producer gets a flush error if anything was outstanding, and the owner
  // marks the link broken. Receive completions already generated stay in the owner's CQ: it
  // still takes them until the next epoch fences the QP.
  void drop() {
    if (dropped()) return;
    const bool outstanding = !in_flight_.empty() || producer->send_queue_outstanding() > 0;
    in_flight_.clear();
    link_->dead = true;
    table_.on_broken(session_.id, link_->epoch);
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
        if (wr.kind == WorkRequest::Kind::write_with_imm) immediates_.push_back(wr.imm);
        break;
      case WorkRequest::Kind::write_tail:
        std::memcpy(tail_mr_.data(), wr.tail.data(), wr.tail.size());
        break;
    }
    if (wr.slot.signaled) complete_or_queue(Completion{wr.slot.wr_id, true});
  }

  // Feeds publish events to the consumer and credit back to the producer, as the adapters do.
  void deliver_publishes() {
    while (!immediates_.empty()) {
      REQUIRE(consumer.on_immediate(immediates_.front()));
      immediates_.pop_front();
    }
    if (consumer_mode() == wire::PublishMode::tail)
      REQUIRE(consumer.on_tail(std::span<const std::byte, wire::kTailRecordSize>(tail_mr_)));
  }
  // The same without Catch: at most `max` immediates (late ones stay queued), then the tail MR.
  Result<void> take_publishes(std::size_t max = SIZE_MAX) {
    for (std::size_t n = 0; n < max && !immediates_.empty(); ++n) {
      const std::uint32_t imm = immediates_.front();
      immediates_.pop_front();
      BOOST_OUTCOME_TRYV(consumer.on_immediate(imm));
    }
    if (consumer_mode() == wire::PublishMode::tail)
      return consumer.on_tail(std::span<const std::byte, wire::kTailRecordSize>(tail_mr_));
    return success();
  }
  std::size_t immediates_queued() const { return immediates_.size(); }

  // Credit write-backs go out only over an established, live link (RingOwner::return_credit);
  // the producer polls its credit MR either way.
  void return_credit() {
    if (link_ && link_->producer && link_->established && !link_->dead) {
      while (auto credit = consumer.take_credit()) {
        credit_mr_ = credit->bytes;
        if (credit->slot.signaled) consumer.on_completion(credit->slot.wr_id, true);
      }
    }
    producer->on_credit(credit_mr_);
  }

  // ---- the control plane: the ring owner's session table ------------------------------------

  // A resume request as the control channel carries it.
  struct Request {
    SessionId session = 0;
    std::uint64_t epoch = 0;
    Proof proof{};
    Credentials who() const { return Credentials{session, epoch, proof}; }
  };

  // A resume request signed for `epoch` (Producer::recover signs its core's epoch).
  Request resume_request(std::uint64_t epoch) const {
    return Request{session_.id, epoch, make_proof(session_.secret, ProofPurpose::resume, session_.id, epoch)};
  }
  wire::ConnectData connect_request(std::uint64_t epoch) const {
    return wire::ConnectData{session_.id, epoch, make_proof(session_.secret, ProofPurpose::connect, session_.id, epoch),
                             0x1000, 7};
  }

  // RingOwner's Service::resume for a known session: table.resume, then fence the epoch (drop
  // the QP, discard its completions, zero what the producer writes again, re-register: old
  // rkeys and tail record gone) and begin the next one. Returns the grant's resume point.
  // Every request is logged, for replays.
  Result<ResumePoint> owner_resume(const Request& r) {
    resumes_sent_.push_back(r);
    BOOST_OUTCOME_TRY(epoch, table_.resume(r.who(), SessionTable::Clock::time_point{}));
    fence();
    return consumer.begin_epoch(epoch);
  }

  // RingOwner's on_connect_request: table.admit_connect, then the new QP replaces the link.
  // `from_producer`: false for a replayed request (the QP is someone else's: the producer's
  // link, if any, is dropped and nothing is ever posted on the new one). Logged, for replays.
  Result<void> owner_connect(const wire::ConnectData& c, bool from_producer) {
    connects_sent_.push_back(c);
    BOOST_OUTCOME_TRYV(table_.admit_connect(c, SessionTable::Clock::time_point{}));
    drop_link();
    link_ = Link{c.epoch, from_producer, false, false};
    return success();
  }

  // ESTABLISHED at the owner for the current link: table.on_connected (ends the retry window).
  bool established() {
    if (!link_ || link_->dead || link_->established) return false;
    link_->established = true;
    table_.on_connected(session_.id);
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
    producer.emplace(staging_, PeerRing{consumer_mode(), geometry_, at, check}, producer_config_);
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
  // (session, secret, last epoch) and starts empty at the grant.
  Result<ResumePoint> restart_producer() {
    BOOST_OUTCOME_TRY(at, owner_resume(resume_request(producer->epoch())));
    producer_restart(at);
    BOOST_OUTCOME_TRYV(connect());
    established();
    return at;
  }

  const std::vector<Request>& resumes_sent() const { return resumes_sent_; }
  const std::vector<wire::ConnectData>& connects_sent() const { return connects_sent_; }
  const SessionTable& table() const { return table_; }
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

  wire::PublishMode consumer_mode() const { return mode_; }
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
  };
  const Stats& stats() const { return stats_; }

 private:
  struct InFlight {
    WorkRequest wr;
    std::vector<bool> placed;  // per 64-byte piece of the payload (the tail record: one piece)
  };
  struct Completion {
    std::uint64_t wr_id;
    bool ok;
  };
  struct Link {
    std::uint64_t epoch;
    bool producer;  // the producer's QP, or one admitted for a replayed request
    bool dead;
    bool established;
  };

  static std::size_t chunks(const WorkRequest& wr) {
    if (wr.kind == WorkRequest::Kind::write_tail) return 0;
    return (wr.length + wire::kRecordAlign - 1) / wire::kRecordAlign;
  }
  static std::string describe(const WorkRequest& wr, std::size_t c) {
    const std::uint64_t at = wr.remote_offset + c * wire::kRecordAlign;
    return std::string(wr.kind == WorkRequest::Kind::write ? "WRITE" : "WRITE_WITH_IMM") + " ring[" +
           std::to_string(at) + ", " +
           std::to_string(std::min<std::uint64_t>(at + wire::kRecordAlign, wr.remote_offset + wr.length)) + ")";
  }

  void place_chunk_of(InFlight& f, std::size_t c) {
    if (f.placed[c]) return;
    f.placed[c] = true;
    WorkRequest piece = f.wr;
    piece.kind = WorkRequest::Kind::write;
    piece.local_offset += c * wire::kRecordAlign;
    piece.remote_offset += c * wire::kRecordAlign;
    piece.length = static_cast<std::uint32_t>(std::min<std::uint64_t>(wire::kRecordAlign, f.wr.length - c * wire::kRecordAlign));
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
  // receive completion (the immediate) and the send completions of signaled WRs.
  void retire() {
    while (!in_flight_.empty() && fully_placed(in_flight_.front())) {
      const WorkRequest wr = in_flight_.front().wr;
      in_flight_.pop_front();
      if (wr.kind == WorkRequest::Kind::write_with_imm) immediates_.push_back(wr.imm);
      if (wr.slot.signaled) complete_or_queue(Completion{wr.slot.wr_id, true});
    }
  }
  void complete_or_queue(const Completion& c) {
    if (delay_completions_) {
      completions_.push_back(c);
    } else {
      producer->on_completion(c.wr_id, c.ok, c.ok ? 0 : 5);
    }
  }

  // RingOwner::State::drop_link: the QP is destroyed; what is still on its wire never lands.
  void drop_link() {
    if (!link_) return;
    if (link_->producer && !link_->dead) {
      const bool outstanding = !in_flight_.empty() || producer->send_queue_outstanding() > 0;
      if (outstanding) complete_or_queue(Completion{0, false});
    }
    in_flight_.clear();
    link_.reset();
  }
  // RingOwner::State::fence: drop_link, the old QP's completions are stale (its immediates are
  // never taken), forget_unread (zero [head, released + ring)), re-register (the tail MR is
  // zeroed; its last record is kept here as a replay).
  void fence() {
    drop_link();
    immediates_.clear();
    const auto l = consumer.ledger();
    for (std::uint64_t pos = l.head; pos < l.released + geometry_.bytes; pos += wire::kRecordAlign)
      std::memset(ring_.data() + geometry_.offset(pos), 0, wire::kRecordAlign);
    old_tails_.push_back(tail_mr_);
    tail_mr_ = {};
  }

  wire::PublishMode mode_;
  bool relaxed_;
  RingGeometry geometry_;
  std::vector<std::byte> staging_;
  std::vector<std::byte> ring_;
  std::array<std::byte, wire::kTailRecordSize> tail_mr_{};
  std::array<std::byte, wire::kCreditRecordSize> credit_mr_{};
  std::deque<InFlight> in_flight_;
  std::deque<std::uint32_t> immediates_;
  std::deque<Completion> completions_;
  std::vector<std::array<std::byte, wire::kTailRecordSize>> old_tails_;
  bool hold_ = false;
  bool delay_completions_ = false;
  Stats stats_;
  ProducerConfig producer_config_;

  SessionTable table_;
  SessionEntry session_;
  std::optional<Link> link_;
  std::optional<wire::ConnectData> pending_connect_;
  std::vector<Request> resumes_sent_;
  std::vector<wire::ConnectData> connects_sent_;

 public:
  std::optional<ProducerCore> producer;
  ConsumerCore consumer;
};

}  // namespace rdmaring::test
