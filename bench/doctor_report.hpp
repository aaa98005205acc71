// rdmaring-doctor's model: the facts it gathers, the verdicts it draws from them, and the two
// renderings (aligned text, one JSON object). Everything here is pure (no device, no file
// system), so tests/unit/doctor_test.cpp checks it with made-up facts; bench/doctor.cpp gathers
// the facts.
//
// Header-only because the doctor is one translation unit (bench/CMakeLists.txt builds
// doctor.cpp alone) and the unit tests include this file directly.
#pragma once

#include "rdmaring/verbs/context.hpp"
#include "rdmaring/verbs/mr.hpp"
#include "rdmaring/wire.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace rdmaring::doctor {

// ---------------------------------------------------------------------------------------------
// JSON: one small writer. Strings are escaped per RFC 8259; bytes that are not valid UTF-8
// become U+FFFD, so the output parses whatever sysfs or nvidia-smi printed.

inline std::string json_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 2);
  out += '"';
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      switch (c) {
        case '"': out += "\\\""; break;
        case '\\': out += "\\\\"; break;
        case '\b': out += "\\b"; break;
        case '\f': out += "\\f"; break;
        case '\n': out += "\\n"; break;
        case '\r': out += "\\r"; break;
        case '\t': out += "\\t"; break;
        default:
          if (c < 0x20) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\u%04x", c);
            out += buf;
          } else {
            out += static_cast<char>(c);
          }
      }
      ++i;
      continue;
    }
    // A multi-byte sequence: copied when well-formed (no overlongs, no surrogates), else U+FFFD.
    std::size_t len = c >= 0xF0 && c <= 0xF4 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 && c <= 0xDF ? 2 : 0;
    if (c > 0xF4) len = 0;
    bool ok = len != 0 && i + len <= s.size();
    for (std::size_t k = 1; ok && k < len; ++k) ok = (static_cast<unsigned char>(s[i + k]) & 0xC0) == 0x80;
    if (ok && len >= 3) {
      const auto c1 = static_cast<unsigned char>(s[i + 1]);
      if (c == 0xE0 && c1 < 0xA0) ok = false;  // overlong
      if (c == 0xED && c1 >= 0xA0) ok = false;  // surrogate
      if (c == 0xF0 && c1 < 0x90) ok = false;  // overlong
      if (c == 0xF4 && c1 >= 0x90) ok = false;  // beyond U+10FFFF
    }
    if (ok) {
      out.append(s.substr(i, len));
      i += len;
    } else {
      out += "\\ufffd";
      ++i;
    }
  }
  out += '"';
  return out;
}

// Builds one JSON text: key() before each value inside an object, values alone inside an array.
// Commas are placed by the writer.
class JsonWriter {
 public:
  JsonWriter& begin_object() { value_prefix(); out_ += '{'; first_.push_back(true); return *this; }
  JsonWriter& begin_array() { value_prefix(); out_ += '['; first_.push_back(true); return *this; }
  JsonWriter& end_object() { out_ += '}'; first_.pop_back(); return *this; }
  JsonWriter& end_array() { out_ += ']'; first_.pop_back(); return *this; }
  JsonWriter& key(std::string_view k) {
    comma();
    out_ += json_escape(k);
    out_ += ':';
    after_key_ = true;
    return *this;
  }
  JsonWriter& string(std::string_view v) { value_prefix(); out_ += json_escape(v); return *this; }
  JsonWriter& number(std::int64_t v) { value_prefix(); out_ += std::to_string(v); return *this; }
  JsonWriter& unsigned_number(std::uint64_t v) { value_prefix(); out_ += std::to_string(v); return *this; }
  JsonWriter& boolean(bool v) { value_prefix(); out_ += v ? "true" : "false"; return *this; }
  JsonWriter& null() { value_prefix(); out_ += "null"; return *this; }
  // Absent facts are empty strings in the structs and null in the JSON.
  JsonWriter& string_or_null(std::string_view v) { return v.empty() ? null() : string(v); }
  template <class T, class F>
  JsonWriter& optional(const std::optional<T>& v, F&& write) {
    if (v) {
      write(*this, *v);
    } else {
      null();
    }
    return *this;
  }
  const std::string& str() const noexcept { return out_; }

 private:
  void comma() {
    if (!first_.empty()) {
      if (!first_.back()) out_ += ',';
      first_.back() = false;
    }
  }
  void value_prefix() {
    if (after_key_) {
      after_key_ = false;
    } else {
      comma();
    }
  }
  std::string out_;
  std::vector<bool> first_;
  bool after_key_ = false;
};

// ---------------------------------------------------------------------------------------------
// Small formatting helpers.

// "1048576 B (1 MiB)": exact bytes, as the verbs layer prints limits, plus a rounded reading.
inline std::string format_bytes(std::uint64_t n) {
  std::string s = std::to_string(n) + " B";
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (n < 1024) return s;
  double v = static_cast<double>(n);
  int unit = -1;
  while (v >= 1024.0 && unit < 5) {
    v /= 1024.0;
    ++unit;
  }
  char buf[32];
  if (v == static_cast<double>(static_cast<std::uint64_t>(v))) {
    std::snprintf(buf, sizeof buf, " (%.0f %s)", v, kUnits[unit]);
  } else {
    std::snprintf(buf, sizeof buf, " (%.1f %s)", v, kUnits[unit]);
  }
  return s + buf;
}

// "0072:72ff:fe00:0001", as ibv_devinfo prints a GUID (host byte order in).
inline std::string format_guid(std::uint64_t guid) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "%04x:%04x:%04x:%04x", static_cast<unsigned>(guid >> 48) & 0xffffU,
                static_cast<unsigned>(guid >> 32) & 0xffffU, static_cast<unsigned>(guid >> 16) & 0xffffU,
                static_cast<unsigned>(guid) & 0xffffU);
  return buf;
}

// "EINVAL, errno 22".
inline std::string errno_name(int err) {
  const char* name = strerrorname_np(err);
  return (name != nullptr ? std::string(name) + ", " : std::string()) + "errno " + std::to_string(err);
}

// `text` without ANSI escape sequences: nvidia-smi underlines its topo header even into a pipe.
inline std::string strip_ansi(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '\x1b') {
      out += text[i];
      continue;
    }
    if (i + 1 < text.size() && text[i + 1] == '[') {
      // CSI: parameters and intermediates, then one final byte in 0x40..0x7e.
      i += 2;
      while (i < text.size() && !(text[i] >= 0x40 && text[i] <= 0x7e)) ++i;
    } else {
      ++i;  // a two-byte escape
    }
  }
  return out;
}

// Parses a kernel CPU or node list ("0-3,8,10-11"); nullopt when it is malformed.
inline std::optional<std::set<int>> parse_id_list(std::string_view s) {
  std::set<int> ids;
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.remove_suffix(1);
  if (s.empty()) return ids;
  std::size_t pos = 0;
  auto number = [&](int& out) {
    const std::size_t start = pos;
    long v = 0;
    while (pos < s.size() && s[pos] >= '0' && s[pos] <= '9' && v < 1 << 20) v = v * 10 + (s[pos++] - '0');
    if (pos == start || v >= 1 << 20) return false;
    out = static_cast<int>(v);
    return true;
  };
  while (pos < s.size()) {
    int lo = 0;
    int hi = 0;
    if (!number(lo)) return std::nullopt;
    hi = lo;
    if (pos < s.size() && s[pos] == '-') {
      ++pos;
      if (!number(hi) || hi < lo) return std::nullopt;
    }
    for (int i = lo; i <= hi; ++i) ids.insert(i);
    if (pos < s.size()) {
      if (s[pos] != ',') return std::nullopt;
      ++pos;
    }
  }
  return ids;
}

// The inverse: "0-3,8,10-11"; "" for none.
inline std::string format_id_list(const std::set<int>& ids) {
  std::string out;
  for (auto it = ids.begin(); it != ids.end();) {
    const int lo = *it;
    int hi = lo;
    auto next = std::next(it);
    while (next != ids.end() && *next == hi + 1) {
      hi = *next;
      ++next;
    }
    if (!out.empty()) out += ',';
    out += std::to_string(lo);
    if (hi != lo) out += '-' + std::to_string(hi);
    it = next;
  }
  return out;
}

// sysfs spells a GID as eight groups of four hex digits; this is the compressed IPv6 form
// (RFC 5952), with an IPv4-mapped GID as ::ffff:a.b.c.d. Returns the input when it is not a GID.
inline std::string compress_gid(std::string_view sysfs) {
  std::uint16_t g[8]{};
  std::size_t pos = 0;
  for (int i = 0; i < 8; ++i) {
    if (pos + 4 > sysfs.size()) return std::string(sysfs);
    unsigned v = 0;
    for (int k = 0; k < 4; ++k) {
      const char ch = sysfs[pos++];
      const int d = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10 : -1;
      if (d < 0) return std::string(sysfs);
      v = v * 16 + static_cast<unsigned>(d);
    }
    g[i] = static_cast<std::uint16_t>(v);
    if (i < 7) {
      if (pos >= sysfs.size() || sysfs[pos] != ':') return std::string(sysfs);
      ++pos;
    }
  }
  if (g[0] == 0 && g[1] == 0 && g[2] == 0 && g[3] == 0 && g[4] == 0 && g[5] == 0xffff) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "::ffff:%u.%u.%u.%u", g[6] >> 8, g[6] & 0xffU, g[7] >> 8, g[7] & 0xffU);
    return buf;
  }
  // The longest run of two or more zero groups becomes "::" (the first such run on a tie).
  int best = -1;
  int best_len = 1;
  for (int i = 0; i < 8;) {
    if (g[i] != 0) {
      ++i;
      continue;
    }
    int j = i;
    while (j < 8 && g[j] == 0) ++j;
    if (j - i > best_len) {
      best = i;
      best_len = j - i;
    }
    i = j;
  }
  std::string out;
  char buf[8];
  for (int i = 0; i < 8; ++i) {
    if (i == best) {
      out += "::";
      i += best_len - 1;
      continue;
    }
    if (!out.empty() && out.back() != ':') out += ':';
    std::snprintf(buf, sizeof buf, "%x", g[i]);
    out += buf;
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// PCI configuration space, as read from /sys/bus/pci/devices/BDF/config. Unprivileged readers
// get only the first 64 bytes; the kernel gives root 256 (conventional) or 4096 (PCIe).

inline std::optional<std::uint16_t> cfg16(const std::vector<std::uint8_t>& cfg, std::size_t off) {
  if (off + 2 > cfg.size()) return std::nullopt;
  return static_cast<std::uint16_t>(cfg[off] | (cfg[off + 1] << 8));
}
inline std::optional<std::uint32_t> cfg32(const std::vector<std::uint8_t>& cfg, std::size_t off) {
  if (off + 4 > cfg.size()) return std::nullopt;
  return static_cast<std::uint32_t>(cfg[off]) | static_cast<std::uint32_t>(cfg[off + 1]) << 8 |
         static_cast<std::uint32_t>(cfg[off + 2]) << 16 | static_cast<std::uint32_t>(cfg[off + 3]) << 24;
}

// What a reader can say about one bit of configuration space.
struct PciBit {
  std::optional<bool> value;  // nullopt: unknown, see why
  std::string why;
};

// The PCI Express capability's Device Control "Enable Relaxed Ordering" bit: whether the function
// may set the Relaxed Ordering attribute on its writes at all (the kernel's
// pcie_relaxed_ordering_enabled(), which mlx5 checks before honouring
// IBV_ACCESS_RELAXED_ORDERING).
inline PciBit pcie_relaxed_ordering(const std::vector<std::uint8_t>& cfg) {
  constexpr std::size_t kPcieCapId = 0x10;
  const auto status = cfg16(cfg, 0x06);
  if (!status) return {std::nullopt, "configuration space not readable"};
  if ((*status & 0x10) == 0) return {std::nullopt, "no capability list (not PCI Express)"};
  std::size_t ptr = cfg.size() > 0x34 ? cfg[0x34] & 0xfcU : 0;
  for (int guard = 0; ptr >= 0x40 && guard < 48; ++guard) {
    if (ptr + 2 > cfg.size()) return {std::nullopt, "not readable (capabilities beyond byte 64 need root)"};
    if (cfg[ptr] == kPcieCapId) {
      const auto devctl = cfg16(cfg, ptr + 8);
      if (!devctl) return {std::nullopt, "not readable (capabilities beyond byte 64 need root)"};
      return {(*devctl & 0x10) != 0, ""};
    }
    ptr = cfg[ptr + 1] & 0xfcU;
  }
  return {std::nullopt, "no PCI Express capability"};
}

// The ACS extended capability of one function: "ctrl 0x001d: SV RR CR UF on (of SV TB RR CR UF)",
// "no ACS capability", or why it cannot be read.
inline std::string describe_acs(const std::vector<std::uint8_t>& cfg) {
  if (cfg.size() <= 0x100) {
    return cfg.size() <= 64 ? "not readable (extended configuration space needs root)"
                            : "no extended configuration space (conventional PCI view)";
  }
  static constexpr const char* kBits[] = {"SV", "TB", "RR", "CR", "UF", "EC", "DT"};
  std::size_t off = 0x100;
  for (int guard = 0; off >= 0x100 && guard < 96; ++guard) {
    const auto header = cfg32(cfg, off);
    if (!header || *header == 0 || *header == 0xffffffffU) break;
    if ((*header & 0xffffU) == 0x000d) {
      const auto cap = cfg16(cfg, off + 4);
      const auto ctrl = cfg16(cfg, off + 6);
      if (!cap || !ctrl) return "not readable";
      std::string on, offered;
      for (int b = 0; b < 7; ++b) {
        if (*cap & (1U << b)) offered += std::string(offered.empty() ? "" : " ") + kBits[b];
        if (*ctrl & (1U << b)) on += std::string(on.empty() ? "" : " ") + kBits[b];
      }
      char buf[16];
      std::snprintf(buf, sizeof buf, "ctrl 0x%04x", *ctrl);
      return std::string(buf) + ": " + (on.empty() ? "none" : on) + " on (offers " +
             (offered.empty() ? "none" : offered) + ")";
    }
    off = (*header >> 20) & 0xffcU;
  }
  return "no ACS capability";
}

// ---------------------------------------------------------------------------------------------
// The facts.

enum class Level { ok, info, warn, fail };

inline const char* level_name(Level l) {
  switch (l) {
    case Level::ok: return "ok";
    case Level::info: return "info";
    case Level::warn: return "warn";
    case Level::fail: return "FAIL";
  }
  return "?";
}

struct Verdict {
  Level level = Level::info;
  std::string text;
};

struct GidEntry {
  int index = 0;
  std::string gid;     // compressed
  std::string type;    // "RoCE v2", "IB/RoCE v1", or "" when gid_attrs/types is unreadable
  std::string netdev;  // "" when gid_attrs/ndevs is unreadable (IB ports have none)
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
};

struct PciFunction {
  std::string bdf;  // "0000:3b:00.0", the device first, then its upstream bridges
  std::string acs;
};

struct DeviceFacts {
  std::string name;
  std::string node_guid;
  std::string node_type;  // ibv_node_type_str
  std::string transport;  // from ibv_device::transport_type
  std::string parent;     // sysfs "parent": the netdev of rxe/siw
  std::string bus_device; // the PCI function, "" for a software device
  std::string driver;
  std::string error;  // why the device could not be opened or queried; "" when it was
  bool queried = false;
  verbs::DeviceCaps caps;
  std::vector<PortFacts> ports;

  // Probes that need a PD (and CQ and QP): done only where those could be created.
  bool objects_ok = false;      // a PD, a CQ and an RC QP were created
  std::string objects_error;    // the failure otherwise
  enum class RoReg { not_probed, accepted, refused } relaxed_registration = RoReg::not_probed;
  int relaxed_errno = 0;
  std::string relaxed_note;  // why the registration was not probed, or the refusal's message
  PciBit pcie_relaxed_ordering{std::nullopt, "no PCI function"};
  bool inline_probed = false;
  std::uint32_t inline_default = 0;            // granted when asking for 0 B
  std::uint32_t max_inline = 0;                // the largest inline size granted
  std::optional<std::uint32_t> inline_refused; // the smallest size asked for and refused
  int inline_errno = 0;

  std::optional<int> numa_node;  // -1 is kept: the device's firmware reported none
  std::string numa_note;         // why numa_node is absent
  std::string numa_cpus;         // the node's cpulist
  std::string iommu_group_type;  // "identity", "DMA", "DMA-FQ"; "" when none
  std::vector<PciFunction> pci_path;
  std::vector<Verdict> verdicts;  // filled by judge()

  bool software() const { return bus_device.empty(); }
  bool any_port_active() const {
    return std::any_of(ports.begin(), ports.end(), [](const PortFacts& p) { return p.active; });
  }
  // What exit status 0 promises: the device opens, a port is ACTIVE, and the objects a
  // connection needs (PD, CQ, RC QP) can be created on it.
  bool usable() const { return error.empty() && queried && any_port_active() && objects_ok; }
};

struct MemlockFacts {
  verbs::MemlockState state;  // limits, CAP_IPC_LOCK, VmPin, VmLck
};

struct ProcessFacts {
  std::set<int> cpus;  // sched_getaffinity
  std::string affinity_error;
  std::string mempolicy;     // "default", "bind 0-1", ..., or why unknown
  std::string mems_allowed;  // /proc/self/status Mems_allowed_list
};

struct IommuFacts {
  std::vector<std::string> units;    // /sys/class/iommu
  std::vector<std::string> cmdline;  // iommu=, intel_iommu=, amd_iommu=, iommu.* arguments
  std::optional<int> groups;         // nullopt: /sys/kernel/iommu_groups absent
  std::map<std::string, int> group_types;  // default domain type -> groups
};

// The IOMMU in one phrase, from what the kernel shows.
inline std::string iommu_mode(const IommuFacts& f) {
  if ((!f.groups || *f.groups == 0) && f.units.empty()) {
    return "off: no IOMMU units, no IOMMU groups (devices DMA to physical addresses)";
  }
  if (f.group_types.empty()) {
    return f.groups && *f.groups > 0 ? "on (group domain types not readable)"
                                     : "IOMMU units present, no groups";
  }
  const bool identity = f.group_types.count("identity") != 0;
  const bool translated = f.group_types.size() > (identity ? 1U : 0U);
  if (identity && !translated) return "passthrough: every group has an identity domain";
  if (!identity) return "translated: DMA goes through IOMMU page tables";
  return "mixed: some groups identity (passthrough), some translated";
}

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

struct Report {
  std::string filter;  // --device
  std::uint64_t ring_bytes = 1 << 20;
  std::vector<DeviceFacts> devices;
  std::string device_error;  // no device at all, or none called --device
  ProcessFacts process;
  MemlockFacts memlock;
  IommuFacts iommu;
  ToolOutput nvidia_smi;
  std::vector<std::string> rdma_netdevs;
  std::vector<ArpScope> arp;  // read only when there are several RDMA netdevs
  std::vector<Verdict> verdicts;  // host-wide

  std::size_t usable_count() const {
    return static_cast<std::size_t>(
        std::count_if(devices.begin(), devices.end(), [](const DeviceFacts& d) { return d.usable(); }));
  }
};

// ---------------------------------------------------------------------------------------------
// Verdicts.

inline std::string odp_rc_names(std::uint32_t caps) {
  static constexpr std::pair<std::uint32_t, const char*> kBits[] = {
      {IBV_ODP_SUPPORT_SEND, "SEND"},     {IBV_ODP_SUPPORT_RECV, "RECV"},
      {IBV_ODP_SUPPORT_WRITE, "WRITE"},   {IBV_ODP_SUPPORT_READ, "READ"},
      {IBV_ODP_SUPPORT_ATOMIC, "ATOMIC"}, {IBV_ODP_SUPPORT_SRQ_RECV, "SRQ_RECV"}};
  std::string s;
  for (const auto& [bit, name] : kBits) {
    if (caps & bit) s += std::string(s.empty() ? "" : " ") + name;
  }
  return s.empty() ? "none" : s;
}

// Pinned bytes one producer connection costs with `ring_bytes` rings: the consumer's ring plus
// its tail-record page (mode tail only; counted always), the producer's staging mirror plus its
// credit page. An on_demand_paging ring pins nothing, but the mirror is always pinned.
struct PinCost {
  std::uint64_t consumer;
  std::uint64_t producer;
};
inline PinCost pin_cost(std::uint64_t ring_bytes) {
  constexpr std::uint64_t kPage = 4096;
  const std::uint64_t ring = (ring_bytes + kPage - 1) / kPage * kPage;
  return {ring + kPage, ring + kPage};
}

inline std::string ring_phrase(std::uint64_t ring_bytes) {
  std::string size = format_bytes(ring_bytes);
  if (const auto paren = size.find(" ("); paren != std::string::npos) {
    size = size.substr(paren + 2, size.size() - paren - 3);  // "1 MiB"
  }
  return "a " + size + " ring needs " + size + " pinned per producer, twice with the producer's staging mirror";
}

inline Verdict memlock_verdict(const MemlockFacts& m, std::uint64_t ring_bytes) {
  const PinCost cost = pin_cost(ring_bytes);
  const std::string why = " (" + ring_phrase(ring_bytes) + ")";
  if (m.state.cap_ipc_lock) {
    return {Level::ok, "memlock: not enforced, the process has CAP_IPC_LOCK" + why};
  }
  if (!m.state.soft_limit) return {Level::ok, "memlock: unlimited" + why};
  const std::uint64_t limit = *m.state.soft_limit;
  const std::uint64_t room = limit > m.state.pinned ? limit - m.state.pinned : 0;
  const std::uint64_t consumers = room / cost.consumer;
  const std::uint64_t pairs = room / (cost.consumer + cost.producer);
  std::string text = "memlock: soft limit " + format_bytes(limit) + ", " + format_bytes(m.state.pinned) +
                     " pinned: room for " + std::to_string(consumers) + " consumer ring" +
                     (consumers == 1 ? "" : "s") + ", " + std::to_string(pairs) +
                     " producer+consumer pair" + (pairs == 1 ? "" : "s") + " in one process" + why;
  const bool raisable = !m.state.hard_limit || *m.state.hard_limit > limit;
  const std::string raise = raisable ? "; raise it (ulimit -l, up to the hard limit " +
                                           (m.state.hard_limit ? format_bytes(*m.state.hard_limit) : std::string("unlimited")) + ")"
                                     : "; the hard limit is no higher: raise it in limits.conf or grant CAP_IPC_LOCK";
  if (consumers == 0) return {Level::fail, text + raise};
  if (pairs == 0) return {Level::warn, text + raise};
  return {Level::ok, text};
}

// ARP on a host with several RDMA netdevs: with arp_ignore=0 every interface answers for every
// local address, and with arp_announce=0 requests carry any local source address, so a peer can
// map one port's address to another port's MAC, and rdma_cm resolves to the wrong device.
inline std::vector<Verdict> arp_verdicts(const std::vector<std::string>& netdevs, const std::vector<ArpScope>& scopes) {
  if (netdevs.size() < 2) {
    return {{Level::info, "ARP: " + std::string(netdevs.empty() ? "no RDMA netdev" : "one RDMA netdev (" + netdevs[0] + ")") +
                              ": arp_ignore/arp_announce do not matter"}};
  }
  const auto find = [&](const std::string& name) -> const ArpScope* {
    for (const ArpScope& s : scopes) {
      if (s.scope == name) return &s;
    }
    return nullptr;
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

inline std::vector<Verdict> device_verdicts(const DeviceFacts& d, const ProcessFacts& process) {
  std::vector<Verdict> v;
  if (!d.error.empty()) {
    v.push_back({Level::fail, d.name + ": not usable: " + d.error});
    return v;
  }
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
      const GidEntry* v4 = nullptr;
      for (const GidEntry& g : p.gids) {
        if (g.type == "RoCE v2" && g.gid.rfind("::ffff:", 0) == 0) {
          v4 = &g;
          break;
        }
      }
      if (v4 != nullptr) {
        text += ", RoCE v2 GID " + std::to_string(v4->index) + " " + v4->gid;
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
  if (!d.queried) return v;

  // Relaxed ordering: the flag is optional in rdma-core, so a registration never fails for it;
  // whether it takes effect is the driver's business and is not reported back.
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
              "PCIe Relaxed Ordering " + d.pcie_relaxed_ordering.why + "); the immediate's receive completion orders the payload either way";
      }
      v.push_back({Level::ok, "payload MR relaxed, publish by imm: ok (" + why + ")"});
      break;
    }
    case RoReg::refused:
      v.push_back({Level::warn, "payload MR relaxed, publish by imm: registration refused (" +
                                    errno_name(d.relaxed_errno) + "): use relaxed_ordering=false"});
      break;
    case RoReg::not_probed:
      v.push_back({Level::info, "payload MR relaxed, publish by imm: not probed (" +
                                    (!d.relaxed_note.empty() ? d.relaxed_note
                                     : d.objects_error.empty() ? std::string("no PD") : d.objects_error) + ")"});
      break;
  }
  v.push_back({Level::ok, "tail mode: relies on in-order placement (no relaxed ordering): ok (the ring is "
                          "registered without IBV_ACCESS_RELAXED_ORDERING; relaxed_ordering with tail is refused)"});

  if (d.inline_probed) {
    const std::size_t need = std::max(wire::kTailRecordSize, wire::kCreditRecordSize);
    if (d.max_inline >= need) {
      v.push_back({Level::ok, "inline: " + std::to_string(d.max_inline) + " B granted >= " + std::to_string(need) +
                                  " B (tail record, credit record): ok"});
    } else {
      v.push_back({Level::fail, "inline: " + std::to_string(d.max_inline) + " B granted < " + std::to_string(need) +
                                    " B: the producer's tail records and the consumer's credits are written inline; "
                                    "connections on " + d.name + " are refused"});
    }
  } else {
    v.push_back({Level::warn, "inline: not probed (" + (d.objects_error.empty() ? std::string("no QP") : d.objects_error) + ")"});
  }

  const verbs::DeviceCaps& c = d.caps;
  if (c.odp_rc_write) {
    v.push_back({Level::ok, std::string("ODP: RC WRITE supported by ") + d.name + " (implicit ODP " +
                                (c.odp_implicit ? "yes" : "no") +
                                "): on_demand_paging rings pin nothing; pinned rings still count against RLIMIT_MEMLOCK"});
  } else if (c.odp) {
    v.push_back({Level::info, "ODP: " + d.name + " has ODP but not for RC WRITE (RC caps: " + odp_rc_names(c.odp_rc_caps) +
                                  "): rings are pinned (registration counts against RLIMIT_MEMLOCK)"});
  } else {
    v.push_back({Level::info, "ODP: not supported by " + d.name + ": rings are pinned (registration counts against RLIMIT_MEMLOCK)"});
  }

  if (!c.dma_bounce) {
    v.push_back({Level::info, "DMA bounce: not reported by this rdma-core (verbs.h has no IBV_DEVICE_CC_DMA_BOUNCE)"});
  } else if (*c.dma_bounce) {
    v.push_back({Level::warn, "DMA bounce required: not direct (" + d.name + " places through bounce buffers: every byte is copied once more)"});
  } else {
    v.push_back({Level::ok, "DMA bounce: not required: direct"});
  }

  if (c.max_mr_size != 0) {
    // The consumer registers the ring as one MR.
    v.push_back({Level::ok, "max MR size: " + format_bytes(c.max_mr_size) + ": a ring may be as large as that"});
  }

  if (d.numa_node && *d.numa_node >= 0) {
    const auto node_cpus = parse_id_list(d.numa_cpus);
    const std::string node = "NUMA: " + d.name + " on node " + std::to_string(*d.numa_node);
    if (!node_cpus || node_cpus->empty() || process.cpus.empty()) {
      v.push_back({Level::info, node + " (CPUs of the node or of the process unknown)"});
    } else {
      std::set<int> off;
      for (int cpu : process.cpus) {
        if (node_cpus->count(cpu) == 0) off.insert(cpu);
      }
      if (off.empty()) {
        v.push_back({Level::ok, node + ", the process runs on its CPUs (" + format_id_list(process.cpus) + ")"});
      } else {
        v.push_back({Level::warn, node + " (CPUs " + d.numa_cpus + "), but the process may run on CPUs " +
                                      format_id_list(off) + " off it: pin it (numactl --cpunodebind=" +
                                      std::to_string(*d.numa_node) + " --membind=" + std::to_string(*d.numa_node) + ")"});
      }
    }
  } else if (d.numa_node) {
    v.push_back({Level::info, "NUMA: " + d.name + " reports no node (-1): locality unknown"});
  } else {
    v.push_back({Level::info, "NUMA: " + d.name + " has no node: " + d.numa_note});
  }
  return v;
}

// Fills the verdicts of every device and of the host.
inline void judge(Report& r) {
  for (DeviceFacts& d : r.devices) d.verdicts = device_verdicts(d, r.process);
  r.verdicts.clear();
  if (r.devices.empty()) {
    r.verdicts.push_back({Level::fail, "devices: " + (r.device_error.empty() ? std::string("none") : r.device_error)});
  } else if (r.usable_count() == 0) {
    r.verdicts.push_back({Level::fail, "devices: none usable (no ACTIVE port, or PD/CQ/QP creation failed)"});
  }
  r.verdicts.push_back(memlock_verdict(r.memlock, r.ring_bytes));
  for (Verdict& v : arp_verdicts(r.rdma_netdevs, r.arp)) r.verdicts.push_back(std::move(v));
  if (r.iommu.groups && *r.iommu.groups > 0) {
    r.verdicts.push_back({Level::info, "IOMMU: " + iommu_mode(r.iommu) +
                                           (r.iommu.group_types.count("identity") ? "" : "; registration maps every ring page through it")});
  }
}

// ---------------------------------------------------------------------------------------------
// Rendering.

inline const char* ro_registration_name(DeviceFacts::RoReg r) {
  switch (r) {
    case DeviceFacts::RoReg::accepted: return "accepted";
    case DeviceFacts::RoReg::refused: return "refused";
    case DeviceFacts::RoReg::not_probed: return "not probed";
  }
  return "?";
}

inline const char* atomic_name(ibv_atomic_cap a) {
  switch (a) {
    case IBV_ATOMIC_NONE: return "none";
    case IBV_ATOMIC_HCA: return "HCA (atomic among this device's operations)";
    case IBV_ATOMIC_GLOB: return "global (atomic with CPU and other devices too)";
  }
  return "?";
}

inline std::string relaxed_ordering_phrase(const DeviceFacts& d) {
  std::string s = "registration with IBV_ACCESS_RELAXED_ORDERING " + std::string(ro_registration_name(d.relaxed_registration));
  if (d.relaxed_registration == DeviceFacts::RoReg::refused) s += " (" + errno_name(d.relaxed_errno) + ")";
  return s;
}

inline std::string pcie_ro_phrase(const DeviceFacts& d) {
  if (d.software()) return "no PCI function (software device): the flag has no effect";
  if (d.pcie_relaxed_ordering.value) {
    return std::string("PCIe Relaxed Ordering ") + (*d.pcie_relaxed_ordering.value ? "enabled" : "disabled") +
           " on " + d.bus_device + " (Device Control)";
  }
  return "PCIe Relaxed Ordering on " + d.bus_device + ": " + d.pcie_relaxed_ordering.why;
}

inline std::string inline_phrase(const DeviceFacts& d) {
  if (!d.inline_probed) return "not probed: " + (d.objects_error.empty() ? std::string("no QP could be created") : d.objects_error);
  std::string s = std::to_string(d.max_inline) + " B granted";
  if (d.inline_refused) {
    s += ", " + std::to_string(*d.inline_refused) + " B refused (" + errno_name(d.inline_errno) + ")";
  } else {
    s += " (not probed further)";
  }
  return s + "; asking 0 B grants " + std::to_string(d.inline_default) + " B";
}

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
      std::string line(indent, ' ');
      std::string level = level_name(v.level);
      level.resize(6, ' ');
      out_ += line + level + v.text + '\n';
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

inline std::string opt_int(const std::optional<int>& v) { return v ? std::to_string(*v) : std::string("unreadable"); }

inline std::string limit_phrase(const std::optional<std::uint64_t>& v) { return v ? format_bytes(*v) : std::string("unlimited"); }

inline std::string render_text(const Report& r) {
  TextWriter t;
  std::string names;
  for (const DeviceFacts& d : r.devices) names += (names.empty() ? "" : ", ") + d.name;
  {
    std::string head = "rdmaring-doctor: " + std::to_string(r.devices.size()) + " verbs device" +
                       (r.devices.size() == 1 ? "" : "s");
    if (!names.empty()) head += " (" + names + ")";
    head += ", " + std::to_string(r.usable_count()) + " usable";
    if (!r.filter.empty()) head += " [--device " + r.filter + "]";
    t.section(head);
    if (!r.device_error.empty()) t.raw(r.device_error, 2);
  }
  for (const DeviceFacts& d : r.devices) {
    t.section("device " + d.name + (d.usable() ? "" : " (not usable)"));
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
      continue;
    }
    if (d.queried) {
      char vendor[48];
      std::snprintf(vendor, sizeof vendor, "vendor 0x%x part %u", d.caps.vendor_id, d.caps.vendor_part_id);
      t.kv("firmware", (d.caps.fw_ver.empty() ? std::string("(none)") : d.caps.fw_ver) + ", " + vendor);
    }
    for (const PortFacts& p : d.ports) {
      std::string line = p.state + (p.phys_state.empty() ? "" : " (" + p.phys_state + ")") + ", " + p.link_layer;
      if (!p.rate.empty()) line += ", " + p.rate;
      t.kv("port " + std::to_string(p.port), line);
      std::string mtu = std::to_string(p.active_mtu) + " active, " + std::to_string(p.max_mtu) + " max";
      if (!p.netdev.empty()) {
        mtu += "; netdev " + p.netdev + " MTU " + (p.netdev_mtu ? std::to_string(*p.netdev_mtu) : std::string("unreadable"));
      }
      t.kv("MTU", mtu, 4);
      std::size_t width = 0;
      for (const GidEntry& g : p.gids) width = std::max(width, g.gid.size());
      for (const GidEntry& g : p.gids) {
        std::string gid = g.gid;
        gid.resize(width + 2, ' ');
        std::string type = g.type.empty() ? "type ?" : g.type;
        type.resize(12, ' ');
        t.kv("GID " + std::to_string(g.index), gid + type + (g.netdev.empty() ? "-" : g.netdev), 4);
      }
      t.kv("GID table", std::to_string(p.gids.size()) + " of " + std::to_string(p.gid_table_len) + " entries in use", 4);
    }
    if (d.queried) {
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
    if (!d.objects_ok && !d.objects_error.empty()) t.kv("PD/CQ/QP", "failed: " + d.objects_error);
    if (d.numa_node) {
      t.kv("NUMA node", std::to_string(*d.numa_node) + (d.numa_cpus.empty() ? "" : " (CPUs " + d.numa_cpus + ")"));
    } else {
      t.kv("NUMA node", "absent: " + d.numa_note);
    }
    t.kv("IOMMU group", d.iommu_group_type.empty() ? std::string("none") : "domain type " + d.iommu_group_type);
    if (d.pci_path.empty()) {
      t.kv("PCI path, ACS", d.software() ? "none (software device)" : "unknown");
    } else {
      for (std::size_t i = 0; i < d.pci_path.size(); ++i) {
        t.kv(i == 0 ? "PCI path, ACS" : "", d.pci_path[i].bdf + (i == 0 ? " (device)" : "") + ": ACS " + d.pci_path[i].acs);
      }
    }
    t.kv("verdicts", std::vector<std::string>{});
    t.verdicts(d.verdicts, 4);
  }

  t.section("process");
  t.kv("CPU affinity", r.process.affinity_error.empty()
                           ? format_id_list(r.process.cpus) + " (" + std::to_string(r.process.cpus.size()) + " CPUs)"
                           : r.process.affinity_error);
  t.kv("memory policy", r.process.mempolicy);
  t.kv("Mems_allowed", r.process.mems_allowed.empty() ? std::string("unreadable") : r.process.mems_allowed);

  t.section("memlock");
  t.kv("RLIMIT_MEMLOCK", "soft " + limit_phrase(r.memlock.state.soft_limit) + ", hard " + limit_phrase(r.memlock.state.hard_limit));
  t.kv("CAP_IPC_LOCK", r.memlock.state.cap_ipc_lock ? "yes (limit not enforced)" : "no");
  t.kv("VmLck", format_bytes(r.memlock.state.locked));
  t.kv("VmPin", format_bytes(r.memlock.state.pinned));

  t.section("IOMMU");
  t.kv("mode", iommu_mode(r.iommu));
  {
    std::string units;
    for (const std::string& u : r.iommu.units) units += (units.empty() ? "" : " ") + u;
    t.kv("units", units.empty() ? std::string("none (/sys/class/iommu empty or absent)") : units);
    std::string args;
    for (const std::string& a : r.iommu.cmdline) args += (args.empty() ? "" : " ") + a;
    t.kv("kernel cmdline", args.empty() ? std::string("no iommu=, intel_iommu=, amd_iommu=, iommu.* argument") : args);
    std::string groups = r.iommu.groups ? std::to_string(*r.iommu.groups) : std::string("absent (/sys/kernel/iommu_groups)");
    std::string types;
    for (const auto& [type, n] : r.iommu.group_types) types += (types.empty() ? "" : ", ") + std::to_string(n) + " " + type;
    if (!types.empty()) groups += " (" + types + ")";
    t.kv("IOMMU groups", groups);
  }

  t.section("GPU topology (nvidia-smi topo -m)");
  if (!r.nvidia_smi.present) {
    t.kv("nvidia-smi", "none (not in PATH)");
  } else {
    t.kv("nvidia-smi", r.nvidia_smi.path + (r.nvidia_smi.status == 0 ? std::string() : ", exit status " + std::to_string(r.nvidia_smi.status) + (r.nvidia_smi.status == 124 ? " (timed out)" : "")));
    t.raw(r.nvidia_smi.output, 2);
  }

  t.section("ARP (rdma_cm address resolution)");
  {
    std::string devs;
    for (const std::string& n : r.rdma_netdevs) devs += (devs.empty() ? "" : ", ") + n;
    t.kv("RDMA netdevs", devs.empty() ? std::string("none") : devs);
    for (const ArpScope& a : r.arp) {
      t.kv("conf." + a.scope, "arp_ignore " + opt_int(a.arp_ignore) + ", arp_announce " + opt_int(a.arp_announce));
    }
    if (r.arp.empty()) t.kv("sysctls", "not read: they matter only with several RDMA netdevs");
  }

  t.section("verdicts (host)");
  t.verdicts(r.verdicts, 2);
  return t.str();
}

inline void json_verdicts(JsonWriter& j, const std::vector<Verdict>& vs) {
  j.begin_array();
  for (const Verdict& v : vs) {
    j.begin_object().key("level").string(v.level == Level::fail ? "fail" : level_name(v.level)).key("text").string(v.text).end_object();
  }
  j.end_array();
}

inline std::string render_json(const Report& r) {
  JsonWriter j;
  const auto opt_u64 = [](JsonWriter& w, std::uint64_t v) { w.unsigned_number(v); };
  const auto opt_i = [](JsonWriter& w, int v) { w.number(v); };
  const auto opt_b = [](JsonWriter& w, bool v) { w.boolean(v); };
  j.begin_object();
  j.key("tool").string("rdmaring-doctor");
  j.key("device_filter").string_or_null(r.filter);
  j.key("usable_devices").unsigned_number(r.usable_count());
  j.key("error").string_or_null(r.device_error);
  j.key("ring_bytes").unsigned_number(r.ring_bytes);
  j.key("devices").begin_array();
  for (const DeviceFacts& d : r.devices) {
    j.begin_object();
    j.key("name").string(d.name);
    j.key("usable").boolean(d.usable());
    j.key("error").string_or_null(d.error);
    j.key("node_guid").string(d.node_guid);
    j.key("node_type").string(d.node_type);
    j.key("transport").string(d.transport);
    j.key("software").boolean(d.software());
    j.key("parent_netdev").string_or_null(d.parent);
    j.key("bus_device").string_or_null(d.bus_device);
    j.key("driver").string_or_null(d.driver);
    j.key("ports").begin_array();
    for (const PortFacts& p : d.ports) {
      j.begin_object();
      j.key("port").number(p.port);
      j.key("state").string(p.state);
      j.key("phys_state").string(p.phys_state);
      j.key("link_layer").string(p.link_layer);
      j.key("active_mtu").number(p.active_mtu);
      j.key("max_mtu").number(p.max_mtu);
      j.key("rate").string(p.rate);
      j.key("netdev").string_or_null(p.netdev);
      j.key("netdev_mtu").optional(p.netdev_mtu, opt_i);
      j.key("gid_table_len").number(p.gid_table_len);
      j.key("gids").begin_array();
      for (const GidEntry& g : p.gids) {
        j.begin_object().key("index").number(g.index).key("gid").string(g.gid).key("type");
        if (g.type.empty()) j.null(); else j.string(g.type);
        j.key("netdev").string_or_null(g.netdev);
        j.end_object();
      }
      j.end_array();
      j.end_object();
    }
    j.end_array();
    j.key("caps");
    if (!d.queried) {
      j.null();
    } else {
      const verbs::DeviceCaps& c = d.caps;
      j.begin_object();
      j.key("fw_ver").string(c.fw_ver);
      j.key("vendor_id").unsigned_number(c.vendor_id);
      j.key("vendor_part_id").unsigned_number(c.vendor_part_id);
      j.key("odp").begin_object()
          .key("supported").boolean(c.odp)
          .key("implicit").boolean(c.odp_implicit)
          .key("rc_write").boolean(c.odp_rc_write)
          .key("rc_caps").string(odp_rc_names(c.odp_rc_caps))
          .end_object();
      j.key("relaxed_ordering").begin_object()
          .key("registration").string(ro_registration_name(d.relaxed_registration))
          .key("pcie_enabled").optional(d.pcie_relaxed_ordering.value, opt_b)
          .key("note").string(pcie_ro_phrase(d))
          .end_object();
      j.key("dma_bounce");
      if (c.dma_bounce) j.boolean(*c.dma_bounce); else j.string("not reported by this rdma-core");
      j.key("max_mr_size").unsigned_number(c.max_mr_size);
      j.key("max_inline").begin_object().key("probed").boolean(d.inline_probed);
      j.key("granted");
      if (d.inline_probed) j.unsigned_number(d.max_inline); else j.null();
      j.key("refused_at").optional(d.inline_refused, [](JsonWriter& w, std::uint32_t v) { w.unsigned_number(v); });
      j.key("refused_errno");
      if (d.inline_refused) j.number(d.inline_errno); else j.null();
      j.end_object();
      j.key("atomics").string(c.atomic_cap == IBV_ATOMIC_NONE ? "none" : c.atomic_cap == IBV_ATOMIC_HCA ? "hca" : "global");
      j.key("max_qp").number(c.max_qp);
      j.key("max_qp_wr").number(c.max_qp_wr);
      j.key("max_sge").number(c.max_sge);
      j.key("max_cqe").number(c.max_cqe);
      j.key("max_mr").number(c.max_mr);
      j.key("max_srq_wr").number(c.max_srq_wr);
      j.key("max_qp_rd_atom").number(c.max_qp_rd_atom);
      j.key("device_cap_flags_ex").unsigned_number(c.device_cap_flags);
      j.end_object();
    }
    j.key("objects").begin_object().key("created").boolean(d.objects_ok).key("error");
    if (d.objects_error.empty()) j.null(); else j.string(d.objects_error);
    j.end_object();
    j.key("numa_node").optional(d.numa_node, opt_i);
    j.key("numa_note").string_or_null(d.numa_note);
    j.key("numa_cpus").string_or_null(d.numa_cpus);
    j.key("iommu_group_type").string_or_null(d.iommu_group_type);
    j.key("pci_path").begin_array();
    for (const PciFunction& f : d.pci_path) j.begin_object().key("bdf").string(f.bdf).key("acs").string(f.acs).end_object();
    j.end_array();
    j.key("verdicts");
    json_verdicts(j, d.verdicts);
    j.end_object();
  }
  j.end_array();

  j.key("process").begin_object();
  j.key("cpu_affinity");
  if (r.process.affinity_error.empty()) j.string(format_id_list(r.process.cpus)); else j.null();
  j.key("mempolicy").string(r.process.mempolicy);
  j.key("mems_allowed").string(r.process.mems_allowed);
  j.end_object();

  j.key("memlock").begin_object();
  j.key("soft").optional(r.memlock.state.soft_limit, opt_u64);
  j.key("hard").optional(r.memlock.state.hard_limit, opt_u64);
  j.key("unlimited").boolean(!r.memlock.state.soft_limit);
  j.key("cap_ipc_lock").boolean(r.memlock.state.cap_ipc_lock);
  j.key("vm_lck").unsigned_number(r.memlock.state.locked);
  j.key("vm_pin").unsigned_number(r.memlock.state.pinned);
  j.end_object();

  j.key("iommu").begin_object();
  j.key("mode").string(iommu_mode(r.iommu));
  j.key("units").begin_array();
  for (const std::string& u : r.iommu.units) j.string(u);
  j.end_array();
  j.key("cmdline").begin_array();
  for (const std::string& a : r.iommu.cmdline) j.string(a);
  j.end_array();
  j.key("groups").optional(r.iommu.groups, opt_i);
  j.key("group_types").begin_object();
  for (const auto& [type, n] : r.iommu.group_types) j.key(type).number(n);
  j.end_object();
  j.end_object();

  j.key("nvidia_smi_topo");
  if (!r.nvidia_smi.present) {
    j.null();
  } else {
    j.begin_object().key("path").string(r.nvidia_smi.path).key("status").number(r.nvidia_smi.status)
        .key("output").string(r.nvidia_smi.output).end_object();
  }

  j.key("rdma_netdevs").begin_array();
  for (const std::string& n : r.rdma_netdevs) j.string(n);
  j.end_array();
  j.key("arp").begin_array();
  for (const ArpScope& a : r.arp) {
    j.begin_object().key("scope").string(a.scope).key("arp_ignore").optional(a.arp_ignore, opt_i)
        .key("arp_announce").optional(a.arp_announce, opt_i).end_object();
  }
  j.end_array();
  j.key("verdicts");
  json_verdicts(j, r.verdicts);
  j.end_object();
  return j.str();
}

}  // namespace rdmaring::doctor
