// The ring owner: the consumer side of rdmaring as a service embeds it. It serves the control
// channel (Cap'n Proto RPC over TCP: attach, resume, heartbeat, detach), admits producers' RC
// QPs by rdma_cm for their session's current epoch only, owns one registered ring per session,
// and delivers every session's records to the application, fairly, from poll().
//
// The protocol decisions (sessions, fencing, leases, credit, fairness) are OwnerCore's
// (queue/include/rdmaring/owner_core.hpp); this class executes them on verbs.
//
// Security: the control channel is mutual TLS unless options.security says insecure_plaintext;
// attach is admitted by identity and quota (options.allow), and every resume, heartbeat and
// detach proves the session secret over a nonce of its own connection, so no captured control
// message can be replayed (protocol-spec/sessions.md §3, §7, §13).
//
// Threads: a control thread (started here, named "rdmaring-owner") runs the control channel,
// rdma_cm events and leases; the application calls poll() from one thread of its own. They share
// the sessions under one lock, which is never held while the application's code runs: handlers,
// on_session, restore and on_session_closed may call any const member (stats(), metrics(),
// ledger_dump(), session_count()). Rings are allocated and registered outside the lock, so an
// attach or resume of a large ring does not stall the other sessions' deliveries. Set-up throws
// SetupError; poll() returns Result.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "rdmaring/consumer_core.hpp"
#include "rdmaring/control_security.hpp"
#include "rdmaring/delivery_batch.hpp"
#include "rdmaring/error.hpp"
#include "rdmaring/held_batches.hpp"
#include "rdmaring/owner_core.hpp"
#include "rdmaring/session_table.hpp"
#include "rdmaring/registration_footprint.hpp"

namespace rdmaring {

struct RingOwnerOptions {
  std::string address;             // local address for both the control channel and rdma_cm
  std::uint16_t control_port = 0;  // 0: ephemeral, see RingOwner::control_port()
  std::uint16_t data_port = 0;     // 0: ephemeral
  std::uint64_t ring_bytes = 1 << 20;  // per session
  std::uint32_t max_record = 64 * 1024;
  wire::PublishMode mode = wire::PublishMode::imm;
  // Register rings with IBV_ACCESS_RELAXED_ORDERING: mode imm only, where the immediate's
  // completion, not the order of placement, makes the bytes valid; and only with
  // core.payload_check crc32c.
  bool relaxed_ordering = false;
  // Register rings with On-Demand Paging; refused where the device has no ODP for RC WRITE.
  bool on_demand_paging = false;
  std::uint32_t max_sessions = 64;
  std::uint32_t recv_depth = 1024;  // receives on the shared receive queue (immediates, doorbells), all sessions
  // A session that neither publishes nor heartbeats for this long is closed and its ring freed.
  // Zero: sessions never expire.
  std::chrono::milliseconds lease = std::chrono::seconds(30);
  // Fairness: per poll round, each session with records ready may deliver up to this many payload
  // bytes (and at least one record) before the next session's turn (deficit round robin).
  std::uint32_t quantum_bytes = 64 * 1024;
  // Mode tail: a session whose tail record this many polls in a row found unmoved, with nothing
  // unread or held, is parked (protocol-spec/wakeup.md §3.2): asked to ring a doorbell after each
  // publish, and its tail read only after one, so a poll reads the tails of busy sessions only.
  // Zero: every tail is read at every poll.
  std::uint32_t tail_park_reads = 1024;
  ConsumerConfig core;

  // Mutual TLS by default: ca, certificate and private_key must be set (control_security.hpp).
  ControlSecurity security;
  // Who may attach and how much each identity may hold (sessions.md §2.8): the first rule whose
  // pattern matches the producer's identity applies; none matching: refused, unauthorized.
  // Empty: every producer the TLS handshake authenticated, no quota but max_sessions.
  std::vector<IdentityRule> allow;

  // Called on the control thread whenever a session's durable record changes: at attach (before
  // the attach reply is sent), at a restore, and when a resumed epoch's QP is established (its
  // floor rises). Persist it (an upsert by session) to survive an owner restart; restore()
  // hands it back.
  std::function<void(const SessionRecord&)> on_session;
  // Called on the control thread for a resume of a session this owner does not know (after its
  // restart): the application's durable record of it (the last SessionRecord on_session gave,
  // and the next sequence it must deliver), or nullopt.
  std::function<std::optional<DurableSession>(SessionId)> restore;
  // Called when a session ends, for whatever reason, so the application can drop its durable
  // record (a detach, an expired lease, a protocol violation: `message` says which rule). On the
  // thread that ended it (the control thread, or the one calling poll()), without the lock.
  std::function<void(SessionId, CloseReason, const std::string& message)> on_session_closed;

  // errc::bad_config / relaxed_ordering_refused with the reason.
  Result<void> validate() const;
};

struct SessionStats {
  SessionId session = 0;
  std::uint64_t epoch = 0;
  SessionState state = SessionState::attached;
  ConsumerCounters core;
  ConsumerLedger ledger;
};

struct RingOwnerStats {
  std::string device;  // the verbs device rdma_cm bound the data port to
  RegistrationFootprint registered;  // the rings' and tail records' MRs, now (outliving rings' too)
  // Rings kept past their session's end, by a held batch, an open poll or a ring_of() share:
  // still allocated and registered until the last of those lets go.
  std::uint64_t rings_outliving_sessions = 0;
  SessionCounters sessions;
  std::uint64_t control_calls = 0;
  std::uint64_t control_task_failures = 0;  // control-thread tasks (listener, rdma_cm, leases) that failed
  bool insecure_plaintext = false;         // the control channel is plain TCP, as the options asked
  std::uint64_t handshakes_failed = 0;     // TLS handshakes refused or cut (no or untrusted certificate, timeout)
  std::string last_handshake_failure;      // why the last one failed, as OpenSSL or KJ said
  std::uint64_t refused_unauthorized = 0;  // attaches and restores of an identity no allow rule matches
  std::uint64_t refused_quota = 0;         // attaches and restores beyond the identity's quota
  std::uint64_t restore_gaps = 0;        // restores where the producer no longer held every unprocessed record
  std::uint64_t handler_aborts = 0;      // give-backs: a poll left a session's records for the next (abort, stop, a throw)
  std::uint64_t session_visits = 0;      // sessions the data path looked at: grows with busy sessions, not attached ones
  std::uint64_t tail_reads = 0;          // mode tail: tail records read (parked sessions' are not)
  std::uint64_t parks = 0;               // mode tail: sessions parked (wakeup.md §3.2)
  std::uint64_t connect_refused = 0;     // connect requests refused (any reason in `sessions`)
  std::uint64_t sessions_failed = 0;     // closed because their producer broke the protocol
  std::uint64_t recv_completions = 0;
  std::uint64_t recv_posts = 0;
  std::uint64_t credit_posts = 0;
  std::uint64_t stale_completions = 0;   // completions of a QP that is gone
  std::uint64_t error_completions = 0;   // each marks its session's connection broken
  std::uint64_t credit_post_failures = 0;  // each marks its session's connection broken
  std::uint64_t sleeps = 0;              // arm()/wait() calls that found nothing to do and armed
  ConsumerCounters rings;  // summed over every ring, closed ones included
  std::map<std::string, std::uint64_t> completion_errors;  // by ibv_wc_status_str
  std::map<std::string, std::uint64_t> async_events;       // by ibv_event_type_str, every one acknowledged
  std::string last_session_failure;
  std::vector<SessionStats> per_session;
};

class RingOwner {
 public:
  // Listens on both ports and starts the control thread. Throws: SetupError (bad options; the
  // address has no RDMA device; a port in use).
  static std::unique_ptr<RingOwner> start(const RingOwnerOptions& options);
  RingOwner(const RingOwner&) = delete;
  RingOwner& operator=(const RingOwner&) = delete;
  // Stops the control thread, disconnects every producer and frees every ring.
  ~RingOwner();

  std::uint16_t control_port() const;
  std::uint16_t data_port() const;

  // Delivers up to `max` records from all sessions, in order within each, taking sessions in
  // turn (deficit round robin by ring space). `handler` is called as handler(const Delivery&) and
  // returns void (consume) or a HandlerAction, without any lock of the owner's held. A record is
  // released (its space goes back to its producer) after its handler returned; an application
  // that keeps DurableSession records makes each sequence durable before the handler returns.
  //   - abort: that record and the rest of this poll's are delivered again by the next poll.
  //   - a handler that throws: the same as abort for its record, then the exception propagates
  //     out of poll(); the records handled before it are released.
  // Returns how many records were handled. A session whose producer breaks the protocol, or
  // whose connection fails, is closed or broken alone (RingOwnerStats); the others go on.
  // Errors: verbs_failure of the shared completion or receive queue (owner-wide);
  // invalid_argument for a poll() from inside a handler or from a second thread.
  template <class Handler>
  Result<std::size_t> poll(Handler&& handler, std::size_t max);
  // The same records, handed over in one call: handler(const DeliveryBatch&) (sessions
  // interleaved as poll() takes them, each in order) returns how many, from the first, it
  // handled; those are released and the rest delivered again by the next poll, as after an abort
  // of the first one not handled. One call per batch lets an application make a whole batch
  // durable at once (one transaction). It is not called for a poll that took nothing.
  //   - a handler that throws: nothing of the batch is released; the exception propagates.
  //   - a count above the batch's size: nothing released, and invalid_argument.
  template <class Handler>
  Result<std::size_t> poll_batch(Handler&& handler, std::size_t max);

  // ---- held batches (protocol-spec/owner.md §5.1) ----
  // For a consumer whose handling ends after the call, as a GPU copy does (gpu/): take() takes
  // up to `max` records as poll() would and returns them still being consumed; their payload
  // spans stay valid, and their rings allocated, until finish(), whatever becomes of their
  // sessions. Several batches may be held at once; poll() and poll_batch() are refused while any
  // is. An empty batch is not held. Errors: poll()'s; invalid_argument from inside a handler.
  Result<std::vector<TakenRecord>> take(std::size_t max);
  // The first `handled` of a held batch (as take() returned it) were handled: released, the
  // rest given back, as poll_batch() does with a count. The oldest held batch may finish wholly
  // handled, the newest be given back whole (handled 0), a batch held alone with any count.
  // Errors: invalid_argument, changing nothing, for any other finish, a batch not held, or
  // `handled` past its end.
  Result<void> finish(std::span<const TakenRecord> batch, std::size_t handled);
  // The whole ring a record of a held batch lies in, and a share that keeps the ring allocated
  // (and registered with the device) while it is kept, after the batch's finish and the
  // session's end: for a consumer that registers each ring once with another device, as the GPU
  // delivery does with CUDA, and lets go once the share is the last (use_count() 1).
  // From the polling thread. Errors: invalid_argument for a record of no held batch.
  Result<RingShare> ring_of(const TakenRecord& held) const;

  // ---- sleeping instead of spinning (protocol-spec/wakeup.md) ----
  // From the polling thread, between polls: sleeps until poll() may have work or `timeout`
  // passes (negative: no limit). It takes what is waiting, asks tail-mode producers to follow
  // their publishes with a doorbell, arms the completion queue and looks again, so no publish
  // is missed: one that lands before the arming is seen by that look, one after it wakes the
  // sleep. A session that ends wakes it too (after on_session_closed), and so does an attach,
  // restore or resume granted, so a loop that waits for session_count() to fall or rise needs
  // no timeout. Returns true at once when there is work, true
  // when woken, false on timeout.
  // Errors: verbs_failure, system_failure; invalid_argument from inside a handler.
  Result<bool> wait(std::chrono::milliseconds timeout);
  // The same for an event loop (epoll nests): arm() returns false when poll() has work now (poll,
  // then arm again), true when fd() becomes readable at the next event; poll() when it is.
  Result<bool> arm();
  int fd() const;
  // Any thread: the sleeping wait() returns now, and fd() becomes readable; when nothing
  // sleeps, the next wait() or arm() returns at once instead. Never lost.
  void wake() const;

  std::size_t session_count() const;
  RingOwnerStats stats() const;
  // One line per session: its state, epoch and ring ledger.
  std::string ledger_dump() const;
  // Every counter above in the Prometheus text format (rdmaring_owner_*, rdmaring_session_*).
  std::string metrics() const;
  // CRC-32C of a session's whole ring as it is in memory now (nullopt: no such session). For
  // audits: what a fenced writer could have touched shows up here.
  std::optional<std::uint32_t> ring_checksum(SessionId session) const;

  struct State;

 private:
  friend struct RingOwnerTestAccess;  // fault injection, control/src/ring_owner_test_access.hpp
  explicit RingOwner(std::unique_ptr<State> s) noexcept;
  // poll() in two halves around the handlers: records taken (and pinned), then the first
  // `handled` released and the rest given back.
  Result<std::span<const TakenRecord>> begin_poll(std::size_t max);
  std::size_t end_poll(std::size_t handled) noexcept;
  // begin_poll, hand_over(taken, handled) (hand_each or hand_batch), end_poll with `handled`,
  // which hand_over keeps current for a handler's throw.
  template <class HandOver>
  Result<std::size_t> poll_with(std::size_t max, HandOver&& hand_over);

  std::unique_ptr<State> s_;
};

template <class HandOver>
Result<std::size_t> RingOwner::poll_with(std::size_t max, HandOver&& hand_over) {
  BOOST_OUTCOME_TRY(taken, begin_poll(max));
  std::size_t handled = 0;
  Result<std::size_t> outcome = std::size_t{0};
  try {
    outcome = hand_over(taken, handled);
  } catch (...) {
    end_poll(handled);
    throw;
  }
  const std::size_t released = end_poll(handled);
  if (!outcome) return std::move(outcome).error();
  return released;
}

template <class Handler>
Result<std::size_t> RingOwner::poll(Handler&& handler, std::size_t max) {
  return poll_with(max, [&handler](std::span<const TakenRecord> taken, std::size_t& handled) -> Result<std::size_t> {
    return hand_each(taken, handler, handled);
  });
}

template <class Handler>
Result<std::size_t> RingOwner::poll_batch(Handler&& handler, std::size_t max) {
  return poll_with(max, [&handler](std::span<const TakenRecord> taken, std::size_t& handled) {
    return hand_batch(taken, handler, handled);
  });
}

}  // namespace rdmaring
