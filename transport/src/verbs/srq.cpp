#include "rdmaring/verbs/srq.hpp"

#include "rdmaring/verbs/context.hpp"
#include "rdmaring/verbs/error.hpp"
#include "rdmaring/verbs/pd.hpp"

#include <cerrno>

namespace rdmaring::verbs {
namespace {

ibv_srq* create_srq(const ProtectionDomain& pd, std::uint32_t max_wr, std::uint32_t max_sge) {
  ibv_srq_init_attr attr{};
  attr.attr.max_wr = max_wr;
  attr.attr.max_sge = max_sge;
  return ibv_create_srq(pd.get(), &attr);
}

}  // namespace

SharedReceiveQueue::SharedReceiveQueue(const ProtectionDomain& pd, std::uint32_t max_wr,
                                       std::uint32_t max_sge)
    : what_(describe_object("srq of " + std::to_string(max_wr) + " WR",
                            device_name(pd.get()->context))),
      srq_(create_srq(pd, max_wr, max_sge)) {
  if (!srq_) throw_verbs("ibv_create_srq", what_, errno);
}

Result<void> SharedReceiveQueue::post_recv(ibv_recv_wr& first) {
  ibv_recv_wr* bad = nullptr;
  if (int err = ibv_post_srq_recv(srq_.get(), &first, &bad); err != 0) {
    return post_error("ibv_post_srq_recv", what_, err, &first, static_cast<const ibv_recv_wr*>(bad));
  }
  return boost::outcome_v2::success();
}

void SharedReceiveQueue::Destroy::operator()(ibv_srq* srq) const noexcept {
  // EBUSY means a QP still uses the SRQ: a destruction-order bug a destructor cannot repair.
  (void)ibv_destroy_srq(srq);
}

}  // namespace rdmaring::verbs
