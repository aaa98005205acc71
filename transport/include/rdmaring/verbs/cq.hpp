// CompletionQueue: where the device reports finished work requests.
//
// Busy-polled only, with no completion channel: the queue's progress loop polls anyway, and a
// channel would add a file descriptor and an arm/ack protocol nothing here uses.
#pragma once

#include "rdmaring/error.hpp"

#include <infiniband/verbs.h>

#include <cstddef>
#include <memory>
#include <span>
#include <string>

namespace rdmaring::verbs {

class Context;

class CompletionQueue {
 public:
  // Creates a CQ with room for at least `entries` completions.
  // Assumes: `context` outlives the CQ; 0 < entries <= DeviceCaps::max_cqe.
  // Throws: SetupError errc::verbs_failure with the errno of ibv_create_cq.
  CompletionQueue(const Context& context, int entries);

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
