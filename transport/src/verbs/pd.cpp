#include "rdmaring/verbs/pd.hpp"

#include "rdmaring/verbs/context.hpp"
#include "rdmaring/verbs/error.hpp"

#include <cerrno>

namespace rdmaring::verbs {

ProtectionDomain::ProtectionDomain(const Context& context)
    : what_(describe_object("pd", context.name())), pd_(ibv_alloc_pd(context.get())) {
  if (!pd_) throw_verbs("ibv_alloc_pd", std::string(context.name()), errno);
}

void ProtectionDomain::Dealloc::operator()(ibv_pd* pd) const noexcept {
  // EBUSY here means an MR or QP of this PD is still alive: a destruction-order bug in the
  // caller that a destructor cannot repair; the kernel reclaims the PD at exit.
  (void)ibv_dealloc_pd(pd);
}

}  // namespace rdmaring::verbs

