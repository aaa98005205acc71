// AsyncEvents: a device's asynchronous events (ibv_get_async_event): QP and SRQ errors that no
// completion reports (a QP gone fatal with nothing posted), port state changes, device fatal.
//
// Every event is acknowledged as soon as it is taken, because destroying the QP, CQ or SRQ it
// names waits until it is. The descriptor is made non-blocking, so a drain never waits: the
// owner's control thread calls drain() when its event loop says the descriptor is readable, a
// producer calls it every so many progress() calls.
//
// librdmacm opens one ibv_context per device per process and every cm id shares it, so a ring
// owner and a producer in one process (or two producers) read one descriptor, and each event
// would reach only whichever read first. All AsyncEvents of one context therefore share a hub:
// whoever reads takes every waiting event for all of them, and each sees each event once in
// its own drain(). pending() says that another reader has queued events for this one.
#pragma once

#include <infiniband/verbs.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "rdmaring/error.hpp"

namespace rdmaring::verbs {

class Context;

// Events counted by type, under ibv_event_type_str's names ("local catastrophic error", ...).
struct AsyncEventCounts {
  std::map<std::string, std::uint64_t> by_type;
  std::uint64_t total = 0;
};

// What an event is about, taken before the event is acknowledged (after that, the QP it names
// may be gone).
struct AsyncEvent {
  ibv_event_type type{};
  std::uint32_t qp_num = 0;  // 0 for device, port, CQ and SRQ events
  // After a QP event of these types the QP cannot carry work: its connection is dead.
  bool qp_dead() const noexcept;
};

class AsyncEvents {
 public:
  // `on_queued` (may be empty) runs when another reader queues an event for this one, on that
  // reader's thread with the hub locked: it may only wake this one's reader (Waiter::wake), whose
  // sleep on fd() would otherwise miss an event that someone else took off the descriptor.
  // Throws: SetupError verbs_failure when the descriptor cannot be made non-blocking.
  explicit AsyncEvents(const Context& context, std::function<void()> on_queued = {});
  ~AsyncEvents();
  AsyncEvents(const AsyncEvents&) = delete;
  AsyncEvents& operator=(const AsyncEvents&) = delete;

  int fd() const noexcept;
  // Takes and acknowledges every event waiting on the descriptor (queuing it for every
  // AsyncEvents of the context), then counts and reports (`on_event`, may be empty) each event
  // queued for this one; returns how many. Thread-safe against the context's other AsyncEvents.
  // Errors: verbs_failure with the errno of a failing read.
  Result<std::size_t> drain(const std::function<void(const AsyncEvent&)>& on_event = {});
  // Whether another AsyncEvents of the context queued events for this one since its last drain:
  // one atomic load, cheap enough for a poll loop.
  bool pending() const noexcept { return queue_->nonempty.load(std::memory_order_acquire); }

  const AsyncEventCounts& counts() const noexcept { return counts_; }

  struct Hub;
  struct Queue {
    std::vector<AsyncEvent> events;  // guarded by the hub's mutex
    std::atomic<bool> nonempty{false};
    std::function<void()> on_queued;
  };

 private:
  std::shared_ptr<Hub> hub_;
  std::unique_ptr<Queue> queue_;
  std::string device_;
  AsyncEventCounts counts_;
};

}  // namespace rdmaring::verbs
