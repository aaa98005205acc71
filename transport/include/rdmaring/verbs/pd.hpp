// ProtectionDomain: the scope in which memory keys and queue pairs may refer to each other.
#pragma once

#include <infiniband/verbs.h>

#include <memory>
#include <string>

namespace rdmaring::verbs {

class Context;

class ProtectionDomain {
 public:
  // Assumes: `context` (its ibv_context) outlives this PD.
  // Throws: SetupError errc::verbs_failure with the errno of ibv_alloc_pd.
  explicit ProtectionDomain(const Context& context);

  ibv_pd* get() const noexcept { return pd_.get(); }
  // "pd on rxe0", for error contexts.
  const std::string& describe() const noexcept { return what_; }

 private:
  struct Dealloc {
    void operator()(ibv_pd* pd) const noexcept;
  };
  std::string what_;  // before pd_: built before the call whose errno it reports
  std::unique_ptr<ibv_pd, Dealloc> pd_;
};

}  // namespace rdmaring::verbs
