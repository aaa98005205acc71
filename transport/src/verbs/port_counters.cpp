#include "rdmaring/verbs/port_counters.hpp"

#include <array>
#include <charconv>
#include <fstream>
#include <system_error>

namespace rdmaring::verbs {

bool is_rnr_or_retry_counter(std::string_view name) noexcept {
  constexpr std::array<std::string_view, 5> kMarks{"rnr", "retry", "timeout", "seq", "duplicate"};
  for (const auto mark : kMarks)
    if (name.find(mark) != std::string_view::npos) return true;
  return false;
}

PortCounters PortCounters::since(const PortCounters& before) const {
  PortCounters out;
  for (const auto& [name, now] : values) {
    const auto was = before.values.find(name);
    const std::uint64_t base = was == before.values.end() || was->second > now ? 0 : was->second;
    if (now > base || is_rnr_or_retry_counter(name)) out.values[name] = now - base;
  }
  return out;
}

Result<PortCounters> read_port_counters(std::string_view device, int port, const std::filesystem::path& sysfs_root) {
  const auto dir = sysfs_root / device / "ports" / std::to_string(port);
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec))
    return make_error(errc::no_device, "port counters: no directory " + dir.string());
  PortCounters out;
  // hw_counters last, so that the driver's own count wins a name both directories have.
  for (const char* sub : {"counters", "hw_counters"}) {
    for (std::filesystem::directory_iterator it(dir / sub, ec), end; !ec && it != end; it.increment(ec)) {
      std::ifstream f(it->path());
      std::string text;
      if (!(f >> text)) continue;  // unreadable counters (EACCES, EINVAL from the driver) say nothing
      std::uint64_t v = 0;
      const auto [p, err] = std::from_chars(text.data(), text.data() + text.size(), v);
      if (err == std::errc{} && p == text.data() + text.size()) out.values[it->path().filename().string()] = v;
    }
    ec.clear();  // a driver without one of the directories is common (rxe has no counters/ data)
  }
  return out;
}

}  // namespace rdmaring::verbs
