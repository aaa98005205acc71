#include "pci_config.hpp"

#include <cstdio>

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

std::string describe_acs(const std::vector<std::uint8_t>& cfg) {
  if (cfg.size() <= 0x100) {
    return cfg.size() <= 64 ? "not readable (extended configuration space needs root)"
                            : "no extended configuration space (conventional PCI view)";
  }
  static constexpr const char* kBits[] = {"SV", "TB", "RR", "CR", "UF", "EC", "DT"};
  std::size_t off = 0x100;
  // As above: a corrupt extended list must not loop forever.
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

}  // namespace rdmaring::doctor
