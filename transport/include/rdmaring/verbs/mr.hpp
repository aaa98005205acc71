// MemoryRegion: memory the device may access, with the keys that name it locally and remotely.
//
// Registration pins pages against RLIMIT_MEMLOCK, and a refused pin comes back from the kernel
// as a bare ENOMEM. Because that is the most common set-up failure on a fresh machine, the limit
// is checked here first and reported with the numbers a person needs to raise it.
#pragma once

#include "rdmaring/error.hpp"
#include "rdmaring/registration_footprint.hpp"

#include <infiniband/verbs.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>

namespace rdmaring::verbs {

class ProtectionDomain;

// What the kernel compares when it pins pages for a registration (ib_umem_get): pages already
// pinned by this process (VmPin) plus the new ones must stay within the soft RLIMIT_MEMLOCK,
// unless the process holds CAP_IPC_LOCK.
struct MemlockState {
  bool cap_ipc_lock = false;
  std::optional<std::uint64_t> soft_limit;  // bytes; nullopt = unlimited
  std::uint64_t pinned = 0;                 // bytes (VmPin: what registrations are charged to)
  std::optional<std::uint64_t> hard_limit;  // bytes; nullopt = unlimited
  std::uint64_t locked = 0;                 // bytes (VmLck: mlock(), not registrations)
};

// Reads the limit (getrlimit), CAP_IPC_LOCK (CapEff bit 14) and VmPin (/proc/self/status).
// Never fails: what cannot be read counts as no capability and nothing pinned, so the check
// can only err on the side of letting the kernel decide.
MemlockState read_memlock_state();

// The error registering `bytes` more would hit, or nullopt when it fits.
// Assumes: `bytes` is the page-rounded span to pin; `object` describes the region
// (describe_mr). Returns errc::memlock_too_low whose context names RLIMIT_MEMLOCK, the limit,
// what is pinned, the size asked for and how to raise the limit.
std::optional<Error> memlock_shortfall(const MemlockState& state, std::uint64_t bytes,
                                       const std::string& object);

// An owning, page-aligned, zero-filled allocation: registrable memory whose first byte starts a
// page, so a registration pins no neighbouring data. Move-only.
class AlignedBuffer {
 public:
  // Throws: std::bad_alloc. The allocation is rounded up to whole pages; size() is `size`.
  explicit AlignedBuffer(std::size_t size);

  std::byte* data() const noexcept { return data_.get(); }
  std::size_t size() const noexcept { return size_; }
  std::span<std::byte> bytes() const noexcept { return {data_.get(), size_}; }

 private:
  struct Free {
    void operator()(std::byte* p) const noexcept;
  };
  std::unique_ptr<std::byte[], Free> data_;
  std::size_t size_;
};

class MemoryRegion {
 public:
  // Registers [addr, addr + length) with `access` (IBV_ACCESS_* flags), on demand-paged when
  // `odp` is set.
  // Assumes: `pd` outlives the region; the memory stays mapped until the region is destroyed.
  // Throws SetupError:
  //   errc::odp_unsupported   odp asked for and the device cannot serve RC RDMA WRITE from ODP;
  //   errc::memlock_too_low   pinning would exceed RLIMIT_MEMLOCK (checked before the call and
  //                           again when ibv_reg_mr fails with ENOMEM/EPERM, sys_errno then set);
  //   errc::verbs_failure     any other ibv_reg_mr (or capability query) failure, with errno.
  MemoryRegion(const ProtectionDomain& pd, void* addr, std::size_t length, int access,
               bool odp = false);

  std::uint32_t lkey() const noexcept { return mr_->lkey; }
  std::uint32_t rkey() const noexcept { return mr_->rkey; }
  void* addr() const noexcept { return mr_->addr; }
  std::size_t length() const noexcept { return mr_->length; }
  ibv_mr* get() const noexcept { return mr_.get(); }
  // "mr 4096 B at 0x7f.. on rxe0", for error contexts.
  const std::string& describe() const noexcept { return what_; }

 private:
  struct Dereg {
    void operator()(ibv_mr* mr) const noexcept;
  };
  std::string what_;
  std::unique_ptr<ibv_mr, Dereg> mr_;
};

}  // namespace rdmaring::verbs
