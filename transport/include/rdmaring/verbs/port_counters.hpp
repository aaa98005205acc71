// PortCounters: a port's traffic and error counters as the kernel exports them, under
// /sys/class/infiniband/<device>/ports/<port>/counters (the IBTA port counters) and
// hw_counters (the driver's own) — the numbers `rdma statistic` prints. rxe exports its RNR,
// retry and sequence-error counts only under hw_counters; mlx5 under both.
//
// A report takes one reading before a run and one after and quotes the difference: the counters
// belong to the port, so on a loopback run they include both ends and anyone else's traffic.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>

#include "rdmaring/error.hpp"

namespace rdmaring::verbs {

struct PortCounters {
  // By file name ("rcvd_rnr_err", "port_xmit_data"); a hw_counters file shadows a counters
  // file of the same name. Files that are not a number (rare driver formats) are left out.
  std::map<std::string, std::uint64_t> values;

  // Counters that went up since `before` (a counter that went down, i.e. was reset, reads as
  // its new value), and every RNR or retry counter even when it stayed 0: "none" is a result.
  PortCounters since(const PortCounters& before) const;
};

// Whether a counter counts RNR NAKs, transport retries or the sequence errors that cause them:
// the names rxe and mlx5 use ("rcvd_rnr_err", "retry_exceeded_err", "rnr_nak_retry_err",
// "local_ack_timeout_err", "out_of_seq_request", "packet_seq_err", "duplicate_request").
bool is_rnr_or_retry_counter(std::string_view name) noexcept;

// Reads both directories of `port` of `device`. `sysfs_root` is for tests.
// Errors: no_device when the port's directory does not exist (naming the path); a port whose
// driver exports no counters at all reads as an empty map, not an error.
Result<PortCounters> read_port_counters(std::string_view device, int port = 1,
                                        const std::filesystem::path& sysfs_root = "/sys/class/infiniband");

}  // namespace rdmaring::verbs
