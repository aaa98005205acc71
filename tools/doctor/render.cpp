#include "render.hpp"

#include "format.hpp"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <string_view>

namespace rdmaring::doctor {
namespace {

using Json = nlohmann::ordered_json;

const char* ro_registration_name(DeviceFacts::RoReg r) {
  switch (r) {
    case DeviceFacts::RoReg::accepted: return "accepted";
    case DeviceFacts::RoReg::refused: return "refused";
    case DeviceFacts::RoReg::not_probed: return "not probed";
  }
  return "?";
}

const char* atomic_name(ibv_atomic_cap a) {
  switch (a) {
    case IBV_ATOMIC_NONE: return "none";
    case IBV_ATOMIC_HCA: return "HCA (atomic among this device's operations)";
    case IBV_ATOMIC_GLOB: return "global (atomic with CPU and other devices too)";
  }
  return "?";
}

std::string relaxed_ordering_phrase(const DeviceFacts& d) {
  std::string s = "registration with IBV_ACCESS_RELAXED_ORDERING " + std::string(ro_registration_name(d.relaxed_registration));
  if (d.relaxed_registration == DeviceFacts::RoReg::refused) s += " (" + errno_name(d.relaxed_errno) + ")";
  return s;
}

std::string pcie_ro_phrase(const DeviceFacts& d) {
  if (d.software()) return "no PCI function (software device): the flag has no effect";
  if (d.pcie_relaxed_ordering.value) {
    return std::string("PCIe Relaxed Ordering ") + (*d.pcie_relaxed_ordering.value ? "enabled" : "disabled") + " on " +
           d.bus_device + " (Device Control)";
  }
  return "PCIe Relaxed Ordering on " + d.bus_device + ": " + d.pcie_relaxed_ordering.why;
}

std::string inline_phrase(const DeviceFacts& d) {
  if (!d.inline_probed) return "not probed: " + (d.objects_error.empty() ? std::string("no QP could be created") : d.objects_error);
  std::string s = std::to_string(d.max_inline) + " B granted";
  if (d.inline_refused) {
    s += ", " + std::to_string(*d.inline_refused) + " B refused (" + errno_name(d.inline_errno) + ")";
  } else {
    s += " (not probed further)";
  }
  return s + "; asking 0 B grants " + std::to_string(d.inline_default) + " B";
}

std::string opt_int(const std::optional<int>& v) { return v ? std::to_string(*v) : std::string("unreadable"); }

std::string limit_phrase(const std::optional<std::uint64_t>& v) { return v ? format_bytes(*v) : std::string("unlimited"); }

// ----- text -------------------------------------------------------------------------------------

class TextWriter {
 public:
  static constexpr std::size_t kKeyWidth = 18;
  void section(const std::string& title) {
    if (!out_.empty()) out_ += '\n';
    out_ += title + '\n';
  }
  // "  key               value", continuation lines aligned under the value.
  void kv(std::string_view key, const std::vector<std::string>& lines, std::size_t indent = 2) {
    std::string head(indent, ' ');
    head += key;
    const std::size_t col = 2 + kKeyWidth;  // one value column, whatever the key's indent
    if (head.size() + 1 > col) {
      head += ' ';
    } else {
      head.resize(col, ' ');
    }
    bool first = true;
    for (const std::string& line : lines.empty() ? std::vector<std::string>{""} : lines) {
      out_ += first ? head : std::string(col, ' ');
      out_ += line;
      // No trailing blanks when a value is empty.
      while (!out_.empty() && out_.back() == ' ') out_.pop_back();
      out_ += '\n';
      first = false;
    }
  }
  void kv(std::string_view key, const std::string& value, std::size_t indent = 2) { kv(key, std::vector<std::string>{value}, indent); }
  void verdicts(const std::vector<Verdict>& vs, std::size_t indent) {
    for (const Verdict& v : vs) {
      std::string level = level_name(v.level);
      level.resize(6, ' ');
      out_ += std::string(indent, ' ') + level + v.text + '\n';
    }
  }
  void raw(const std::string& text, std::size_t indent) {
    std::size_t start = 0;
    while (start < text.size()) {
      std::size_t end = text.find('\n', start);
      if (end == std::string::npos) end = text.size();
      const std::string line = text.substr(start, end - start);
      out_ += (line.empty() ? std::string() : std::string(indent, ' ') + line) + '\n';
      start = end + 1;
    }
  }
  const std::string& str() const noexcept { return out_; }

 private:
  std::string out_;
};

void text_port(TextWriter& t, const PortFacts& p) {
  std::string line = p.state + (p.phys_state.empty() ? "" : " (" + p.phys_state + ")") + ", " + p.link_layer;
  if (!p.rate.empty()) line += ", " + p.rate;
  t.kv("port " + std::to_string(p.port), line);
  std::string mtu = std::to_string(p.active_mtu) + " active, " + std::to_string(p.max_mtu) + " max";
  if (!p.netdev.empty()) mtu += "; netdev " + p.netdev + " MTU " + opt_int(p.netdev_mtu);
  t.kv("MTU", mtu, 4);
  std::size_t width = 0;
  for (const GidEntry& g : p.gids) width = std::max(width, g.gid.size());
  for (const GidEntry& g : p.gids) {
    std::string gid = g.gid;
    gid.resize(width + 2, ' ');
    std::string type = g.type;
    type.resize(12, ' ');
    t.kv("GID " + std::to_string(g.index), gid + type + (g.netdev.empty() ? "-" : g.netdev), 4);
  }
  std::string table = std::to_string(p.gids.size()) + " of " + std::to_string(p.gid_table_len) + " entries in use";
  if (!p.gid_error.empty()) table += "; stopped at " + p.gid_error;
  t.kv("GID table", table, 4);
}

void text_caps(TextWriter& t, const DeviceFacts& d) {
  const verbs::DeviceCaps& c = d.caps;
  t.kv("ODP", std::string(c.odp ? "yes" : "no") + " (RC: " + odp_rc_names(c.odp_rc_caps) + "; RC WRITE " +
                  (c.odp_rc_write ? "yes" : "no") + "); implicit ODP " + (c.odp_implicit ? "yes" : "no"));
  t.kv("relaxed ordering", {relaxed_ordering_phrase(d), pcie_ro_phrase(d),
                            "rdma-core treats the flag as optional: never refused for it, never told whether it took effect"});
  t.kv("DMA bounce", c.dma_bounce ? (*c.dma_bounce ? "required (IBV_DEVICE_CC_DMA_BOUNCE)" : "not required")
                                  : "not reported by this rdma-core (verbs.h has no IBV_DEVICE_CC_DMA_BOUNCE)");
  t.kv("max MR size", format_bytes(c.max_mr_size));
  t.kv("max inline", inline_phrase(d));
  t.kv("atomics", atomic_name(c.atomic_cap));
  t.kv("limits", "max_qp " + std::to_string(c.max_qp) + ", max_qp_wr " + std::to_string(c.max_qp_wr) + ", max_sge " +
                     std::to_string(c.max_sge) + ", max_cqe " + std::to_string(c.max_cqe) + ", max_mr " +
                     std::to_string(c.max_mr) + ", max_srq_wr " + std::to_string(c.max_srq_wr) + ", max_qp_rd_atom " +
                     std::to_string(c.max_qp_rd_atom));
}

// The IOMMU group and the PCI path with each function's ACS; the NUMA node is the caller's.
void text_placement(TextWriter& t, const PciPlacement& p, const std::string& no_path) {
  t.kv("IOMMU group", p.iommu_group_type.empty() ? std::string("none") : "domain type " + p.iommu_group_type);
  if (p.path.empty()) {
    t.kv("PCI path, ACS", no_path);
    return;
  }
  for (std::size_t i = 0; i < p.path.size(); ++i) {
    t.kv(i == 0 ? "PCI path, ACS" : "", p.path[i].bdf + (i == 0 ? " (device)" : "") + ": ACS " + p.path[i].acs);
  }
  t.kv("", p.host_bridge + " (host bridge)");
}

std::string dmabuf_phrase(const DeviceFacts& d) {
  switch (d.dmabuf_registration) {
    case DeviceFacts::DmabufReg::supported:
      return "taken by the provider and driver (a probe without a dma-buf got as far as the descriptor: " +
             errno_name(d.dmabuf_errno) + ")";
    case DeviceFacts::DmabufReg::unsupported: return "refused (ibv_reg_dmabuf_mr: " + errno_name(d.dmabuf_errno) + ")";
    case DeviceFacts::DmabufReg::not_probed: return "not probed (no PD)";
  }
  return "?";
}

const char* dmabuf_name(DeviceFacts::DmabufReg r) {
  switch (r) {
    case DeviceFacts::DmabufReg::supported: return "supported";
    case DeviceFacts::DmabufReg::unsupported: return "unsupported";
    case DeviceFacts::DmabufReg::not_probed: return "not probed";
  }
  return "?";
}

void text_gpus(TextWriter& t, const Facts& f, const Verdicts& v) {
  t.section("GPUs and GPUDirect RDMA (sysfs)");
  if (f.gpus.empty()) t.kv("GPUs", "none (no 3D controller, no NVIDIA or AMD VGA controller on the PCI bus)");
  for (const GpuFacts& g : f.gpus) {
    t.kv("GPU " + g.bdf, g.vendor + ":" + g.device_id + (g.driver.empty() ? ", no driver bound" : ", driver " + g.driver));
    t.kv("NUMA node", g.pci.numa_node ? std::to_string(*g.pci.numa_node) : std::string("absent"), 4);
    text_placement(t, g.pci, "unknown");
  }
  t.kv("nvidia_peermem", f.nvidia_peermem ? "loaded (the peer-memory route; rdmaring uses dma-buf)" : "not loaded");
  for (const GpuDirect& p : v.gpudirect) {
    if (!p.route) continue;
    t.kv(p.gpu + " <-> " + p.device, std::string(path_class_name(p.route->cls)) + ": " + p.route->why);
    if (!p.route->crossed.empty()) t.kv("bridges crossed", joined(p.route->crossed, ", "), 4);
  }
  t.kv("route taken", {"GPU delivery (gpu/) reads a host ring with the GPU's copy engine, whatever the verdicts below;",
                       "a GPU-resident ring needs GPUDirect RDMA possible and CUDA's dma-buf export, which gpu/ checks",
                       "when asked for one, refusing by name"});
}

void text_device(TextWriter& t, const DeviceFacts& d, const std::vector<Verdict>& verdicts) {
  t.section("device " + d.name + (usable(d) ? "" : " (not usable)"));
  t.kv("node GUID", d.node_guid);
  t.kv("node type", d.node_type);
  t.kv("transport", d.transport);
  if (d.software()) {
    t.kv("bus device", "none: a software device" + (d.parent.empty() ? std::string() : " on netdev " + d.parent));
  } else {
    t.kv("bus device", d.bus_device + (d.driver.empty() ? "" : ", driver " + d.driver));
  }
  if (!d.error.empty()) {
    t.kv("error", d.error);
    return;
  }
  if (d.queried) {
    char vendor[48];
    std::snprintf(vendor, sizeof vendor, "vendor 0x%x part %u", d.caps.vendor_id, d.caps.vendor_part_id);
    t.kv("firmware", (d.caps.fw_ver.empty() ? std::string("(none)") : d.caps.fw_ver) + ", " + vendor);
  }
  for (const PortFacts& p : d.ports) text_port(t, p);
  if (d.queried) text_caps(t, d);
  if (!d.objects_ok && !d.objects_error.empty()) t.kv("PD/CQ/QP", "failed: " + d.objects_error);
  if (d.pci.numa_node) {
    t.kv("NUMA node", std::to_string(*d.pci.numa_node) + (d.numa_cpus.empty() ? "" : " (CPUs " + d.numa_cpus + ")"));
  } else {
    t.kv("NUMA node", "absent: " + d.numa_note);
  }
  text_placement(t, d.pci, d.software() ? "none (software device)" : "unknown");
  t.kv("dma-buf MR", dmabuf_phrase(d));
  t.kv("verdicts", std::vector<std::string>{});
  t.verdicts(verdicts, 4);
}

void text_host(TextWriter& t, const Facts& f, const Verdicts& v) {
  t.section("process");
  t.kv("CPU affinity", f.process.affinity_error.empty()
                           ? format_id_list(f.process.cpus) + " (" + std::to_string(f.process.cpus.size()) + " CPUs)"
                           : f.process.affinity_error);
  t.kv("memory policy", f.process.mempolicy);
  t.kv("Mems_allowed", f.process.mems_allowed.empty() ? std::string("unreadable") : f.process.mems_allowed);

  t.section("memlock");
  t.kv("RLIMIT_MEMLOCK", "soft " + limit_phrase(f.memlock.soft_limit) + ", hard " + limit_phrase(f.memlock.hard_limit));
  t.kv("CAP_IPC_LOCK", f.memlock.cap_ipc_lock ? "yes (limit not enforced)" : "no");
  t.kv("VmLck", format_bytes(f.memlock.locked));
  t.kv("VmPin", format_bytes(f.memlock.pinned));

  t.section("IOMMU");
  t.kv("mode", iommu_mode(f.iommu));
  t.kv("units", joined(f.iommu.units, " ", "none (/sys/class/iommu empty or absent)"));
  t.kv("kernel cmdline", joined(f.iommu.cmdline, " ", "no iommu=, intel_iommu=, amd_iommu=, iommu.* argument"));
  std::string groups = f.iommu.groups ? std::to_string(*f.iommu.groups) : std::string("absent (/sys/kernel/iommu_groups)");
  std::vector<std::string> types;
  for (const auto& [type, n] : f.iommu.group_types) types.push_back(std::to_string(n) + " " + type);
  if (!types.empty()) groups += " (" + joined(types, ", ") + ")";
  t.kv("IOMMU groups", groups);

  t.section("GPU topology (nvidia-smi topo -m)");
  if (!f.nvidia_smi.present) {
    t.kv("nvidia-smi", "none (not in PATH)");
  } else {
    const int status = f.nvidia_smi.status;
    t.kv("nvidia-smi", f.nvidia_smi.path + (status == 0 ? std::string()
                                                         : ", exit status " + std::to_string(status) +
                                                               (status == 124 ? " (timed out)" : "")));
    t.raw(f.nvidia_smi.output, 2);
  }

  text_gpus(t, f, v);

  t.section("ARP (rdma_cm address resolution)");
  t.kv("RDMA netdevs", joined(f.rdma_netdevs, ", ", "none"));
  for (const ArpScope& a : f.arp) {
    t.kv("conf." + a.scope, "arp_ignore " + opt_int(a.arp_ignore) + ", arp_announce " + opt_int(a.arp_announce));
  }
  if (f.arp.empty()) t.kv("sysctls", "not read: they matter only with several RDMA netdevs");
}

// ----- JSON -------------------------------------------------------------------------------------

// Absent facts are empty strings or empty optionals in the structs, and null in the JSON.
Json or_null(const std::string& s) { return s.empty() ? Json(nullptr) : Json(s); }

template <class T>
Json or_null(const std::optional<T>& v) {
  return v ? Json(*v) : Json(nullptr);
}

Json json_verdict(const Verdict& v) {
  // Lower case in JSON: "FAIL" is shouted only for a person.
  return {{"level", v.level == Level::fail ? "fail" : level_name(v.level)}, {"text", v.text}};
}

Json json_verdicts(const std::vector<Verdict>& vs) {
  Json a = Json::array();
  for (const Verdict& v : vs) a.push_back(json_verdict(v));
  return a;
}

Json json_port(const PortFacts& p) {
  Json gids = Json::array();
  for (const GidEntry& g : p.gids) {
    gids.push_back({{"index", g.index}, {"gid", g.gid}, {"type", g.type}, {"netdev", or_null(g.netdev)}});
  }
  return {{"port", p.port},
          {"state", p.state},
          {"phys_state", p.phys_state},
          {"link_layer", p.link_layer},
          {"active_mtu", p.active_mtu},
          {"max_mtu", p.max_mtu},
          {"rate", p.rate},
          {"netdev", or_null(p.netdev)},
          {"netdev_mtu", or_null(p.netdev_mtu)},
          {"gid_table_len", p.gid_table_len},
          {"gids", std::move(gids)},
          {"gid_error", or_null(p.gid_error)}};
}

Json json_caps(const DeviceFacts& d) {
  const verbs::DeviceCaps& c = d.caps;
  return {{"fw_ver", c.fw_ver},
          {"vendor_id", c.vendor_id},
          {"vendor_part_id", c.vendor_part_id},
          {"odp", {{"supported", c.odp}, {"implicit", c.odp_implicit}, {"rc_write", c.odp_rc_write}, {"rc_caps", odp_rc_names(c.odp_rc_caps)}}},
          {"relaxed_ordering",
           {{"registration", ro_registration_name(d.relaxed_registration)},
            {"pcie_enabled", or_null(d.pcie_relaxed_ordering.value)},
            {"note", pcie_ro_phrase(d)}}},
          {"dma_bounce", c.dma_bounce ? Json(*c.dma_bounce) : Json("not reported by this rdma-core")},
          {"max_mr_size", c.max_mr_size},
          {"max_inline",
           {{"probed", d.inline_probed},
            {"granted", d.inline_probed ? Json(d.max_inline) : Json(nullptr)},
            {"refused_at", or_null(d.inline_refused)},
            {"refused_errno", d.inline_refused ? Json(d.inline_errno) : Json(nullptr)}}},
          {"atomics", c.atomic_cap == IBV_ATOMIC_NONE ? "none" : c.atomic_cap == IBV_ATOMIC_HCA ? "hca" : "global"},
          {"max_qp", c.max_qp},
          {"max_qp_wr", c.max_qp_wr},
          {"max_sge", c.max_sge},
          {"max_cqe", c.max_cqe},
          {"max_mr", c.max_mr},
          {"max_srq_wr", c.max_srq_wr},
          {"max_qp_rd_atom", c.max_qp_rd_atom},
          {"device_cap_flags_ex", c.device_cap_flags}};
}

Json json_pci_path(const PciPlacement& p) {
  Json a = Json::array();
  for (const PciFunction& f : p.path) a.push_back({{"bdf", f.bdf}, {"acs", f.acs}, {"acs_redirects", or_null(f.acs_redirects)}});
  return a;
}

Json json_gpus(const Facts& f) {
  Json a = Json::array();
  for (const GpuFacts& g : f.gpus) {
    a.push_back({{"bdf", g.bdf},
                 {"vendor", g.vendor},
                 {"device", g.device_id},
                 {"driver", or_null(g.driver)},
                 {"numa_node", or_null(g.pci.numa_node)},
                 {"iommu_group_type", or_null(g.pci.iommu_group_type)},
                 {"host_bridge", or_null(g.pci.host_bridge)},
                 {"pci_path", json_pci_path(g.pci)}});
  }
  return a;
}

Json json_gpudirect(const Verdicts& v) {
  Json a = Json::array();
  for (const GpuDirect& p : v.gpudirect) {
    Json route = nullptr;
    if (p.route) {
      route = {{"class", path_class_name(p.route->cls)},
               {"words", path_class_words(p.route->cls)},
               {"why", p.route->why},
               {"crossed", p.route->crossed},
               {"acs_redirecting", p.route->redirecting},
               {"acs_unknown", p.route->acs_unknown}};
    }
    a.push_back({{"gpu", p.gpu},
                 {"rdma_device", p.device},
                 {"route", std::move(route)},
                 {"possible", p.possible()},
                 {"because_not", p.because_not},
                 {"caveats", p.caveats},
                 {"verdict", json_verdict(p.verdict)}});
  }
  return a;
}

Json json_device(const DeviceFacts& d, const std::vector<Verdict>& verdicts) {
  Json ports = Json::array();
  for (const PortFacts& p : d.ports) ports.push_back(json_port(p));
  return {{"name", d.name},
          {"usable", usable(d)},
          {"error", or_null(d.error)},
          {"node_guid", d.node_guid},
          {"node_type", d.node_type},
          {"transport", d.transport},
          {"software", d.software()},
          {"parent_netdev", or_null(d.parent)},
          {"bus_device", or_null(d.bus_device)},
          {"driver", or_null(d.driver)},
          {"ports", std::move(ports)},
          {"caps", d.queried ? json_caps(d) : Json(nullptr)},
          {"objects", {{"created", d.objects_ok}, {"error", or_null(d.objects_error)}}},
          {"numa_node", or_null(d.pci.numa_node)},
          {"numa_note", or_null(d.numa_note)},
          {"numa_cpus", or_null(d.numa_cpus)},
          {"iommu_group_type", or_null(d.pci.iommu_group_type)},
          {"host_bridge", or_null(d.pci.host_bridge)},
          {"pci_path", json_pci_path(d.pci)},
          {"dmabuf_registration", {{"result", dmabuf_name(d.dmabuf_registration)}, {"errno", d.dmabuf_errno}}},
          {"verdicts", json_verdicts(verdicts)}};
}

}  // namespace

std::string render_text(const Facts& f, const Verdicts& v) {
  TextWriter t;
  std::vector<std::string> names;
  for (const DeviceFacts& d : f.devices) names.push_back(d.name);
  std::string head = "rdmaring doctor: " + std::to_string(f.devices.size()) + " verbs device" +
                     (f.devices.size() == 1 ? "" : "s");
  if (!names.empty()) head += " (" + joined(names, ", ") + ")";
  head += ", " + std::to_string(usable_count(f)) + " usable";
  if (!f.filter.empty()) head += " [--device " + f.filter + "]";
  t.section(head);
  if (!f.device_error.empty()) t.raw(f.device_error, 2);
  for (std::size_t i = 0; i < f.devices.size(); ++i) text_device(t, f.devices[i], v.devices.at(i));
  text_host(t, f, v);
  t.section("verdicts (host)");
  t.verdicts(v.host, 2);
  return t.str();
}

std::string render_json(const Facts& f, const Verdicts& v) {
  Json devices = Json::array();
  for (std::size_t i = 0; i < f.devices.size(); ++i) devices.push_back(json_device(f.devices[i], v.devices.at(i)));
  std::vector<Json> arp;
  for (const ArpScope& a : f.arp) {
    arp.push_back({{"scope", a.scope}, {"arp_ignore", or_null(a.arp_ignore)}, {"arp_announce", or_null(a.arp_announce)}});
  }
  Json group_types = Json::object();
  for (const auto& [type, n] : f.iommu.group_types) group_types[type] = n;
  const Json j = {
      {"tool", "rdmaring doctor"},
      {"device_filter", or_null(f.filter)},
      {"usable_devices", usable_count(f)},
      {"error", or_null(f.device_error)},
      {"ring_bytes", v.ring_bytes},
      {"devices", std::move(devices)},
      {"process",
       {{"cpu_affinity", f.process.affinity_error.empty() ? Json(format_id_list(f.process.cpus)) : Json(nullptr)},
        {"mempolicy", f.process.mempolicy},
        {"mems_allowed", f.process.mems_allowed}}},
      {"memlock",
       {{"soft", or_null(f.memlock.soft_limit)},
        {"hard", or_null(f.memlock.hard_limit)},
        {"unlimited", !f.memlock.soft_limit},
        {"cap_ipc_lock", f.memlock.cap_ipc_lock},
        {"vm_lck", f.memlock.locked},
        {"vm_pin", f.memlock.pinned}}},
      {"iommu",
       {{"mode", iommu_mode(f.iommu)},
        {"units", f.iommu.units},
        {"cmdline", f.iommu.cmdline},
        {"groups", or_null(f.iommu.groups)},
        {"group_types", std::move(group_types)}}},
      {"gpus", json_gpus(f)},
      {"nvidia_peermem", f.nvidia_peermem},
      {"gpudirect", json_gpudirect(v)},
      {"nvidia_smi_topo", f.nvidia_smi.present ? Json{{"path", f.nvidia_smi.path},
                                                      {"status", f.nvidia_smi.status},
                                                      {"output", f.nvidia_smi.output}}
                                               : Json(nullptr)},
      {"rdma_netdevs", f.rdma_netdevs},
      {"arp", Json(std::move(arp))},
      {"verdicts", json_verdicts(v.host)}};
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

}  // namespace rdmaring::doctor
