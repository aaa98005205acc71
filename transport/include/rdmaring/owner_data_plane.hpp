// The ring owner's data plane on verbs: the rdma_cm listener, the shared PD, CQ and SRQ, and per
// session a registered ring (and tail record in mode tail) and the admitted QP. It executes what
// OwnerCore decides: feeds it completions, immediates and tail records, posts its credit
// write-backs, zeroes and re-registers its fenced rings, tears down the sessions it ends.
//
// Threads and the lock: the control thread calls the control-side members (connect requests,
// rdma_cm and async events, attach, resume, restore, heartbeat, detach, tick), one thread polls
// (begin_poll / end_poll), and any thread may inspect(). One mutex serialises them; it is never
// held while the application's code runs (the handlers between begin_poll and end_poll, the
// on_session_closed callback) nor while a ring is allocated, zeroed or registered.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "rdmaring/held_batches.hpp"
#include "rdmaring/owner_core.hpp"
#include "rdmaring/post.hpp"
#include "rdmaring/verbs/async_events.hpp"
#include "rdmaring/verbs/cm_id.hpp"
#include "rdmaring/verbs/comp_channel.hpp"
#include "rdmaring/verbs/cq.hpp"
#include "rdmaring/verbs/event_channel.hpp"
#include "rdmaring/verbs/mr.hpp"
#include "rdmaring/verbs/pd.hpp"
#include "rdmaring/verbs/srq.hpp"
#include "rdmaring/waiter.hpp"

namespace rdmaring {

// Receives consumed by immediates (mode imm's publishes, mode tail's doorbells) are re-posted to
// the shared receive queue in chains of this many, so recv_depth must be at least twice it.
inline constexpr std::uint32_t kRecvRepostBatch = 16;

struct OwnerDataPlaneOptions {
  std::string address;  // the RDMA device's address rdma_cm listens on
  std::uint16_t data_port = 0;
  bool relaxed_ordering = false;
  bool on_demand_paging = false;
  std::uint32_t recv_depth = 1024;  // receives on the shared receive queue
  OwnerConfig core;
  std::function<void(SessionId, CloseReason, const std::string&)> on_session_closed;
  // Every durable record the core changed (attach, restore, a resumed epoch established).
  std::function<void(const SessionRecord&)> on_session;
};

struct Granted {
  SessionEntry session;
  ResumePoint at;
  RingKeys keys;
};

struct DataPlaneCounters {
  std::string device;
  std::uint64_t recv_completions = 0;
  std::uint64_t recv_posts = 0;
  std::uint64_t stale_completions = 0;     // completions of a QP that is gone
  std::uint64_t malformed_connects = 0;    // connect requests whose private data did not decode
  std::uint64_t credit_post_failures = 0;  // each breaks its session's link only
  std::uint64_t sleeps = 0;                // arm() calls that found nothing to do: the poller may sleep
  std::map<std::string, std::uint64_t> completion_errors;  // by ibv_wc_status_str
};

class OwnerDataPlane {
 public:
  using Clock = OwnerCore::Clock;

  // Binds and listens; opens the device's PD, completion channel, CQ and SRQ. Throws SetupError
  // (no_device: the address is on no RDMA device; verbs_failure; system_failure).
  explicit OwnerDataPlane(const OwnerDataPlaneOptions& options);
  OwnerDataPlane(const OwnerDataPlane&) = delete;
  OwnerDataPlane& operator=(const OwnerDataPlane&) = delete;
  // Ends every session (owner_stopped).
  ~OwnerDataPlane();

  std::uint16_t data_port() const noexcept { return listener_.local_port(); }
  int cm_fd() const noexcept;
  int async_fd() const noexcept { return async_->fd(); }

  // ---- the control thread ----
  void on_cm_readable();     // connect requests, ESTABLISHED, disconnects
  void on_async_readable();  // a QP gone fatal breaks its session's link
  void tick(Clock::time_point now);
  // The session's ring is allocated and registered before the session exists, outside the lock.
  // Errors: no_capacity, memlock_too_low, odp_unsupported, verbs_failure (from the
  // registration), out of memory as no_capacity.
  // `identity`: who the control channel authenticated; its allow rule and quota apply.
  // Errors also unauthorized, quota_exceeded.
  Result<Granted> attach(std::string_view identity, Clock::time_point now);
  bool knows(SessionId id) const;
  Result<Granted> restore(const Credentials& who, const DurableSession& durable, bool restarted,
                          std::uint64_t released, std::uint64_t first, Clock::time_point now);
  // Fences the epoch (QP dropped, unread ring zeroed outside the lock, ring registered again:
  // the old rkeys die) and grants the next. Errors: OwnerCore::resume's; a ring that cannot be
  // registered again closes the session (ring_failure) and is returned.
  Result<Granted> resume(const Credentials& who, Clock::time_point now);
  Result<void> heartbeat(const Credentials& who, Clock::time_point now);
  Result<void> detach(const Credentials& who);

  // ---- the polling thread ----
  // Takes up to `max` records (pinning their rings) for the application. Errors: verbs_failure
  // of the shared CQ or SRQ; invalid_argument when a poll is already open (a handler polling,
  // or two threads).
  Result<std::span<const TakenRecord>> begin_poll(std::size_t max);
  // The first `handled` of them were handled: released; the rest are given back. Posts credit.
  std::size_t end_poll(std::size_t handled) noexcept;
  // Held batches (owner.md §5.1), for a consumer whose handling ends after the call, as a GPU
  // copy does: take() takes up to `max` records as begin_poll does and keeps them being
  // consumed, their rings alive, until finish(). Several may be held at once; no poll is open
  // meanwhile. Errors: begin_poll's; invalid_argument while a poll is open.
  Result<std::vector<TakenRecord>> take(std::size_t max);
  // The first `handled` of a held batch (as take() returned it) were handled: released, the
  // rest given back; posts credit. HeldBatches::remove says which batch may end now. Errors:
  // invalid_argument (a batch not held, out of order, or `handled` past its end), and nothing
  // changes.
  Result<void> finish(std::span<const TakenRecord> batch, std::size_t handled);
  // The ring a record of a held batch lies in, and a share of it (owner.md §5.1). Errors:
  // invalid_argument for a record of no held batch.
  Result<RingShare> ring_of(const TakenRecord& held) const;
  // Before the polling thread sleeps (protocol-spec/wakeup.md): takes what is waiting, asks
  // tail-mode producers for doorbells, arms the CQ and looks again. false: there is work now (or
  // a wake() came), poll instead of sleeping; true: fd() becomes readable at the next event. Errors:
  // verbs_failure; invalid_argument while a poll is open.
  Result<bool> arm();
  // arm(), then sleeps until fd() is readable or the timeout passes. true: woken (or there was
  // work), false: timed out. Errors: arm()'s, system_failure.
  Result<bool> wait(std::chrono::milliseconds timeout);
  // Readable when poll() may have work, once arm() returned true (epoll nests: put it in a loop).
  int fd() const noexcept { return waiter_->fd(); }
  // Any thread: fd() becomes readable and a wait() returns.
  void wake() const noexcept { waiter_->wake(); }

  // ---- any thread ----
  // Runs f(core, counters) under the lock: a consistent view, for stats.
  template <class F>
  decltype(auto) inspect(F&& f) const {
    std::lock_guard lock(m_);
    return f(core_, counters_);
  }
  // The rings' and tail records' MRs now, those of rings kept past their session's end (by a
  // held batch, an open poll or a ring_of() share) included, and how many such rings there are.
  struct Registered {
    RegistrationFootprint footprint;
    std::uint64_t outliving = 0;
  };
  Registered registered() const;
  std::map<std::string, std::uint64_t> async_event_counts() const;
  // CRC-32C of a session's whole ring as it is in memory now. For audits.
  std::optional<std::uint32_t> ring_checksum(SessionId session) const;

  // Fault injection points (eRPC's model), so tests can show that a fault of one session
  // harms that session only. Armed per session; each fires once except the last.
  enum class Fault {
    refuse_next_credit_post,  // the session's next credit post fails as a refused ibv_post_send would
    qp_error,                 // the session's QP is moved to the error state now
    corrupt_next_immediate,   // the session's next immediate arrives with wrong epoch bits
    drop_credit_completions,  // the session's credit completions are lost: its send queue fills
  };
  void inject(SessionId session, Fault fault);

 private:
  struct Link;
  struct SessionRing;
  // What the application is told once the lock is released: sessions that ended, and durable
  // records that changed.
  struct Notices {
    std::vector<ClosedSession> closed;
    std::vector<SessionRecord> records;
  };

  // Allocated, zeroed and registered, outside the lock. Errors: ring_failure's, named for `call`.
  Result<std::shared_ptr<SessionRing>> new_ring(const char* call) const;
  void register_ring(SessionRing& r) const;
  RingKeys keys(const SessionRing& r) const noexcept;
  Result<void> post_receives(std::uint32_t n);
  // Under the lock: async events, completions and (mode tail) tail records, fed to the core.
  Result<void> take_events(Notices& notices);
  // Under the lock: take_events, credits posted; whether a poll has records to take.
  Result<bool> work_waiting(Notices& notices);
  // Under the lock: the completion channel's events of an earlier arm() are taken back.
  void disarm();
  // Under the lock: every completion waiting, fed to the core, and the sessions it ended torn
  // down (their QPs' own completions then drained too, before any QP number can be reused).
  Result<void> take_completions(Notices& notices);
  void dispatch(const ibv_wc& wc);
  void apply_actions(Notices& notices);
  void drop_link(SessionRing& r);
  void post_credits();
  void on_connect_request(verbs::ConnectRequest request, Notices& notices);
  void take_async_events();
  void notify(const Notices& notices) const;
  SessionRing* ring_of(SessionId id) const;

  OwnerDataPlaneOptions options_;
  verbs::EventChannel channel_;  // the listener's and every accepted connection's events
  verbs::CmId listener_{channel_};
  std::optional<verbs::ProtectionDomain> pd_;
  std::optional<verbs::CompletionChannel> cq_channel_;  // before the CQ: it outlives it
  std::optional<verbs::CompletionQueue> cq_;
  std::optional<verbs::SharedReceiveQueue> srq_;
  std::optional<verbs::AsyncEvents> async_;
  std::optional<Waiter> waiter_;
  bool armed_ = false;
  // The waiter's timer as last set (wakeup.md O7): set again only when it changes, so a sleep
  // with no failing record costs no system call for it.
  std::optional<Clock::time_point> wake_at_;
  std::vector<ibv_recv_wr> recv_chain_;
  std::uint32_t recv_owed_ = 0;  // receives consumed, not yet re-posted

  mutable std::mutex m_;
  OwnerCore core_;
  DataPlaneCounters counters_;
  std::map<SessionId, std::shared_ptr<SessionRing>> rings_;
  // Rings whose session ended while something else held them: still pinned, so still counted.
  mutable std::vector<std::weak_ptr<SessionRing>> outliving_;
  std::unordered_map<std::uint32_t, SessionId> by_qp_;
  std::unordered_map<rdma_cm_id*, SessionId> by_cm_;
  std::unordered_map<SessionId, Fault> faults_;  // tests only: checked after one empty() on the data path

  // Under the lock: takes up to `max` records into `taken` and the rings they lie in into
  // `pinned`, after the events waiting.
  Result<void> take_into(std::size_t max, std::vector<TakenRecord>& taken, std::vector<std::shared_ptr<void>>& pinned,
                         Notices& notices);

  // The open poll (polling thread only): the records taken and the rings they lie in, kept
  // alive until end_poll even if their session closes meanwhile.
  bool polling_ = false;
  std::vector<TakenRecord> taken_;
  std::vector<std::shared_ptr<void>> pinned_;
  // Held batches, oldest first, each with the rings it pins (polling thread only).
  HeldBatches held_;
  std::vector<CreditPost> credit_scratch_;
};

}  // namespace rdmaring
