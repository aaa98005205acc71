// What the facts mean for the queue: one verdict per path a connection would take (ports and
// their GIDs, relaxed ordering with publish by imm, tail mode, inline, ODP, DMA bounce, NUMA) and
// per host-wide limit (memlock for a given ring size, ARP, IOMMU). Pure: facts in, verdicts out.
#pragma once

#include "facts.hpp"

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace rdmaring::doctor {

enum class Level { ok, info, warn, fail };

// "ok", "info", "warn", "FAIL": the failure stands out in the text report.
const char* level_name(Level l);

struct Verdict {
  Level level = Level::info;
  std::string text;
};

// Whether a ring in one GPU's memory could be written by one RDMA device directly, and why not.
struct GpuDirect {
  std::string gpu;     // the GPU's BDF
  std::string device;  // the RDMA device's name
  std::optional<PciRoute> route;         // absent when one of them is not on the PCI bus
  std::vector<std::string> because_not;  // each a reason it is impossible
  std::vector<std::string> caveats;      // possible, but each of these may stop it or slow it
  Verdict verdict;
  bool possible() const { return because_not.empty(); }
};

// The pair's route (path class, ACS on the bridges crossed), its IOMMU groups and the device's
// dma-buf registration, judged; gpu, device and verdict are left for judge() to fill.
GpuDirect gpudirect(const GpuFacts& g, const DeviceFacts& d);

struct Verdicts {
  std::uint64_t ring_bytes = 0;              // the ring size the memlock verdict counted with
  std::vector<std::vector<Verdict>> devices;  // one list per Facts::devices entry, in order
  std::vector<GpuDirect> gpudirect;           // one per GPU and RDMA device pair
  std::vector<Verdict> host;                  // the gpudirect verdicts among them
};

// What exit status 0 promises: the device opens, a port is ACTIVE, and the objects a
// connection needs (PD, CQ, RC QP) can be created on it.
bool usable(const DeviceFacts& d);
std::size_t usable_count(const Facts& f);

// Why no device is usable, in one line that says how to get a Soft-RoCE device.
// Assumes: usable_count(f) == 0.
std::string no_usable_device(const Facts& f);

// The IOMMU in one phrase, from what the kernel shows.
std::string iommu_mode(const IommuFacts& f);

Verdict memlock_verdict(const verbs::MemlockState& m, std::uint64_t ring_bytes);

// ARP on a host with several RDMA netdevs: with arp_ignore=0 every interface answers for every
// local address, and with arp_announce=0 requests carry any local source address, so a peer can
// map one port's address to another port's MAC, and rdma_cm resolves to the wrong device.
std::vector<Verdict> arp_verdicts(const std::vector<std::string>& netdevs, const std::vector<ArpScope>& scopes);

std::vector<Verdict> device_verdicts(const DeviceFacts& d, const ProcessFacts& process);

// Every device's verdicts and the host's, the memlock one counting rings of `ring_bytes`.
Verdicts judge(const Facts& f, std::uint64_t ring_bytes);

}  // namespace rdmaring::doctor
