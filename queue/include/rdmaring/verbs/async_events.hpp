// AsyncEvents: a device's asynchronous events (ibv_get_async_event): QP and SRQ errors that no
// completion reports (a QP gone fatal with nothing posted), port state changes, device fatal.
//
// Every event is acknowledged as soon as it is taken, because destroying the QP, CQ or SRQ it
// names waits until it is. The descriptor is made non-blocking, so a drain never waits: the
// owner's control thread calls drain() when its event loop says the descriptor is readable, a
// producer calls it every so many progress() calls.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>

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
  // Throws: SetupError verbs_failure when the descriptor cannot be made non-blocking.
  explicit AsyncEvents(const Context& context);

  int fd() const noexcept;
  // Takes, counts, acknowledges and reports (`on_event`, may be empty) every waiting event;
  // returns how many. Errors: verbs_failure with the errno of a failing read.
  Result<std::size_t> drain(const std::function<void(const AsyncEvent&)>& on_event = {});

  const AsyncEventCounts& counts() const noexcept { return counts_; }

 private:
  ibv_context* ctx_;
  std::string device_;
  AsyncEventCounts counts_;
};

}  // namespace rdmaring::verbs
