#include "format.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <cstdio>
#include <cstring>
#include <iterator>
#include <utility>

namespace rdmaring::doctor {

std::string format_bytes(std::uint64_t n) {
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
  const bool whole = v == static_cast<double>(static_cast<std::uint64_t>(v));
  std::snprintf(buf, sizeof buf, whole ? " (%.0f %s)" : " (%.1f %s)", v, kUnits[unit]);
  return s + buf;
}

std::string format_guid(std::uint64_t guid) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "%04x:%04x:%04x:%04x", static_cast<unsigned>(guid >> 48) & 0xffffU,
                static_cast<unsigned>(guid >> 32) & 0xffffU, static_cast<unsigned>(guid >> 16) & 0xffffU,
                static_cast<unsigned>(guid) & 0xffffU);
  return buf;
}

std::string format_gid(const ibv_gid& gid) {
  // glibc's inet_ntop already writes RFC 5952 (longest zero run, the first on a tie, lower case)
  // and the ::ffff:a.b.c.d form.
  in6_addr addr{};
  static_assert(sizeof addr.s6_addr == sizeof gid.raw);
  std::memcpy(addr.s6_addr, gid.raw, sizeof gid.raw);
  char buf[INET6_ADDRSTRLEN];
  return inet_ntop(AF_INET6, &addr, buf, sizeof buf) != nullptr ? std::string(buf) : std::string("?");
}

std::string errno_name(int err) {
  const char* name = strerrorname_np(err);
  return (name != nullptr ? std::string(name) + ", " : std::string()) + "errno " + std::to_string(err);
}

std::string strip_ansi(std::string_view text) {
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

std::optional<std::set<int>> parse_id_list(std::string_view s) {
  std::set<int> ids;
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.remove_suffix(1);
  if (s.empty()) return ids;
  // Bounded so that a corrupt list cannot make the loop below insert billions of ids.
  constexpr long kMaxId = 1 << 20;
  std::size_t pos = 0;
  auto number = [&](int& out) {
    const std::size_t start = pos;
    long v = 0;
    while (pos < s.size() && s[pos] >= '0' && s[pos] <= '9' && v < kMaxId) v = v * 10 + (s[pos++] - '0');
    if (pos == start || v >= kMaxId) return false;
    out = static_cast<int>(v);
    return true;
  };
  while (pos < s.size()) {
    int lo = 0;
    if (!number(lo)) return std::nullopt;
    int hi = lo;
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

std::string format_id_list(const std::set<int>& ids) {
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

std::string odp_rc_names(std::uint32_t caps) {
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

std::string joined(const std::vector<std::string>& items, std::string_view sep, const std::string& none) {
  std::string s;
  for (const std::string& i : items) s += (s.empty() ? "" : std::string(sep)) + i;
  return s.empty() ? none : s;
}

}  // namespace rdmaring::doctor
