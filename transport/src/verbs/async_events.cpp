#include "rdmaring/verbs/async_events.hpp"

#include <fcntl.h>

#include <algorithm>
#include <cerrno>
#include <map>
#include <mutex>

#include "rdmaring/verbs/context.hpp"
#include "rdmaring/verbs/error.hpp"

namespace rdmaring::verbs {

struct AsyncEvents::Hub {
  ibv_context* ctx = nullptr;
  std::mutex m;
  std::vector<Queue*> queues;  // every live AsyncEvents of the context
};

namespace {

// One hub per context, alive while an AsyncEvents of it is.
std::shared_ptr<AsyncEvents::Hub> hub_of(ibv_context* ctx, std::string_view device) {
  static std::mutex registry_m;
  static std::map<ibv_context*, std::weak_ptr<AsyncEvents::Hub>> registry;
  std::lock_guard lock(registry_m);
  if (auto hub = registry[ctx].lock()) return hub;
  const int flags = fcntl(ctx->async_fd, F_GETFL);
  if (flags < 0 || fcntl(ctx->async_fd, F_SETFL, flags | O_NONBLOCK) < 0)
    throw_verbs("fcntl(O_NONBLOCK)", describe_object("async event fd", device), errno);
  auto hub = std::make_shared<AsyncEvents::Hub>();
  hub->ctx = ctx;
  registry[ctx] = hub;
  return hub;
}

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

AsyncEvents::AsyncEvents(const Context& context, std::function<void()> on_queued)
    : hub_(hub_of(context.get(), context.name())), queue_(std::make_unique<Queue>()), device_(context.name()) {
  queue_->on_queued = std::move(on_queued);
  std::lock_guard lock(hub_->m);
  hub_->queues.push_back(queue_.get());
}

AsyncEvents::~AsyncEvents() {
  std::lock_guard lock(hub_->m);
  hub_->queues.erase(std::find(hub_->queues.begin(), hub_->queues.end(), queue_.get()));
}

int AsyncEvents::fd() const noexcept { return hub_->ctx->async_fd; }

bool AsyncEvent::qp_dead() const noexcept {
  return type == IBV_EVENT_QP_FATAL || type == IBV_EVENT_QP_REQ_ERR || type == IBV_EVENT_QP_ACCESS_ERR;
}

Result<std::size_t> AsyncEvents::drain(const std::function<void(const AsyncEvent&)>& on_event) {
  std::vector<AsyncEvent> mine;
  int read_errno = 0;
  {
    std::lock_guard lock(hub_->m);
    for (;;) {
      ibv_async_event event{};
      if (ibv_get_async_event(hub_->ctx, &event) != 0) {
        if (errno != EAGAIN && errno != EWOULDBLOCK) read_errno = errno;
        break;
      }
      const AsyncEvent e{event.event_type, event_qp_num(event)};
      // Acknowledged before anyone handles it: a handler may destroy the QP, which waits for
      // its events' acks.
      ibv_ack_async_event(&event);
      for (Queue* q : hub_->queues) {
        q->events.push_back(e);
        q->nonempty.store(true, std::memory_order_release);
        if (q != queue_.get() && q->on_queued) q->on_queued();
      }
    }
    mine.swap(queue_->events);
    queue_->nonempty.store(false, std::memory_order_release);
  }
  for (const AsyncEvent& e : mine) {
    ++counts_.total;
    ++counts_.by_type[ibv_event_type_str(e.type)];
    if (on_event) on_event(e);
  }
  if (read_errno != 0) return verbs_error("ibv_get_async_event", describe_object("context", device_), read_errno);
  return mine.size();
}

}  // namespace rdmaring::verbs
