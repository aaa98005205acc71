#include "rdmaring/ring_owner.hpp"

#include <arpa/inet.h>
#include <capnp/rpc-twoparty.h>
#include <kj/async-unix.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <map>
#include <mutex>
#include <unordered_map>

#include "event_loop_thread.hpp"
#include "messages.hpp"
#include "rdmaring/checksum.hpp"
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
#include "rdmaring/verbs/srq.hpp"

namespace rdmaring {
namespace {

using Clock = std::chrono::steady_clock;

// Receive WRs carry this id, so an error completion (whose opcode is undefined) can still be
// told apart from a credit write's.
constexpr std::uint64_t kRecvWrId = ~std::uint64_t{0};
// Receives are re-posted in chains of this many.
constexpr std::uint32_t kRecvRepostBatch = 16;

// One epoch's connection of a session. Replaced whole on resume; the QP goes before its id.
struct Link {
  verbs::CmId id;
  std::optional<verbs::QueuePair> qp;
  wire::ConnectData producer;  // where credit goes
  std::uint64_t epoch = 0;
  bool established = false;
  bool dead = false;
};

// A session's ring and what reads it. The ring buffer lives as long as the session; its MRs are
// registered again at every epoch, which is what revokes the last epoch's rkeys.
struct SessionRing {
  SessionId id = 0;
  verbs::AlignedBuffer ring;
  std::optional<verbs::MemoryRegion> ring_mr;
  verbs::AlignedBuffer tail_buf{4096};
  std::optional<verbs::MemoryRegion> tail_mr;
  std::optional<ConsumerCore> core;
  std::unique_ptr<Link> link;
  std::uint64_t publishes_seen = 0;
  std::int64_t deficit = 0;

  explicit SessionRing(std::uint64_t bytes) : ring(bytes) {}
};

}  // namespace

Result<void> RingOwnerOptions::validate() const {
  BOOST_OUTCOME_TRYV(RingGeometry::make(ring_bytes, max_record));
  BOOST_OUTCOME_TRYV(core.validate());
  if (relaxed_ordering && mode == wire::PublishMode::tail)
    return make_error(errc::relaxed_ordering_refused,
                      "relaxed ordering with publish mode tail: the tail record's write may land before the payload "
                      "it publishes, and the consumer would read a record that is not there yet; use mode imm");
  if (relaxed_ordering && core.payload_check == wire::PayloadCheck::none)
    return make_error(errc::relaxed_ordering_refused,
                      "relaxed ordering with payload check none: placement order is then up to the fabric, and the "
                      "payload CRC is the only check that would see a record whose bytes have not all landed; keep "
                      "payload_check crc32c");
  if (mode == wire::PublishMode::imm && recv_depth < 2 * kRecvRepostBatch)
    return make_error(errc::bad_config, "recv_depth " + std::to_string(recv_depth) + " below " +
                                            std::to_string(2 * kRecvRepostBatch));
  if (max_sessions == 0) return make_error(errc::bad_config, "max_sessions 0");
  if (quantum_bytes == 0) return make_error(errc::bad_config, "quantum_bytes 0");
  if (address.empty()) return make_error(errc::bad_config, "no address: the owner listens on one RDMA device's address");
  return success();
}

struct RingOwner::State {
  RingOwnerOptions options;
  verbs::EventChannel channel;  // the listener's and every accepted connection's events
  verbs::CmId listener{channel};
  std::optional<verbs::ProtectionDomain> pd;
  std::optional<verbs::CompletionQueue> cq;
  std::optional<verbs::SharedReceiveQueue> srq;
  std::optional<verbs::AsyncEvents> async;
  std::vector<ibv_recv_wr> recv_chain;
  std::uint32_t recv_owed = 0;  // receives consumed, not yet re-posted
  std::uint16_t control_port = 0;

  mutable std::mutex m;
  SessionTable table;
  std::map<SessionId, std::unique_ptr<SessionRing>> rings;
  std::unordered_map<std::uint32_t, SessionRing*> by_qp;
  std::unordered_map<rdma_cm_id*, SessionRing*> by_cm;
  SessionId last_served = 0;  // round robin: the next poll starts after this session
  // poll()'s scratch, kept so that a busy-polling consumer allocates nothing per call.
  std::vector<SessionId> failed_scratch, turn_scratch;
  RingOwnerStats counters;

  // Control-thread objects; the thread is the last member, so it stops before the rest go.
  kj::Own<kj::ConnectionReceiver> control_listener;
  kj::Own<kj::TaskSet> tasks;
  kj::Own<kj::UnixEventPort::FdObserver> cm_observer;
  kj::Own<kj::UnixEventPort::FdObserver> async_observer;
  struct TaskErrors;
  kj::Own<TaskErrors> task_errors;
  std::optional<control::EventLoopThread> loop;

  State(const RingOwnerOptions& o)
      : options(o), table(o.max_sessions, std::chrono::duration_cast<std::chrono::nanoseconds>(o.lease)) {}

  // ---- data path (poll thread, under m) ----
  Result<void> post_receives(std::uint32_t n);
  Result<void> take_completions();
  void dispatch(const ibv_wc& wc);
  void break_link(SessionRing& r);
  void fail_session(SessionId id, const Error& e);
  Result<void> return_credit(SessionRing& r);

  // ---- control (control thread, under m) ----
  SessionRing& make_ring(SessionId id, const ResumePoint& start, std::uint64_t deliver_from);
  void register_ring(SessionRing& r);
  void fence(SessionRing& r);
  void forget_unread(SessionRing& r);
  void drop_link(SessionRing& r);
  void close_session(SessionId id);
  control::RingGrant grant(const SessionRing& r, const SessionEntry& e, const ResumePoint& at) const;
  void on_cm_event(const verbs::CmEvent& event);
  void on_connect_request(verbs::ConnectRequest request);
  void drain_cm_events();
  kj::Promise<void> watch_cm();
  kj::Promise<void> watch_async();
  // Under `m`: every async event queued for this owner; a dead QP breaks its session's link.
  void take_async_events();
  kj::Promise<void> accept_control();
  kj::Promise<void> expire_leases(kj::Timer& timer);
};

struct RingOwner::State::TaskErrors final : kj::TaskSet::ErrorHandler {
  State& s;
  explicit TaskErrors(State& state) : s(state) {}
  void taskFailed(kj::Exception&&) override {
    std::lock_guard lock(s.m);
    ++s.counters.control_task_failures;
  }
};

// ---- rings -------------------------------------------------------------------------------------

SessionRing& RingOwner::State::make_ring(SessionId id, const ResumePoint& start, std::uint64_t deliver_from) {
  auto r = std::make_unique<SessionRing>(options.ring_bytes);
  r->id = id;
  register_ring(*r);
  r->core.emplace(r->ring.bytes(), RingGeometry::make(options.ring_bytes, options.max_record).value(), options.mode,
                  start, deliver_from, options.core);
  SessionRing& ref = *r;
  rings[id] = std::move(r);
  return ref;
}

// (Re-)registers the ring and tail MRs. Re-registration is what revokes the old rkeys at a
// resume: a write still carrying one fails with a remote access error and places no byte.
void RingOwner::State::register_ring(SessionRing& r) {
  int ring_access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  if (options.relaxed_ordering) ring_access |= IBV_ACCESS_RELAXED_ORDERING;
  r.ring_mr.reset();
  r.ring_mr.emplace(*pd, r.ring.data(), r.ring.size(), ring_access, options.on_demand_paging);
  if (options.mode == wire::PublishMode::tail) {
    r.tail_mr.reset();
    std::fill(r.tail_buf.bytes().begin(), r.tail_buf.bytes().end(), std::byte{0});
    r.tail_mr.emplace(*pd, r.tail_buf.data(), r.tail_buf.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  }
}

void RingOwner::State::drop_link(SessionRing& r) {
  if (!r.link) return;
  if (r.link->qp) by_qp.erase(r.link->qp->qp_num());
  by_cm.erase(r.link->id.get());
  r.link.reset();
}

// Ends an epoch: nothing of it is placed in the ring or read from the CQ after this returns.
void RingOwner::State::fence(SessionRing& r) {
  drop_link(r);
  // The QP is destroyed: every completion it will ever make is in the CQ now. Dispatching them
  // here, before any new QP exists, keeps a reused QP number from inheriting them.
  (void)take_completions();
  forget_unread(r);
  register_ring(r);
}

// Zeroes the ring from the read head to the end of the space the producer may write. The next
// epoch re-sends those records; without this, an old copy left there could pass the checks in
// place of the new one if placement order were ever broken (protocol-spec/model, run 8).
void RingOwner::State::forget_unread(SessionRing& r) {
  const auto l = r.core->ledger();
  const std::uint64_t bytes = r.ring.size();
  for (std::uint64_t pos = l.head, end = l.released + bytes; pos < end;) {
    const std::uint64_t off = pos & (bytes - 1);
    const std::uint64_t n = std::min(end - pos, bytes - off);
    std::memset(r.ring.data() + off, 0, n);
    pos += n;
  }
}

void RingOwner::State::close_session(SessionId id) {
  const auto it = rings.find(id);
  if (it == rings.end()) return;
  drop_link(*it->second);
  (void)take_completions();
  counters.rings += it->second->core->counters();
  rings.erase(it);
}

control::RingGrant RingOwner::State::grant(const SessionRing& r, const SessionEntry& e, const ResumePoint& at) const {
  control::RingGrant g;
  g.session = e.id;
  g.secret = e.secret;
  g.mode = options.mode;
  g.relaxed_ordering = options.relaxed_ordering;
  g.ring_addr = reinterpret_cast<std::uintptr_t>(r.ring.data());
  g.ring_rkey = r.ring_mr->rkey();
  g.ring_bytes = options.ring_bytes;
  g.max_record = options.max_record;
  if (r.tail_mr) {
    g.tail_addr = reinterpret_cast<std::uintptr_t>(r.tail_buf.data());
    g.tail_rkey = r.tail_mr->rkey();
  }
  g.at = at;
  g.data_port = listener.local_port();
  g.lease = options.lease;
  g.payload_check = options.core.payload_check;
  return g;
}

// ---- the data path -----------------------------------------------------------------------------

Result<void> RingOwner::State::post_receives(std::uint32_t n) {
  for (std::uint32_t i = 0; i < n; ++i) recv_chain[i].next = i + 1 < n ? &recv_chain[i + 1] : nullptr;
  ++counters.recv_posts;
  return srq->post_recv(recv_chain[0]);
}

void RingOwner::State::break_link(SessionRing& r) {
  if (!r.link || r.link->dead) return;
  r.link->dead = true;
  table.on_broken(r.id, r.link->epoch);
}

// The producer broke the protocol: its session ends (rkey revoked with the MR), the others go on.
void RingOwner::State::fail_session(SessionId id, const Error& e) {
  ++counters.sessions_failed;
  counters.last_session_failure = "session " + std::to_string(id) + ": " + e.message();
  table.remove(id);
  close_session(id);
}

void RingOwner::State::dispatch(const ibv_wc& wc) {
  // A receive is consumed whichever QP it completed for: the SRQ needs it back.
  if (wc.wr_id == kRecvWrId) {
    ++counters.recv_completions;
    ++recv_owed;
  }
  const auto it = by_qp.find(wc.qp_num);
  if (it == by_qp.end()) {
    ++counters.stale_completions;  // of a QP that is gone
    return;
  }
  SessionRing& r = *it->second;
  if (wc.status != IBV_WC_SUCCESS) {
    // The connection is dead (the producer left, or a credit write ran out of retries): what is
    // published stays deliverable, and the producer may resume.
    ++counters.error_completions;
    ++counters.completion_errors[ibv_wc_status_str(wc.status)];
    break_link(r);
    return;
  }
  if (wc.wr_id == kRecvWrId) {
    if (auto ok = r.core->on_immediate(ntohl(wc.imm_data)); !ok) fail_session(r.id, ok.error());
  } else {
    r.core->on_completion(wc.wr_id, true);
  }
}

Result<void> RingOwner::State::take_completions() {
  std::array<ibv_wc, 32> wcs;
  for (;;) {
    BOOST_OUTCOME_TRY(n, cq->poll(wcs));
    for (std::size_t i = 0; i < n; ++i) dispatch(wcs[i]);
    if (n < wcs.size()) break;
  }
  if (srq && recv_owed >= kRecvRepostBatch) {
    BOOST_OUTCOME_TRYV(post_receives(recv_owed));
    recv_owed = 0;
  }
  return success();
}

Result<void> RingOwner::State::return_credit(SessionRing& r) {
  if (!r.link || !r.link->established || r.link->dead) return success();
  while (auto w = r.core->take_credit()) {
    ++counters.credit_posts;
    BOOST_OUTCOME_TRYV(post_inline_write(*r.link->qp, w->bytes, r.link->producer.credit_addr,
                                         r.link->producer.credit_rkey, w->slot));
  }
  return success();
}

Result<std::size_t> RingOwner::poll(const Handler& handler, std::size_t max) {
  State& s = *s_;
  std::lock_guard lock(s.m);
  // Events a producer of this process read off the shared descriptor wake no observer here.
  if (s.async->pending()) s.take_async_events();
  BOOST_OUTCOME_TRYV(s.take_completions());
  // The clock only when something was published: an idle consumer polls in a tight loop, and
  // under emulation a clock read costs more than the rest of an empty poll.
  std::optional<Clock::time_point> now_once;
  const auto now = [&now_once] { return now_once ? *now_once : *(now_once = Clock::now()); };
  std::vector<SessionId>& failed = s.failed_scratch;
  failed.clear();
  bool unread = false;
  for (auto& [id, r] : s.rings) {
    if (s.options.mode == wire::PublishMode::tail) {
      std::array<std::byte, wire::kTailRecordSize> tail;
      read_dma(r->tail_buf.data(), std::span{tail});
      if (auto ok = r->core->on_tail(tail); !ok) failed.push_back(id);
    }
    if (r->core->counters().publishes != r->publishes_seen) {
      r->publishes_seen = r->core->counters().publishes;
      s.table.touch(id, now());
    }
    const auto l = r->core->ledger();
    if (l.head == l.published) r->deficit = 0;  // an idle session banks no allowance
    else unread = true;
  }
  for (SessionId id : failed) s.fail_session(id, *s.rings.at(id)->core->failure());

  // Deficit round robin over the sessions, starting after the one served last: each turn adds a
  // quantum of payload bytes to a session's allowance; a record goes out while the allowance
  // lasts (and one always does), so a session of large records gets no more bytes per round
  // than one of small records, and none waits more than one round.
  std::size_t n = 0;
  bool progress = unread;
  std::vector<SessionId>& turn = s.turn_scratch;
  while (n < max && progress) {
    progress = false;
    turn.clear();
    const auto start = s.rings.upper_bound(s.last_served);
    for (auto it = start; it != s.rings.end(); ++it) turn.push_back(it->first);
    for (auto it = s.rings.begin(); it != start; ++it) turn.push_back(it->first);
    for (SessionId id : turn) {
      if (n >= max) break;
      // A session failed earlier in this turn (by its own record or a completion) is gone.
      const auto found = s.rings.find(id);
      if (found == s.rings.end()) continue;
      SessionRing& r = *found->second;
      r.deficit += s.options.quantum_bytes;
      std::uint64_t last_end = 0;
      std::size_t served = 0;
      std::optional<Error> broke;
      while (n < max && (served == 0 || r.deficit > 0)) {
        auto record = r.core->next(now());
        if (!record) {
          broke = record.error();
          break;
        }
        if (!record.value()) break;
        const DeliveredRecord& d = *record.value();
        handler(Delivery{id, d.payload, d.sequence});
        // Charged by the ring space a record takes, so empty records are not free.
        r.deficit -= static_cast<std::int64_t>(wire::record_span(d.payload.size()));
        last_end = d.end;
        ++served;
        ++n;
      }
      if (served > 0) {
        progress = true;
        s.last_served = id;
        BOOST_OUTCOME_TRYV(r.core->release(last_end));
        BOOST_OUTCOME_TRYV(s.return_credit(r));
      } else {
        r.deficit = 0;  // an idle session banks no allowance
      }
      if (broke) s.fail_session(id, *broke);
    }
  }
  for (auto& [id, r] : s.rings) {
    BOOST_OUTCOME_TRYV(s.return_credit(*r));
  }
  return n;
}

// ---- connections (control thread) -------------------------------------------------------------

void RingOwner::State::on_connect_request(verbs::ConnectRequest request) {
  const auto hello = wire::decode_connect_data(request.private_data);
  auto refuse = [&] { ++counters.connect_refused; };  // destroying the request's id rejects it
  if (!hello) return refuse();
  if (!table.admit_connect(*hello, Clock::now())) return refuse();
  const auto it = rings.find(hello->session);
  if (it == rings.end()) return refuse();
  SessionRing& r = *it->second;
  // A new QP for this epoch replaces any earlier one: the table admits a QP only for the
  // current epoch, so the one it replaces was of an epoch already fenced.
  drop_link(r);
  auto link = std::make_unique<Link>(Link{std::move(request.id), {}, *hello, hello->epoch, false, false});
  try {
    verbs::QueuePairCaps caps;
    caps.max_send_wr = options.core.sq_depth;
    caps.max_recv_wr = 1;
    caps.max_inline_data = wire::kCreditRecordSize;
    link->qp.emplace(link->id, *pd, *cq, *cq, caps, srq ? &*srq : nullptr);
    if (link->qp->max_inline_data() < wire::kCreditRecordSize) return refuse();
    const auto reply = wire::encode(wire::AcceptData{hello->epoch});
    rdma_conn_param param{};
    param.private_data = reply.data();
    param.private_data_len = static_cast<std::uint8_t>(reply.size());
    param.retry_count = 7;
    param.rnr_retry_count = 7;
    link->id.start_accept(param);
  } catch (const SetupError&) {
    return refuse();
  }
  by_qp[link->qp->qp_num()] = &r;
  by_cm[link->id.get()] = &r;
  r.link = std::move(link);
}

void RingOwner::State::on_cm_event(const verbs::CmEvent& event) {
  const auto it = by_cm.find(event.id());
  if (it == by_cm.end()) return;  // an id already replaced or closed
  SessionRing& r = *it->second;
  switch (event.type()) {
    case RDMA_CM_EVENT_ESTABLISHED:
      r.link->established = true;
      table.on_connected(r.id);
      break;
    case RDMA_CM_EVENT_DISCONNECTED:
    case RDMA_CM_EVENT_CONNECT_ERROR:
    case RDMA_CM_EVENT_UNREACHABLE:
    case RDMA_CM_EVENT_REJECTED:
    case RDMA_CM_EVENT_DEVICE_REMOVAL:
      break_link(r);
      break;
    default:
      break;
  }
}

void RingOwner::State::drain_cm_events() {
  std::lock_guard lock(m);
  for (;;) {
    auto event = verbs::next_event(channel.get(), std::chrono::milliseconds(0));
    if (!event) return;  // none left (or the channel failed: the next readable edge retries)
    if (event.value().type() == RDMA_CM_EVENT_CONNECT_REQUEST) {
      // The request's id is destroyed (rejecting it) or kept only after its event is acked.
      std::optional<verbs::ConnectRequest> request;
      {
        const verbs::CmEvent e = std::move(event).value();
        request.emplace(verbs::CmId::adopt_request(e));
      }
      on_connect_request(std::move(*request));
    } else {
      on_cm_event(event.value());
    }
  }
}

kj::Promise<void> RingOwner::State::watch_cm() {
  return cm_observer->whenBecomesReadable().then([this] {
    drain_cm_events();
    return watch_cm();
  });
}

// A QP gone fatal with nothing posted on it reports no completion: only its async event tells.
void RingOwner::State::take_async_events() {
  (void)async->drain([this](const verbs::AsyncEvent& e) {
    if (!e.qp_dead()) return;
    if (const auto it = by_qp.find(e.qp_num); it != by_qp.end()) break_link(*it->second);
  });
}

kj::Promise<void> RingOwner::State::watch_async() {
  return async_observer->whenBecomesReadable().then([this] {
    {
      std::lock_guard lock(m);
      take_async_events();
    }
    return watch_async();
  });
}

kj::Promise<void> RingOwner::State::expire_leases(kj::Timer& timer) {
  const auto period = std::max<std::int64_t>(options.lease.count() / 4, 1) * kj::MILLISECONDS;
  return timer.afterDelay(period).then([this, &timer] {
    {
      std::lock_guard lock(m);
      for (SessionId id : table.expire(Clock::now())) close_session(id);
    }
    return expire_leases(timer);
  });
}

// ---- the control channel (control thread) -----------------------------------------------------

namespace {

class Service final : public control::schema::RingService::Server {
 public:
  explicit Service(RingOwner::State& s) : s_(s) {}

 protected:
  kj::Promise<void> attach(AttachContext context) override;
  kj::Promise<void> resume(ResumeContext context) override;
  kj::Promise<void> heartbeat(HeartbeatContext context) override;
  kj::Promise<void> detach(DetachContext context) override;

 private:
  RingOwner::State& s_;
};

}  // namespace

kj::Promise<void> RingOwner::State::accept_control() {
  return control_listener->accept().then([this](kj::Own<kj::AsyncIoStream>&& stream) {
    struct Client {
      kj::Own<kj::AsyncIoStream> stream;
      capnp::TwoPartyVatNetwork network;
      capnp::RpcSystem<capnp::rpc::twoparty::VatId> rpc;
      Client(kj::Own<kj::AsyncIoStream> s, RingOwner::State& state)
          : stream(kj::mv(s)),
            network(*stream, capnp::rpc::twoparty::Side::SERVER,
                    capnp::ReaderOptions{control::kTraversalLimitWords, control::kNestingLimit}),
            rpc(capnp::makeRpcServer(network, kj::heap<Service>(state))) {}
    };
    auto client = kj::heap<Client>(kj::mv(stream), *this);
    auto ended = client->network.onDisconnect();
    tasks->add(ended.attach(kj::mv(client)));
    return accept_control();
  });
}

namespace {

template <class Reply>
void refuse(Reply reply, const Error& e) {
  control::write(reply.initRefused(), e);
}

// A session's ring could not be made or registered again (memlock, device, memory): the session
// cannot go on, and the producer is told why.
Error ring_failure(const char* call, const std::exception& e) {
  const auto* setup = dynamic_cast<const SetupError*>(&e);
  return make_error(errc::no_capacity, std::string(call) + ": " + (setup ? setup->error().message() : e.what()));
}

}  // namespace

kj::Promise<void> Service::attach(AttachContext context) {
  const auto params = context.getParams();
  auto reply = context.getResults().initReply();
  std::unique_lock lock(s_.m);
  ++s_.counters.control_calls;
  if (params.getVersion() != wire::kVersion) {
    control::write(reply.initRefused(), make_error(errc::protocol_violation, "producer speaks rdmaring v" +
                                                                                 std::to_string(params.getVersion()) +
                                                                                 ", this owner v" +
                                                                                 std::to_string(wire::kVersion)));
    reply.getRefused().setCode(control::schema::Refusal::Code::VERSION_MISMATCH);
    return kj::READY_NOW;
  }
  auto entry = s_.table.attach(Clock::now());
  if (!entry) {
    refuse(reply, entry.error());
    return kj::READY_NOW;
  }
  const SessionEntry e = entry.value();
  try {
    SessionRing& r = s_.make_ring(e.id, ResumePoint{}, 0);
    control::write(reply.initGrant(), s_.grant(r, e, ResumePoint{}), true);
  } catch (const std::exception& err) {
    s_.table.remove(e.id);
    s_.rings.erase(e.id);
    refuse(reply, ring_failure("attach", err));
    return kj::READY_NOW;
  }
  auto on_session = s_.options.on_session;
  lock.unlock();
  if (on_session) on_session(e.id, e.secret);
  return kj::READY_NOW;
}

kj::Promise<void> Service::resume(ResumeContext context) {
  const auto params = context.getParams();
  auto reply = context.getResults().initReply();
  auto who = control::read(params.getWho());
  if (!who) {
    refuse(reply, who.error());
    return kj::READY_NOW;
  }
  const Credentials c = who.value();
  bool known;
  {
    std::lock_guard lock(s_.m);
    ++s_.counters.control_calls;
    known = s_.table.find(c.session) != nullptr;
  }
  // The application's store is asked without the lock: it may be slow (a disk, a database).
  std::optional<DurableSession> durable;
  if (!known && s_.options.restore) durable = s_.options.restore(c.session);
  std::lock_guard lock(s_.m);
  const auto now = Clock::now();
  try {
    if (durable && !s_.table.find(c.session)) {
      const std::uint64_t released = params.getRestarted() ? 0 : params.getReleased();
      const std::uint64_t first = params.getRestarted() ? durable->next_sequence : params.getReleasedSequence();
      if (released % wire::kRecordAlign != 0) {
        refuse(reply, make_error(errc::invalid_argument, "resume: released " + std::to_string(released) +
                                                             " is not a record boundary"));
        return kj::READY_NOW;
      }
      auto epoch = s_.table.restore(c, durable->secret, now);
      if (!epoch) {
        refuse(reply, epoch.error());
        return kj::READY_NOW;
      }
      if (first > durable->next_sequence) {
        // The producer no longer holds records the application's durable record says it has not
        // processed: the old owner released them. Delivery goes on; the gap is reported.
        ++s_.counters.restore_gaps;
        s_.counters.last_session_failure = "session " + std::to_string(c.session) + ": restored at sequence " +
                                           std::to_string(durable->next_sequence) + " but the producer holds from " +
                                           std::to_string(first) + "; records in between are lost";
      }
      const ResumePoint at{epoch.value(), released, released, first};
      SessionRing& r = s_.make_ring(c.session, at, durable->next_sequence);
      control::write(reply.initGrant(), s_.grant(r, *s_.table.find(c.session), at), false);
      return kj::READY_NOW;
    }
    auto epoch = s_.table.resume(c, now);
    if (!epoch) {
      refuse(reply, epoch.error());
      return kj::READY_NOW;
    }
    SessionRing& r = *s_.rings.at(c.session);
    s_.fence(r);
    const auto at = r.core->begin_epoch(epoch.value());
    if (!at) {
      refuse(reply, at.error());
      return kj::READY_NOW;
    }
    control::write(reply.initGrant(), s_.grant(r, *s_.table.find(c.session), at.value()), false);
  } catch (const std::exception& err) {
    s_.table.remove(c.session);
    s_.close_session(c.session);
    refuse(reply, ring_failure("resume", err));
  }
  return kj::READY_NOW;
}

kj::Promise<void> Service::heartbeat(HeartbeatContext context) {
  auto results = context.getResults();
  auto who = control::read(context.getParams().getWho());
  std::lock_guard lock(s_.m);
  ++s_.counters.control_calls;
  const auto ok = who ? s_.table.heartbeat(who.value(), Clock::now()) : Result<void>(who.error());
  results.setOk(bool(ok));
  if (!ok) control::write(results.initRefused(), ok.error());
  return kj::READY_NOW;
}

kj::Promise<void> Service::detach(DetachContext context) {
  auto results = context.getResults();
  auto who = control::read(context.getParams().getWho());
  std::lock_guard lock(s_.m);
  ++s_.counters.control_calls;
  const auto ok = who ? s_.table.detach(who.value()) : Result<void>(who.error());
  results.setOk(bool(ok));
  if (!ok) {
    control::write(results.initRefused(), ok.error());
  } else {
    s_.close_session(who.value().session);
  }
  return kj::READY_NOW;
}

// ---- life cycle --------------------------------------------------------------------------------

std::unique_ptr<RingOwner> RingOwner::start(const RingOwnerOptions& options) {
  if (auto ok = options.validate(); !ok) throw SetupError(ok.error());
  auto s = std::make_unique<State>(options);
  s->listener.bind_and_listen(options.address, options.data_port, 64);
  const verbs::Context ctx = [&] {
    try {
      return s->listener.context();
    } catch (const SetupError& e) {
      if (e.error() != errc::no_device) throw;
      throw SetupError(make_error(errc::no_device, "RingOwner: address " + options.address +
                                                       " is on no RDMA device (rdma_cm bound it to none); give the "
                                                       "address of an RDMA netdev (rdmaring-doctor lists them)"));
    }
  }();
  s->counters.device = ctx.name();
  s->pd.emplace(ctx);
  s->async.emplace(ctx);
  const bool imm = options.mode == wire::PublishMode::imm;
  s->cq.emplace(ctx, static_cast<int>(options.core.sq_depth * options.max_sessions + (imm ? options.recv_depth : 0)));
  if (imm) {
    s->srq.emplace(*s->pd, options.recv_depth);
    s->recv_chain.assign(options.recv_depth, ibv_recv_wr{});
    for (auto& wr : s->recv_chain) wr.wr_id = kRecvWrId;  // no scatter list: an immediate carries no payload
    if (auto r = s->post_receives(options.recv_depth); !r) throw SetupError(r.error());
  }
  State& st = *s;
  st.loop.emplace(
      [&st](kj::AsyncIoContext& io) {
        auto address = io.provider->getNetwork().parseAddress(st.options.address, st.options.control_port).wait(io.waitScope);
        st.control_listener = address->listen();
        st.control_port = static_cast<std::uint16_t>(st.control_listener->getPort());
        st.task_errors = kj::heap<State::TaskErrors>(st);
        st.tasks = kj::heap<kj::TaskSet>(*st.task_errors);
        st.tasks->add(st.accept_control());
        st.cm_observer = kj::heap<kj::UnixEventPort::FdObserver>(io.unixEventPort, st.channel.get()->fd,
                                                                   kj::UnixEventPort::FdObserver::OBSERVE_READ);
        st.tasks->add(st.watch_cm());
        st.async_observer = kj::heap<kj::UnixEventPort::FdObserver>(io.unixEventPort, st.async->fd(),
                                                                      kj::UnixEventPort::FdObserver::OBSERVE_READ);
        st.tasks->add(st.watch_async());
        if (st.options.lease.count() > 0) st.tasks->add(st.expire_leases(io.provider->getTimer()));
      },
      [&st] {
        st.tasks = nullptr;
        st.cm_observer = nullptr;
        st.async_observer = nullptr;
        st.control_listener = nullptr;
      });
  return std::unique_ptr<RingOwner>(new RingOwner(std::move(s)));
}

RingOwner::RingOwner(std::unique_ptr<State> s) noexcept : s_(std::move(s)) {}

RingOwner::~RingOwner() {
  s_->loop.reset();
  std::lock_guard lock(s_->m);
  while (!s_->rings.empty()) s_->close_session(s_->rings.begin()->first);
}

std::uint16_t RingOwner::control_port() const { return s_->control_port; }
std::uint16_t RingOwner::data_port() const { return s_->listener.local_port(); }

std::size_t RingOwner::session_count() const {
  std::lock_guard lock(s_->m);
  return s_->table.size();
}

RingOwnerStats RingOwner::stats() const {
  std::lock_guard lock(s_->m);
  RingOwnerStats out = s_->counters;
  out.sessions = s_->table.counters();
  out.async_events = s_->async->counts().by_type;
  for (const auto& [id, r] : s_->rings) {
    out.registered.add(r->ring_mr);
    out.registered.add(r->tail_mr);
    out.rings += r->core->counters();
    const SessionEntry* e = s_->table.find(id);
    out.per_session.push_back(SessionStats{id, e ? e->epoch : 0, e ? e->state : SessionState::broken,
                                           r->core->counters(), r->core->ledger()});
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
                                  {"no_capacity", t.refused_capacity}})
    m.counter("owner_refusals_total", "Control messages and connect requests refused", n, {{"reason", reason}});
  m.counter("owner_connect_refused_total", "Connect requests rejected", s.connect_refused);
  m.counter("owner_control_calls_total", "Control-channel calls served", s.control_calls);
  m.counter("owner_records_total", "Records delivered", s.rings.records);
  m.counter("owner_payload_bytes_total", "Payload bytes delivered", s.rings.payload_bytes);
  m.counter("owner_publishes_total", "Publish events (immediates, tail records) that moved a mark", s.rings.publishes);
  m.counter("owner_credit_writes_total", "Credit write-backs posted", s.rings.credit_writes);
  m.counter("owner_credit_requests_total", "Credit requests seen", s.rings.credit_requests);
  m.counter("owner_stale_epoch_publishes_total", "Publishes of another epoch, ignored", s.rings.stale_epoch);
  m.counter("owner_duplicates_dropped_total", "Records below a restored session's durable sequence, not delivered",
            s.rings.duplicates_dropped);
  m.counter("owner_recv_completions_total", "Receive completions (immediates)", s.recv_completions);
  m.counter("owner_stale_completions_total", "Completions of a QP that is gone", s.stale_completions);
  m.counters("owner_completion_errors_total", "Error completions by status", s.completion_errors, "status");
  m.counters("owner_async_events_total", "Asynchronous device events, acknowledged", s.async_events, "type");
  m.registrations("owner", s.device, s.registered.regions, s.registered.bytes);
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

std::optional<std::uint32_t> RingOwner::ring_checksum(SessionId session) const {
  std::lock_guard lock(s_->m);
  const auto it = s_->rings.find(session);
  if (it == s_->rings.end()) return std::nullopt;
  return crc32c(it->second->ring.bytes());
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
