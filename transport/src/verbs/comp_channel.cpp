#include "rdmaring/verbs/comp_channel.hpp"

#include <fcntl.h>

#include <cerrno>

#include "rdmaring/verbs/context.hpp"
#include "rdmaring/verbs/error.hpp"

namespace rdmaring::verbs {

CompletionChannel::CompletionChannel(const Context& context)
    : what_(describe_object("completion channel", context.name())),
      channel_(ibv_create_comp_channel(context.get())) {
  if (!channel_) throw_verbs("ibv_create_comp_channel", what_, errno);
  const int flags = fcntl(channel_->fd, F_GETFL);
  if (flags < 0 || fcntl(channel_->fd, F_SETFL, flags | O_NONBLOCK) < 0) throw_verbs("fcntl(O_NONBLOCK)", what_, errno);
}

Result<std::size_t> CompletionChannel::take_events() {
  std::size_t n = 0;
  for (;;) {
    ibv_cq* cq = nullptr;
    void* cq_context = nullptr;
    if (ibv_get_cq_event(channel_.get(), &cq, &cq_context) != 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) return n;
      return verbs_error("ibv_get_cq_event", what_, errno);
    }
    ibv_ack_cq_events(cq, 1);
    ++n;
  }
}

void CompletionChannel::Destroy::operator()(ibv_comp_channel* c) const noexcept {
  // EBUSY means a CQ still uses the channel: the caller's destruction order is wrong.
  (void)ibv_destroy_comp_channel(c);
}

}  // namespace rdmaring::verbs
