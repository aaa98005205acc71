// One RAII type per CUDA object the GPU delivery holds: a stream, an event, a host range
// registered with CUDA (cudaHostRegister: the copy engine then reads those pages directly, no
// staging copy), device memory, and page-locked host memory of CUDA's own. Each is created at set-up
// (a failure throws SetupError naming the call) and moves, never copies.
#pragma once

#include <cstddef>
#include <span>
#include <utility>

#include "rdmaring/gpu/cuda_error.hpp"

namespace rdmaring::gpu {

template <class Handle, class Release>
class CudaHandle {
 public:
  CudaHandle() = default;
  explicit CudaHandle(Handle h) noexcept : h_(h) {}
  CudaHandle(CudaHandle&& o) noexcept : h_(std::exchange(o.h_, Handle{})) {}
  CudaHandle& operator=(CudaHandle&& o) noexcept {
    if (this != &o) reset(std::exchange(o.h_, Handle{}));
    return *this;
  }
  ~CudaHandle() { reset(Handle{}); }
  Handle get() const noexcept { return h_; }

 private:
  void reset(Handle h) noexcept {
    if (h_) Release{}(h_);
    h_ = h;
  }
  Handle h_{};
};

struct StreamRelease { void operator()(cudaStream_t s) const noexcept { cudaStreamDestroy(s); } };
struct EventRelease { void operator()(cudaEvent_t e) const noexcept { cudaEventDestroy(e); } };
struct DeviceRelease { void operator()(void* p) const noexcept { cudaFree(p); } };
struct PinnedRelease { void operator()(void* p) const noexcept { cudaFreeHost(p); } };
struct RegistrationRelease { void operator()(void* p) const noexcept { cudaHostUnregister(p); } };

class CudaStream {
 public:
  CudaStream() {
    cudaStream_t s = nullptr;
    cuda_setup("cudaStreamCreateWithFlags(cudaStreamNonBlocking)", cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    h_ = decltype(h_)(s);
  }
  cudaStream_t get() const noexcept { return h_.get(); }

 private:
  CudaHandle<cudaStream_t, StreamRelease> h_;
};

class CudaEvent {
 public:
  // Timing costs a timestamp per record; the delivery's events only order and report.
  explicit CudaEvent(bool timing = false) {
    cudaEvent_t e = nullptr;
    cuda_setup("cudaEventCreateWithFlags", cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming));
    h_ = decltype(h_)(e);
  }
  cudaEvent_t get() const noexcept { return h_.get(); }

 private:
  CudaHandle<cudaEvent_t, EventRelease> h_;
};

// Memory of one of CUDA's allocators, freed by `Release`.
template <class Release>
class CudaMemory {
 public:
  std::byte* data() const noexcept { return static_cast<std::byte*>(h_.get()); }
  std::size_t size() const noexcept { return bytes_; }

 protected:
  CudaMemory(std::size_t bytes, const char* call, cudaError_t (*allocate)(void**, std::size_t)) : bytes_(bytes) {
    void* p = nullptr;
    cuda_setup(call, allocate(&p, bytes));
    h_ = CudaHandle<void*, Release>(p);
  }

 private:
  CudaHandle<void*, Release> h_;
  std::size_t bytes_ = 0;
};

class DeviceBuffer : public CudaMemory<DeviceRelease> {
 public:
  explicit DeviceBuffer(std::size_t bytes) : CudaMemory(bytes, "cudaMalloc", cudaMalloc) {}
};

class PinnedBuffer : public CudaMemory<PinnedRelease> {
 public:
  explicit PinnedBuffer(std::size_t bytes) : CudaMemory(bytes, "cudaMallocHost", cudaMallocHost) {}
};

// A host range (a ring) page-locked and mapped for the GPU by cudaHostRegister, beside whatever
// verbs registration it also has: the two are separate registrations of the same pages.
class HostRegistration {
 public:
  explicit HostRegistration(std::span<std::byte> range) : range_(range) {
    cuda_setup("cudaHostRegister(ring)", cudaHostRegister(range.data(), range.size(), cudaHostRegisterDefault));
    h_ = decltype(h_)(range.data());
  }
  std::span<std::byte> range() const noexcept { return range_; }
  bool holds(const std::byte* p, std::size_t n) const noexcept {
    return p >= range_.data() && p + n <= range_.data() + range_.size();
  }

 private:
  CudaHandle<void*, RegistrationRelease> h_;
  std::span<std::byte> range_;
};

}  // namespace rdmaring::gpu
