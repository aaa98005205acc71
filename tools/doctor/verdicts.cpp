#include "verdicts.hpp"

#include "format.hpp"

#include "rdmaring/wire.hpp"

#include <algorithm>
#include <utility>

namespace rdmaring::doctor {
namespace {

// Pinned bytes one producer connection costs with `ring_bytes` rings: the consumer's ring plus
// its tail-record page (mode tail only; counted always), the producer's staging mirror plus its
// credit page. An on_demand_paging ring pins nothing, but the mirror is always pinned.
struct PinCost {
  std::uint64_t consumer;
  std::uint64_t producer;
};

PinCost pin_cost(std::uint64_t ring_bytes) {
  constexpr std::uint64_t kPage = 4096;
  const std::uint64_t ring = (ring_bytes + kPage - 1) / kPage * kPage;
  return {ring + kPage, ring + kPage};
}

std::string ring_phrase(std::uint64_t ring_bytes) {
  std::string size = format_bytes(ring_bytes);
  if (const auto paren = size.find(" ("); paren != std::string::npos) {
    size = size.substr(paren + 2, size.size() - paren - 3);  // "1 MiB"
  }
  return "a " + size + " ring needs " + size + " pinned per producer, twice with the producer's staging mirror";
}

std::vector<Verdict> port_verdicts(const DeviceFacts& d) {
  std::vector<Verdict> v;
  for (const PortFacts& p : d.ports) {
    const std::string port = "port " + std::to_string(p.port);
    if (!p.active) {
      v.push_back({Level::fail, port + ": " + (p.state.empty() ? "state unknown" : p.state) +
                                    ": no connection can use it" +
                                    (p.netdev.empty() ? "" : " (is " + p.netdev + " up, with carrier?)")});
      continue;
    }
    std::string text = port + ": ACTIVE, " + p.link_layer + ", MTU " + std::to_string(p.active_mtu);
    if (!p.netdev.empty()) {
      text += " (netdev " + p.netdev + (p.netdev_mtu ? " MTU " + std::to_string(*p.netdev_mtu) : "") + ")";
    }
    Level level = Level::ok;
    if (p.link_layer == "Ethernet") {
      const auto v4 = std::find_if(p.gids.begin(), p.gids.end(), [](const GidEntry& g) {
        return g.type == "RoCE v2" && g.gid.rfind("::ffff:", 0) == 0;
      });
      if (v4 != p.gids.end()) {
        text += ", RoCE v2 GID " + std::to_string(v4->index) + " " + v4->gid;
      } else if (!p.gid_error.empty()) {
        level = Level::warn;
        text += ": GID table not read (" + p.gid_error + ")";
      } else {
        level = Level::warn;
        text += ": no IPv4 RoCE v2 GID, so rdma_cm cannot reach this port by an IPv4 address "
                "(give " + (p.netdev.empty() ? std::string("its netdev") : p.netdev) + " an address)";
      }
      if (p.active_mtu < 4096 && p.netdev_mtu && *p.netdev_mtu < 4096 + 200) {
        text += "; RDMA MTU " + std::to_string(p.active_mtu) + " follows the netdev MTU " +
                std::to_string(*p.netdev_mtu) + " (raise it to 9000 for 4096)";
      }
    }
    v.push_back({level, text});
  }
  return v;
}

// Relaxed ordering: the flag is optional in rdma-core, so a registration never fails for it;
// whether it takes effect is the driver's business and is not reported back.
Verdict relaxed_ordering_verdict(const DeviceFacts& d) {
  using RoReg = DeviceFacts::RoReg;
  switch (d.relaxed_registration) {
    case RoReg::accepted: {
      std::string why;
      if (d.software()) {
        why = d.name + " accepts IBV_ACCESS_RELAXED_ORDERING and ignores it: a software device copies in order";
      } else if (d.pcie_relaxed_ordering.value == true) {
        why = "registration accepted and PCIe Relaxed Ordering is enabled on " + d.bus_device +
              ", so placement may be reordered; the immediate's receive completion still comes after the payload";
      } else if (d.pcie_relaxed_ordering.value == false) {
        why = "registration accepted, but PCIe Relaxed Ordering is disabled on " + d.bus_device +
              ": placement stays strictly ordered";
      } else {
        why = "registration accepted; whether " + d.name + " honours it cannot be known (optional flag, " +
              "PCIe Relaxed Ordering " + d.pcie_relaxed_ordering.why +
              "); the immediate's receive completion orders the payload either way";
      }
      return {Level::ok, "payload MR relaxed, publish by imm: ok (" + why + ")"};
    }
    case RoReg::refused:
      return {Level::warn, "payload MR relaxed, publish by imm: registration refused (" + errno_name(d.relaxed_errno) +
                               "): use relaxed_ordering=false"};
    case RoReg::not_probed:
      break;
  }
  return {Level::info, "payload MR relaxed, publish by imm: not probed (" +
                           (!d.relaxed_note.empty() ? d.relaxed_note
                            : d.objects_error.empty() ? std::string("no PD")
                                                      : d.objects_error) +
                           ")"};
}

Verdict inline_verdict(const DeviceFacts& d) {
  if (!d.inline_probed) {
    return {Level::warn, "inline: not probed (" + (d.objects_error.empty() ? std::string("no QP") : d.objects_error) + ")"};
  }
  // The producer's tail records and the consumer's credits are posted inline.
  const std::size_t need = std::max(wire::kTailRecordSize, wire::kCreditRecordSize);
  if (d.max_inline >= need) {
    return {Level::ok, "inline: " + std::to_string(d.max_inline) + " B granted >= " + std::to_string(need) +
                           " B (tail record, credit record): ok"};
  }
  return {Level::fail, "inline: " + std::to_string(d.max_inline) + " B granted < " + std::to_string(need) +
                           " B: the producer's tail records and the consumer's credits are written inline; "
                           "connections on " + d.name + " are refused"};
}

Verdict odp_verdict(const DeviceFacts& d) {
  const verbs::DeviceCaps& c = d.caps;
  if (c.odp_rc_write) {
    return {Level::ok, "ODP: RC WRITE supported by " + d.name + " (implicit ODP " + (c.odp_implicit ? "yes" : "no") +
                           "): on_demand_paging rings pin nothing; pinned rings still count against RLIMIT_MEMLOCK"};
  }
  if (c.odp) {
    return {Level::info, "ODP: " + d.name + " has ODP but not for RC WRITE (RC caps: " + odp_rc_names(c.odp_rc_caps) +
                             "): rings are pinned (registration counts against RLIMIT_MEMLOCK)"};
  }
  return {Level::info, "ODP: not supported by " + d.name + ": rings are pinned (registration counts against RLIMIT_MEMLOCK)"};
}

Verdict dma_bounce_verdict(const DeviceFacts& d) {
  if (!d.caps.dma_bounce) {
    return {Level::info, "DMA bounce: not reported by this rdma-core (verbs.h has no IBV_DEVICE_CC_DMA_BOUNCE)"};
  }
  if (*d.caps.dma_bounce) {
    return {Level::warn, "DMA bounce required: not direct (" + d.name +
                             " places through bounce buffers: every byte is copied once more)"};
  }
  return {Level::ok, "DMA bounce: not required: direct"};
}

Verdict numa_verdict(const DeviceFacts& d, const ProcessFacts& process) {
  if (!d.pci.numa_node) return {Level::info, "NUMA: " + d.name + " has no node: " + d.numa_note};
  if (*d.pci.numa_node < 0) return {Level::info, "NUMA: " + d.name + " reports no node (-1): locality unknown"};
  const auto node_cpus = parse_id_list(d.numa_cpus);
  const std::string node = "NUMA: " + d.name + " on node " + std::to_string(*d.pci.numa_node);
  if (!node_cpus || node_cpus->empty() || process.cpus.empty()) {
    return {Level::info, node + " (CPUs of the node or of the process unknown)"};
  }
  std::set<int> off;
  for (int cpu : process.cpus) {
    if (node_cpus->count(cpu) == 0) off.insert(cpu);
  }
  if (off.empty()) return {Level::ok, node + ", the process runs on its CPUs (" + format_id_list(process.cpus) + ")"};
  return {Level::warn, node + " (CPUs " + d.numa_cpus + "), but the process may run on CPUs " + format_id_list(off) +
                           " off it: pin it (numactl --cpunodebind=" + std::to_string(*d.pci.numa_node) +
                           " --membind=" + std::to_string(*d.pci.numa_node) + ")"};
}

}  // namespace

const char* level_name(Level l) {
  switch (l) {
    case Level::ok: return "ok";
    case Level::info: return "info";
    case Level::warn: return "warn";
    case Level::fail: return "FAIL";
  }
  return "?";
}

bool usable(const DeviceFacts& d) { return d.error.empty() && d.queried && d.any_port_active() && d.objects_ok; }

std::size_t usable_count(const Facts& f) {
  return static_cast<std::size_t>(std::count_if(f.devices.begin(), f.devices.end(), usable));
}

std::string no_usable_device(const Facts& f) {
  if (!f.device_error.empty()) return f.device_error;
  std::string why = "no usable RDMA device:";
  for (const DeviceFacts& d : f.devices) {
    why += " " + d.name + " (" + (!d.error.empty() ? d.error : !d.any_port_active() ? "no ACTIVE port" : d.objects_error) + ")";
  }
  return why + "; for a software device load rdma_rxe and add a Soft-RoCE link (rdma link add rxe0 type rxe netdev <ifname>)";
}

std::string iommu_mode(const IommuFacts& f) {
  if ((!f.groups || *f.groups == 0) && f.units.empty()) {
    return "off: no IOMMU units, no IOMMU groups (devices DMA to physical addresses)";
  }
  if (f.group_types.empty()) {
    return f.groups && *f.groups > 0 ? "on (group domain types not readable)" : "IOMMU units present, no groups";
  }
  const bool identity = f.group_types.count("identity") != 0;
  const bool translated = f.group_types.size() > (identity ? 1U : 0U);
  if (identity && !translated) return "passthrough: every group has an identity domain";
  if (!identity) return "translated: DMA goes through IOMMU page tables";
  return "mixed: some groups identity (passthrough), some translated";
}

Verdict memlock_verdict(const verbs::MemlockState& m, std::uint64_t ring_bytes) {
  const PinCost cost = pin_cost(ring_bytes);
  const std::string why = " (" + ring_phrase(ring_bytes) + ")";
  if (m.cap_ipc_lock) return {Level::ok, "memlock: not enforced, the process has CAP_IPC_LOCK" + why};
  if (!m.soft_limit) return {Level::ok, "memlock: unlimited" + why};
  const std::uint64_t limit = *m.soft_limit;
  const std::uint64_t room = limit > m.pinned ? limit - m.pinned : 0;
  const std::uint64_t consumers = room / cost.consumer;
  const std::uint64_t pairs = room / (cost.consumer + cost.producer);
  std::string text = "memlock: soft limit " + format_bytes(limit) + ", " + format_bytes(m.pinned) + " pinned: room for " +
                     std::to_string(consumers) + " consumer ring" + (consumers == 1 ? "" : "s") + ", " +
                     std::to_string(pairs) + " producer+consumer pair" + (pairs == 1 ? "" : "s") + " in one process" + why;
  const bool raisable = !m.hard_limit || *m.hard_limit > limit;
  const std::string raise =
      raisable ? "; raise it (ulimit -l, up to the hard limit " +
                     (m.hard_limit ? format_bytes(*m.hard_limit) : std::string("unlimited")) + ")"
               : "; the hard limit is no higher: raise it in limits.conf or grant CAP_IPC_LOCK";
  if (consumers == 0) return {Level::fail, text + raise};
  if (pairs == 0) return {Level::warn, text + raise};
  return {Level::ok, text};
}

std::vector<Verdict> arp_verdicts(const std::vector<std::string>& netdevs, const std::vector<ArpScope>& scopes) {
  if (netdevs.size() < 2) {
    return {{Level::info, "ARP: " + std::string(netdevs.empty() ? "no RDMA netdev" : "one RDMA netdev (" + netdevs[0] + ")") +
                              ": arp_ignore/arp_announce do not matter"}};
  }
  const auto find = [&](const std::string& name) -> const ArpScope* {
    const auto it = std::find_if(scopes.begin(), scopes.end(), [&](const ArpScope& s) { return s.scope == name; });
    return it == scopes.end() ? nullptr : &*it;
  };
  const ArpScope* all = find("all");
  std::vector<std::string> at_defaults;
  for (const std::string& dev : netdevs) {
    const ArpScope* d = find(dev);
    // The kernel uses the larger of conf/all and conf/<dev> for both.
    const int ignore = std::max(all && all->arp_ignore ? *all->arp_ignore : 0, d && d->arp_ignore ? *d->arp_ignore : 0);
    const int announce = std::max(all && all->arp_announce ? *all->arp_announce : 0, d && d->arp_announce ? *d->arp_announce : 0);
    if (ignore == 0 && announce == 0) at_defaults.push_back(dev);
  }
  std::string list;
  for (const std::string& d : (at_defaults.empty() ? netdevs : at_defaults)) list += (list.empty() ? "" : ", ") + d;
  if (at_defaults.empty()) {
    return {{Level::ok, "ARP: " + std::to_string(netdevs.size()) + " RDMA netdevs (" + list +
                            "), none at arp_ignore/arp_announce defaults 0/0"}};
  }
  return {{Level::warn, "ARP: arp_ignore/arp_announce at their defaults (0/0) on " + list + " with " +
                            std::to_string(netdevs.size()) +
                            " RDMA netdevs: a neighbour may learn one port's address at another port's "
                            "MAC, and rdma_cm then resolves to the wrong device; set "
                            "net.ipv4.conf.all.arp_ignore=1 and net.ipv4.conf.all.arp_announce=2"}};
}

std::vector<Verdict> device_verdicts(const DeviceFacts& d, const ProcessFacts& process) {
  if (!d.error.empty()) return {{Level::fail, d.name + ": not usable: " + d.error}};
  std::vector<Verdict> v = port_verdicts(d);
  if (!d.queried) return v;
  v.push_back(relaxed_ordering_verdict(d));
  v.push_back({Level::ok, "tail mode: relies on in-order placement (no relaxed ordering): ok (the ring is "
                          "registered without IBV_ACCESS_RELAXED_ORDERING; relaxed_ordering with tail is refused)"});
  v.push_back(inline_verdict(d));
  v.push_back(odp_verdict(d));
  v.push_back(dma_bounce_verdict(d));
  if (d.caps.max_mr_size != 0) {
    // The consumer registers the ring as one MR.
    v.push_back({Level::ok, "max MR size: " + format_bytes(d.caps.max_mr_size) + ": a ring may be as large as that"});
  }
  v.push_back(numa_verdict(d, process));
  return v;
}

namespace {

bool translated(const std::string& iommu_group_type) { return iommu_group_type.rfind("DMA", 0) == 0; }

std::string listed(const std::vector<std::string>& items) { return joined(items, ", "); }

}  // namespace

GpuDirect gpudirect(const GpuFacts& g, const DeviceFacts& d) {
  GpuDirect r;
  const auto no = [&r](std::string why) { r.because_not.push_back(std::move(why)); };
  if (d.software()) {
    no(d.name + " is a software device" + (d.parent.empty() ? std::string() : " over " + d.parent) +
       ": it has no DMA engine, the CPU copies what it places, so GPU memory would be read by the CPU");
    return r;
  }
  if (g.pci.path.empty() || g.pci.host_bridge.empty() || d.pci.host_bridge.empty()) {
    no("the PCI path of " + (g.pci.host_bridge.empty() ? "GPU " + g.bdf : d.name) + " is not in sysfs");
    return r;
  }
  r.route = route_between(g.pci, d.pci);
  const PciRoute& route = *r.route;
  switch (route.cls) {
    case PathClass::pix:
    case PathClass::pxb:
      if (!route.redirecting.empty()) {
        no("ACS on " + listed(route.redirecting) +
           " redirects peer-to-peer requests to the root complex (P2P Request/Completion Redirect or Egress Control on): "
           "turn it off there (the kernel's pci=disable_acs_redir=, or setpci)");
      }
      if (!route.acs_unknown.empty()) {
        r.caveats.push_back("ACS of " + listed(route.acs_unknown) +
                            " not readable (configuration space past 64 bytes needs root): run as root to know "
                            "whether it redirects peer-to-peer traffic");
      }
      break;
    case PathClass::phb:
    case PathClass::node:
      r.caveats.push_back(std::string("the transfer goes ") + path_class_words(route.cls) +
                          ": peer-to-peer through a root complex is slow or unsupported on many CPUs; measure it "
                          "(ib_write_bw --use_cuda) before relying on it");
      break;
    case PathClass::sys:
      no(std::string("the transfer would go ") + path_class_words(route.cls) + " (" + route.why +
         "): GPUDirect RDMA is not supported across it");
      break;
  }
  for (const auto& [who, type] : {std::pair{"GPU " + g.bdf, g.pci.iommu_group_type}, std::pair{d.name, d.pci.iommu_group_type}}) {
    if (translated(type)) {
      no("the IOMMU translates DMA for " + who + " (domain type " + type +
         "): GPUDirect RDMA needs it off or in pass-through (iommu=pt)");
    }
  }
  switch (d.dmabuf_registration) {
    case DeviceFacts::DmabufReg::unsupported:
      no(d.name + " refuses dma-buf registration (ibv_reg_dmabuf_mr: " + errno_name(d.dmabuf_errno) +
         "), rdmaring's only way to register GPU memory");
      break;
    case DeviceFacts::DmabufReg::not_probed:
      r.caveats.push_back(d.name + "'s dma-buf registration not probed (no PD could be made)");
      break;
    case DeviceFacts::DmabufReg::supported: break;
  }
  if (g.driver.empty()) r.caveats.push_back("no driver bound to GPU " + g.bdf);
  return r;
}

namespace {

Verdict gpudirect_verdict(const GpuFacts& g, const DeviceFacts& d, const GpuDirect& p) {
  std::string text = "GPUDirect RDMA GPU " + g.bdf + " <-> " + d.name + ": ";
  if (p.route) text += std::string(path_class_name(p.route->cls)) + " (" + path_class_words(p.route->cls) + "), ";
  if (!p.possible()) return {Level::warn, text + "not possible: because " + listed(p.because_not)};
  if (p.caveats.empty()) return {Level::ok, text + "possible"};
  return {Level::warn, text + "possible, but " + listed(p.caveats)};
}

}  // namespace

Verdicts judge(const Facts& f, std::uint64_t ring_bytes) {
  Verdicts r;
  r.ring_bytes = ring_bytes;
  for (const DeviceFacts& d : f.devices) r.devices.push_back(device_verdicts(d, f.process));
  if (f.devices.empty()) {
    r.host.push_back({Level::fail, "devices: " + (f.device_error.empty() ? std::string("none") : f.device_error)});
  } else if (usable_count(f) == 0) {
    r.host.push_back({Level::fail, "devices: none usable (no ACTIVE port, or PD/CQ/QP creation failed)"});
  }
  r.host.push_back(memlock_verdict(f.memlock, ring_bytes));
  for (Verdict& v : arp_verdicts(f.rdma_netdevs, f.arp)) r.host.push_back(std::move(v));
  for (const GpuFacts& g : f.gpus) {
    for (std::size_t i = 0; i < f.devices.size(); ++i) {
      GpuDirect p = gpudirect(g, f.devices[i]);
      p.gpu = g.bdf;
      p.device = f.devices[i].name;
      p.verdict = gpudirect_verdict(g, f.devices[i], p);
      r.host.push_back(p.verdict);
      r.gpudirect.push_back(std::move(p));
    }
  }
  if (f.gpus.empty()) {
    r.host.push_back({Level::info, "GPUDirect RDMA: no GPU on the PCI bus (no 3D controller, no NVIDIA or AMD VGA controller in /sys/bus/pci/devices)"});
  } else if (f.devices.empty()) {
    std::vector<std::string> bdfs;
    for (const GpuFacts& g : f.gpus) bdfs.push_back(g.bdf);
    r.host.push_back({Level::warn, "GPUDirect RDMA: not possible for GPU " + listed(bdfs) + ": because there is no RDMA device"});
  }
  if (f.iommu.groups && *f.iommu.groups > 0) {
    r.host.push_back({Level::info, "IOMMU: " + iommu_mode(f.iommu) +
                                       (f.iommu.group_types.count("identity") ? "" : "; registration maps every ring page through it")});
  }
  return r;
}

}  // namespace rdmaring::doctor
