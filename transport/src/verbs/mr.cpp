#include "rdmaring/verbs/mr.hpp"

#include "rdmaring/verbs/context.hpp"
#include "rdmaring/verbs/error.hpp"
#include "rdmaring/verbs/pd.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <new>
#include <sstream>

namespace rdmaring::verbs {
namespace {

constexpr int kCapIpcLock = 14;  // linux/capability.h

std::uintptr_t page_size() { return static_cast<std::uintptr_t>(sysconf(_SC_PAGESIZE)); }

// The kernel pins whole pages, so a region that straddles a page boundary costs both pages.
std::uint64_t pinned_span(const void* addr, std::size_t length) {
  const std::uintptr_t page = page_size();
  const auto begin = reinterpret_cast<std::uintptr_t>(addr) & ~(page - 1);
  const auto end = (reinterpret_cast<std::uintptr_t>(addr) + length + page - 1) & ~(page - 1);
  return end - begin;
}

}  // namespace

MemlockState read_memlock_state() {
  MemlockState state;
  rlimit lim{};
  if (getrlimit(RLIMIT_MEMLOCK, &lim) == 0) {
    if (lim.rlim_cur != RLIM_INFINITY) state.soft_limit = lim.rlim_cur;
    if (lim.rlim_max != RLIM_INFINITY) state.hard_limit = lim.rlim_max;
  }
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    std::istringstream fields(line);
    std::string key;
    fields >> key;
    if (key == "CapEff:") {
      std::uint64_t caps = 0;
      fields >> std::hex >> caps;
      state.cap_ipc_lock = (caps >> kCapIpcLock) & 1U;
    } else if (key == "VmPin:" || key == "VmLck:") {
      std::uint64_t kib = 0;
      fields >> kib;
      (key == "VmPin:" ? state.pinned : state.locked) = kib * 1024;
    }
  }
  return state;
}

std::optional<Error> memlock_shortfall(const MemlockState& state, std::uint64_t bytes,
                                       const std::string& object) {
  if (state.cap_ipc_lock || !state.soft_limit) return std::nullopt;
  const std::uint64_t needed = state.pinned + bytes;
  if (needed <= *state.soft_limit) return std::nullopt;
  return make_error(errc::memlock_too_low,
                    "ibv_reg_mr(" + object + "): RLIMIT_MEMLOCK is " +
                        describe_bytes(*state.soft_limit) + " with " +
                        describe_bytes(state.pinned) + " already pinned, registration of " +
                        describe_bytes(bytes) + " needs " +
                        describe_bytes(needed - *state.soft_limit) +
                        " more; raise it (ulimit -l, limits.conf, or CAP_IPC_LOCK)");
}

AlignedBuffer::AlignedBuffer(std::size_t size) : size_(size) {
  const std::size_t page = page_size();
  // aligned_alloc wants a multiple of the alignment, and a zero-size request may return null.
  const std::size_t rounded = (size == 0 ? page : (size + page - 1) & ~(page - 1));
  data_.reset(static_cast<std::byte*>(std::aligned_alloc(page, rounded)));
  if (!data_) throw std::bad_alloc();
  std::memset(data_.get(), 0, rounded);
}

void AlignedBuffer::Free::operator()(std::byte* p) const noexcept { std::free(p); }

MemoryRegion::MemoryRegion(const ProtectionDomain& pd, void* addr, std::size_t length, int access,
                           bool odp)
    : what_(describe_mr(addr, length, device_name(pd.get()->context))) {
  const std::uint64_t pinned = pinned_span(addr, length);
  if (odp) {
    const DeviceCaps caps = Context::borrow(pd.get()->context).query_caps();
    if (!caps.odp_rc_write) {
      throw SetupError(make_error(errc::odp_unsupported,
                                  "ibv_reg_mr(" + what_ + "): on-demand paging requested, but " +
                                      caps.name +
                                      " does not support ODP for RC RDMA WRITE; register "
                                      "pinned memory instead"));
    }
    access |= IBV_ACCESS_ON_DEMAND;
  } else if (auto e = memlock_shortfall(read_memlock_state(), pinned, what_)) {
    throw SetupError(std::move(*e));
  }
  mr_.reset(ibv_reg_mr(pd.get(), addr, length, access));
  if (mr_) return;
  const int err = errno;
  // ODP pins nothing, so only a pinned registration can have been refused for the limit.
  if (!odp && (err == ENOMEM || err == EPERM)) {
    if (auto e = memlock_shortfall(read_memlock_state(), pinned, what_)) {
      e->sys_errno = err;
      throw SetupError(std::move(*e));
    }
  }
  throw_verbs("ibv_reg_mr", what_, err);
}

void MemoryRegion::Dereg::operator()(ibv_mr* mr) const noexcept {
  // Fails only for an invalid MR or one a memory window still binds; the kernel drops the
  // registration at exit either way.
  (void)ibv_dereg_mr(mr);
}

}  // namespace rdmaring::verbs
