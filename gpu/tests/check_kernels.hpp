// The kernels of the GPU tests, behind plain launch functions: the tests' host code (the
// loopback fabric among it) compiles with the host compiler alone.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "rdmaring/gpu/gpu_batch.hpp"

namespace rdmaring::gpu::test {

inline constexpr std::uint32_t kMaxPayload = 3000;

struct Tally {
  unsigned long long records;
  unsigned long long bytes;
  unsigned long long wrong;
};

// One block per record: its sequence follows `first_sequence` (the batches before), its length
// and every byte are the ones the producer wrote; counted into `tally` (device memory).
void launch_check_records(cudaStream_t stream, const GpuBatch& batch, std::uint64_t first_sequence, Tally* tally);
// Holds `stream` until *open (mapped host memory) is non-zero, or 20 s pass.
void launch_gate(cudaStream_t stream, int* open);

}  // namespace rdmaring::gpu::test
