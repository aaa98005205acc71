// The records the GPU tests and the bench send: sizes mixed by sequence, bytes a function of
// sequence and index, so that a kernel checks each record without a copy of what was sent.
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define RDMARING_HOST_DEVICE __host__ __device__
#else
#define RDMARING_HOST_DEVICE
#endif

namespace rdmaring::gpu::test {

RDMARING_HOST_DEVICE inline std::uint32_t record_length(std::uint64_t sequence, std::uint32_t max) {
  return 1 + static_cast<std::uint32_t>((sequence * 2654435761u >> 7) % max);
}
RDMARING_HOST_DEVICE inline unsigned char record_byte(std::uint64_t sequence, std::uint32_t i) {
  return static_cast<unsigned char>(sequence * 7 + i * 13);
}

}  // namespace rdmaring::gpu::test
