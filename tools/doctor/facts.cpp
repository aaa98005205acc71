#include "facts.hpp"

#include "format.hpp"

#include "rdmaring/error.hpp"
#include "rdmaring/verbs/cq.hpp"
#include "rdmaring/verbs/pd.hpp"

#include <infiniband/verbs.h>

#include <dirent.h>
#include <endian.h>
#include <fcntl.h>
#include <net/if.h>
#include <sched.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <span>
#include <sstream>
#include <utility>

namespace rdmaring::doctor {
namespace {

constexpr const char* kSysIb = "/sys/class/infiniband/";
constexpr int kNvidiaSmiTimeoutS = 10;

// ----- files ------------------------------------------------------------------------------------

// The first line of a small file, without its newline; nullopt when it cannot be read.
std::optional<std::string> read_line(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  char buf[4096];
  ssize_t n = 0;
  do {
    n = read(fd, buf, sizeof buf);
  } while (n < 0 && errno == EINTR);
  close(fd);
  if (n < 0) return std::nullopt;
  std::string line(buf, static_cast<std::size_t>(n));
  if (const auto nl = line.find('\n'); nl != std::string::npos) line.resize(nl);
  while (!line.empty() && (line.back() == ' ' || line.back() == '\0')) line.pop_back();
  return line;
}

std::optional<int> read_int(const std::string& path) {
  const auto line = read_line(path);
  if (!line || line->empty()) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(line->c_str(), &end, 10);
  if (errno != 0 || end == line->c_str() || v < INT_MIN || v > INT_MAX) return std::nullopt;
  return static_cast<int>(v);
}

std::vector<std::string> list_dir(const std::string& path) {
  std::vector<std::string> names;
  if (DIR* dir = opendir(path.c_str())) {
    while (const dirent* e = readdir(dir)) {
      if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) names.emplace_back(e->d_name);
    }
    closedir(dir);
  }
  std::sort(names.begin(), names.end());
  return names;
}

bool exists(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0;
}

std::string real_path(const std::string& path) {
  char buf[PATH_MAX];
  return realpath(path.c_str(), buf) != nullptr ? std::string(buf) : std::string();
}

std::string base_name(const std::string& path) {
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::vector<std::uint8_t> read_bytes(const std::string& path, std::size_t max) {
  std::vector<std::uint8_t> bytes;
  std::ifstream in(path, std::ios::binary);
  if (!in) return bytes;
  bytes.resize(max);
  in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(max));
  bytes.resize(static_cast<std::size_t>(in.gcount()));
  return bytes;
}

// "0000:3b:00.0"
bool is_bdf(const std::string& s) {
  return s.size() == 12 && s[4] == ':' && s[7] == ':' && s[10] == '.' &&
         std::all_of(s.begin(), s.end(), [](char c) { return std::isxdigit(static_cast<unsigned char>(c)) || c == ':' || c == '.'; });
}

std::string errno_text(int err) { return std::string(std::strerror(err)) + " (" + errno_name(err) + ")"; }

// ----- devices ----------------------------------------------------------------------------------

std::string transport_name(ibv_transport_type t) {
  switch (t) {
    case IBV_TRANSPORT_IB: return "InfiniBand verbs (IB or RoCE: see the link layer)";
    case IBV_TRANSPORT_IWARP: return "iWARP";
    case IBV_TRANSPORT_USNIC: return "usNIC";
    case IBV_TRANSPORT_USNIC_UDP: return "usNIC UDP";
    case IBV_TRANSPORT_UNSPECIFIED: return "unspecified";
    default: return "unknown (" + std::to_string(static_cast<int>(t)) + ")";
  }
}

std::string link_layer_name(std::uint8_t l) {
  switch (l) {
    case IBV_LINK_LAYER_INFINIBAND: return "InfiniBand";
    case IBV_LINK_LAYER_ETHERNET: return "Ethernet";
    default: return "unspecified";
  }
}

// As sysfs and ibv_devinfo spell it ("ACTIVE"); ibv_port_state_str says "active".
std::string port_state_name(ibv_port_state s) {
  switch (s) {
    case IBV_PORT_NOP: return "NOP";
    case IBV_PORT_DOWN: return "DOWN";
    case IBV_PORT_INIT: return "INIT";
    case IBV_PORT_ARMED: return "ARMED";
    case IBV_PORT_ACTIVE: return "ACTIVE";
    case IBV_PORT_ACTIVE_DEFER: return "ACTIVE_DEFER";
  }
  return "state " + std::to_string(static_cast<int>(s));
}

std::string gid_type_name(std::uint32_t type) {
  switch (type) {
    case IBV_GID_TYPE_IB: return "IB";
    case IBV_GID_TYPE_ROCE_V1: return "RoCE v1";
    case IBV_GID_TYPE_ROCE_V2: return "RoCE v2";
    default: return "type " + std::to_string(type);
  }
}

int mtu_bytes(ibv_mtu mtu) { return mtu >= IBV_MTU_256 && mtu <= IBV_MTU_4096 ? 128 << static_cast<int>(mtu) : 0; }

// The entries in use of the port's GID table. ibv_query_gid_ex answers ENODATA for an unused
// entry; any other error ends the walk, and is kept, so that a missing RoCE v2 GID is not
// reported where the table simply could not be read.
void gather_gids(PortFacts& p, ibv_context* ctx) {
  for (int i = 0; i < p.gid_table_len; ++i) {
    ibv_gid_entry entry{};
    const int err = ibv_query_gid_ex(ctx, static_cast<std::uint32_t>(p.port), static_cast<std::uint32_t>(i), &entry, 0);
    if (err == ENODATA) continue;
    if (err != 0) {
      p.gid_error = "ibv_query_gid_ex(port " + std::to_string(p.port) + ", index " + std::to_string(i) + "): " + errno_text(err);
      return;
    }
    GidEntry g;
    g.index = i;
    g.gid = format_gid(entry.gid);
    g.type = gid_type_name(entry.gid_type);
    char ifname[IF_NAMESIZE];
    if (entry.ndev_ifindex != 0 && if_indextoname(entry.ndev_ifindex, ifname) != nullptr) g.netdev = ifname;
    p.gids.push_back(std::move(g));
  }
}

PortFacts gather_port(const std::string& dev, ibv_context* ctx, int port_num) {
  PortFacts p;
  p.port = port_num;
  const std::string base = kSysIb + dev + "/ports/" + std::to_string(port_num) + "/";
  ibv_port_attr attr{};
  if (const int err = ibv_query_port(ctx, static_cast<std::uint8_t>(port_num), &attr); err != 0) {
    p.state = "unknown (ibv_query_port: " + errno_text(err) + ")";
    return p;
  }
  p.state = port_state_name(attr.state);
  p.active = attr.state == IBV_PORT_ACTIVE;
  p.phys_state = read_line(base + "phys_state").value_or("");
  p.link_layer = link_layer_name(attr.link_layer);
  p.active_mtu = mtu_bytes(attr.active_mtu);
  p.max_mtu = mtu_bytes(attr.max_mtu);
  p.rate = read_line(base + "rate").value_or("");
  p.gid_table_len = attr.gid_tbl_len;
  gather_gids(p, ctx);
  for (const GidEntry& g : p.gids) {
    if (!g.netdev.empty()) {
      p.netdev = g.netdev;
      break;
    }
  }
  if (p.netdev.empty()) p.netdev = read_line(kSysIb + dev + "/parent").value_or("");
  if (!p.netdev.empty()) p.netdev_mtu = read_int("/sys/class/net/" + p.netdev + "/mtu");
  return p;
}

struct DestroyQp {
  void operator()(ibv_qp* qp) const noexcept { (void)ibv_destroy_qp(qp); }
};

// Creates an RC QP asking for `inline_size` inline bytes; the granted size, or the errno.
std::pair<std::optional<std::uint32_t>, int> try_inline(const verbs::ProtectionDomain& pd, const verbs::CompletionQueue& cq,
                                                        std::uint32_t inline_size) {
  ibv_qp_init_attr attr{};
  attr.qp_type = IBV_QPT_RC;
  attr.send_cq = cq.get();
  attr.recv_cq = cq.get();
  attr.cap.max_send_wr = 1;
  attr.cap.max_recv_wr = 1;
  attr.cap.max_send_sge = 1;
  attr.cap.max_recv_sge = 1;
  attr.cap.max_inline_data = inline_size;
  std::unique_ptr<ibv_qp, DestroyQp> qp(ibv_create_qp(pd.get(), &attr));
  if (!qp) return {std::nullopt, errno};
  return {attr.cap.max_inline_data, 0};
}

struct DeregisterMr {
  void operator()(ibv_mr* mr) const noexcept { (void)ibv_dereg_mr(mr); }
};

// With the descriptor -1 a provider or driver without dma-buf support refuses the call itself
// (libibverbs and the kernel answer EOPNOTSUPP); one with it gets as far as the descriptor.
void probe_dmabuf_registration(DeviceFacts& d, const verbs::ProtectionDomain& pd) {
  errno = 0;
  std::unique_ptr<ibv_mr, DeregisterMr> mr(ibv_reg_dmabuf_mr(pd.get(), 0, 4096, 0, -1, IBV_ACCESS_LOCAL_WRITE));
  d.dmabuf_errno = mr ? 0 : errno;
  d.dmabuf_registration = d.dmabuf_errno == EOPNOTSUPP || d.dmabuf_errno == ENOSYS ? DeviceFacts::DmabufReg::unsupported
                                                                                  : DeviceFacts::DmabufReg::supported;
}

// The probes that need verbs objects: an RC QP per inline size tried (doubling from 32 B, then
// bisecting between the last size granted and the first refused), and one page registered
// with IBV_ACCESS_RELAXED_ORDERING.
void probe_objects(DeviceFacts& d, const verbs::Context& ctx) {
  try {
    const verbs::ProtectionDomain pd(ctx);
    const verbs::CompletionQueue cq(ctx, 4);
    const auto base = try_inline(pd, cq, 0);
    if (!base.first) {
      d.objects_error = "ibv_create_qp(RC) on " + d.name + ": " + errno_text(base.second);
      return;
    }
    d.objects_ok = true;
    d.inline_probed = true;
    d.inline_default = *base.first;
    d.max_inline = *base.first;
    constexpr std::uint32_t kCeiling = 1U << 16;
    std::uint32_t good = 0;
    std::uint32_t bad = 0;
    for (std::uint32_t asked = 32; asked <= kCeiling; asked *= 2) {
      const auto [granted, err] = try_inline(pd, cq, asked);
      if (!granted) {
        bad = asked;
        d.inline_errno = err;
        break;
      }
      good = asked;
      d.max_inline = std::max(d.max_inline, *granted);
    }
    if (bad != 0) {
      while (bad - good > 1) {
        const std::uint32_t mid = good + (bad - good) / 2;
        const auto [granted, err] = try_inline(pd, cq, mid);
        if (granted) {
          good = mid;
          d.max_inline = std::max(d.max_inline, *granted);
        } else {
          bad = mid;
          d.inline_errno = err;
        }
      }
      d.inline_refused = bad;
    }

    const verbs::AlignedBuffer page(4096);
    try {
      const verbs::MemoryRegion mr(pd, page.data(), page.size(),
                                   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_RELAXED_ORDERING);
      d.relaxed_registration = DeviceFacts::RoReg::accepted;
    } catch (const SetupError& e) {
      // A page the memlock limit refuses says nothing about the flag.
      d.relaxed_registration =
          e.error() == errc::memlock_too_low ? DeviceFacts::RoReg::not_probed : DeviceFacts::RoReg::refused;
      d.relaxed_errno = e.error().sys_errno;
      d.relaxed_note = e.what();
    }
    probe_dmabuf_registration(d, pd);
  } catch (const SetupError& e) {
    d.objects_error = e.what();
  }
}

void gather_bus(DeviceFacts& d) {
  const std::string base = kSysIb + d.name + "/";
  d.parent = read_line(base + "parent").value_or("");
  d.pci = read_pci_placement("/sys", base + "device");
  if (d.pci.path.empty()) {
    d.numa_note = "no bus device (a software device such as rxe or siw has no sysfs numa_node)";
    d.pcie_relaxed_ordering = {std::nullopt, "not a PCI function"};
    return;
  }
  d.bus_device = d.pci.path.front().bdf;
  d.driver = base_name(real_path(base + "device/driver"));
  if (!d.pci.numa_node) d.numa_note = "no numa_node in sysfs for " + d.bus_device;
  if (d.pci.numa_node && *d.pci.numa_node >= 0) {
    d.numa_cpus = read_line("/sys/devices/system/node/node" + std::to_string(*d.pci.numa_node) + "/cpulist").value_or("");
  }
  d.pcie_relaxed_ordering = pcie_relaxed_ordering(read_bytes("/sys/bus/pci/devices/" + d.bus_device + "/config", 4096));
}

DeviceFacts gather_device(ibv_device* dev) {
  DeviceFacts d;
  d.name = ibv_get_device_name(dev);
  d.node_guid = format_guid(be64toh(ibv_get_device_guid(dev)));
  d.node_type = ibv_node_type_str(dev->node_type);
  d.transport = transport_name(dev->transport_type);
  gather_bus(d);
  try {
    const verbs::Context ctx = verbs::Context::open(d.name);
    d.caps = ctx.query_caps();
    d.queried = true;
    for (int port = 1; port <= d.caps.phys_port_cnt; ++port) d.ports.push_back(gather_port(d.name, ctx.get(), port));
    probe_objects(d, ctx);
  } catch (const SetupError& e) {
    d.error = e.what();
  }
  return d;
}

struct FreeDeviceList {
  void operator()(ibv_device** list) const noexcept { ibv_free_device_list(list); }
};

void gather_devices(Facts& f) {
  int count = 0;
  errno = 0;
  std::unique_ptr<ibv_device*, FreeDeviceList> list(ibv_get_device_list(&count));
  const int list_errno = list ? 0 : errno;
  std::span<ibv_device* const> all;
  if (list) all = {list.get(), static_cast<std::size_t>(count)};
  try {
    // select_device words the two refusals: no device at all (naming rdma_rxe and Soft-RoCE),
    // or none called --device (naming those present).
    if (all.empty() || !f.filter.empty()) (void)verbs::select_device(all, f.filter, list_errno);
  } catch (const SetupError& e) {
    f.device_error = e.what();
  }
  for (ibv_device* dev : all) {
    if (!f.filter.empty() && f.filter != ibv_get_device_name(dev)) continue;
    f.devices.push_back(gather_device(dev));
  }
}

// ----- host -------------------------------------------------------------------------------------

ProcessFacts gather_process() {
  ProcessFacts p;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
      if (CPU_ISSET(cpu, &set)) p.cpus.insert(cpu);
    }
  } else {
    p.affinity_error = "unknown (sched_getaffinity: " + errno_text(errno) + ")";
  }
  // get_mempolicy(2) through syscall(): libnuma is not a dependency.
  constexpr unsigned long kMaxNode = 1024;
  constexpr unsigned long kWordBits = 8 * sizeof(unsigned long);
  unsigned long mask[kMaxNode / kWordBits] = {};
  int mode = 0;
  if (syscall(SYS_get_mempolicy, &mode, mask, kMaxNode, nullptr, 0UL) == 0) {
    static constexpr const char* kModes[] = {"default", "preferred", "bind", "interleave", "local", "preferred-many", "weighted-interleave"};
    const int base = mode & 0xff;  // the MPOL_F_* flags live above
    std::string name = base >= 0 && base < 7 ? kModes[base] : "mode " + std::to_string(base);
    std::set<int> nodes;
    for (unsigned long n = 0; n < kMaxNode; ++n) {
      if (mask[n / kWordBits] >> (n % kWordBits) & 1UL) nodes.insert(static_cast<int>(n));
    }
    if (!nodes.empty()) name += " " + format_id_list(nodes);
    p.mempolicy = name + " (get_mempolicy)";
  } else {
    p.mempolicy = "unknown (get_mempolicy: " + errno_text(errno) + ")";
  }
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("Mems_allowed_list:", 0) == 0) {
      std::string v = line.substr(18);
      v.erase(0, v.find_first_not_of(" \t"));
      p.mems_allowed = v;
    }
  }
  return p;
}

IommuFacts gather_iommu() {
  IommuFacts f;
  f.units = list_dir("/sys/class/iommu");
  if (const auto cmdline = read_line("/proc/cmdline")) {
    std::istringstream args(*cmdline);
    for (std::string a; args >> a;) {
      if (a.rfind("iommu", 0) == 0 || a.rfind("intel_iommu=", 0) == 0 || a.rfind("amd_iommu", 0) == 0) f.cmdline.push_back(a);
    }
  }
  if (exists("/sys/kernel/iommu_groups")) {
    const auto groups = list_dir("/sys/kernel/iommu_groups");
    f.groups = static_cast<int>(groups.size());
    for (const std::string& g : groups) {
      if (const auto type = read_line("/sys/kernel/iommu_groups/" + g + "/type")) ++f.group_types[*type];
    }
  }
  return f;
}

std::string find_in_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path != nullptr ? path : "/usr/bin:/bin");
  for (std::string dir; std::getline(dirs, dir, ':');) {
    const std::string candidate = (dir.empty() ? "." : dir) + "/" + name;
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return {};
}

ToolOutput run_nvidia_smi() {
  ToolOutput t;
  t.path = find_in_path("nvidia-smi");
  if (t.path.empty()) return t;
  t.present = true;
  // timeout(1) kills a wedged driver query; the path came from PATH and is quoted.
  std::string quoted = "'";
  for (char c : t.path) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  quoted += "'";
  const std::string cmd = "timeout " + std::to_string(kNvidiaSmiTimeoutS) + " " + quoted + " topo -m 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) {
    t.status = -1;
    t.output = "popen: " + errno_text(errno);
    return t;
  }
  char buf[4096];
  while (std::fgets(buf, sizeof buf, pipe) != nullptr) {
    if (t.output.size() < (1U << 16)) t.output += buf;
  }
  const int status = pclose(pipe);
  t.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  t.output = strip_ansi(t.output);
  while (!t.output.empty() && t.output.back() == '\n') t.output.pop_back();
  return t;
}

void gather_netdevs(Facts& f) {
  std::set<std::string> seen;
  for (const DeviceFacts& d : f.devices) {
    for (const PortFacts& p : d.ports) {
      for (const GidEntry& g : p.gids) {
        if (!g.netdev.empty() && seen.insert(g.netdev).second) f.rdma_netdevs.push_back(g.netdev);
      }
      if (!p.netdev.empty() && seen.insert(p.netdev).second) f.rdma_netdevs.push_back(p.netdev);
    }
    if (!d.parent.empty() && seen.insert(d.parent).second) f.rdma_netdevs.push_back(d.parent);
  }
  // arp_ignore/arp_announce decide anything only between several RDMA netdevs.
  if (f.rdma_netdevs.size() < 2) return;
  std::vector<std::string> scopes = {"all", "default"};
  scopes.insert(scopes.end(), f.rdma_netdevs.begin(), f.rdma_netdevs.end());
  for (const std::string& s : scopes) {
    const std::string base = "/proc/sys/net/ipv4/conf/" + s + "/";
    f.arp.push_back({s, read_int(base + "arp_ignore"), read_int(base + "arp_announce")});
  }
}

}  // namespace

PciPlacement read_pci_placement(const std::string& sys_root, const std::string& device_link) {
  PciPlacement p;
  const std::string dev = real_path(device_link);
  if (dev.empty()) return p;
  // ".../devices/pci0000:00/0000:00:01.0/0000:01:00.0": the host bridge, then each function
  // from the root port down to the device.
  std::vector<std::string> bdfs;
  std::stringstream parts(dev);
  for (std::string part; std::getline(parts, part, '/');) {
    if (is_bdf(part)) {
      bdfs.push_back(part);
    } else if (bdfs.empty() && part.rfind("pci", 0) == 0) {
      p.host_bridge = part;
    }
  }
  if (bdfs.empty()) return p;
  std::reverse(bdfs.begin(), bdfs.end());
  for (const std::string& bdf : bdfs) {
    const auto cfg = read_bytes(sys_root + "/bus/pci/devices/" + bdf + "/config", 4096);
    if (cfg.empty()) {
      p.path.push_back({bdf, "not readable", std::nullopt});
    } else {
      p.path.push_back({bdf, describe_acs(cfg), acs_redirects_peer_to_peer(cfg)});
    }
  }
  p.numa_node = read_int(dev + "/numa_node");
  const std::string group = real_path(dev + "/iommu_group");
  if (!group.empty()) p.iommu_group_type = read_line(group + "/type").value_or("unreadable");
  return p;
}

std::vector<GpuFacts> gather_gpus(const std::string& sys_root) {
  std::vector<GpuFacts> gpus;
  const std::string bus = sys_root + "/bus/pci/devices/";
  for (const std::string& bdf : list_dir(bus)) {
    const std::string cls = read_line(bus + bdf + "/class").value_or("");
    const std::string vendor = read_line(bus + bdf + "/vendor").value_or("");
    // A 3D controller (0x0302), as compute GPUs present themselves, or a VGA controller (0x0300)
    // of NVIDIA or AMD; not a server's BMC display (ASPEED) or a virtual machine's.
    const bool vga_of_gpu_maker = cls.rfind("0x0300", 0) == 0 && (vendor == "0x10de" || vendor == "0x1002");
    if (cls.rfind("0x0302", 0) != 0 && !vga_of_gpu_maker) continue;
    GpuFacts g;
    g.bdf = bdf;
    g.vendor = vendor;
    g.device_id = read_line(bus + bdf + "/device").value_or("");
    g.driver = base_name(real_path(bus + bdf + "/driver"));
    g.pci = read_pci_placement(sys_root, bus + bdf);
    gpus.push_back(std::move(g));
  }
  return gpus;
}

Facts gather_facts(const std::string& device_filter) {
  Facts f;
  f.filter = device_filter;
  gather_devices(f);
  f.process = gather_process();
  f.memlock = verbs::read_memlock_state();
  f.iommu = gather_iommu();
  f.gpus = gather_gpus("/sys");
  f.nvidia_peermem = exists("/sys/module/nvidia_peermem");
  f.nvidia_smi = run_nvidia_smi();
  gather_netdevs(f);
  return f;
}

}  // namespace rdmaring::doctor
