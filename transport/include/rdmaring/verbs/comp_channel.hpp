// CompletionChannel: the descriptor through which armed completion queues say "a completion
// arrived", so a poller can sleep in poll(2)/epoll instead of spinning.
//
// The descriptor is non-blocking: take_events() never waits, it acknowledges what is there.
// Every event is acknowledged as it is taken, because destroying its CQ waits until it is.
#pragma once

#include <infiniband/verbs.h>

#include <cstddef>
#include <memory>
#include <string>

#include "rdmaring/error.hpp"

namespace rdmaring::verbs {

class Context;

class CompletionChannel {
 public:
  // Assumes: `context` outlives the channel, and every CQ bound to it is destroyed before it.
  // Throws: SetupError verbs_failure with the errno of ibv_create_comp_channel or fcntl.
  explicit CompletionChannel(const Context& context);

  int fd() const noexcept { return channel_->fd; }
  ibv_comp_channel* get() const noexcept { return channel_.get(); }
  // Takes and acknowledges every event waiting; returns how many. An armed CQ reports once per
  // arming, so the caller arms again before it next sleeps. Errors: verbs_failure with the errno
  // of ibv_get_cq_event other than EAGAIN.
  Result<std::size_t> take_events();

 private:
  struct Destroy {
    void operator()(ibv_comp_channel* c) const noexcept;
  };
  std::string what_;
  std::unique_ptr<ibv_comp_channel, Destroy> channel_;
};

}  // namespace rdmaring::verbs
