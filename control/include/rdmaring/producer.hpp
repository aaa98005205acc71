// A producer session over real verbs: attached to a RingOwner through the control channel,
// the ProducerCore driven by an RC QP into the ring the owner granted.
//
// Single-threaded: one thread calls everything on a Producer (ThreadedProducer puts a lock-free
// front on it for many threads). Set-up throws SetupError; the data path returns Result.
// Threads: each Producer starts one control thread, named "rdmaring-ctl" (what top -H, ps -L and
// /proc/PID/task/*/comm show), which carries the control channel and the heartbeats; the data
// path never waits on it.
// Ownership: the Producer owns every verbs object of its session; spans returned by claim() point
// into its registered staging buffer and are valid until commit() or abort().
#pragma once

#include <array>
#include <chrono>
#include <functional>
#include <map>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "rdmaring/control_security.hpp"
#include "rdmaring/error.hpp"
#include "rdmaring/idle_strategy.hpp"
#include "rdmaring/producer_core.hpp"
#include "rdmaring/registration_footprint.hpp"

namespace rdmaring {

// What a producer process must keep (durably, if it wants to survive its own restart) to rejoin
// its session: the id, the secret, and the epoch it was last granted.
struct SessionCredentials {
  std::uint64_t session = 0;
  std::array<std::byte, 32> secret{};
  std::uint64_t epoch = 0;
};

struct ProducerOptions {
  std::string address;  // the ring owner's address: control channel (TCP) and rdma_cm both
  std::uint16_t control_port = 0;
  // Mutual TLS by default: ca, certificate and private_key must be set; the owner's certificate
  // must name server_name (default: address). control_security.hpp.
  ControlSecurity security;
  // Local address to bind the RDMA connection to (empty: the route's choice). A test host that
  // shares its network namespace with others is told apart by this.
  std::string source_address;
  ProducerConfig core;
  std::chrono::milliseconds connect_timeout = std::chrono::seconds(10);
  // How send(payload, timeout) and drain() wait: they poll (spin, then yield) before they sleep
  // in wait(), so that a round trip shorter than the spinning costs no wake-up latency.
  IdlePolicy idle;
  // Heartbeats keep the session's lease while the producer is idle; by default a third of the
  // lease the owner grants. Zero: no heartbeats (the session lives only while it publishes).
  std::optional<std::chrono::milliseconds> heartbeat_interval;
  // Called with the session's credentials as soon as an epoch is granted (attach, rejoin,
  // recover), before its QP connects: a producer that wants to survive its own restart stores
  // them here. Once the QP connects, the owner no longer admits a resume from the epoch before.
  std::function<void(const SessionCredentials&)> on_credentials;
};

// Per-record costs are these divided by core.records.
struct ProducerStats {
  std::string device;  // the verbs device rdma_cm resolved the owner's address to
  RegistrationFootprint registered;  // staging and credit MRs
  ProducerCounters core;
  std::uint64_t post_send_calls = 0;
  std::uint64_t completions = 0;  // signaled send completions polled
  std::uint64_t stale_completions = 0;  // completions of a replaced connection, ignored
  std::uint64_t recoveries = 0;
  std::uint64_t credit_notifications = 0;  // credit records the owner wrote with an immediate (they wake wait())
  std::uint64_t sleeps = 0;                // waits that armed the completion queue and slept
  std::map<std::string, std::uint64_t> completion_errors;  // by ibv_wc_status_str
  std::map<std::string, std::uint64_t> async_events;       // by ibv_event_type_str, every one acknowledged
  ProducerLedger ledger;
};

class Producer {
 public:
  // Attaches a new session: asks the owner for a ring over the control channel, registers the
  // staging mirror of it and connects the QP for epoch 1.
  // Throws: SetupError (bad options, control_failure, no_capacity, no route, rejected, memlock
  // too low, device lacks inline).
  static Producer attach(const ProducerOptions& options);
  // Rejoins an existing session after this process restarted (its staging is gone): resumes in
  // the next epoch, from the owner's last delivered record. The application sends again from
  // next_sequence(). Throws: as attach, and unknown_session / bad_proof / stale_epoch.
  static Producer rejoin(const ProducerOptions& options, const SessionCredentials& credentials);
  Producer(Producer&&) noexcept;
  Producer& operator=(Producer&&) noexcept;
  ~Producer();

  // Copies `payload` into staging as one record; posts when a coalescing threshold is reached.
  // Errors: would_block (ring full even after taking the credit that had come, and credit asked
  // for: wait() until the answer, or progress(), and retry), record_too_large, the
  // connection's error (needs_recover()). An error means the record was not taken; once taken,
  // a record is delivered exactly once whatever fails after.
  Result<void> send(std::span<const std::byte> payload);
  // send(), retried until it fits or `timeout` passes (errc::timed_out), sleeping in wait()
  // between tries: the owner answers the credit request with an immediate that wakes it.
  Result<void> send(std::span<const std::byte> payload, std::chrono::nanoseconds timeout);
  // Zero-copy: fill the returned span, then commit() (optionally fewer bytes) or abort().
  // commit() posts when a coalescing threshold is reached, judging the delay by the clock
  // reading claim() took: a record whose delay ran out while it was being built goes out at the
  // next call (progress(), flush(), the next record's commit).
  Result<std::span<std::byte>> claim(std::uint32_t len);
  Result<void> commit(std::optional<std::uint32_t> len = std::nullopt);
  void abort() noexcept;
  // Publishes everything committed now, whatever the thresholds.
  Result<void> flush();
  // Polls completions and credit, publishes what the coalescing delay has made due. Call it
  // whenever the application is idle. Errors: the connection's error; owner_lost when
  // heartbeats go unanswered (a producer with a full ring posts nothing, so only they notice an
  // owner that died), unknown_session / stale_epoch when the owner refuses them.
  Result<void> progress();
  // True when the owner has released every record sent: nothing is in flight, so nothing needs
  // this producer to watch its credit (a ring owner that sleeps counts on a producer with
  // publishes in flight to read its doorbell flag: protocol-spec/wakeup.md). Otherwise asks the
  // owner for the credit write-back that settles it, once, and returns false. ThreadedProducer's
  // poster sleeps without a time limit only when this is true.
  bool quiescent();
  // Flushes, then sleeps until something happens that progress() acts on: credit the owner wrote
  // with an immediate (it answers this producer's credit request, or asks for doorbells), a
  // completion, the owner's disconnect, a device event on the QP, the control thread's alarm
  // (owner_lost, a refused heartbeat), or `timeout` (negative: none). Returns true at once when
  // something is there, false on timeout. Errors: as progress(); system_failure.
  Result<bool> wait(std::chrono::milliseconds timeout);
  // For an event loop: false when progress() has something now; true when fd() becomes readable
  // at the next event (any of wait()'s), then call progress(). Errors: as wait().
  Result<bool> arm();
  // An epoll descriptor (it nests in the application's epoll, poll or select); the same one for
  // the producer's life, across recover().
  int fd() const;
  // Flushes and waits until the consumer has released every record (errc::timed_out), asking
  // for credit and sleeping in wait() until it comes.
  Result<void> drain(std::chrono::nanoseconds timeout);

  // After the connection failed (a call returned completion_error): resumes the session in the
  // owner's next epoch (the owner revokes the old rkey) and connects again. Every record not yet
  // delivered goes out again from staging, unchanged; the owner reads from exactly the record
  // after its last delivery, so each record is delivered once, in order. Returns where it
  // resumed. Errors: control_failure, unknown_session (lease expired, owner restarted without
  // the session's durable record), stale_epoch, ring_changed, protocol_violation, and set-up's.
  Result<ResumePoint> recover();

  // Detaches: drain(), then ends the session (the owner frees the ring) and disconnects.
  Result<void> detach(std::chrono::nanoseconds timeout);

  // The sequence the next record sent will carry.
  std::uint64_t next_sequence() const;
  // Keep these to rejoin() after a restart; they change at every recover().
  SessionCredentials credentials() const;

  ProducerStats stats() const;
  // The stats in the Prometheus text format (rdmaring_producer_*).
  std::string metrics() const;
  std::string ledger_dump() const;
  wire::PublishMode mode() const;

 private:
  // Fault injection for tests, kept out of the installed headers (control/src).
  friend struct ProducerTestAccess;
  struct Connection;
  explicit Producer(std::unique_ptr<Connection> c) noexcept;
  static Producer open(const ProducerOptions& options, const SessionCredentials* rejoining);
  // Posts what the coalescing policy says is due at `now` (everything, with `force`).
  Result<void> post_due(bool force, Clock::time_point now);
  // progress() after a refused claim; true when it took credit that moved `released`, and the
  // claim is to be tried again: a caller that sleeps on would_block would otherwise sleep on
  // space it already has, since a sleep waits only for what comes after its own look.
  Result<bool> progress_for_space();
  // One idle round of send(payload, timeout) or drain(): spin, yield, or sleep in wait().
  Result<void> pause(IdleStrategy& idle, Clock::time_point deadline, Clock::time_point now);
  std::unique_ptr<Connection> c_;
};

}  // namespace rdmaring
