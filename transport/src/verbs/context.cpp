#include "rdmaring/verbs/context.hpp"

#include "rdmaring/verbs/error.hpp"

#include <endian.h>

#include <cerrno>
#include <cstring>

namespace rdmaring::verbs {
namespace {

constexpr std::uint8_t kPort = 1;

struct FreeDeviceList {
  void operator()(ibv_device** list) const noexcept { ibv_free_device_list(list); }
};

std::string_view link_layer_name(std::uint8_t link_layer) {
  switch (link_layer) {
    case IBV_LINK_LAYER_INFINIBAND: return "InfiniBand";
    case IBV_LINK_LAYER_ETHERNET: return "Ethernet";
    default: return "unspecified";
  }
}

int mtu_bytes(ibv_mtu mtu) { return 128 << static_cast<int>(mtu); }

}  // namespace

std::string to_string(const DeviceCaps& caps) {
  std::string s = caps.name;
  s += ": port " + std::to_string(kPort) + " " + ibv_port_state_str(caps.port_state);
  s += " ";
  s += link_layer_name(caps.link_layer);
  s += " mtu " + std::to_string(mtu_bytes(caps.active_mtu));
  s += ", odp(rc write) ";
  s += caps.odp_rc_write ? "yes" : "no";
  s += ", max_mr_size " + describe_bytes(caps.max_mr_size);
  s += ", max_qp_wr " + std::to_string(caps.max_qp_wr);
  s += ", max_sge " + std::to_string(caps.max_sge);
  s += ", max_srq_wr " + std::to_string(caps.max_srq_wr);
  s += ", max_cqe " + std::to_string(caps.max_cqe);
  s += ", atomics ";
  s += caps.atomic_cap == IBV_ATOMIC_NONE ? "none" : caps.atomic_cap == IBV_ATOMIC_HCA ? "hca" : "global";
  return s;
}

ibv_device& select_device(std::span<ibv_device* const> devices, std::string_view name,
                          int list_errno) {
  if (devices.empty()) {
    throw SetupError(make_error(
        errc::no_device,
        "ibv_get_device_list: no RDMA device found; on a machine without an RNIC load rdma_rxe "
        "and add a Soft-RoCE link (rdma link add rxe0 type rxe netdev <ifname>), or run inside "
        "tests/softroce/guest-run",
        list_errno));
  }
  if (name.empty()) return *devices.front();
  std::string present;
  for (ibv_device* dev : devices) {
    if (name == ibv_get_device_name(dev)) return *dev;
    present += present.empty() ? "" : ", ";
    present += ibv_get_device_name(dev);
  }
  throw SetupError(make_error(errc::no_device, "ibv_get_device_list: no RDMA device named '" +
                                                   std::string(name) + "' (present: " + present + ")"));
}

Context Context::open(std::string_view device_name) {
  int count = 0;
  std::unique_ptr<ibv_device*, FreeDeviceList> list(ibv_get_device_list(&count));
  const int list_errno = list ? 0 : errno;
  std::span<ibv_device* const> devices;
  if (list) devices = {list.get(), static_cast<std::size_t>(count)};
  ibv_device& dev = select_device(devices, device_name, list_errno);
  ibv_context* ctx = ibv_open_device(&dev);
  if (ctx == nullptr) throw_verbs("ibv_open_device", ibv_get_device_name(&dev), errno);
  return Context(ctx, true);
}

Context Context::borrow(ibv_context* context) noexcept { return Context(context, false); }

std::string_view device_name(const ibv_context* ctx) noexcept {
  return ibv_get_device_name(ctx->device);
}

std::string_view Context::name() const noexcept { return device_name(ctx_.get()); }

DeviceCaps Context::query_caps() const {
  const std::string dev(name());
  ibv_device_attr_ex attr{};
  if (int err = ibv_query_device_ex(ctx_.get(), nullptr, &attr); err != 0) {
    throw_verbs("ibv_query_device_ex", dev, err);
  }
  ibv_port_attr port{};
  if (int err = ibv_query_port(ctx_.get(), kPort, &port); err != 0) {
    throw_verbs("ibv_query_port", dev + " port " + std::to_string(kPort), err);
  }
  DeviceCaps caps;
  caps.name = dev;
  caps.odp_rc_write = (attr.odp_caps.general_caps & IBV_ODP_SUPPORT) != 0 &&
                      (attr.odp_caps.per_transport_caps.rc_odp_caps & IBV_ODP_SUPPORT_WRITE) != 0;
  caps.max_mr_size = attr.orig_attr.max_mr_size;
  caps.max_qp_wr = attr.orig_attr.max_qp_wr;
  caps.max_sge = attr.orig_attr.max_sge;
  caps.max_srq_wr = attr.orig_attr.max_srq_wr;
  caps.max_cqe = attr.orig_attr.max_cqe;
  caps.atomic_cap = attr.orig_attr.atomic_cap;
  caps.link_layer = port.link_layer;
  caps.active_mtu = port.active_mtu;
  caps.port_state = port.state;
  caps.odp = (attr.odp_caps.general_caps & IBV_ODP_SUPPORT) != 0;
  caps.odp_implicit = (attr.odp_caps.general_caps & IBV_ODP_SUPPORT_IMPLICIT) != 0;
  caps.odp_rc_caps = attr.odp_caps.per_transport_caps.rc_odp_caps;
  caps.device_cap_flags = attr.device_cap_flags_ex;
#ifdef IBV_DEVICE_CC_DMA_BOUNCE
  caps.dma_bounce = (attr.device_cap_flags_ex & IBV_DEVICE_CC_DMA_BOUNCE) != 0;
#endif
  caps.node_guid = be64toh(attr.orig_attr.node_guid);
  caps.fw_ver.assign(attr.orig_attr.fw_ver, strnlen(attr.orig_attr.fw_ver, sizeof attr.orig_attr.fw_ver));
  caps.vendor_id = attr.orig_attr.vendor_id;
  caps.vendor_part_id = attr.orig_attr.vendor_part_id;
  caps.phys_port_cnt = attr.orig_attr.phys_port_cnt;
  caps.max_qp = attr.orig_attr.max_qp;
  caps.max_mr = attr.orig_attr.max_mr;
  caps.max_qp_rd_atom = attr.orig_attr.max_qp_rd_atom;
  return caps;
}

void Context::Close::operator()(ibv_context* ctx) const noexcept {
  // A failed close leaves nothing for the caller to do: the kernel frees the device file
  // when the process exits.
  if (owning) (void)ibv_close_device(ctx);
}

}  // namespace rdmaring::verbs
