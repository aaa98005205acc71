// The producer's data plane on verbs: the device rdma_cm routes the owner's address to, the PD,
// CQ (with a completion channel, to sleep on) and async events, the staging mirror of the ring
// and the credit record (each registered once), and the RC QP of the current epoch, with
// receives posted for the credit records the owner writes with an immediate. It executes what
// ProducerCore decides: posts its batches, feeds it completions, async events and the credit
// record.
//
// What can end a producer's sleep is in the Waiter the producer gives it: the completion
// channel, the current link's rdma_cm event channel (the owner's disconnect) and the device's
// asynchronous events (a QP gone fatal with nothing posted).
//
// One thread at a time (the Producer's caller); no lock. What the control channel grants (the
// epoch, its connect proof, the ring's keys) comes in as an Epoch: this layer never speaks
// Cap'n Proto.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "rdmaring/error.hpp"
#include "rdmaring/post.hpp"
#include "rdmaring/producer_core.hpp"
#include "rdmaring/registration_footprint.hpp"
#include "rdmaring/session_proof.hpp"
#include "rdmaring/verbs/async_events.hpp"
#include "rdmaring/verbs/comp_channel.hpp"
#include "rdmaring/verbs/cq.hpp"
#include "rdmaring/verbs/mr.hpp"
#include "rdmaring/verbs/pd.hpp"
#include "rdmaring/waiter.hpp"

namespace rdmaring {

struct ProducerDataPlaneOptions {
  std::string address;         // the owner's address: rdma_cm resolves the device from it
  std::string source_address;  // empty: the route's choice
  std::chrono::milliseconds connect_timeout = std::chrono::seconds(10);
  std::uint32_t sq_depth = 0;  // ProducerConfig::sq_depth
};

// One epoch's connection as the owner granted it (sessions.md §2.4, wire-formats.md §6).
struct ProducerEpoch {
  std::uint64_t session = 0;
  std::uint64_t epoch = 0;
  Proof connect_proof{};
  std::uint16_t data_port = 0;
  RingKeys keys;
};

struct ProducerDataPlaneCounters {
  std::uint64_t post_send_calls = 0;
  std::uint64_t completions = 0;        // signaled send completions polled
  std::uint64_t stale_completions = 0;  // completions of a replaced connection, ignored
  std::uint64_t credit_notifications = 0;  // credit records that came with an immediate
  std::uint64_t sleeps = 0;                // waits that armed the CQ and slept
  std::map<std::string, std::uint64_t> completion_errors;  // by ibv_wc_status_str
};

class ProducerDataPlane {
 public:
  // Opens the device, registers a staging mirror of `ring_bytes` and the credit record, and
  // connects the QP for `first`; puts what ends a sleep into `waiter`, which must outlive this.
  // Throws SetupError (no_device, verbs_failure, bad_config when the device grants too little
  // inline data, protocol_violation for a foreign accept, system_failure of the waiter's epoll).
  ProducerDataPlane(const ProducerDataPlaneOptions& options, std::uint64_t ring_bytes, const ProducerEpoch& first,
                    const Waiter& waiter);
  ProducerDataPlane(const ProducerDataPlane&) = delete;
  ProducerDataPlane& operator=(const ProducerDataPlane&) = delete;
  ~ProducerDataPlane();

  // The ring's mirror, where the core builds records; it lives as long as this.
  std::span<std::byte> staging() noexcept;

  // The next epoch's connection replaces the current one (whose QP goes first: its rkeys were
  // revoked anyway). Errors: the connect's, as SetupError's error.
  Result<void> reconnect(const ProducerEpoch& next);
  // Posts every batch the core has due (all of them when `force`); when the send queue is full,
  // polls once for the completions that free it and posts again. A refused post breaks the
  // connection in the core and is returned.
  Result<void> post_due(ProducerCore& core, bool force, Clock::time_point now);
  // Completions, async events (every so many calls) and the credit record, into the core.
  // Returns how many events it took (completions, a changed credit record). Errors:
  // verbs_failure of the CQ or the async event queue.
  Result<std::size_t> poll(ProducerCore& core);
  // Before sleeping: looks at the waiter's descriptors and takes the link's rdma_cm and async
  // events that are ready, polls, arms the CQ, polls again.
  // false: an event was there (act on the core's state instead of sleeping); true: the waiter
  // becomes readable at the next completion (a signaled send's, or a receive: credit the owner
  // wrote with an immediate, because it answers a request or sets the doorbell flag), rdma_cm
  // event or async event. A repair doorbell that waits for send-queue slots does not keep it
  // awake: the completion that frees them ends the sleep. Errors: poll()'s, verbs_failure of the
  // arming.
  Result<bool> arm(ProducerCore& core);
  // The link's rdma_cm and async events that the waiter's last wait() or look() found ready (and
  // async events another reader of the device context queued for this one), into the core:
  // after a sleep, whatever ended it is seen by the next progress(), and no descriptor with
  // nothing on it is read (a wake-up costs the system calls raw verbs' does, and one look).
  // Errors: verbs_failure.
  Result<void> take_ready(ProducerCore& core);
  // The QPs go (detach: the owner already tore its side down).
  void disconnect() noexcept;

  const std::string& device() const noexcept { return device_; }
  const ProducerDataPlaneCounters& counters() const noexcept { return counters_; }
  RegistrationFootprint registered() const;
  std::map<std::string, std::uint64_t> async_event_counts() const;

  // Tests only (through ProducerTestAccess): the current QP to the error state, as a dead link.
  Result<void> force_error();

 private:
  struct Link;
  void connect(Link& l, const ProducerEpoch& e);
  Link& current() noexcept;
  Result<void> post_receives(std::uint32_t n);
  Result<void> check_link(ProducerCore& core);
  Result<void> take_cm_event(ProducerCore& core);
  Result<void> take_async_events(ProducerCore& core, std::uint32_t qp_num);
  void read_credit(ProducerCore& core) const;

  ProducerDataPlaneOptions options_;
  const Waiter* waiter_;
  std::unique_ptr<Link> first_;  // its rdma_cm id holds the device context of the PD open
  std::string device_;
  std::optional<verbs::ProtectionDomain> pd_;
  std::optional<verbs::AsyncEvents> async_;
  std::optional<Watched> async_watched_;
  std::optional<verbs::CompletionChannel> cq_channel_;  // before the CQ: it outlives it
  std::optional<Watched> cq_watched_;
  std::optional<verbs::CompletionQueue> cq_;
  std::array<ibv_recv_wr, 16> recv_chain_{};  // no scatter list: the credit is in the WRITE's bytes
  std::uint32_t recv_owed_ = 0;               // receives consumed, not yet posted again
  bool armed_ = false;
  verbs::AlignedBuffer credit_buf_{4096};
  std::optional<verbs::MemoryRegion> credit_mr_;
  std::optional<verbs::AlignedBuffer> staging_;
  std::optional<verbs::MemoryRegion> staging_mr_;
  std::unique_ptr<Link> link_;  // the current connection, when it is not first_
  WriteTarget target_;
  std::uint32_t poll_calls_ = 0;
  ProducerDataPlaneCounters counters_;
};

}  // namespace rdmaring
