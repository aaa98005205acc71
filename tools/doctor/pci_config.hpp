// Readings of PCI configuration space, as /sys/bus/pci/devices/BDF/config gives it. Unprivileged
// readers get only the first 64 bytes; the kernel gives root 256 (conventional) or 4096 (PCIe),
// so every reading says why it could not be made rather than guessing.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace rdmaring::doctor {

// What a reader can say about one bit of configuration space.
struct PciBit {
  std::optional<bool> value;  // nullopt: unknown, see why
  std::string why;
};

// The PCI Express capability's Device Control "Enable Relaxed Ordering" bit: whether the function
// may set the Relaxed Ordering attribute on its writes at all (the kernel's
// pcie_relaxed_ordering_enabled(), which mlx5 checks before honouring
// IBV_ACCESS_RELAXED_ORDERING).
PciBit pcie_relaxed_ordering(const std::vector<std::uint8_t>& cfg);

// The ACS extended capability of one function: "ctrl 0x001d: SV RR CR UF on (offers SV TB RR CR
// UF)", "no ACS capability", or why it cannot be read.
std::string describe_acs(const std::vector<std::uint8_t>& cfg);

// Whether ACS makes a bridge send peer-to-peer traffic up toward the root complex instead of
// across to its peer (P2P Request or Completion Redirect, or Egress Control on): true or false,
// nullopt when the capability cannot be read. A function without ACS redirects nothing.
std::optional<bool> acs_redirects_peer_to_peer(const std::vector<std::uint8_t>& cfg);

}  // namespace rdmaring::doctor
