// Context: an open verbs device (ibv_context).
//
// Two ownerships, because rdma_cm decides which device a connection uses: an owning Context
// opened by name (tools, capability checks before any connection exists), and a borrowed one
// wrapping the ibv_context librdmacm opened for a cm id (cm_id->verbs), which librdmacm closes.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace rdmaring::verbs {

// What the queue's configuration checks against: device limits and the state of port 1.
struct DeviceCaps {
  std::string name;
  bool odp_rc_write = false;  // ODP usable as the target of RC RDMA WRITE
  std::uint64_t max_mr_size = 0;
  int max_qp_wr = 0;
  int max_sge = 0;
  int max_srq_wr = 0;
  int max_cqe = 0;
  ibv_atomic_cap atomic_cap = IBV_ATOMIC_NONE;
  std::uint8_t link_layer = IBV_LINK_LAYER_UNSPECIFIED;  // port 1
  ibv_mtu active_mtu = IBV_MTU_256;                      // port 1
  ibv_port_state port_state = IBV_PORT_NOP;              // port 1

  // Device-wide detail for diagnostics (`rdmaring doctor`); the queue's checks use the fields above.
  bool odp = false;           // IBV_ODP_SUPPORT in the general ODP caps
  bool odp_implicit = false;  // IBV_ODP_SUPPORT_IMPLICIT: one ODP MR may cover the address space
  std::uint32_t odp_rc_caps = 0;       // ibv_odp_transport_cap_bits for RC
  std::uint64_t device_cap_flags = 0;  // ibv_device_attr_ex::device_cap_flags_ex
  // IBV_DEVICE_CC_DMA_BOUNCE when this rdma-core's verbs.h defines it; nullopt when it does not
  // (then the device cannot say, and the answer is unknown, not "no").
  std::optional<bool> dma_bounce;
  std::uint64_t node_guid = 0;  // host byte order
  std::string fw_ver;
  std::uint32_t vendor_id = 0;
  std::uint32_t vendor_part_id = 0;
  std::uint8_t phys_port_cnt = 0;
  int max_qp = 0;
  int max_mr = 0;
  int max_qp_rd_atom = 0;
};

// Whether this build's verbs.h lets a device report that its DMA goes through bounce buffers
// (IBV_DEVICE_CC_DMA_BOUNCE): placement is then a copy, not direct. rdma-core 44 has no such flag.
#ifdef IBV_DEVICE_CC_DMA_BOUNCE
inline constexpr bool kVerbsReportsDmaBounce = true;
#else
inline constexpr bool kVerbsReportsDmaBounce = false;
#endif

// One line for logs: "rxe0: port 1 ACTIVE Ethernet mtu 4096, odp(rc write) no, ...".
std::string to_string(const DeviceCaps& caps);

// Picks the device called `name` from `devices`, or the first one when `name` is empty.
// Assumes: `devices` are the entries of an ibv_get_device_list() result (or stand-ins with a
// name), without its terminating null; `list_errno` is the errno of ibv_get_device_list when it
// returned no list, else 0.
// Throws: SetupError errc::no_device (sys_errno = list_errno) when the list is empty, saying
// that no RDMA device was found and how to get a Soft-RoCE one; errc::no_device naming the
// devices present when none is called `name`.
ibv_device& select_device(std::span<ibv_device* const> devices, std::string_view name,
                          int list_errno = 0);

// The kernel name of the device `ctx` belongs to ("rxe0"). Assumes: `ctx` is non-null.
std::string_view device_name(const ibv_context* ctx) noexcept;

class Context {
 public:
  // Opens the device called `device_name`, or the first device when it is empty.
  // Throws: SetupError errc::no_device as select_device does; errc::verbs_failure with the
  // errno of ibv_open_device.
  static Context open(std::string_view device_name = {});

  // Wraps a context owned by someone else (librdmacm's cm_id->verbs); never closed here.
  // Assumes: `context` is non-null and outlives the returned object.
  static Context borrow(ibv_context* context) noexcept;

  ibv_context* get() const noexcept { return ctx_.get(); }
  // The kernel device name ("rxe0"). Assumes: not moved from.
  std::string_view name() const noexcept;

  // Device and port 1 attributes (ibv_query_device_ex, ibv_query_port).
  // Throws: SetupError errc::verbs_failure naming the failing query and the device.
  DeviceCaps query_caps() const;

 private:
  struct Close {
    bool owning = true;
    void operator()(ibv_context* ctx) const noexcept;
  };
  Context(ibv_context* ctx, bool owning) noexcept : ctx_(ctx, Close{owning}) {}

  std::unique_ptr<ibv_context, Close> ctx_;
};

}  // namespace rdmaring::verbs
