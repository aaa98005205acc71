// Whether a ring can live in GPU memory and be written by the NIC directly (GPUDirect RDMA over
// dma-buf): CUDA must export the allocation as a dma-buf (CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED,
// cuMemGetHandleForAddressRange) and a verbs device must register it (ibv_reg_dmabuf_mr). The
// probe tries each for real, on a small allocation; require_gpu_resident_ring() refuses, naming
// what is missing, and never falls back to a host ring.
#pragma once

#include <string>
#include <vector>

namespace rdmaring::gpu {

struct DmabufRoute {
  bool cuda_export = false;            // the GPU exported a dma-buf of device memory
  std::string cuda_note;               // why not, or the attribute's value
  std::vector<std::string> devices;    // verbs devices that registered that dma-buf
  std::vector<std::string> refusals;   // "mlx5_0: ibv_reg_dmabuf_mr: Operation not supported", "no RDMA device"
  bool possible() const { return cuda_export && !devices.empty(); }
  std::string missing() const;         // "" when possible()
};

DmabufRoute probe_dmabuf_route(int cuda_device);

// Throws SetupError (no_device when no verbs device registered it) naming what is missing.
void require_gpu_resident_ring(const DmabufRoute& route);

}  // namespace rdmaring::gpu
