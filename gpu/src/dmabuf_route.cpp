#include "rdmaring/gpu/dmabuf_route.hpp"

#include <infiniband/verbs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "rdmaring/gpu/cuda_error.hpp"

namespace rdmaring::gpu {
namespace {

constexpr std::size_t kProbeBytes = 2 << 20;  // one GPU page: dma-buf export works in whole pages

struct DeviceListRelease { void operator()(ibv_device** l) const noexcept { ibv_free_device_list(l); } };
struct ContextRelease { void operator()(ibv_context* c) const noexcept { ibv_close_device(c); } };
struct PdRelease { void operator()(ibv_pd* p) const noexcept { ibv_dealloc_pd(p); } };
struct MrRelease { void operator()(ibv_mr* m) const noexcept { ibv_dereg_mr(m); } };
struct FdRelease { void operator()(int* fd) const noexcept { close(*fd); delete fd; } };
struct DeviceMemoryRelease { void operator()(CUdeviceptr* p) const noexcept { cuMemFree(*p); delete p; } };

std::string verbs_refusal(const char* device, const char* call, int err) {
  return std::string(device) + ": " + call + ": " + std::strerror(err);
}

// Registers the exported dma-buf on one device, as the GPU-resident ring would be registered.
void try_device(ibv_device* dev, int fd, CUdeviceptr ptr, DmabufRoute& route) {
  const char* name = ibv_get_device_name(dev);
  std::unique_ptr<ibv_context, ContextRelease> ctx(ibv_open_device(dev));
  if (!ctx) return route.refusals.push_back(verbs_refusal(name, "ibv_open_device", errno));
  std::unique_ptr<ibv_pd, PdRelease> pd(ibv_alloc_pd(ctx.get()));
  if (!pd) return route.refusals.push_back(verbs_refusal(name, "ibv_alloc_pd", errno));
  std::unique_ptr<ibv_mr, MrRelease> mr(ibv_reg_dmabuf_mr(pd.get(), 0, kProbeBytes, ptr, fd,
                                                          IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE));
  if (!mr) return route.refusals.push_back(verbs_refusal(name, "ibv_reg_dmabuf_mr", errno));
  route.devices.push_back(name);
}

}  // namespace

std::string DmabufRoute::missing() const {
  std::string why;
  const auto add = [&why](const std::string& s) { why += (why.empty() ? "" : "; ") + s; };
  if (!cuda_export) add("CUDA dma-buf export: " + cuda_note);
  if (devices.empty())
    for (const std::string& r : refusals) add(r);
  return why;
}

DmabufRoute probe_dmabuf_route(int cuda_device) {
  DmabufRoute route;
  cuda_setup("cudaSetDevice", cudaSetDevice(cuda_device));
  cuda_setup("cudaFree(0) (primary context)", cudaFree(nullptr));
  CUdevice dev = 0;
  cuda_setup("cuDeviceGet", cuDeviceGet(&dev, cuda_device));
  int attr = 0;
  cuda_setup("cuDeviceGetAttribute(DMA_BUF_SUPPORTED)", cuDeviceGetAttribute(&attr, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, dev));
  std::unique_ptr<CUdeviceptr, DeviceMemoryRelease> memory;
  std::unique_ptr<int, FdRelease> fd;
  if (attr == 0) {
    route.cuda_note = "CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED is 0 (driver or kernel without dma-buf)";
  } else {
    CUdeviceptr p = 0;
    cuda_setup("cuMemAlloc", cuMemAlloc(&p, kProbeBytes));
    memory.reset(new CUdeviceptr(p));
    int handle = -1;
    const CUresult r = cuMemGetHandleForAddressRange(&handle, p, kProbeBytes, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
    if (r == CUDA_SUCCESS) {
      fd.reset(new int(handle));
      route.cuda_export = true;
      route.cuda_note = "CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED = 1, cuMemGetHandleForAddressRange gave a dma-buf";
    } else {
      route.cuda_note = cuda_error("cuMemGetHandleForAddressRange(DMA_BUF_FD)", r).message();
    }
  }
  int n = 0;
  std::unique_ptr<ibv_device*, DeviceListRelease> list(ibv_get_device_list(&n));
  if (!list || n == 0) {
    route.refusals.push_back("no RDMA device (ibv_get_device_list found none)");
    return route;
  }
  if (!fd) {
    route.refusals.push_back("no dma-buf to register on the " + std::to_string(n) + " RDMA device(s)");
    return route;
  }
  for (int i = 0; i < n; ++i) try_device(list.get()[i], *fd, *memory, route);
  return route;
}

void require_gpu_resident_ring(const DmabufRoute& route) {
  if (route.possible()) return;
  throw SetupError(make_error(route.devices.empty() ? errc::no_device : errc::bad_config,
                              "GPU-resident ring refused (no host fallback): " + route.missing()));
}

}  // namespace rdmaring::gpu
