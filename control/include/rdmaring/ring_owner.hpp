// The ring owner: the consumer side of rdmaring as a service embeds it. It serves the control
// channel (Cap'n Proto RPC over TCP: attach, resume, heartbeat, detach), admits producers' RC
// QPs by rdma_cm for their session's current epoch only, owns one registered ring per session,
// and delivers every session's records to the application, fairly, from poll().
//
// Threads: a control thread (started here) runs the control channel, rdma_cm events and
// leases; the application calls poll() from one thread of its own. They share the sessions under
// one mutex, taken once per poll() and per control event. Set-up throws SetupError; poll()
// returns Result.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "rdmaring/consumer_core.hpp"
#include "rdmaring/error.hpp"
#include "rdmaring/session_table.hpp"
#include "rdmaring/verbs/mr.hpp"

namespace rdmaring {

// What an application keeps, durably, so that exactly-once delivery survives a restart of the
// owner: per session, its id and secret (given to on_session) and the sequence after the last
// record it has durably processed. Without it, a restarted owner knows no session: producers get
// unknown_session, attach again and re-send what was not released, so delivery across an owner
// restart is at-least-once.
struct DurableSession {
  SessionSecret secret{};
  std::uint64_t next_sequence = 0;  // records below this were delivered and must not be again
};

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
  std::uint32_t recv_depth = 1024;  // receives on the shared receive queue (mode imm), all sessions
  // A session that neither publishes nor heartbeats for this long is closed and its ring freed.
  // Zero: sessions never expire.
  std::chrono::milliseconds lease = std::chrono::seconds(30);
  // Fairness: per poll round, each session with records ready may deliver up to this many payload
  // bytes (and at least one record) before the next session's turn (deficit round robin).
  std::uint32_t quantum_bytes = 64 * 1024;
  ConsumerConfig core;

  // Called on the control thread when a session is attached: persist it to survive an owner
  // restart.
  std::function<void(SessionId, const SessionSecret&)> on_session;
  // Called on the control thread for a resume of a session this owner does not know (after its
  // restart): the application's durable record of it, or nullopt.
  std::function<std::optional<DurableSession>(SessionId)> restore;

  // errc::bad_config / relaxed_ordering_refused with the reason.
  Result<void> validate() const;
};

struct Delivery {
  SessionId session = 0;
  std::span<const std::byte> payload;  // in the session's ring: valid until the handler returns
  std::uint64_t sequence = 0;          // per session, from 0, without gaps
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
  verbs::RegistrationFootprint registered;  // the rings' and tail records' MRs, now
  SessionCounters sessions;
  std::uint64_t control_calls = 0;
  std::uint64_t control_task_failures = 0;  // control-thread tasks (listener, rdma_cm, leases) that failed
  std::uint64_t restore_gaps = 0;        // restores where the producer no longer held every unprocessed record
  std::uint64_t connect_refused = 0;     // connect requests refused (any reason in `sessions`)
  std::uint64_t sessions_failed = 0;     // closed because their producer broke the protocol
  std::uint64_t recv_completions = 0;
  std::uint64_t recv_posts = 0;
  std::uint64_t credit_posts = 0;
  std::uint64_t stale_completions = 0;   // completions of a QP that is gone
  std::uint64_t error_completions = 0;   // each marks its session's connection broken
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

  using Handler = std::function<void(const Delivery&)>;
  // Delivers up to `max` records from all sessions, in order within each, taking sessions in
  // turn (deficit round robin by ring space). A record is released (its space goes back to its
  // producer) after its handler returned, at the end of its session's turn: an application that
  // keeps DurableSession records makes each sequence durable before the handler returns.
  // Returns how many. A session whose producer breaks the protocol is closed (counted,
  // RingOwnerStats::last_session_failure) and the others go on. Errors: verbs_failure of the
  // shared completion or receive queue.
  Result<std::size_t> poll(const Handler& handler, std::size_t max);

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
  explicit RingOwner(std::unique_ptr<State> s) noexcept;
  std::unique_ptr<State> s_;
};

}  // namespace rdmaring
