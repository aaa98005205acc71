#include "standin.hpp"

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>

namespace {

struct State {
  bool held = false;
  std::deque<std::function<void()>> queued;  // every stream's work, in enqueue order
  std::map<const std::byte*, std::size_t> registered, pinned, device;  // base -> length
  std::map<cudaEvent_t, bool> events;                                 // complete?
  std::uint64_t unregistered_copies = 0;
};
State& state() {
  static State s;
  return s;
}

bool within(const std::map<const std::byte*, std::size_t>& ranges, const void* p, std::size_t n) {
  const auto* b = static_cast<const std::byte*>(p);
  auto it = ranges.upper_bound(b);
  if (it == ranges.begin()) return false;
  --it;
  return b >= it->first && b + n <= it->first + it->second;
}

bool overlaps(const std::map<const std::byte*, std::size_t>& ranges, const std::byte* p, std::size_t n) {
  for (const auto& [base, len] : ranges)
    if (p < base + len && base < p + n) return true;
  return false;
}

void enqueue(std::function<void()> work) {
  state().queued.push_back(std::move(work));
  if (!state().held) rdmaring::test::cuda_standin::run_held();
}

cudaError_t allocate(std::map<const std::byte*, std::size_t>& ranges, void** p, std::size_t bytes) {
  *p = std::calloc(bytes ? bytes : 1, 1);
  if (!*p) return cudaErrorInvalidValue;
  ranges[static_cast<const std::byte*>(*p)] = bytes;
  return cudaSuccess;
}

cudaError_t release(std::map<const std::byte*, std::size_t>& ranges, void* p) {
  if (!p) return cudaSuccess;
  if (ranges.erase(static_cast<const std::byte*>(p)) == 0) return cudaErrorInvalidValue;
  std::free(p);
  return cudaSuccess;
}

}  // namespace

namespace rdmaring::test::cuda_standin {

void hold(bool on) { state().held = on; }
void run_held() {
  while (!state().queued.empty()) {
    auto work = std::move(state().queued.front());
    state().queued.pop_front();
    work();
  }
}
std::size_t registered_ranges() { return state().registered.size(); }
std::uint64_t unregistered_copies() { return state().unregistered_copies; }

}  // namespace rdmaring::test::cuda_standin

CUresult cuGetErrorName(CUresult, const char** name) {
  *name = "CUDA_ERROR_STANDIN";
  return CUDA_SUCCESS;
}
CUresult cuGetErrorString(CUresult, const char** text) {
  *text = "an error of the stand-in CUDA runtime";
  return CUDA_SUCCESS;
}

const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorHostMemoryAlreadyRegistered: return "cudaErrorHostMemoryAlreadyRegistered";
    case cudaErrorHostMemoryNotRegistered: return "cudaErrorHostMemoryNotRegistered";
  }
  return "cudaErrorUnknown";
}
const char* cudaGetErrorString(cudaError_t e) { return cudaGetErrorName(e); }

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned) {
  static int next = 0;
  *stream = reinterpret_cast<cudaStream_t>(static_cast<std::uintptr_t>(++next));
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamSynchronize(cudaStream_t) {
  rdmaring::test::cuda_standin::run_held();
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned) {
  *event = reinterpret_cast<cudaEvent_t>(new char);
  state().events[*event] = true;  // an event never recorded reads as complete, as in CUDA
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  if (state().events.erase(event) == 0) return cudaErrorInvalidValue;
  delete reinterpret_cast<char*>(event);
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t) {
  if (!state().events.count(event)) return cudaErrorInvalidValue;
  state().events[event] = false;
  enqueue([event] {
    if (auto it = state().events.find(event); it != state().events.end()) it->second = true;
  });
  return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t event) {
  const auto it = state().events.find(event);
  if (it == state().events.end()) return cudaErrorInvalidValue;
  return it->second ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaMalloc(void** p, std::size_t bytes) { return allocate(state().device, p, bytes); }
cudaError_t cudaFree(void* p) { return release(state().device, p); }
cudaError_t cudaMallocHost(void** p, std::size_t bytes) { return allocate(state().pinned, p, bytes); }
cudaError_t cudaFreeHost(void* p) { return release(state().pinned, p); }

cudaError_t cudaHostRegister(void* p, std::size_t bytes, unsigned) {
  const auto* b = static_cast<const std::byte*>(p);
  if (!p || bytes == 0) return cudaErrorInvalidValue;
  if (overlaps(state().registered, b, bytes)) return cudaErrorHostMemoryAlreadyRegistered;
  state().registered[b] = bytes;
  return cudaSuccess;
}
cudaError_t cudaHostUnregister(void* p) {
  return state().registered.erase(static_cast<const std::byte*>(p)) ? cudaSuccess : cudaErrorHostMemoryNotRegistered;
}

// The bytes are read when the copy runs, not when it is enqueued, as the copy engine reads them:
// a ring overwritten before a held copy runs shows in what lands.
cudaError_t cudaMemcpyAsync(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind, cudaStream_t) {
  if (kind == cudaMemcpyHostToDevice &&
      (!(within(state().registered, src, bytes) || within(state().pinned, src, bytes)) ||
       !within(state().device, dst, bytes)))
    ++state().unregistered_copies;
  enqueue([dst, src, bytes] { std::memcpy(dst, src, bytes); });
  return cudaSuccess;
}
