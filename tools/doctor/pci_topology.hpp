// Where two PCI functions sit relative to each other: the path class that nvidia-smi topo and
// NCCL name (PIX, PXB, PHB, NODE, SYS), the bridges a peer-to-peer transfer between them would
// cross, and those of them whose ACS sends it up to the root complex instead. Pure: placements
// in (read from sysfs by facts.cpp), a route out.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace rdmaring::doctor {

struct PciFunction {
  std::string bdf;  // "0000:3b:00.0"
  std::string acs;  // describe_acs
  std::optional<bool> acs_redirects;  // acs_redirects_peer_to_peer; nullopt: not readable
};

// A function's place on the buses, as its sysfs device path spells it.
struct PciPlacement {
  std::string host_bridge;        // "pci0000:00": the root complex; "" for no PCI function
  std::vector<PciFunction> path;  // the function first, then each bridge above it
  std::optional<int> numa_node;   // sysfs numa_node; -1 kept (the firmware reported none)
  std::string iommu_group_type;   // "identity", "DMA", "DMA-FQ"; "" when the function has no group
};

enum class PathClass {
  pix,   // through at most one PCIe switch (or bridge)
  pxb,   // through several switches, not through the host bridge
  phb,   // through the host bridge: the CPU's root complex
  node,  // across host bridges of one NUMA node
  sys,   // across NUMA nodes: the sockets' interconnect
};

// "PIX", "PXB", "PHB", "NODE", "SYS": nvidia-smi topo -m's legend.
const char* path_class_name(PathClass c);
// "one PCIe switch", ...: the class in words.
const char* path_class_words(PathClass c);

struct PciRoute {
  PathClass cls = PathClass::sys;
  std::string why;                       // how the class was decided, in words
  std::vector<std::string> crossed;      // bridges a P2P transfer crosses below the root complex
  std::vector<std::string> redirecting;  // of `crossed`, those whose ACS redirects it upstream
  std::vector<std::string> acs_unknown;  // of `crossed`, those whose ACS could not be read
};

// Assumes: both placements have a host bridge and a non-empty path.
PciRoute route_between(const PciPlacement& a, const PciPlacement& b);

}  // namespace rdmaring::doctor
