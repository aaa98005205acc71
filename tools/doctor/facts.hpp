// What the doctor knows about this host: the verbs devices (ports, GIDs, capabilities, what
// creating verbs objects on them showed), their place on the buses, the process's CPUs, memory
// policy and memlock, the IOMMU, the GPU topology and the ARP sysctls. Plain data, so that the
// verdicts and the rendering are tested with made-up facts; gather_facts() is the one function
// that touches the device, sysfs and procfs.
#pragma once

#include "pci_config.hpp"
#include "pci_topology.hpp"

#include "rdmaring/verbs/context.hpp"
#include "rdmaring/verbs/mr.hpp"

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace rdmaring::doctor {

struct GidEntry {
  int index = 0;
  std::string gid;     // format_gid
  std::string type;    // "RoCE v2", "RoCE v1", "IB"
  std::string netdev;  // "" when the entry has none (IB ports)
};

struct PortFacts {
  int port = 1;
  std::string state;       // "ACTIVE"
  std::string phys_state;  // "5: LinkUp" (sysfs)
  std::string link_layer;  // "Ethernet", "InfiniBand"
  bool active = false;
  int active_mtu = 0;  // bytes
  int max_mtu = 0;
  std::string rate;  // sysfs, "100 Gb/sec (4X EDR)"
  std::string netdev;
  std::optional<int> netdev_mtu;
  int gid_table_len = 0;
  std::vector<GidEntry> gids;  // the entries in use
  std::string gid_error;       // why the table could not be read to its end; "" when it was
};

struct DeviceFacts {
  std::string name;
  std::string node_guid;
  std::string node_type;   // ibv_node_type_str
  std::string transport;   // from ibv_device::transport_type
  std::string parent;      // sysfs "parent": the netdev of rxe/siw
  std::string bus_device;  // the PCI function, "" for a software device
  std::string driver;
  std::string error;  // why the device could not be opened or queried; "" when it was
  bool queried = false;
  verbs::DeviceCaps caps;
  std::vector<PortFacts> ports;

  // Probes that need a PD (and CQ and QP): done only where those could be created.
  bool objects_ok = false;    // a PD, a CQ and an RC QP were created
  std::string objects_error;  // the failure otherwise
  enum class RoReg { not_probed, accepted, refused } relaxed_registration = RoReg::not_probed;
  int relaxed_errno = 0;
  std::string relaxed_note;  // why the registration was not probed, or the refusal's message
  PciBit pcie_relaxed_ordering{std::nullopt, "no PCI function"};
  bool inline_probed = false;
  std::uint32_t inline_default = 0;             // granted when asking for 0 B
  std::uint32_t max_inline = 0;                 // the largest inline size granted
  std::optional<std::uint32_t> inline_refused;  // the smallest size asked for and refused
  int inline_errno = 0;

  // Whether the provider and the kernel driver take a dma-buf registration (ibv_reg_dmabuf_mr,
  // the route of a ring in GPU memory): probed with no dma-buf at all, so that a refusal of the
  // call (EOPNOTSUPP) is told apart from one of the descriptor (EBADF).
  enum class DmabufReg { not_probed, supported, unsupported } dmabuf_registration = DmabufReg::not_probed;
  int dmabuf_errno = 0;

  PciPlacement pci;       // empty for a software device
  std::string numa_note;  // why pci.numa_node is absent
  std::string numa_cpus;  // the node's cpulist

  bool software() const { return bus_device.empty(); }
  bool any_port_active() const {
    return std::any_of(ports.begin(), ports.end(), [](const PortFacts& p) { return p.active; });
  }
};

struct ProcessFacts {
  std::set<int> cpus;  // sched_getaffinity
  std::string affinity_error;
  std::string mempolicy;     // "default", "bind 0-1", ..., or why unknown
  std::string mems_allowed;  // /proc/self/status Mems_allowed_list
};

struct IommuFacts {
  std::vector<std::string> units;          // /sys/class/iommu
  std::vector<std::string> cmdline;        // iommu=, intel_iommu=, amd_iommu=, iommu.* arguments
  std::optional<int> groups;               // nullopt: /sys/kernel/iommu_groups absent
  std::map<std::string, int> group_types;  // default domain type -> groups
};

// A GPU on the PCI bus (a 3D controller, or an NVIDIA or AMD VGA controller), found from sysfs
// without its driver's libraries, so that the doctor can place it beside the RDMA devices.
struct GpuFacts {
  std::string bdf;
  std::string vendor;     // "0x10de"
  std::string device_id;  // "0x2330"
  std::string driver;     // "nvidia"; "" when none is bound
  PciPlacement pci;
};

struct ToolOutput {
  bool present = false;
  std::string path;
  int status = 0;  // exit status; 124 = timed out
  std::string output;
};

struct ArpScope {
  std::string scope;  // "all", "default" or a netdev
  std::optional<int> arp_ignore;
  std::optional<int> arp_announce;
};

struct Facts {
  std::string filter;  // --device; "" for every device
  std::vector<DeviceFacts> devices;
  std::string device_error;  // no device at all, or none called `filter`
  ProcessFacts process;
  verbs::MemlockState memlock;  // limits, CAP_IPC_LOCK, VmPin, VmLck
  IommuFacts iommu;
  std::vector<GpuFacts> gpus;
  bool nvidia_peermem = false;  // /sys/module/nvidia_peermem: the peer-memory route's module
  ToolOutput nvidia_smi;        // `nvidia-smi topo -m`
  std::vector<std::string> rdma_netdevs;
  std::vector<ArpScope> arp;  // read only when there are several RDMA netdevs
};

// Reads every device (only the one called `device_filter` when it is not empty) and the host.
// It creates a PD, a CQ and RC QPs on each device (to probe the inline size) and registers one
// page with IBV_ACCESS_RELAXED_ORDERING; it connects nothing. What cannot be read is recorded
// in the facts, never thrown.
Facts gather_facts(const std::string& device_filter);

// The GPUs under a sysfs tree ("/sys", or a made-up one in the tests), each placed by
// read_pci_placement.
std::vector<GpuFacts> gather_gpus(const std::string& sys_root);

// Places the function a sysfs device link points to (".../device" of an RDMA device, or
// bus/pci/devices/BDF): its host bridge, its bridges with their ACS (from each one's config
// under `sys_root`), NUMA node and IOMMU group type. An empty placement when the link does not
// lead to a PCI function.
PciPlacement read_pci_placement(const std::string& sys_root, const std::string& device_link);

}  // namespace rdmaring::doctor
