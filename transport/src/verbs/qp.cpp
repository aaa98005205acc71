#include "rdmaring/verbs/qp.hpp"

#include "rdmaring/verbs/cm_id.hpp"
#include "rdmaring/verbs/cq.hpp"
#include "rdmaring/verbs/error.hpp"
#include "rdmaring/verbs/pd.hpp"
#include "rdmaring/verbs/srq.hpp"

#include <rdma/rdma_cma.h>

#include <cerrno>

namespace rdmaring::verbs {

QueuePair::QueuePair(CmId& id, const ProtectionDomain& pd, const CompletionQueue& send_cq,
                     const CompletionQueue& recv_cq, const QueuePairCaps& caps,
                     const SharedReceiveQueue* srq) {
  ibv_qp_init_attr attr{};
  attr.qp_type = IBV_QPT_RC;
  attr.send_cq = send_cq.get();
  attr.recv_cq = recv_cq.get();
  attr.srq = srq != nullptr ? srq->get() : nullptr;
  attr.cap.max_send_wr = caps.max_send_wr;
  attr.cap.max_send_sge = caps.max_send_sge;
  attr.cap.max_recv_wr = srq != nullptr ? 0 : caps.max_recv_wr;
  attr.cap.max_recv_sge = srq != nullptr ? 0 : caps.max_recv_sge;
  attr.cap.max_inline_data = caps.max_inline_data;
  if (rdma_create_qp(id.get(), pd.get(), &attr) != 0) {
    throw_verbs("rdma_create_qp", id.describe(), errno);
  }
  id_.reset(id.get());
  // rdma_create_qp writes the granted capabilities back into attr.cap.
  max_inline_data_ = attr.cap.max_inline_data;
  what_ = describe_qp(qp_num(), device_name(id.get()->verbs));
}

Result<void> QueuePair::post_send(ibv_send_wr& first) {
  ibv_send_wr* bad = nullptr;
  if (int err = ibv_post_send(get(), &first, &bad); err != 0) {
    return post_error("ibv_post_send", what_, err, &first, static_cast<const ibv_send_wr*>(bad));
  }
  return boost::outcome_v2::success();
}

Result<void> QueuePair::post_recv(ibv_recv_wr& first) {
  ibv_recv_wr* bad = nullptr;
  if (int err = ibv_post_recv(get(), &first, &bad); err != 0) {
    return post_error("ibv_post_recv", what_, err, &first, static_cast<const ibv_recv_wr*>(bad));
  }
  return boost::outcome_v2::success();
}

Result<void> QueuePair::force_error() {
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_ERR;
  if (int err = ibv_modify_qp(get(), &attr, IBV_QP_STATE); err != 0) {
    return verbs_error("ibv_modify_qp", what_ + ", to IBV_QPS_ERR", err);
  }
  return boost::outcome_v2::success();
}

ibv_qp* QueuePair::get() const noexcept { return id_->qp; }

std::uint32_t QueuePair::qp_num() const noexcept { return id_->qp->qp_num; }

void QueuePair::Destroy::operator()(rdma_cm_id* id) const noexcept { rdma_destroy_qp(id); }

}  // namespace rdmaring::verbs
