// `rdmaring doctor`'s GPU placement: GPUs and RDMA devices read from a made-up sysfs tree (the
// same reader the doctor runs on /sys), the path class between each pair, ACS on the bridges a
// peer-to-peer transfer crosses, the IOMMU and the verdict "GPUDirect RDMA possible / not
// possible: because ...", in both renderings.
#include "../../tools/doctor/facts.hpp"
#include "../../tools/doctor/pci_topology.hpp"
#include "../../tools/doctor/render.hpp"
#include "../../tools/doctor/verdicts.hpp"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

using namespace rdmaring::doctor;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

constexpr std::uint16_t kAcsRequestRedirect = 1U << 2;
constexpr std::uint16_t kAcsCompletionRedirect = 1U << 3;
constexpr std::uint16_t kAcsSourceValidation = 1U << 0;

// A 4096-byte configuration space whose first extended capability is ACS with `ctrl` on.
std::vector<std::uint8_t> config_with_acs(std::uint16_t ctrl) {
  std::vector<std::uint8_t> cfg(4096, 0);
  cfg[0x100] = 0x0d;
  cfg[0x104] = 0x7f;  // offers every bit
  cfg[0x106] = static_cast<std::uint8_t>(ctrl & 0xff);
  cfg[0x107] = static_cast<std::uint8_t>(ctrl >> 8);
  return cfg;
}

// A sysfs tree as the kernel lays it out: devices/pciDDDD:BB/<root port>/.../<function>, with
// bus/pci/devices/<bdf> links to each function, iommu_group links and class/infiniband links.
class FakeSysfs {
 public:
  FakeSysfs() {
    root_ = fs::temp_directory_path() / ("rdmaring-sysfs-" + std::to_string(::getpid()) + "-" + std::to_string(counter_++));
    fs::remove_all(root_);
    fs::create_directories(root_ / "bus/pci/devices");
  }
  ~FakeSysfs() { fs::remove_all(root_); }
  FakeSysfs(const FakeSysfs&) = delete;
  FakeSysfs& operator=(const FakeSysfs&) = delete;

  std::string root() const { return root_.string(); }

  // The chain from the root port down to the function, every bridge of it made on the way;
  // bridges get ACS off unless set_acs says otherwise, or a 64-byte view (an unprivileged reader).
  fs::path function(const std::string& host_bridge, const std::vector<std::string>& chain, const std::string& cls) {
    fs::path dir = root_ / "devices" / host_bridge;
    for (const std::string& bdf : chain) {
      dir /= bdf;
      if (!fs::exists(dir)) {
        fs::create_directories(dir);
        write(dir / "class", "0x060400");
        write_config(dir, config_with_acs(0));
        fs::create_directory_symlink(dir, root_ / "bus/pci/devices" / bdf);
      }
    }
    write(dir / "class", cls);
    return dir;
  }

  fs::path gpu(const std::string& host_bridge, const std::vector<std::string>& chain, int numa, const std::string& iommu) {
    const fs::path dir = function(host_bridge, chain, "0x030200");
    write(dir / "vendor", "0x10de");
    write(dir / "device", "0x2330");
    write(dir / "numa_node", std::to_string(numa));
    bind(dir, "nvidia");
    group(dir, iommu);
    return dir;
  }

  // An RDMA device: class/infiniband/NAME/device links to its function.
  std::string nic(const std::string& name, const std::string& host_bridge, const std::vector<std::string>& chain, int numa,
                  const std::string& iommu) {
    const fs::path dir = function(host_bridge, chain, "0x020000");
    write(dir / "numa_node", std::to_string(numa));
    bind(dir, "mlx5_core");
    group(dir, iommu);
    const fs::path ib = root_ / "class/infiniband" / name;
    fs::create_directories(ib);
    fs::create_directory_symlink(dir, ib / "device");
    return (ib / "device").string();
  }

  void set_acs(const std::string& bdf, std::uint16_t ctrl) { write_config(root_ / "bus/pci/devices" / bdf, config_with_acs(ctrl)); }
  void unprivileged(const std::string& bdf) {
    const auto cfg = config_with_acs(0);
    write_config(root_ / "bus/pci/devices" / bdf, {cfg.begin(), cfg.begin() + 64});
  }

 private:
  static void write(const fs::path& p, const std::string& text) { std::ofstream(p) << text << "\n"; }
  static void write_config(const fs::path& dir, const std::vector<std::uint8_t>& cfg) {
    std::ofstream(dir / "config", std::ios::binary | std::ios::trunc).write(reinterpret_cast<const char*>(cfg.data()),
                                                                           static_cast<std::streamsize>(cfg.size()));
  }
  void bind(const fs::path& dir, const std::string& driver) {
    const fs::path d = root_ / "bus/pci/drivers" / driver;
    fs::create_directories(d);
    fs::create_directory_symlink(d, dir / "driver");
  }
  void group(const fs::path& dir, const std::string& type) {
    if (type.empty()) return;
    const fs::path g = root_ / "kernel/iommu_groups" / std::to_string(groups_++);
    fs::create_directories(g);
    write(g / "type", type);
    fs::create_directory_symlink(g, dir / "iommu_group");
  }

  static inline int counter_ = 0;
  fs::path root_;
  int groups_ = 0;
};

// An RDMA device on the PCI bus as the doctor's gathering leaves it, its placement read from `link`.
DeviceFacts pci_device(const std::string& name, const FakeSysfs& sys, const std::string& link) {
  DeviceFacts d;
  d.name = name;
  d.pci = read_pci_placement(sys.root(), link);
  REQUIRE_FALSE(d.pci.path.empty());
  d.bus_device = d.pci.path.front().bdf;
  d.dmabuf_registration = DeviceFacts::DmabufReg::supported;
  d.dmabuf_errno = EBADF;
  return d;
}

void write_vendor(const fs::path& dir, const std::string& vendor) { std::ofstream(dir / "vendor") << vendor << "\n"; }

// One host bridge with a PCIe switch holding a GPU and mlx5_0, a second switch below it holding
// another GPU, mlx5_1 on a root port of its own, and mlx5_2 under a second host bridge.
struct Box {
  FakeSysfs sys;
  std::string mlx5_0, mlx5_1, mlx5_2;
  explicit Box(int far_numa = 1, const std::string& gpu_iommu = "identity") {
    sys.gpu("pci0000:00", {"0000:00:01.0", "0000:01:00.0", "0000:02:00.0", "0000:03:00.0"}, 0, gpu_iommu);
    mlx5_0 = sys.nic("mlx5_0", "pci0000:00", {"0000:00:01.0", "0000:01:00.0", "0000:02:01.0", "0000:04:00.0"}, 0, "identity");
    sys.gpu("pci0000:00", {"0000:00:01.0", "0000:01:00.0", "0000:02:02.0", "0000:05:00.0", "0000:06:00.0", "0000:07:00.0"}, 0,
            "identity");
    mlx5_1 = sys.nic("mlx5_1", "pci0000:00", {"0000:00:02.0", "0000:08:00.0"}, 0, "identity");
    mlx5_2 = sys.nic("mlx5_2", "pci0000:80", {"0000:80:01.0", "0000:81:00.0"}, far_numa, "identity");
    // An NVIDIA VGA controller is a GPU; a BMC's (ASPEED) is not.
    write_vendor(sys.function("pci0000:00", {"0000:00:1f.0"}, "0x030000"), "0x10de");
    write_vendor(sys.function("pci0000:00", {"0000:00:1c.0", "0000:09:00.0"}, "0x030000"), "0x1a03");
  }
  // GPUDirect between the near GPU (0000:03:00.0, unless named) and mlx5_<device>.
  GpuDirect judge(std::size_t device, const std::string& gpu_bdf = "0000:03:00.0");
  Facts facts() {
    Facts f;
    f.gpus = gather_gpus(sys.root());
    f.devices = {pci_device("mlx5_0", sys, mlx5_0), pci_device("mlx5_1", sys, mlx5_1), pci_device("mlx5_2", sys, mlx5_2)};
    return f;
  }
};

const GpuFacts& gpu(const Facts& f, const std::string& bdf) {
  const auto it = std::find_if(f.gpus.begin(), f.gpus.end(), [&](const GpuFacts& g) { return g.bdf == bdf; });
  REQUIRE(it != f.gpus.end());
  return *it;
}

GpuDirect Box::judge(std::size_t device, const std::string& gpu_bdf) {
  const Facts f = facts();
  return gpudirect(gpu(f, gpu_bdf), f.devices.at(device));
}

std::string all(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& x : v) s += x + "\n";
  return s;
}

}  // namespace

TEST_CASE("ACS redirects peer-to-peer only with Request or Completion Redirect or Egress Control on", "[doctor]") {
  CHECK(acs_redirects_peer_to_peer(config_with_acs(0)) == false);
  CHECK(acs_redirects_peer_to_peer(config_with_acs(kAcsSourceValidation)) == false);
  CHECK(acs_redirects_peer_to_peer(config_with_acs(kAcsRequestRedirect)) == true);
  CHECK(acs_redirects_peer_to_peer(config_with_acs(kAcsCompletionRedirect)) == true);
  CHECK(acs_redirects_peer_to_peer(config_with_acs(1U << 5)) == true);
  CHECK(acs_redirects_peer_to_peer(std::vector<std::uint8_t>(4096, 0)) == false);  // no ACS capability
  CHECK_FALSE(acs_redirects_peer_to_peer(std::vector<std::uint8_t>(64, 0)).has_value());
}

TEST_CASE("GPUs and RDMA devices are placed from sysfs: host bridge, bridges, NUMA node, IOMMU group", "[doctor]") {
  Box box;
  const Facts f = box.facts();
  REQUIRE(f.gpus.size() == 3);
  const GpuFacts& g = gpu(f, "0000:03:00.0");
  CHECK(g.vendor == "0x10de");
  CHECK(g.device_id == "0x2330");
  CHECK(g.driver == "nvidia");
  CHECK(g.pci.host_bridge == "pci0000:00");
  CHECK(g.pci.numa_node == 0);
  CHECK(g.pci.iommu_group_type == "identity");
  REQUIRE(g.pci.path.size() == 4);
  CHECK(g.pci.path.front().bdf == "0000:03:00.0");
  CHECK(g.pci.path.back().bdf == "0000:00:01.0");
  CHECK(g.pci.path[1].acs == "ctrl 0x0000: none on (offers SV TB RR CR UF EC DT)");
  CHECK(g.pci.path[1].acs_redirects == false);
  CHECK(gpu(f, "0000:00:1f.0").driver.empty());
  CHECK(f.devices[2].pci.host_bridge == "pci0000:80");
  CHECK(f.devices[2].pci.numa_node == 1);
  // Nothing there: an empty placement, never a throw.
  CHECK(read_pci_placement(box.sys.root(), box.sys.root() + "/class/infiniband/none/device").path.empty());
}

TEST_CASE("the path class follows the deepest bridge two functions share", "[doctor]") {
  Box box;
  const Facts f = box.facts();
  const GpuFacts& near = gpu(f, "0000:03:00.0");
  const GpuFacts& deep = gpu(f, "0000:07:00.0");

  const PciRoute pix = route_between(near.pci, f.devices[0].pci);
  CHECK(pix.cls == PathClass::pix);
  CHECK(pix.crossed == std::vector<std::string>{"0000:01:00.0", "0000:02:00.0", "0000:02:01.0"});
  CHECK(pix.redirecting.empty());

  const PciRoute pxb = route_between(deep.pci, f.devices[0].pci);
  CHECK(pxb.cls == PathClass::pxb);
  CHECK(pxb.crossed.size() == 5);

  CHECK(route_between(near.pci, f.devices[1].pci).cls == PathClass::phb);
  const PciRoute sys = route_between(near.pci, f.devices[2].pci);
  CHECK(sys.cls == PathClass::sys);
  CHECK_THAT(sys.why, Contains("NUMA nodes 0 and 1"));
  CHECK(std::string(path_class_name(sys.cls)) == "SYS");

  Box one_node(0);
  const Facts g = one_node.facts();
  CHECK(route_between(gpu(g, "0000:03:00.0").pci, g.devices[2].pci).cls == PathClass::node);

  // The same pair either way round.
  CHECK(route_between(f.devices[0].pci, deep.pci).cls == PathClass::pxb);
}

TEST_CASE("GPUDirect RDMA: possible only on a PCI path without redirection, IOMMU translation or a software device",
          "[doctor]") {
  SECTION("one switch, ACS off, identity domains, dma-buf taken: possible") {
    Box box;
    const GpuDirect p = box.judge(0);
    INFO(all(p.because_not) << all(p.caveats));
    CHECK(p.possible());
    CHECK(p.caveats.empty());
  }
  SECTION("ACS redirect on a downstream port of the switch: not possible, naming the bridge") {
    Box box;
    box.sys.set_acs("0000:02:01.0", kAcsSourceValidation | kAcsRequestRedirect | kAcsCompletionRedirect);
    const GpuDirect p = box.judge(0);
    CHECK_FALSE(p.possible());
    CHECK_THAT(all(p.because_not), Contains("ACS on 0000:02:01.0 redirects peer-to-peer requests"));
    // A bridge off the path does not matter.
    box.sys.set_acs("0000:02:01.0", 0);
    box.sys.set_acs("0000:02:02.0", kAcsRequestRedirect);
    CHECK(box.judge(0).possible());
  }
  SECTION("ACS not readable without root: possible, with that caveat") {
    Box box;
    box.sys.unprivileged("0000:02:00.0");
    const GpuDirect p = box.judge(0);
    CHECK(p.possible());
    CHECK_THAT(all(p.caveats), Contains("ACS of 0000:02:00.0 not readable"));
  }
  SECTION("through the host bridge: possible, with a caveat; across sockets: not possible") {
    Box box;
    const GpuDirect phb = box.judge(1);
    CHECK(phb.possible());
    CHECK_THAT(all(phb.caveats), Contains("through the host bridge"));
    const GpuDirect sys = box.judge(2);
    CHECK_FALSE(sys.possible());
    CHECK_THAT(all(sys.because_not), Contains("across NUMA nodes"));
  }
  SECTION("the IOMMU translating the GPU's DMA: not possible") {
    Box box(1, "DMA-FQ");
    const GpuDirect p = box.judge(0);
    CHECK_FALSE(p.possible());
    CHECK_THAT(all(p.because_not), Contains("IOMMU translates DMA for GPU 0000:03:00.0 (domain type DMA-FQ)"));
  }
  SECTION("a device that refuses dma-buf registration: not possible") {
    Box box;
    Facts f = box.facts();
    f.devices[0].dmabuf_registration = DeviceFacts::DmabufReg::unsupported;
    f.devices[0].dmabuf_errno = EOPNOTSUPP;
    const GpuDirect p = gpudirect(gpu(f, "0000:03:00.0"), f.devices[0]);
    CHECK_FALSE(p.possible());
    CHECK_THAT(all(p.because_not), Contains("mlx5_0 refuses dma-buf registration (ibv_reg_dmabuf_mr: EOPNOTSUPP"));
  }
  SECTION("a software device: not possible, whatever the GPU's place") {
    Box box;
    const Facts f = box.facts();
    DeviceFacts rxe;
    rxe.name = "rxe0";
    rxe.parent = "eth0";
    const GpuDirect p = gpudirect(gpu(f, "0000:03:00.0"), rxe);
    CHECK_FALSE(p.possible());
    CHECK_FALSE(p.route.has_value());
    CHECK_THAT(all(p.because_not), Contains("rxe0 is a software device over eth0"));
  }
}

TEST_CASE("the reports give one GPUDirect verdict per GPU and RDMA device pair, and say why none is possible", "[doctor]") {
  Box box;
  Facts f = box.facts();
  const Verdicts v = judge(f, 1 << 20);
  REQUIRE(v.gpudirect.size() == 9);
  CHECK(v.gpudirect[0].gpu == "0000:00:1f.0");
  const std::string text = render_text(f, v);
  INFO(text);
  CHECK_THAT(text, Contains("\nGPUs and GPUDirect RDMA (sysfs)\n"));
  CHECK_THAT(text, Contains("GPU 0000:03:00.0  0x10de:0x2330, driver nvidia"));
  CHECK_THAT(text, Contains("0000:03:00.0 <-> mlx5_0 PIX: deepest common bridge 0000:01:00.0"));
  CHECK_THAT(text, Contains("ok    GPUDirect RDMA GPU 0000:03:00.0 <-> mlx5_0: PIX (through one PCIe switch), possible\n"));
  CHECK_THAT(text, Contains("warn  GPUDirect RDMA GPU 0000:03:00.0 <-> mlx5_2: SYS (across NUMA nodes (the sockets' interconnect)), "
                            "not possible: because the transfer would go across NUMA nodes"));

  const auto j = nlohmann::json::parse(render_json(f, v));
  REQUIRE(j["gpus"].size() == 3);
  CHECK(j["gpus"][1]["bdf"] == "0000:03:00.0");
  CHECK(j["gpus"][1]["pci_path"][0]["acs_redirects"] == false);
  const auto& pair = j["gpudirect"][3];
  CHECK(pair["gpu"] == "0000:03:00.0");
  CHECK(pair["rdma_device"] == "mlx5_0");
  CHECK(pair["route"]["class"] == "PIX");
  CHECK(pair["possible"] == true);
  CHECK(pair["verdict"]["level"] == "ok");
  CHECK(j["gpudirect"][5]["possible"] == false);
  CHECK(j["gpudirect"][5]["because_not"].size() == 1);

  // The GPU machine: GPUs and no RDMA device.
  f.devices.clear();
  const Verdicts none = judge(f, 1 << 20);
  CHECK(none.gpudirect.empty());
  CHECK_THAT(render_text(f, none), Contains("GPUDirect RDMA: not possible for GPU 0000:00:1f.0, 0000:03:00.0, 0000:07:00.0: "
                                            "because there is no RDMA device"));
  // This machine and the Soft-RoCE guest: no GPU.
  f.gpus.clear();
  CHECK_THAT(render_text(f, judge(f, 1 << 20)), Contains("GPUDirect RDMA: no GPU on the PCI bus"));
}
