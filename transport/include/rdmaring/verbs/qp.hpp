// QueuePair: an RC queue pair created on a CmId, so rdma_cm drives its state transitions
// (INIT on creation, RTR/RTS on connect/accept, ERR on disconnect).
//
// Work requests are posted without sq_sig_all: the caller decides which sends are signalled
// (IBV_SEND_SIGNALED), so selective signalling is possible.
#pragma once

#include "rdmaring/error.hpp"

#include <infiniband/verbs.h>

#include <cstdint>
#include <memory>
#include <string>

struct rdma_cm_id;

namespace rdmaring::verbs {

class CmId;
class CompletionQueue;
class ProtectionDomain;
class SharedReceiveQueue;

// Queue sizes asked for; the device may grant more (see QueuePair::max_inline_data()).
struct QueuePairCaps {
  std::uint32_t max_send_wr = 64;
  std::uint32_t max_recv_wr = 64;  // ignored with an SRQ
  std::uint32_t max_send_sge = 1;
  std::uint32_t max_recv_sge = 1;  // ignored with an SRQ
  std::uint32_t max_inline_data = 0;
};

class QueuePair {
 public:
  // Creates the RC QP of `id` (rdma_create_qp), receiving from `srq` when it is non-null.
  // Assumes: `id` is resolved or came from a connect request, its device is the one of `pd` and
  // the CQs; id, pd, CQs and srq all outlive the QP.
  // Throws: SetupError errc::verbs_failure with the errno of rdma_create_qp (EINVAL for caps
  // beyond DeviceCaps, or a PD of another device).
  QueuePair(CmId& id, const ProtectionDomain& pd, const CompletionQueue& send_cq,
            const CompletionQueue& recv_cq, const QueuePairCaps& caps,
            const SharedReceiveQueue* srq = nullptr);

  // Posts the list of send WRs starting at `first`.
  // Assumes: the local buffers are registered, the remote ones named by valid rkeys, and
  // inline sends fit max_inline_data().
  // Returns: errc::verbs_failure with the errno of ibv_post_send, naming the first WR not posted
  // (position and wr_id); the WRs before it were posted and will complete.
  Result<void> post_send(ibv_send_wr& first);

  // As post_send, for receive WRs (ibv_post_recv). Fails (EINVAL) on a QP with an SRQ.
  Result<void> post_recv(ibv_recv_wr& first);

  // Moves the QP to the error state: outstanding WRs flush (IBV_WC_WR_FLUSH_ERR) and the peer's
  // next access fails. Fault injection for tests; the QP is unusable afterwards.
  // Returns: errc::verbs_failure with the errno of ibv_modify_qp.
  Result<void> force_error();

  ibv_qp* get() const noexcept;
  std::uint32_t qp_num() const noexcept;
  // The inline size the device granted, which may exceed the one asked for.
  std::uint32_t max_inline_data() const noexcept { return max_inline_data_; }
  // "qp 0x1a on rxe0", for error contexts.
  const std::string& describe() const noexcept { return what_; }

 private:
  // rdma_destroy_qp takes the cm id, which owns the QP pointer.
  struct Destroy {
    void operator()(rdma_cm_id* id) const noexcept;
  };
  std::unique_ptr<rdma_cm_id, Destroy> id_;
  std::uint32_t max_inline_data_ = 0;
  std::string what_;
};

}  // namespace rdmaring::verbs
