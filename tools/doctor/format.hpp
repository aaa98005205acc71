// How the doctor spells sizes, GUIDs, GIDs, errnos and id lists, and reads back the kernel's id
// lists: shared by the facts (gathering), the verdicts and the rendering, and pure.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace rdmaring::doctor {

// "1048576 B (1 MiB)": exact bytes, as the verbs layer prints limits, plus a rounded reading.
std::string format_bytes(std::uint64_t n);

// "0072:72ff:fe00:0001", as ibv_devinfo prints a GUID (host byte order in).
std::string format_guid(std::uint64_t guid);

// The compressed IPv6 form (RFC 5952), an IPv4-mapped GID as ::ffff:a.b.c.d: how rdma_cm users
// write the address a RoCE v2 GID stands for.
std::string format_gid(const ibv_gid& gid);

// "EINVAL, errno 22".
std::string errno_name(int err);

// `text` without ANSI escape sequences: nvidia-smi underlines its topo header even into a pipe.
std::string strip_ansi(std::string_view text);

// Parses a kernel CPU or node list ("0-3,8,10-11"); nullopt when it is malformed.
std::optional<std::set<int>> parse_id_list(std::string_view s);

// The inverse: "0-3,8,10-11"; "" for none.
std::string format_id_list(const std::set<int>& ids);

// "a, b, c" with `sep` between, or `none` for an empty list.
std::string joined(const std::vector<std::string>& items, std::string_view sep, const std::string& none = "");

// The RC operations ODP covers ("SEND RECV WRITE"), "none" for none.
std::string odp_rc_names(std::uint32_t caps);

}  // namespace rdmaring::doctor
