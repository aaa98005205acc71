// SharedReceiveQueue: one pool of receive buffers for many queue pairs, so receive memory grows
// with the traffic rather than with the number of connections.
#pragma once

#include "rdmaring/error.hpp"

#include <infiniband/verbs.h>

#include <cstdint>
#include <memory>
#include <string>

namespace rdmaring::verbs {

class ProtectionDomain;

class SharedReceiveQueue {
 public:
  // Assumes: `pd` outlives the SRQ; max_wr <= DeviceCaps::max_srq_wr.
  // Throws: SetupError errc::verbs_failure with the errno of ibv_create_srq.
  SharedReceiveQueue(const ProtectionDomain& pd, std::uint32_t max_wr, std::uint32_t max_sge = 1);

  // Posts the list of receive WRs starting at `first`.
  // Assumes: the buffers the WRs name are registered and stay so until their completions.
  // Returns: errc::verbs_failure with the errno of ibv_post_srq_recv, naming the first WR not
  // posted (its position and wr_id); the WRs before it were posted.
  Result<void> post_recv(ibv_recv_wr& first);

  ibv_srq* get() const noexcept { return srq_.get(); }
  // "srq of 128 WR on rxe0", for error contexts.
  const std::string& describe() const noexcept { return what_; }

 private:
  struct Destroy {
    void operator()(ibv_srq* srq) const noexcept;
  };
  std::string what_;
  std::unique_ptr<ibv_srq, Destroy> srq_;
};

}  // namespace rdmaring::verbs
