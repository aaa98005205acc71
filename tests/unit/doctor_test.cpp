// `rdmaring doctor`'s pure parts: the GID/CPU-list/PCI readings, the verdicts drawn from made-up
// facts (an rxe-like device, a PCI RNIC, memlock limits, ARP), both renderings, and the command
// line it accepts and refuses.
#include "../../tools/doctor/doctor_command.hpp"
#include "../../tools/doctor/format.hpp"
#include "../../tools/doctor/render.hpp"
#include "../../tools/doctor/verdicts.hpp"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <arpa/inet.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

using namespace rdmaring;
using namespace rdmaring::doctor;
using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;

namespace {

bool has_verdict(const std::vector<Verdict>& vs, Level level, const std::string& text) {
  return std::any_of(vs.begin(), vs.end(), [&](const Verdict& v) { return v.level == level && v.text.find(text) != std::string::npos; });
}

std::string all_text(const std::vector<Verdict>& vs) {
  std::string s;
  for (const Verdict& v : vs) s += std::string(level_name(v.level)) + " " + v.text + "\n";
  return s;
}

ibv_gid gid_of(const char* ipv6) {
  ibv_gid g{};
  REQUIRE(inet_pton(AF_INET6, ipv6, g.raw) == 1);
  return g;
}

// What the doctor finds on rxe0 in the Soft-RoCE guest.
DeviceFacts rxe_like() {
  DeviceFacts d;
  d.name = "rxe0";
  d.node_guid = format_guid(0x007272fffe000001ULL);
  d.node_type = "InfiniBand channel adapter";
  d.transport = "InfiniBand verbs";
  d.parent = "dummy0";
  d.queried = true;
  d.caps.name = "rxe0";
  d.caps.max_mr_size = ~0ULL;
  d.caps.atomic_cap = IBV_ATOMIC_HCA;
  d.caps.phys_port_cnt = 1;
  PortFacts p;
  p.state = "ACTIVE";
  p.active = true;
  p.link_layer = "Ethernet";
  p.active_mtu = 4096;
  p.max_mtu = 4096;
  p.netdev = "dummy0";
  p.netdev_mtu = 9000;
  p.gid_table_len = 1024;
  p.gids = {{0, "fe80::72:72ff:fe00:1", "RoCE v2", "dummy0"}, {1, "::ffff:169.254.0.1", "RoCE v2", "dummy0"}};
  d.ports = {p};
  d.objects_ok = true;
  d.relaxed_registration = DeviceFacts::RoReg::accepted;
  d.inline_probed = true;
  d.max_inline = 512;
  d.inline_refused = 513;
  d.inline_errno = EINVAL;
  d.numa_note = "no bus device";
  return d;
}

Facts rxe_facts() {
  Facts f;
  f.devices = {rxe_like()};
  f.process.cpus = {0, 1};
  f.process.mempolicy = "default";
  f.process.mems_allowed = "0";
  f.rdma_netdevs = {"dummy0"};
  return f;
}

constexpr std::uint64_t kRing = 1 << 20;

}  // namespace

TEST_CASE("GIDs print in compressed IPv6 form", "[doctor]") {
  ibv_gid g{};
  CHECK(format_gid(g) == "::");
  const std::uint8_t link_local[16] = {0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x00, 0x72, 0x72, 0xff, 0xfe, 0x00, 0x00, 0x01};
  std::memcpy(g.raw, link_local, sizeof g.raw);
  CHECK(format_gid(g) == "fe80::72:72ff:fe00:1");
  const std::uint8_t v4_mapped[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 169, 254, 0, 1};
  std::memcpy(g.raw, v4_mapped, sizeof g.raw);
  CHECK(format_gid(g) == "::ffff:169.254.0.1");
  // RFC 5952: the first of two equally long zero runs is the one compressed.
  CHECK(format_gid(gid_of("2001:db8:0:0:1:0:0:1")) == "2001:db8::1:0:0:1");
  CHECK(format_gid(gid_of("2001:db8:0:1:1:1:1:1")) == "2001:db8:0:1:1:1:1:1");
  CHECK(format_gid(gid_of("fe80::")) == "fe80::");
}

TEST_CASE("ANSI escapes are stripped from tool output", "[doctor]") {
  CHECK(strip_ansi("\t\x1b[4mGPU0\tCPU Affinity\x1b[0m\nGPU0\t X") == "\tGPU0\tCPU Affinity\nGPU0\t X");
  CHECK(strip_ansi("\x1b[1;31mred\x1b[m and \x1b" "cplain") == "red and plain");
  CHECK(strip_ansi("tail \x1b[") == "tail ");
}

TEST_CASE("CPU lists parse and print as the kernel writes them", "[doctor]") {
  const auto ids = parse_id_list("0-3,8,10-11\n");
  REQUIRE(ids);
  CHECK(ids->size() == 7);
  CHECK(format_id_list(*ids) == "0-3,8,10-11");
  CHECK(parse_id_list("")->empty());
  CHECK_FALSE(parse_id_list("3-1"));
  CHECK_FALSE(parse_id_list("1,,2"));
  CHECK_FALSE(parse_id_list("x"));
  CHECK(format_id_list({}) == "");
}

TEST_CASE("sizes and GUIDs are printed exactly", "[doctor]") {
  CHECK(format_bytes(0) == "0 B");
  CHECK(format_bytes(1048576) == "1048576 B (1 MiB)");
  CHECK(format_bytes(1536) == "1536 B (1.5 KiB)");
  CHECK(format_bytes(~0ULL) == "18446744073709551615 B (16 EiB)");
  CHECK(format_guid(0x007272fffe000001ULL) == "0072:72ff:fe00:0001");
  CHECK(errno_name(EINVAL) == "EINVAL, errno 22");
  CHECK(odp_rc_names(IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_WRITE) == "SEND WRITE");
  CHECK(odp_rc_names(0) == "none");
}

TEST_CASE("memlock verdicts count a ring and the producer's mirror", "[doctor]") {
  verbs::MemlockState m;
  CHECK(memlock_verdict(m, kRing).level == Level::ok);
  CHECK_THAT(memlock_verdict(m, kRing).text,
             StartsWith("memlock: unlimited") &&
                 Contains("a 1 MiB ring needs 1 MiB pinned per producer, twice with the producer's staging mirror"));

  m.soft_limit = 64 * 1024;
  m.hard_limit = 64 * 1024;
  Verdict v = memlock_verdict(m, kRing);
  CHECK(v.level == Level::fail);
  CHECK_THAT(v.text, Contains("65536 B (64 KiB)") && Contains("room for 0 consumer rings") && Contains("limits.conf"));

  m.cap_ipc_lock = true;
  CHECK(memlock_verdict(m, kRing).level == Level::ok);
  CHECK_THAT(memlock_verdict(m, kRing).text, Contains("CAP_IPC_LOCK"));
  m.cap_ipc_lock = false;

  // 1.5 MiB: one consumer ring fits, a producer and a consumer in one process do not.
  m.soft_limit = 3 << 19;
  m.hard_limit.reset();
  v = memlock_verdict(m, kRing);
  CHECK(v.level == Level::warn);
  CHECK_THAT(v.text, Contains("room for 1 consumer ring,") && Contains("0 producer+consumer pairs") && Contains("ulimit -l"));

  m.soft_limit = 8 << 20;  // the usual distribution default
  v = memlock_verdict(m, kRing);
  CHECK(v.level == Level::ok);
  CHECK_THAT(v.text, Contains("room for 7 consumer rings") && Contains("3 producer+consumer pairs"));

  // What is already pinned is gone.
  m.pinned = 7 << 20;
  CHECK(memlock_verdict(m, kRing).level == Level::fail);

  m.pinned = 0;
  CHECK_THAT(memlock_verdict(m, 64 << 20).text, Contains("a 64 MiB ring needs 64 MiB pinned"));
}

TEST_CASE("an rxe-like device gets the verdicts of a software device", "[doctor]") {
  const DeviceFacts d = rxe_like();
  ProcessFacts p;
  p.cpus = {0, 1};
  const auto vs = device_verdicts(d, p);
  INFO(all_text(vs));
  CHECK(usable(d));
  CHECK(has_verdict(vs, Level::ok, "port 1: ACTIVE, Ethernet, MTU 4096 (netdev dummy0 MTU 9000), RoCE v2 GID 1 ::ffff:169.254.0.1"));
  CHECK(has_verdict(vs, Level::ok, "payload MR relaxed, publish by imm: ok"));
  CHECK(has_verdict(vs, Level::ok, "a software device copies in order"));
  CHECK(has_verdict(vs, Level::ok, "tail mode: relies on in-order placement (no relaxed ordering): ok"));
  CHECK(has_verdict(vs, Level::ok, "inline: 512 B granted >= 32 B"));
  CHECK(has_verdict(vs, Level::info,
                    "ODP: not supported by rxe0: rings are pinned (registration counts against RLIMIT_MEMLOCK)"));
  CHECK(has_verdict(vs, Level::info, "DMA bounce: not reported by this rdma-core"));
  CHECK(has_verdict(vs, Level::info, "NUMA: rxe0 has no node"));
}

TEST_CASE("verdicts follow the capabilities", "[doctor]") {
  ProcessFacts p;
  p.cpus = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  DeviceFacts d = rxe_like();
  d.name = "mlx5_0";
  d.bus_device = "0000:3b:00.0";
  d.caps.odp = true;
  d.caps.odp_rc_write = true;
  d.caps.odp_implicit = true;
  d.caps.dma_bounce = true;
  d.pcie_relaxed_ordering = {true, ""};
  d.pci.numa_node = 1;
  d.numa_cpus = "8-15";
  auto vs = device_verdicts(d, p);
  INFO(all_text(vs));
  CHECK(has_verdict(vs, Level::ok, "ODP: RC WRITE supported by mlx5_0 (implicit ODP yes)"));
  CHECK(has_verdict(vs, Level::warn, "DMA bounce required: not direct"));
  CHECK(has_verdict(vs, Level::ok, "PCIe Relaxed Ordering is enabled on 0000:3b:00.0"));
  CHECK(has_verdict(vs, Level::warn, "may run on CPUs 0-7 off it"));

  p.cpus = {8, 9};
  d.caps.dma_bounce = false;
  d.pcie_relaxed_ordering = {std::nullopt, "not readable (capabilities beyond byte 64 need root)"};
  vs = device_verdicts(d, p);
  INFO(all_text(vs));
  CHECK(has_verdict(vs, Level::ok, "DMA bounce: not required: direct"));
  CHECK(has_verdict(vs, Level::ok, "cannot be known"));
  CHECK(has_verdict(vs, Level::ok, "NUMA: mlx5_0 on node 1, the process runs on its CPUs (8-9)"));

  d.caps.odp_rc_write = false;
  d.caps.odp_rc_caps = IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV;
  vs = device_verdicts(d, p);
  CHECK(has_verdict(vs, Level::info, "ODP: mlx5_0 has ODP but not for RC WRITE (RC caps: SEND RECV)"));

  d.max_inline = 16;
  vs = device_verdicts(d, p);
  CHECK(has_verdict(vs, Level::fail, "inline: 16 B granted < 32 B"));

  d.ports[0].active = false;
  d.ports[0].state = "DOWN";
  vs = device_verdicts(d, p);
  CHECK(has_verdict(vs, Level::fail, "port 1: DOWN: no connection can use it (is dummy0 up, with carrier?)"));
  CHECK_FALSE(usable(d));

  DeviceFacts broken = rxe_like();
  broken.error = "ibv_open_device(rxe0): Permission denied";
  CHECK_FALSE(usable(broken));
  CHECK(has_verdict(device_verdicts(broken, p), Level::fail, "rxe0: not usable: ibv_open_device"));

  DeviceFacts no_qp = rxe_like();
  no_qp.objects_ok = false;
  no_qp.inline_probed = false;
  no_qp.relaxed_registration = DeviceFacts::RoReg::not_probed;
  no_qp.objects_error = "ibv_alloc_pd(rxe0): ENOMEM";
  CHECK_FALSE(usable(no_qp));
  CHECK(has_verdict(device_verdicts(no_qp, p), Level::warn, "inline: not probed (ibv_alloc_pd(rxe0): ENOMEM)"));

  Facts f;
  f.devices = {broken, no_qp};
  CHECK(usable_count(f) == 0);
  CHECK_THAT(no_usable_device(f), StartsWith("no usable RDMA device: rxe0 (ibv_open_device(rxe0): Permission denied) "
                                             "rxe0 (ibv_alloc_pd(rxe0): ENOMEM); ") &&
                                      Contains("rdma link add rxe0 type rxe"));
}

TEST_CASE("an Ethernet port without an IPv4 GID or with a small MTU is called out", "[doctor]") {
  DeviceFacts d = rxe_like();
  d.ports[0].gids.pop_back();
  d.ports[0].active_mtu = 1024;
  d.ports[0].netdev_mtu = 1500;
  auto vs = device_verdicts(d, ProcessFacts{});
  INFO(all_text(vs));
  CHECK(has_verdict(vs, Level::warn, "no IPv4 RoCE v2 GID"));
  CHECK(has_verdict(vs, Level::warn, "RDMA MTU 1024 follows the netdev MTU 1500"));

  // A table that could not be read is said to be unread, not to lack the GID.
  d.ports[0].gid_error = "ibv_query_gid_ex(port 1, index 1): Permission denied (EACCES, errno 13)";
  vs = device_verdicts(d, ProcessFacts{});
  INFO(all_text(vs));
  CHECK(has_verdict(vs, Level::warn, "GID table not read (ibv_query_gid_ex(port 1, index 1): Permission denied"));
  CHECK_FALSE(has_verdict(vs, Level::warn, "no IPv4 RoCE v2 GID"));
}

TEST_CASE("ARP sysctls matter with several RDMA netdevs", "[doctor]") {
  CHECK(has_verdict(arp_verdicts({"dummy0"}, {}), Level::info, "one RDMA netdev (dummy0)"));
  const std::vector<std::string> devs = {"eth2", "eth3"};
  std::vector<ArpScope> scopes = {{"all", 0, 0}, {"default", 0, 0}, {"eth2", 0, 0}, {"eth3", 1, 2}};
  auto vs = arp_verdicts(devs, scopes);
  CHECK(has_verdict(vs, Level::warn, "at their defaults (0/0) on eth2 with 2 RDMA netdevs"));
  CHECK(has_verdict(vs, Level::warn, "rdma_cm then resolves to the wrong device"));
  scopes[0] = {"all", 1, 2};
  CHECK(has_verdict(arp_verdicts(devs, scopes), Level::ok, "none at arp_ignore/arp_announce defaults"));
}

TEST_CASE("PCI configuration space: relaxed ordering enable and ACS", "[doctor]") {
  std::vector<std::uint8_t> cfg(4096, 0);
  cfg[0x06] = 0x10;  // status: capability list
  cfg[0x34] = 0x40;
  cfg[0x40] = 0x10;  // PCI Express capability, last in the list
  cfg[0x41] = 0x00;
  cfg[0x48] = 0x10;  // Device Control: Enable Relaxed Ordering
  // ACS at 0x100 (the first extended capability), capability SV TB RR CR UF, control SV RR CR UF.
  cfg[0x100] = 0x0d;
  cfg[0x104] = 0x1f;
  cfg[0x106] = 0x1d;
  CHECK(pcie_relaxed_ordering(cfg).value == true);
  CHECK(describe_acs(cfg) == "ctrl 0x001d: SV RR CR UF on (offers SV TB RR CR UF)");

  cfg[0x48] = 0;
  CHECK(pcie_relaxed_ordering(cfg).value == false);

  // An unprivileged reader sees 64 bytes.
  const std::vector<std::uint8_t> user(cfg.begin(), cfg.begin() + 64);
  CHECK_FALSE(pcie_relaxed_ordering(user).value);
  CHECK_THAT(pcie_relaxed_ordering(user).why, Contains("need root"));
  CHECK_THAT(describe_acs(user), Contains("not readable"));

  // ACS second in the extended list, behind AER.
  std::vector<std::uint8_t> two(4096, 0);
  two[0x100] = 0x01;
  two[0x102] = 0x01;
  two[0x103] = 0x14;  // next 0x140, version 1
  two[0x140] = 0x0d;
  two[0x146] = 0x00;
  CHECK(describe_acs(two) == "ctrl 0x0000: none on (offers none)");
  CHECK(describe_acs(std::vector<std::uint8_t>(4096, 0)) == "no ACS capability");
}

TEST_CASE("the IOMMU mode is named from units and group types", "[doctor]") {
  IommuFacts f;
  f.groups = 0;
  CHECK_THAT(iommu_mode(f), StartsWith("off"));
  f.units = {"dmar0"};
  f.groups = 40;
  f.group_types = {{"identity", 40}};
  CHECK_THAT(iommu_mode(f), StartsWith("passthrough"));
  f.group_types = {{"DMA-FQ", 40}};
  CHECK_THAT(iommu_mode(f), StartsWith("translated"));
  f.group_types = {{"DMA", 1}, {"identity", 39}};
  CHECK_THAT(iommu_mode(f), StartsWith("mixed"));
}

TEST_CASE("the text report aligns keys and names the device, link layer and memlock", "[doctor]") {
  const Facts f = rxe_facts();
  const std::string text = render_text(f, judge(f, kRing));
  INFO(text);
  CHECK_THAT(text, StartsWith("rdmaring doctor: 1 verbs device (rxe0), 1 usable\n"));
  CHECK_THAT(text, Contains("\ndevice rxe0\n"));
  CHECK_THAT(text, Contains("\n  port 1            ACTIVE, Ethernet\n"));
  CHECK_THAT(text, Contains("\n    MTU             4096 active, 4096 max; netdev dummy0 MTU 9000\n"));
  CHECK_THAT(text, Contains("\n    GID 1           ::ffff:169.254.0.1    RoCE v2     dummy0\n"));
  CHECK_THAT(text, Contains("\n    GID table       2 of 1024 entries in use\n"));
  CHECK_THAT(text, Contains("\n  RLIMIT_MEMLOCK    soft unlimited, hard unlimited\n"));
  CHECK_THAT(text, Contains("\n  max inline        512 B granted, 513 B refused (EINVAL, errno 22)"));
  CHECK_THAT(text, Contains("\n  ok    memlock: unlimited"));
  CHECK_THAT(text, Contains("nvidia-smi        none"));
  // No line ends in a blank.
  CHECK(text.find(" \n") == std::string::npos);
}

TEST_CASE("the JSON report is one object with a devices array", "[doctor]") {
  Facts f = rxe_facts();
  // Not UTF-8 (a lone 0xff), control characters, quotes and backslashes: it must still parse.
  f.nvidia_smi = {true, "/usr/bin/nvidia-smi", 0, "\tGPU0\tmlx5_0\nGPU0\t X \tPIX\n\"quoted\"\\ \xff"};
  const std::string text = render_json(f, judge(f, kRing));
  INFO(text);
  CHECK(text.find('\n') == std::string::npos);
  const auto j = nlohmann::ordered_json::parse(text);
  REQUIRE(j.is_object());
  CHECK(j.begin().key() == "tool");
  CHECK(j["tool"] == "rdmaring doctor");
  CHECK(j["device_filter"].is_null());
  CHECK(j["usable_devices"] == 1);
  CHECK(j["ring_bytes"] == kRing);
  REQUIRE(j["devices"].size() == 1);
  const auto& d = j["devices"][0];
  CHECK(d["name"] == "rxe0");
  CHECK(d["usable"] == true);
  CHECK(d["software"] == true);
  CHECK(d["ports"][0]["link_layer"] == "Ethernet");
  CHECK(d["ports"][0]["gids"][1] == nlohmann::ordered_json{{"index", 1}, {"gid", "::ffff:169.254.0.1"}, {"type", "RoCE v2"}, {"netdev", "dummy0"}});
  CHECK(d["ports"][0]["gid_error"].is_null());
  CHECK(d["caps"]["dma_bounce"] == "not reported by this rdma-core");
  CHECK(d["caps"]["max_inline"]["granted"] == 512);
  CHECK(d["caps"]["max_inline"]["refused_errno"] == EINVAL);
  CHECK(d["numa_node"].is_null());
  CHECK(d["verdicts"][0]["level"] == "ok");
  CHECK(j["memlock"]["soft"].is_null());
  CHECK(j["memlock"]["hard"].is_null());
  CHECK(j["memlock"]["unlimited"] == true);
  CHECK(j["nvidia_smi_topo"]["output"] == "\tGPU0\tmlx5_0\nGPU0\t X \tPIX\n\"quoted\"\\ \xef\xbf\xbd");  // U+FFFD
  CHECK(j["arp"].is_array());
  CHECK(j["verdicts"].is_array());

  Facts none;
  none.device_error = "ibv_get_device_list: no RDMA device found; load rdma_rxe (Soft-RoCE)";
  const Verdicts judged = judge(none, kRing);
  CHECK(has_verdict(judged.host, Level::fail, "devices: ibv_get_device_list: no RDMA device found"));
  const auto empty = nlohmann::json::parse(render_json(none, judged));
  CHECK(empty["usable_devices"] == 0);
  CHECK(empty["devices"].empty());
  CHECK_THAT(empty["error"].get<std::string>(), Contains("rdma_rxe"));
  CHECK(std::any_of(empty["verdicts"].begin(), empty["verdicts"].end(), [](const auto& v) { return v["level"] == "fail"; }));
}

namespace {

// Parses `args` as the command line of `rdmaring doctor`, without running it.
std::string parse_doctor(std::vector<std::string> args, std::uint64_t* ring_bytes = nullptr) {
  CLI::App app{"test", "rdmaring"};
  const tools::Command doctor = tools::add_doctor_command(app);
  args.insert(args.begin(), "doctor");
  std::reverse(args.begin(), args.end());  // CLI11 takes the vector reversed, as a stack
  try {
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    return e.what();
  }
  if (ring_bytes != nullptr) *ring_bytes = doctor.app->get_option("--ring-bytes")->as<std::uint64_t>();
  return "";
}

}  // namespace

TEST_CASE("the doctor's command line: byte counts are read strictly, and every refusal is one line", "[doctor]") {
  std::uint64_t ring = 0;
  CHECK(parse_doctor({"--json", "--device", "rxe0"}, &ring) == "");
  CHECK(ring == kRing);
  CHECK(parse_doctor({"--ring-bytes", "0x100000"}, &ring) == "");
  CHECK(ring == 0x100000);
  CHECK(parse_doctor({"--ring-bytes", "010"}, &ring) == "");
  CHECK(ring == 10);  // decimal: a leading 0 is not octal

  for (const char* bad : {"0", "-1", "x", "1k", "", "0x", "18446744073709551616"}) {
    const std::string error = parse_doctor({"--ring-bytes", bad});
    INFO(error);
    CHECK_THAT(error, StartsWith("--ring-bytes: needs a whole number from 1 below 2^64"));
    CHECK(error.find('\n') == std::string::npos);
  }
  CHECK_THAT(parse_doctor({"--no-such-option"}), Contains("--no-such-option"));
  CHECK_THAT(parse_doctor({"--device"}), Contains("--device"));
}
