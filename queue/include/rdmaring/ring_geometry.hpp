// The shape of one ring: its size and the largest record it takes, validated once so the cores
// can do position arithmetic without re-checking.
//
// Positions are 64-bit byte counts that only grow: at 100 GB/s they last 5 years, so a
// connection never sees them wrap. The offset in the ring is pos & (bytes - 1).

#pragma once

#include <cstdint>

#include "rdmaring/error.hpp"
#include "rdmaring/wire.hpp"

namespace rdmaring {

struct RingGeometry {
  std::uint64_t bytes = 0;
  std::uint32_t max_record = 0;  // largest payload in bytes

  // errc::bad_config when `bytes` is not a power of two in [wire::kMinRingBytes, wire::kMaxRingBytes], or
  // when a record of `max_record` bytes would not fit in the ring.
  static Result<RingGeometry> make(std::uint64_t bytes, std::uint32_t max_record);

  std::uint64_t offset(std::uint64_t pos) const noexcept { return pos & (bytes - 1); }
  std::uint64_t to_end(std::uint64_t pos) const noexcept { return bytes - offset(pos); }
};

}  // namespace rdmaring
