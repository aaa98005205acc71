// EventChannel and CmEvent: how rdma_cm reports progress on connections.
//
// The channel's descriptor is made non-blocking and waited on with poll(), so every wait has a
// deadline: a peer that never answers costs a timeout, not a hung process. A CmEvent acks its
// event when it goes away, because an unacked event blocks rdma_destroy_id forever.
#pragma once

#include "rdmaring/error.hpp"

#include <rdma/rdma_cma.h>

#include <chrono>
#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace rdmaring::verbs {

class CmEvent {
 public:
  // Takes over `event` (from rdma_get_cm_event) and acks it on destruction.
  // Assumes: `event` is non-null and not acked elsewhere.
  explicit CmEvent(rdma_cm_event* event) noexcept : event_(event) {}

  rdma_cm_event_type type() const noexcept { return event_->event; }
  // "RDMA_CM_EVENT_ESTABLISHED" (rdma_event_str).
  const char* name() const noexcept { return rdma_event_str(event_->event); }
  // The id the event is about; for CONNECT_REQUEST, the new id of the incoming connection.
  rdma_cm_id* id() const noexcept { return event_->id; }
  // For CONNECT_REQUEST, the listening id; otherwise null.
  rdma_cm_id* listen_id() const noexcept { return event_->listen_id; }
  // 0, a negative errno, or (REJECTED) the transport's reject reason.
  int status() const noexcept { return event_->status; }
  // The peer's private data of CONNECT_REQUEST / ESTABLISHED / REJECTED. Valid only while this
  // event lives: acking frees it. Over IB/RoCE the transport pads it, so it can be longer than
  // what the peer sent.
  std::span<const std::byte> private_data() const noexcept;
  // A copy that outlives the event.
  std::vector<std::byte> copy_private_data() const;

 private:
  struct Ack {
    void operator()(rdma_cm_event* event) const noexcept;
  };
  std::unique_ptr<rdma_cm_event, Ack> event_;
};

class EventChannel {
 public:
  // Throws: SetupError errc::verbs_failure with the errno of rdma_create_event_channel or of
  // making its descriptor non-blocking.
  EventChannel();

  // The next event, waiting at most `timeout`.
  // Assumes: no other thread takes events from this channel at the same time.
  // Returns: errc::timed_out when none arrives in time; errc::verbs_failure with the errno of
  // rdma_get_cm_event or poll.
  Result<CmEvent> next(std::chrono::milliseconds timeout);

  // Assumes: every id created on the channel is destroyed before the channel.
  rdma_event_channel* get() const noexcept { return channel_.get(); }

 private:
  struct Destroy {
    void operator()(rdma_event_channel* channel) const noexcept;
  };
  std::unique_ptr<rdma_event_channel, Destroy> channel_;
};

// The next event on `channel` within `timeout` (0: only one already waiting).
// Assumes: `channel` is non-blocking (it belongs to an EventChannel).
// Returns: errc::timed_out; verbs_failure with the errno of rdma_get_cm_event or poll.
Result<CmEvent> next_event(rdma_event_channel* channel, std::chrono::milliseconds timeout);

// Set-up step: waits for `expected` about `id` (or, for CONNECT_REQUEST, about the listening
// `id`) and returns it.
// Assumes: `id` was created on an EventChannel (non-blocking), and nobody else is taking its
// events; `call` and `object` name the step waited for, as in "rdma_connect(cm id ...)".
// Throws: SetupError errc::timed_out when nothing arrives within `timeout`; errc::verbs_failure
// for any other event or an event for another id (unexpected_event_error), or when the wait
// itself fails. The unexpected event is acked before the throw.
CmEvent expect_event(rdma_cm_id* id, rdma_cm_event_type expected, const char* call,
                     const std::string& object, std::chrono::milliseconds timeout);

// "CALL(OBJECT): expected RDMA_CM_EVENT_X, got RDMA_CM_EVENT_Y (status S)", errc::verbs_failure,
// sys_errno = -status when status is a negative errno. `for_this_id` false adds that the event
// was about another id.
Error unexpected_event_error(const char* call, const std::string& object,
                             rdma_cm_event_type expected, rdma_cm_event_type got, int status,
                             bool for_this_id);

}  // namespace rdmaring::verbs
