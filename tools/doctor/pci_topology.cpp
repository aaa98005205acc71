#include "pci_topology.hpp"

#include <algorithm>
#include <cstddef>

namespace rdmaring::doctor {

const char* path_class_name(PathClass c) {
  switch (c) {
    case PathClass::pix: return "PIX";
    case PathClass::pxb: return "PXB";
    case PathClass::phb: return "PHB";
    case PathClass::node: return "NODE";
    case PathClass::sys: return "SYS";
  }
  return "?";
}

const char* path_class_words(PathClass c) {
  switch (c) {
    case PathClass::pix: return "through one PCIe switch";
    case PathClass::pxb: return "through several PCIe switches, not the host bridge";
    case PathClass::phb: return "through the host bridge (the CPU's root complex)";
    case PathClass::node: return "across host bridges of one NUMA node";
    case PathClass::sys: return "across NUMA nodes (the sockets' interconnect)";
  }
  return "?";
}

PciRoute route_between(const PciPlacement& a, const PciPlacement& b) {
  PciRoute r;
  if (a.host_bridge != b.host_bridge) {
    const bool both_known = a.numa_node && b.numa_node && *a.numa_node >= 0 && *b.numa_node >= 0;
    if (both_known && *a.numa_node == *b.numa_node) {
      r.cls = PathClass::node;
      r.why = "host bridges " + a.host_bridge + " and " + b.host_bridge + ", both on NUMA node " + std::to_string(*a.numa_node);
    } else {
      r.cls = PathClass::sys;
      r.why = "host bridges " + a.host_bridge + " and " + b.host_bridge +
              (both_known ? ", NUMA nodes " + std::to_string(*a.numa_node) + " and " + std::to_string(*b.numa_node)
                          : ", NUMA nodes not both known (taken as apart)");
    }
    return r;
  }
  // The bridges above each function, the root port first.
  const std::vector<PciFunction> up_a(a.path.rbegin(), a.path.rend() - 1);
  const std::vector<PciFunction> up_b(b.path.rbegin(), b.path.rend() - 1);
  std::size_t common = 0;
  while (common < up_a.size() && common < up_b.size() && up_a[common].bdf == up_b[common].bdf) ++common;
  if (common == 0) {
    r.cls = PathClass::phb;
    r.why = "no bridge in common below host bridge " + a.host_bridge;
    return r;
  }
  // A switch is an upstream port over downstream ports: two functions each at most one bridge
  // below their deepest common bridge meet inside one switch.
  const std::size_t below_a = up_a.size() - common;
  const std::size_t below_b = up_b.size() - common;
  r.cls = below_a <= 1 && below_b <= 1 ? PathClass::pix : PathClass::pxb;
  r.why = "deepest common bridge " + up_a[common - 1].bdf + ", " + std::to_string(below_a) + " and " +
          std::to_string(below_b) + " bridge(s) below it";
  std::vector<const PciFunction*> crossed = {&up_a[common - 1]};
  for (std::size_t i = common; i < up_a.size(); ++i) crossed.push_back(&up_a[i]);
  for (std::size_t i = common; i < up_b.size(); ++i) crossed.push_back(&up_b[i]);
  for (const PciFunction* f : crossed) {
    r.crossed.push_back(f->bdf);
    if (!f->acs_redirects) r.acs_unknown.push_back(f->bdf);
    else if (*f->acs_redirects) r.redirecting.push_back(f->bdf);
  }
  return r;
}

}  // namespace rdmaring::doctor
