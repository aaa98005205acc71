// rdmaring-doctor's pure parts: JSON escaping and writing, the GID/CPU-list/PCI parsers, and the
// verdicts drawn from made-up facts (an rxe-like device, a PCI RNIC, memlock limits, ARP).
#include "../../bench/doctor_report.hpp"

#include <catch2/catch.hpp>

#include "../json_shape.hpp"

#include <cerrno>
#include <string>
#include <vector>

using namespace rdmaring;
using namespace rdmaring::doctor;
using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;

namespace {


bool has_verdict(const std::vector<Verdict>& vs, Level level, const std::string& text) {
  for (const Verdict& v : vs) {
    if (v.level == level && v.text.find(text) != std::string::npos) return true;
  }
  return false;
}

std::string all_text(const std::vector<Verdict>& vs) {
  std::string s;
  for (const Verdict& v : vs) s += std::string(level_name(v.level)) + " " + v.text + "\n";
  return s;
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

Report rxe_report() {
  Report r;
  r.devices = {rxe_like()};
  r.process.cpus = {0, 1};
  r.process.mempolicy = "default";
  r.process.mems_allowed = "0";
  r.rdma_netdevs = {"dummy0"};
  judge(r);
  return r;
}

}  // namespace

TEST_CASE("json_escape escapes quotes, backslashes and control characters", "[doctor]") {
  CHECK(json_escape("plain") == "\"plain\"");
  CHECK(json_escape("a\"b\\c") == "\"a\\\"b\\\\c\"");
  CHECK(json_escape("l1\nl2\tx\r") == "\"l1\\nl2\\tx\\r\"");
  CHECK(json_escape(std::string("\x01\x1f", 2)) == "\"\\u0001\\u001f\"");
  CHECK(json_escape(std::string("nul\0x", 5)) == "\"nul\\u0000x\"");
  CHECK(json_escape("/") == "\"/\"");
}

TEST_CASE("json_escape keeps UTF-8 and replaces what is not", "[doctor]") {
  CHECK(json_escape("GPU0\xe2\x86\x92mlx5_0") == "\"GPU0\xe2\x86\x92mlx5_0\"");  // U+2192
  CHECK(json_escape("\xf0\x9f\x98\x80") == "\"\xf0\x9f\x98\x80\"");              // 4-byte
  CHECK(json_escape("a\xff" "b") == "\"a\\ufffdb\"");                           // never valid
  CHECK(json_escape("\xc0\xaf") == "\"\\ufffd\\ufffd\"");                        // overlong '/'
  CHECK(json_escape("\xed\xa0\x80") == "\"\\ufffd\\ufffd\\ufffd\"");             // surrogate
  CHECK(json_escape("\xe2\x86") == "\"\\ufffd\\ufffd\"");                        // truncated
}

TEST_CASE("JsonWriter places commas and keys", "[doctor]") {
  JsonWriter j;
  j.begin_object();
  j.key("a").number(-1);
  j.key("b").begin_array().string("x").boolean(true).null().unsigned_number(18446744073709551615ULL).end_array();
  j.key("c").begin_object().end_object();
  j.key("d").optional(std::optional<int>{}, [](JsonWriter& w, int v) { w.number(v); });
  j.key("e\"").optional(std::optional<int>{3}, [](JsonWriter& w, int v) { w.number(v); });
  j.key("f").begin_array().begin_object().key("g").string("h").end_object().begin_object().end_object().end_array();
  j.end_object();
  CHECK(j.str() ==
        "{\"a\":-1,\"b\":[\"x\",true,null,18446744073709551615],\"c\":{},\"d\":null,\"e\\\"\":3,"
        "\"f\":[{\"g\":\"h\"},{}]}");
  CHECK(rdmaring::test::structurally_json(j.str()));
}

TEST_CASE("GIDs print in compressed IPv6 form", "[doctor]") {
  CHECK(compress_gid("fe80:0000:0000:0000:0072:72ff:fe00:0001") == "fe80::72:72ff:fe00:1");
  CHECK(compress_gid("0000:0000:0000:0000:0000:ffff:a9fe:0001") == "::ffff:169.254.0.1");
  CHECK(compress_gid("0000:0000:0000:0000:0000:0000:0000:0000") == "::");
  CHECK(compress_gid("2001:0db8:0000:0000:0001:0000:0000:0001") == "2001:db8::1:0:0:1");
  CHECK(compress_gid("2001:0db8:0000:0001:0001:0001:0001:0001") == "2001:db8:0:1:1:1:1:1");
  CHECK(compress_gid("fe80:0000:0000:0000:0000:0000:0000:0000") == "fe80::");
  CHECK(compress_gid("not a gid") == "not a gid");
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
}

TEST_CASE("memlock verdicts count a ring and the producer's mirror", "[doctor]") {
  MemlockFacts m;
  CHECK(memlock_verdict(m, 1 << 20).level == Level::ok);
  CHECK_THAT(memlock_verdict(m, 1 << 20).text,
             StartsWith("memlock: unlimited") &&
                 Contains("a 1 MiB ring needs 1 MiB pinned per producer, twice with the producer's staging mirror"));

  m.state.soft_limit = 64 * 1024;
  m.state.hard_limit = 64 * 1024;
  Verdict v = memlock_verdict(m, 1 << 20);
  CHECK(v.level == Level::fail);
  CHECK_THAT(v.text, Contains("65536 B (64 KiB)") && Contains("room for 0 consumer rings") && Contains("limits.conf"));

  m.state.cap_ipc_lock = true;
  CHECK(memlock_verdict(m, 1 << 20).level == Level::ok);
  CHECK_THAT(memlock_verdict(m, 1 << 20).text, Contains("CAP_IPC_LOCK"));
  m.state.cap_ipc_lock = false;

  // 1.5 MiB: one consumer ring fits, a producer and a consumer in one process do not.
  m.state.soft_limit = 3 << 19;
  m.state.hard_limit.reset();
  v = memlock_verdict(m, 1 << 20);
  CHECK(v.level == Level::warn);
  CHECK_THAT(v.text, Contains("room for 1 consumer ring,") && Contains("0 producer+consumer pairs") && Contains("ulimit -l"));

  m.state.soft_limit = 8 << 20;  // the usual distribution default
  v = memlock_verdict(m, 1 << 20);
  CHECK(v.level == Level::ok);
  CHECK_THAT(v.text, Contains("room for 7 consumer rings") && Contains("3 producer+consumer pairs"));

  // What is already pinned is gone.
  m.state.pinned = 7 << 20;
  CHECK(memlock_verdict(m, 1 << 20).level == Level::fail);

  m.state.pinned = 0;
  CHECK_THAT(memlock_verdict(m, 64 << 20).text, Contains("a 64 MiB ring needs 64 MiB pinned"));
}

TEST_CASE("an rxe-like device gets the verdicts of a software device", "[doctor]") {
  const DeviceFacts d = rxe_like();
  ProcessFacts p;
  p.cpus = {0, 1};
  const auto vs = device_verdicts(d, p);
  INFO(all_text(vs));
  CHECK(d.usable());
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
  d.numa_node = 1;
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
  CHECK_FALSE(d.usable());

  DeviceFacts broken = rxe_like();
  broken.error = "ibv_open_device(rxe0): Permission denied";
  CHECK_FALSE(broken.usable());
  CHECK(has_verdict(device_verdicts(broken, p), Level::fail, "rxe0: not usable: ibv_open_device"));

  DeviceFacts no_qp = rxe_like();
  no_qp.objects_ok = false;
  no_qp.inline_probed = false;
  no_qp.relaxed_registration = DeviceFacts::RoReg::not_probed;
  no_qp.objects_error = "ibv_alloc_pd(rxe0): ENOMEM";
  CHECK_FALSE(no_qp.usable());
  CHECK(has_verdict(device_verdicts(no_qp, p), Level::warn, "inline: not probed (ibv_alloc_pd(rxe0): ENOMEM)"));
}

TEST_CASE("an Ethernet port without an IPv4 GID or with a small MTU is called out", "[doctor]") {
  DeviceFacts d = rxe_like();
  d.ports[0].gids.pop_back();
  d.ports[0].active_mtu = 1024;
  d.ports[0].netdev_mtu = 1500;
  const auto vs = device_verdicts(d, ProcessFacts{});
  INFO(all_text(vs));
  CHECK(has_verdict(vs, Level::warn, "no IPv4 RoCE v2 GID"));
  CHECK(has_verdict(vs, Level::warn, "RDMA MTU 1024 follows the netdev MTU 1500"));
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
  const Report r = rxe_report();
  const std::string text = render_text(r);
  INFO(text);
  CHECK_THAT(text, StartsWith("rdmaring-doctor: 1 verbs device (rxe0), 1 usable\n"));
  CHECK_THAT(text, Contains("\ndevice rxe0\n"));
  CHECK_THAT(text, Contains("\n  port 1            ACTIVE, Ethernet\n"));
  CHECK_THAT(text, Contains("\n    MTU             4096 active, 4096 max; netdev dummy0 MTU 9000\n"));
  CHECK_THAT(text, Contains("\n    GID 1           ::ffff:169.254.0.1    RoCE v2     dummy0\n"));
  CHECK_THAT(text, Contains("\n  RLIMIT_MEMLOCK    soft unlimited, hard unlimited\n"));
  CHECK_THAT(text, Contains("\n  max inline        512 B granted, 513 B refused (EINVAL, errno 22)"));
  CHECK_THAT(text, Contains("\n  ok    memlock: unlimited"));
  CHECK_THAT(text, Contains("nvidia-smi        none"));
  // No line ends in a blank.
  CHECK(text.find(" \n") == std::string::npos);
}

TEST_CASE("the JSON report is one object with a devices array", "[doctor]") {
  Report r = rxe_report();
  r.nvidia_smi = {true, "/usr/bin/nvidia-smi", 0, "\tGPU0\tmlx5_0\nGPU0\t X \tPIX\n\"quoted\"\\"};
  const std::string json = render_json(r);
  INFO(json);
  CHECK(rdmaring::test::structurally_json(json));
  CHECK_THAT(json, StartsWith("{\"tool\":\"rdmaring-doctor\""));
  CHECK_THAT(json, Contains("\"devices\":[{\"name\":\"rxe0\",\"usable\":true"));
  CHECK_THAT(json, Contains("\"link_layer\":\"Ethernet\""));
  CHECK_THAT(json, Contains("\"gid\":\"::ffff:169.254.0.1\",\"type\":\"RoCE v2\",\"netdev\":\"dummy0\""));
  CHECK_THAT(json, Contains("\"memlock\":{\"soft\":null,\"hard\":null,\"unlimited\":true"));
  CHECK_THAT(json, Contains("\"dma_bounce\":\"not reported by this rdma-core\""));
  CHECK_THAT(json, Contains("\"output\":\"\\tGPU0\\tmlx5_0\\nGPU0\\t X \\tPIX\\n\\\"quoted\\\"\\\\\""));
  CHECK(json.back() == '}');

  Report none;
  none.device_error = "ibv_get_device_list: no RDMA device found; load rdma_rxe (Soft-RoCE)";
  judge(none);
  const std::string empty = render_json(none);
  CHECK(rdmaring::test::structurally_json(empty));
  CHECK_THAT(empty, Contains("\"usable_devices\":0") && Contains("\"devices\":[]") && Contains("rdma_rxe"));
  CHECK(has_verdict(none.verdicts, Level::fail, "devices: ibv_get_device_list: no RDMA device found"));
}
