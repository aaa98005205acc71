#include "pci_config.hpp"

#include <cstdio>
#include <utility>

namespace rdmaring::doctor {
namespace {

std::optional<std::uint16_t> cfg16(const std::vector<std::uint8_t>& cfg, std::size_t off) {
  if (off + 2 > cfg.size()) return std::nullopt;
  return static_cast<std::uint16_t>(cfg[off] | (cfg[off + 1] << 8));
}

std::optional<std::uint32_t> cfg32(const std::vector<std::uint8_t>& cfg, std::size_t off) {
  if (off + 4 > cfg.size()) return std::nullopt;
  return static_cast<std::uint32_t>(cfg[off]) | static_cast<std::uint32_t>(cfg[off + 1]) << 8 |
         static_cast<std::uint32_t>(cfg[off + 2]) << 16 | static_cast<std::uint32_t>(cfg[off + 3]) << 24;
}

}  // namespace

PciBit pcie_relaxed_ordering(const std::vector<std::uint8_t>& cfg) {
  constexpr std::size_t kPcieCapId = 0x10;
  const auto status = cfg16(cfg, 0x06);
  if (!status) return {std::nullopt, "configuration space not readable"};
  if ((*status & 0x10) == 0) return {std::nullopt, "no capability list (not PCI Express)"};
  std::size_t ptr = cfg.size() > 0x34 ? cfg[0x34] & 0xfcU : 0;
  // The guard stops a corrupt list that loops; 48 is every possible slot of the 256-byte space.
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

namespace {

struct Acs {
  std::uint16_t cap = 0;
  std::uint16_t ctrl = 0;
};

// The ACS extended capability's registers, or why they cannot be read ("" with nullopt: the
// function has no ACS capability).
std::pair<std::optional<Acs>, std::string> find_acs(const std::vector<std::uint8_t>& cfg) {
  if (cfg.size() <= 0x100) {
    return {std::nullopt, cfg.size() <= 64 ? "not readable (extended configuration space needs root)"
                                           : "no extended configuration space (conventional PCI view)"};
  }
  std::size_t off = 0x100;
  // As above: a corrupt extended list must not loop forever.
  for (int guard = 0; off >= 0x100 && guard < 96; ++guard) {
    const auto header = cfg32(cfg, off);
    if (!header || *header == 0 || *header == 0xffffffffU) break;
    if ((*header & 0xffffU) == 0x000d) {
      const auto cap = cfg16(cfg, off + 4);
      const auto ctrl = cfg16(cfg, off + 6);
      if (!cap || !ctrl) return {std::nullopt, "not readable"};
      return {Acs{*cap, *ctrl}, ""};
    }
    off = (*header >> 20) & 0xffcU;
  }
  return {std::nullopt, ""};
}

}  // namespace

std::string describe_acs(const std::vector<std::uint8_t>& cfg) {
  const auto [acs, why] = find_acs(cfg);
  if (!acs) return why.empty() ? "no ACS capability" : why;
  static constexpr const char* kBits[] = {"SV", "TB", "RR", "CR", "UF", "EC", "DT"};
  std::string on, offered;
  for (int b = 0; b < 7; ++b) {
    if (acs->cap & (1U << b)) offered += std::string(offered.empty() ? "" : " ") + kBits[b];
    if (acs->ctrl & (1U << b)) on += std::string(on.empty() ? "" : " ") + kBits[b];
  }
  char buf[16];
  std::snprintf(buf, sizeof buf, "ctrl 0x%04x", acs->ctrl);
  return std::string(buf) + ": " + (on.empty() ? "none" : on) + " on (offers " + (offered.empty() ? "none" : offered) + ")";
}

std::optional<bool> acs_redirects_peer_to_peer(const std::vector<std::uint8_t>& cfg) {
  constexpr std::uint16_t kRequestRedirect = 1U << 2;
  constexpr std::uint16_t kCompletionRedirect = 1U << 3;
  constexpr std::uint16_t kEgressControl = 1U << 5;
  const auto [acs, why] = find_acs(cfg);
  if (!acs) return why.empty() ? std::optional<bool>(false) : std::nullopt;
  return (acs->ctrl & (kRequestRedirect | kCompletionRedirect | kEgressControl)) != 0;
}

}  // namespace rdmaring::doctor
