#include "rdmaring/gpu/cuda_error.hpp"

#include <string>

namespace rdmaring::gpu {

// errc has no CUDA code: system_failure, with the CUDA call and its error string as the context.
Error cuda_error(const char* call, cudaError_t e) {
  return make_error(errc::system_failure, std::string(call) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}

Error cuda_error(const char* call, CUresult e) {
  const char* name = "unknown CUresult";
  const char* text = "";
  cuGetErrorName(e, &name);
  cuGetErrorString(e, &text);
  return make_error(errc::system_failure, std::string(call) + ": " + name + " (" + text + ")");
}

Result<void> cuda_result(const char* call, cudaError_t e) {
  if (e != cudaSuccess) return cuda_error(call, e);
  return success();
}

void cuda_setup(const char* call, cudaError_t e) {
  if (e != cudaSuccess) throw SetupError(cuda_error(call, e));
}

void cuda_setup(const char* call, CUresult e) {
  if (e != CUDA_SUCCESS) throw SetupError(cuda_error(call, e));
}

}  // namespace rdmaring::gpu
