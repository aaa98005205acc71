// CompletionQueue: where the device reports finished work requests. Polled; bound to a
// completion channel, it can also be armed, so that a poller with nothing to do can sleep until
// the next completion.
#pragma once

#include "rdmaring/error.hpp"

#include <infiniband/verbs.h>

#include <cstddef>
#include <memory>
#include <span>
#include <string>

namespace rdmaring::verbs {

class CompletionChannel;
class Context;

class CompletionQueue {
 public:
  // Creates a CQ with room for at least `entries` completions, bound to `channel` if given.
  // Assumes: `context` and `channel` outlive the CQ; 0 < entries <= DeviceCaps::max_cqe.
  // Throws: SetupError errc::verbs_failure with the errno of ibv_create_cq.
  CompletionQueue(const Context& context, int entries, const CompletionChannel* channel = nullptr);

  // The next completion (one that arrives after this call) raises an event on the channel.
  // Completions already queued raise none: poll once more after arming, before sleeping.
  // Assumes: bound to a channel. Returns: verbs_failure with the errno of ibv_req_notify_cq.
  Result<void> arm();

  // Moves up to out.size() completions into `out` and returns how many; 0 when none is ready.
  // Assumes: one poller at a time (verbs serialises, but completions would be split arbitrarily).
  // Returns: errc::verbs_failure when ibv_poll_cq fails (it gives no errno: the context carries
  // the value it returned).
  Result<std::size_t> poll(std::span<ibv_wc> out);

  ibv_cq* get() const noexcept { return cq_.get(); }
  // The capacity granted, which may exceed the one asked for.
  int capacity() const noexcept { return cq_->cqe; }
  // "cq of 256 entries on rxe0", for error contexts.
  const std::string& describe() const noexcept { return what_; }

 private:
  struct Destroy {
    void operator()(ibv_cq* cq) const noexcept;
  };
  std::string what_;
  std::unique_ptr<ibv_cq, Destroy> cq_;
};

}  // namespace rdmaring::verbs
