// MemlockSandbox: lowers what the process may pin for one test and restores it afterwards.
#pragma once

#include <linux/capability.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <cstdint>

// Lowers what the process may pin for one test and restores it afterwards: the effective
// CAP_IPC_LOCK (root in the guest has it, and it would bypass the limit) and the soft
// RLIMIT_MEMLOCK. Capabilities are per thread: construct it before a RingOwner, whose control
// thread (where rings are registered) inherits the lowered set.
class MemlockSandbox {
 public:
  explicit MemlockSandbox(std::uint64_t soft_limit) {
    REQUIRE(getrlimit(RLIMIT_MEMLOCK, &saved_limit_) == 0);
    REQUIRE(syscall(SYS_capget, &header_, saved_caps_) == 0);
    __user_cap_data_struct lowered[2] = {saved_caps_[0], saved_caps_[1]};
    lowered[CAP_TO_INDEX(CAP_IPC_LOCK)].effective &= ~CAP_TO_MASK(CAP_IPC_LOCK);
    REQUIRE(syscall(SYS_capset, &header_, lowered) == 0);
    rlimit lim = saved_limit_;
    lim.rlim_cur = soft_limit;
    REQUIRE(setrlimit(RLIMIT_MEMLOCK, &lim) == 0);
  }
  ~MemlockSandbox() {
    setrlimit(RLIMIT_MEMLOCK, &saved_limit_);
    syscall(SYS_capset, &header_, saved_caps_);
  }
  MemlockSandbox(const MemlockSandbox&) = delete;
  MemlockSandbox& operator=(const MemlockSandbox&) = delete;

 private:
  rlimit saved_limit_{};
  __user_cap_header_struct header_{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct saved_caps_[2]{};
};
