#include "rdmaring/verbs/cq.hpp"

#include "rdmaring/verbs/comp_channel.hpp"
#include "rdmaring/verbs/context.hpp"
#include "rdmaring/verbs/error.hpp"

#include <algorithm>
#include <cerrno>
#include <climits>

namespace rdmaring::verbs {

CompletionQueue::CompletionQueue(const Context& context, int entries, const CompletionChannel* channel)
    : what_(describe_object("cq of " + std::to_string(entries) + " entries", context.name())),
      cq_(ibv_create_cq(context.get(), entries, nullptr, channel ? channel->get() : nullptr, 0)) {
  if (!cq_) throw_verbs("ibv_create_cq", what_, errno);
}

Result<void> CompletionQueue::arm() {
  // ibv_req_notify_cq returns the errno value itself.
  if (const int rc = ibv_req_notify_cq(cq_.get(), 0); rc != 0) return verbs_error("ibv_req_notify_cq", what_, rc);
  return success();
}

Result<std::size_t> CompletionQueue::poll(std::span<ibv_wc> out) {
  const int n = ibv_poll_cq(cq_.get(), static_cast<int>(std::min<std::size_t>(out.size(), INT_MAX)),
                            out.data());
  if (n >= 0) return static_cast<std::size_t>(n);
  Error e = verbs_error("ibv_poll_cq", what_, 0);
  e.context += " returned " + std::to_string(n);
  return e;
}

void CompletionQueue::Destroy::operator()(ibv_cq* cq) const noexcept {
  // EBUSY means a QP still uses the CQ: the caller's destruction order is wrong, and a
  // destructor can only leave the CQ to be reclaimed at exit.
  (void)ibv_destroy_cq(cq);
}

}  // namespace rdmaring::verbs
