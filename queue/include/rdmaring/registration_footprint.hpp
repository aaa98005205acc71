// What a set of memory registrations pins, as the stats and metrics of either side report it
// beside the process's VmPin. Plain data: a producer's or owner's stats carry it to applications
// that never see a verbs type.
#pragma once

#include <concepts>
#include <cstdint>
#include <optional>

namespace rdmaring {

struct RegistrationFootprint {
  std::uint64_t regions = 0;
  std::uint64_t bytes = 0;  // the regions' lengths; the kernel pins whole pages of them

  // Counts a registration that may not exist (yet, or any more). Any region type with a
  // length() will do, so this header stays free of the verbs MemoryRegion it is used with.
  template <class Region>
    requires requires(const Region& r) {
      { r.length() } -> std::convertible_to<std::uint64_t>;
    }
  void add(const std::optional<Region>& region) noexcept {
    if (!region) return;
    ++regions;
    bytes += region->length();
  }
};

}  // namespace rdmaring
