#include "rdmaring/verbs/event_channel.hpp"

#include "rdmaring/verbs/error.hpp"

#include <fcntl.h>
#include <poll.h>

#include <cerrno>

namespace rdmaring::verbs {
namespace {

using std::chrono::milliseconds;

std::string describe_channel(const rdma_event_channel* channel) {
  return "event channel fd " + std::to_string(channel->fd);
}

}  // namespace

Result<CmEvent> next_event(rdma_event_channel* channel, milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    rdma_cm_event* event = nullptr;
    if (rdma_get_cm_event(channel, &event) == 0) return CmEvent(event);
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      return verbs_error("rdma_get_cm_event", describe_channel(channel), errno);
    }
    // Rounded up so a wait never spins on a sub-millisecond remainder.
    const auto left = std::chrono::ceil<milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left <= milliseconds::zero()) {
      return make_error(errc::timed_out, "rdma_get_cm_event(" + describe_channel(channel) +
                                             "): no event within " +
                                             std::to_string(timeout.count()) + " ms");
    }
    pollfd pfd{channel->fd, POLLIN, 0};
    if (::poll(&pfd, 1, static_cast<int>(left.count())) < 0 && errno != EINTR) {
      return verbs_error("poll", describe_channel(channel), errno);
    }
  }
}

std::span<const std::byte> CmEvent::private_data() const noexcept {
  const rdma_conn_param& conn = event_->param.conn;
  if (conn.private_data == nullptr) return {};
  return {static_cast<const std::byte*>(conn.private_data), conn.private_data_len};
}

std::vector<std::byte> CmEvent::copy_private_data() const {
  const auto data = private_data();
  return {data.begin(), data.end()};
}

void CmEvent::Ack::operator()(rdma_cm_event* event) const noexcept {
  // Only fails for a null event; there is nothing to undo.
  (void)rdma_ack_cm_event(event);
}

EventChannel::EventChannel() : channel_(rdma_create_event_channel()) {
  if (!channel_) throw_verbs("rdma_create_event_channel", "event channel", errno);
  const int flags = fcntl(channel_->fd, F_GETFL);
  if (flags < 0 || fcntl(channel_->fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    throw_verbs("fcntl(O_NONBLOCK)", describe_channel(channel_.get()), errno);
  }
}

Result<CmEvent> EventChannel::next(milliseconds timeout) { return next_event(channel_.get(), timeout); }

void EventChannel::Destroy::operator()(rdma_event_channel* channel) const noexcept {
  rdma_destroy_event_channel(channel);
}

CmEvent expect_event(rdma_cm_id* id, rdma_cm_event_type expected, const char* call,
                     const std::string& object, milliseconds timeout) {
  Result<CmEvent> next = next_event(id->channel, timeout);
  if (!next) {
    Error e = std::move(next).error();
    e.context = std::string(call) + "(" + object + ") waiting for " + rdma_event_str(expected) +
                ": " + e.context;
    throw SetupError(std::move(e));
  }
  CmEvent event = std::move(next).value();
  const bool for_this_id = event.id() == id || event.listen_id() == id;
  if (event.type() != expected || !for_this_id) {
    throw SetupError(unexpected_event_error(call, object, expected, event.type(), event.status(),
                                            for_this_id));
  }
  return event;
}

Error unexpected_event_error(const char* call, const std::string& object,
                             rdma_cm_event_type expected, rdma_cm_event_type got, int status,
                             bool for_this_id) {
  std::string context = std::string(call) + "(" + object + "): expected " +
                        rdma_event_str(expected) + ", got " + rdma_event_str(got) + " (status " +
                        std::to_string(status) + ")";
  if (!for_this_id) context += " for another cm id";
  return make_error(errc::verbs_failure, std::move(context), status < 0 ? -status : 0);
}

}  // namespace rdmaring::verbs
