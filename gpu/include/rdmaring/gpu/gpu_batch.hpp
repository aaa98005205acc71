// What a kernel gets of one delivered batch: plain data, so that device code includes nothing of
// the host side (Boost.Outcome among it).
#pragma once

#include <cstddef>
#include <cstdint>

namespace rdmaring::gpu {

// One record as the GPU sees it: where its payload lies in the slot's device bytes.
struct GpuRecord {
  std::uint64_t offset = 0;  // from GpuBatch::bytes
  std::uint64_t sequence = 0;
  std::uint64_t session = 0;
  std::uint32_t length = 0;
  std::uint32_t reserved = 0;
};
static_assert(sizeof(GpuRecord) == 32);

// Device pointers of one batch, valid for kernels launched on `stream` after the delivery's copy.
struct GpuBatch {
  const std::byte* bytes = nullptr;
  const GpuRecord* records = nullptr;
  std::uint32_t count = 0;
};

}  // namespace rdmaring::gpu
