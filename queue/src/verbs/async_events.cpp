#include "rdmaring/verbs/async_events.hpp"

#include <fcntl.h>

#include <cerrno>

#include "rdmaring/verbs/context.hpp"
#include "rdmaring/verbs/error.hpp"

namespace rdmaring::verbs {

AsyncEvents::AsyncEvents(const Context& context) : ctx_(context.get()), device_(context.name()) {
  const int flags = fcntl(ctx_->async_fd, F_GETFL);
  if (flags < 0 || fcntl(ctx_->async_fd, F_SETFL, flags | O_NONBLOCK) < 0)
    throw_verbs("fcntl(O_NONBLOCK)", describe_object("async event fd", device_), errno);
}

int AsyncEvents::fd() const noexcept { return ctx_->async_fd; }

namespace {

std::uint32_t event_qp_num(const ibv_async_event& event) noexcept {
  switch (event.event_type) {
    case IBV_EVENT_QP_FATAL:
    case IBV_EVENT_QP_REQ_ERR:
    case IBV_EVENT_QP_ACCESS_ERR:
    case IBV_EVENT_COMM_EST:
    case IBV_EVENT_SQ_DRAINED:
    case IBV_EVENT_PATH_MIG:
    case IBV_EVENT_PATH_MIG_ERR:
    case IBV_EVENT_QP_LAST_WQE_REACHED:
      return event.element.qp != nullptr ? event.element.qp->qp_num : 0;
    default:
      return 0;
  }
}

}  // namespace

bool AsyncEvent::qp_dead() const noexcept {
  return type == IBV_EVENT_QP_FATAL || type == IBV_EVENT_QP_REQ_ERR || type == IBV_EVENT_QP_ACCESS_ERR;
}

Result<std::size_t> AsyncEvents::drain(const std::function<void(const AsyncEvent&)>& on_event) {
  std::size_t n = 0;
  for (;;) {
    ibv_async_event event{};
    if (ibv_get_async_event(ctx_, &event) != 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) return n;
      return verbs_error("ibv_get_async_event", describe_object("context", device_), errno);
    }
    ++n;
    ++counts_.total;
    ++counts_.by_type[ibv_event_type_str(event.event_type)];
    const AsyncEvent e{event.event_type, event_qp_num(event)};
    // Reported after the ack: the handler may destroy the QP, which waits for its events' acks.
    ibv_ack_async_event(&event);
    if (on_event) on_event(e);
  }
}

}  // namespace rdmaring::verbs
