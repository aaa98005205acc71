// A CUDA runtime or driver failure as the project's Error: the call that failed and CUDA's own
// string for the code, so that a report names both. Set-up throws it (SetupError); the data path
// returns it.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "rdmaring/error.hpp"

namespace rdmaring::gpu {

Error cuda_error(const char* call, cudaError_t e);
Error cuda_error(const char* call, CUresult e);
Result<void> cuda_result(const char* call, cudaError_t e);
void cuda_setup(const char* call, cudaError_t e);
void cuda_setup(const char* call, CUresult e);

}  // namespace rdmaring::gpu
