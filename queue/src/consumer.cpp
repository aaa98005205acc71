#include "rdmaring/consumer.hpp"

#include <arpa/inet.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <optional>
#include <vector>

#include "rdmaring/dma.hpp"
#include "rdmaring/post.hpp"
#include "rdmaring/verbs/cm_id.hpp"
#include "rdmaring/verbs/context.hpp"
#include "rdmaring/verbs/cq.hpp"
#include "rdmaring/verbs/event_channel.hpp"
#include "rdmaring/verbs/mr.hpp"
#include "rdmaring/verbs/pd.hpp"
#include "rdmaring/verbs/qp.hpp"
#include "rdmaring/verbs/srq.hpp"

namespace rdmaring {
namespace {

// Receive WRs carry this id, so an error completion (whose opcode is undefined) can still be
// told apart from a credit write's.
constexpr std::uint64_t kRecvWrId = ~std::uint64_t{0};
// Receives are re-posted in chains of this many.
constexpr std::uint32_t kRecvRepostBatch = 16;

}  // namespace

Result<void> ConsumerOptions::validate() const {
  BOOST_OUTCOME_TRYV(RingGeometry::make(ring_bytes, max_record));
  BOOST_OUTCOME_TRYV(core.validate());
  if (relaxed_ordering && mode == wire::PublishMode::tail)
    return make_error(errc::relaxed_ordering_refused,
                      "relaxed ordering with publish mode tail: the tail record's write may land before the payload "
                      "it publishes, and the consumer would read a record that is not there yet; use mode imm");
  if (mode == wire::PublishMode::imm && recv_depth < 2 * kRecvRepostBatch)
    return make_error(errc::bad_config, "recv_depth " + std::to_string(recv_depth) + " below " +
                                            std::to_string(2 * kRecvRepostBatch));
  return success();
}

// The verbs objects of one producer connection (one epoch). Replaced whole on resume.
struct Link {
  verbs::EventChannel channel;  // this connection's own events (DISCONNECTED), apart from the listener's
  verbs::CmId id;
  std::optional<verbs::QueuePair> qp;
  wire::ConnectData producer;
  bool connected = false;
};

struct Consumer::Connection {
  ConsumerOptions options;
  verbs::EventChannel channel;
  verbs::CmId listener{channel};
  // Ring-level objects live across connections; the PD outlives every link's QP.
  std::optional<verbs::ProtectionDomain> pd;
  std::optional<verbs::CompletionQueue> cq;
  std::optional<verbs::SharedReceiveQueue> srq;
  std::optional<verbs::AlignedBuffer> ring;
  std::optional<verbs::MemoryRegion> ring_mr;
  verbs::AlignedBuffer tail_buf{4096};
  std::optional<verbs::MemoryRegion> tail_mr;
  std::optional<ConsumerCore> core;
  std::unique_ptr<Link> link;
  std::vector<ibv_recv_wr> recv_chain;
  std::uint32_t recv_owed = 0;  // receives consumed, not yet re-posted
  std::uint32_t polls_since_cm_check = 0;
  std::uint64_t recv_completions = 0;
  std::uint64_t recv_posts = 0;
  std::uint64_t post_send_calls = 0;
  std::uint64_t resumes = 0;
  std::uint64_t refused_requests = 0;
  std::uint64_t stale_completions = 0;
  std::uint64_t error_completions = 0;
  std::optional<std::uint64_t> unconfirmed_epoch;  // the producer's epoch before the last resume
  std::uint64_t publishes_at_resume = 0;

  Result<void> post_receives(std::uint32_t n) {
    for (std::uint32_t i = 0; i < n; ++i) recv_chain[i].next = i + 1 < n ? &recv_chain[i + 1] : nullptr;
    ++recv_posts;
    return srq->post_recv(recv_chain[0]);
  }

  void setup_ring(const verbs::Context& ctx);
  void register_ring();
  void admit(verbs::ConnectRequest request, const wire::ConnectData& hello, const ResumePoint& at);
  Result<void> check_cm();
  void discard_completions();
  void forget_unread();
};

void Consumer::Connection::setup_ring(const verbs::Context& ctx) {
  const ConsumerOptions& o = options;
  pd.emplace(ctx);
  cq.emplace(ctx, static_cast<int>(o.core.sq_depth + o.recv_depth));
  ring.emplace(o.ring_bytes);
  if (o.mode == wire::PublishMode::imm) {
    srq.emplace(*pd, o.recv_depth);
    recv_chain.assign(o.recv_depth, ibv_recv_wr{});
    for (auto& wr : recv_chain) wr.wr_id = kRecvWrId;  // no scatter list: an immediate carries no payload
    if (auto r = post_receives(o.recv_depth); !r) throw SetupError(r.error());
  }
  register_ring();
  const auto geometry = RingGeometry::make(o.ring_bytes, o.max_record).value();
  core.emplace(ring->bytes(), geometry, o.mode, 1, 0, o.core);
}

// (Re-)registers the ring and tail MRs. Re-registration is what revokes the old rkeys at a
// resume: a write still carrying one fails with a remote access error and places no byte.
void Consumer::Connection::register_ring() {
  int ring_access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  if (options.relaxed_ordering) ring_access |= IBV_ACCESS_RELAXED_ORDERING;
  ring_mr.reset();
  ring_mr.emplace(*pd, ring->data(), ring->size(), ring_access, options.on_demand_paging);
  if (options.mode == wire::PublishMode::tail) {
    tail_mr.reset();
    std::fill(tail_buf.bytes().begin(), tail_buf.bytes().end(), std::byte{0});
    tail_mr.emplace(*pd, tail_buf.data(), tail_buf.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  }
}

void Consumer::Connection::admit(verbs::ConnectRequest request, const wire::ConnectData& hello, const ResumePoint& at) {
  const ConsumerOptions& o = options;
  auto l = std::make_unique<Link>(Link{verbs::EventChannel{}, std::move(request.id), {}, hello, false});
  l->id.migrate(l->channel);
  verbs::QueuePairCaps caps;
  caps.max_send_wr = o.core.sq_depth;
  caps.max_recv_wr = 1;
  caps.max_inline_data = wire::kCreditRecordSize;
  l->qp.emplace(l->id, *pd, *cq, *cq, caps, srq ? &*srq : nullptr);
  if (l->qp->max_inline_data() < wire::kCreditRecordSize)
    throw SetupError(make_error(errc::bad_config, l->qp->describe() + ": device grants " +
                                                      std::to_string(l->qp->max_inline_data()) +
                                                      " B of inline data, the credit record needs " +
                                                      std::to_string(wire::kCreditRecordSize)));
  wire::AcceptData a;
  a.mode = o.mode;
  a.flags = o.relaxed_ordering ? wire::kAcceptRelaxedOrdering : 0;
  a.ring_addr = reinterpret_cast<std::uintptr_t>(ring->data());
  a.ring_rkey = ring_mr->rkey();
  a.max_record = o.max_record;
  a.ring_bytes = o.ring_bytes;
  if (tail_mr) {
    a.tail_addr = reinterpret_cast<std::uintptr_t>(tail_buf.data());
    a.tail_rkey = tail_mr->rkey();
  }
  a.epoch = at.epoch;
  a.next_sequence = at.next_sequence;
  a.position = at.position;
  a.released = at.released;
  const auto reply = wire::encode(a);
  rdma_conn_param param{};
  param.private_data = reply.data();
  param.private_data_len = static_cast<std::uint8_t>(reply.size());
  param.retry_count = 7;
  param.rnr_retry_count = 7;
  l->id.accept(param, o.accept_timeout);
  l->connected = true;
  link = std::move(l);
}

Consumer Consumer::listen(const ConsumerOptions& options) {
  if (auto ok = options.validate(); !ok) throw SetupError(ok.error());
  auto c = std::make_unique<Connection>();
  c->options = options;
  c->listener.bind_and_listen(options.address, options.port, 8);
  return Consumer(std::move(c));
}

Consumer::Consumer(std::unique_ptr<Connection> c) noexcept : c_(std::move(c)) {}
Consumer::Consumer(Consumer&&) noexcept = default;
Consumer& Consumer::operator=(Consumer&&) noexcept = default;
Consumer::~Consumer() = default;

std::uint16_t Consumer::port() const { return c_->listener.local_port(); }

void Consumer::accept() {
  Connection& c = *c_;
  // One producer per Consumer: its ring, tail MR and epochs belong to that producer alone.
  if (c.core) throw SetupError(make_error(errc::invalid_argument, "accept(): this Consumer already accepted its producer"));
  auto request = c.listener.next_request(c.options.accept_timeout);
  const auto hello = wire::decode_connect_data(request.private_data);
  if (!hello || (hello->flags & wire::kConnectResume))
    throw SetupError(make_error(errc::protocol_violation, request.id.describe() + ": connect request is not a new rdmaring v" +
                                                              std::to_string(wire::kVersion) + " producer"));
  c.setup_ring(request.id.context());
  c.admit(std::move(request), *hello, ResumePoint{});
}

// Connection events, checked every so many polls (each check is a system call): a producer
// resuming after its QP died, and the disconnect of the current one.
Result<void> Consumer::Connection::check_cm() {
  polls_since_cm_check = 0;
  if (link && link->connected) {
    for (;;) {
      auto event = verbs::next_event(link->channel.get(), std::chrono::milliseconds(0));
      if (!event) break;
      if (event.value().type() == RDMA_CM_EVENT_DISCONNECTED) link->connected = false;
    }
  }
  BOOST_OUTCOME_TRY(request, listener.poll_request());
  if (!request) return success();
  const auto hello = wire::decode_connect_data(request->private_data);
  // Only a resume of the current epoch is admitted: a new producer, or a replayed request from an
  // older epoch, is refused (destroying the request's id rejects it). Until the producer has
  // shown it moved to the current epoch (a publish in it), a resume of the previous epoch is
  // admitted too: the last resume may have failed on its side after ours.
  const bool current = hello && hello->epoch == core->epoch();
  const bool retried = hello && unconfirmed_epoch && hello->epoch == *unconfirmed_epoch;
  if (!hello || !(hello->flags & wire::kConnectResume) || !(current || retried)) {
    ++refused_requests;
    return success();
  }
  link.reset();  // the old QP goes first: nothing of the old epoch is placed after this
  discard_completions();
  forget_unread();
  try {
    register_ring();
    BOOST_OUTCOME_TRY(at, core->begin_epoch(core->epoch() + 1));
    unconfirmed_epoch = hello->epoch;
    publishes_at_resume = core->counters().publishes;
    admit(std::move(*request), *hello, at);
  } catch (const SetupError& e) {
    return e.error();
  }
  ++resumes;
  return success();
}

// Zeroes the ring from the read head to the end of the space the producer may write. The next
// epoch re-sends those records; without this, an old copy left there could pass the checks in
// place of the new one if placement order were ever broken (protocol-spec/model, run 8).
void Consumer::Connection::forget_unread() {
  const auto l = core->ledger();
  const std::uint64_t bytes = ring->size();
  for (std::uint64_t pos = l.head, end = l.released + bytes; pos < end;) {
    const std::uint64_t off = pos & (bytes - 1);
    const std::uint64_t n = std::min(end - pos, bytes - off);
    std::memset(ring->data() + off, 0, n);
    pos += n;
  }
}

// After the old QP is gone every completion in the CQ is its own: none may be taken for the next
// connection's (a provider may reuse the QP number). Consumed receives still go back to the SRQ.
void Consumer::Connection::discard_completions() {
  std::array<ibv_wc, 32> wcs;
  for (;;) {
    auto n = cq->poll(wcs);
    if (!n || n.value() == 0) return;
    for (std::size_t i = 0; i < n.value(); ++i) {
      ++stale_completions;
      if (wcs[i].wr_id == kRecvWrId) ++recv_owed;
    }
  }
}

Result<void> Consumer::progress() {
  Connection& c = *c_;
  if (++c.polls_since_cm_check >= (c.link && c.link->connected ? 1024u : 16u)) {
    BOOST_OUTCOME_TRYV(c.check_cm());
  }
  std::array<ibv_wc, 32> wcs;
  BOOST_OUTCOME_TRY(n, c.cq->poll(wcs));
  const std::uint32_t qp_num = c.link ? c.link->qp->qp_num() : 0;
  for (std::size_t i = 0; i < n; ++i) {
    const ibv_wc& wc = wcs[i];
    if (wc.wr_id == kRecvWrId) {
      // A receive is consumed whichever QP it completed for: the SRQ needs it back.
      ++c.recv_completions;
      ++c.recv_owed;
    }
    if (wc.qp_num != qp_num) {
      ++c.stale_completions;  // from a connection of an earlier epoch
      continue;
    }
    if (wc.status != IBV_WC_SUCCESS) {
      // The connection is dead (the producer left, or a credit write ran out of retries): what
      // is published stays deliverable, and the producer may resume.
      ++c.error_completions;
      c.link->connected = false;
      continue;
    }
    if (wc.wr_id == kRecvWrId) {
      BOOST_OUTCOME_TRYV(c.core->on_immediate(ntohl(wc.imm_data)));
    } else {
      c.core->on_completion(wc.wr_id, true);
    }
  }
  if (c.unconfirmed_epoch && c.core->counters().publishes != c.publishes_at_resume) c.unconfirmed_epoch.reset();
  if (c.srq && c.recv_owed >= kRecvRepostBatch) {
    BOOST_OUTCOME_TRYV(c.post_receives(c.recv_owed));
    c.recv_owed = 0;
  }
  if (c.tail_mr) {
    std::array<std::byte, wire::kTailRecordSize> tail;
    read_dma(c.tail_buf.data(), std::span{tail});
    BOOST_OUTCOME_TRYV(c.core->on_tail(tail));
  }
  if (c.core->failure()) return *c.core->failure();
  return success();
}

Result<void> Consumer::return_credit() {
  Connection& c = *c_;
  if (!c.link || !c.link->connected) return success();
  while (auto w = c.core->take_credit()) {
    ++c.post_send_calls;
    BOOST_OUTCOME_TRYV(
        post_inline_write(*c.link->qp, w->bytes, c.link->producer.credit_addr, c.link->producer.credit_rkey, w->slot));
  }
  return success();
}

Result<std::size_t> Consumer::poll(const Handler& handler, std::size_t max) {
  BOOST_OUTCOME_TRYV(progress());
  const auto now = Clock::now();
  std::size_t n = 0;
  std::uint64_t last_end = 0;
  while (n < max) {
    BOOST_OUTCOME_TRY(record, c_->core->next(now));
    if (!record) break;
    handler(*record);
    last_end = record->end;
    ++n;
  }
  if (n > 0) {
    BOOST_OUTCOME_TRYV(c_->core->release(last_end));
  }
  BOOST_OUTCOME_TRYV(return_credit());
  return n;
}

Result<std::size_t> Consumer::poll_batch(std::span<DeliveredRecord> out) {
  BOOST_OUTCOME_TRYV(progress());
  const auto now = Clock::now();
  std::size_t n = 0;
  while (n < out.size()) {
    BOOST_OUTCOME_TRY(record, c_->core->next(now));
    if (!record) break;
    out[n++] = *record;
  }
  BOOST_OUTCOME_TRYV(return_credit());
  return n;
}

Result<void> Consumer::release(const DeliveredRecord& last) {
  BOOST_OUTCOME_TRYV(c_->core->release(last.end));
  return return_credit();
}

bool Consumer::connected() {
  Connection& c = *c_;
  if (auto r = c.check_cm(); !r) return false;
  return c.link && c.link->connected;
}

ConsumerStats Consumer::stats() const {
  const Connection& c = *c_;
  return ConsumerStats{c.core->counters(), c.recv_completions, c.recv_posts, c.post_send_calls, c.resumes,
                       c.refused_requests, c.stale_completions, c.error_completions, c.core->ledger()};
}

std::string Consumer::ledger_dump() const { return to_string(c_->core->ledger()); }

}  // namespace rdmaring
