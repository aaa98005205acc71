#include "rdmaring/ring_geometry.hpp"

#include <bit>
#include <string>

namespace rdmaring {

Result<RingGeometry> RingGeometry::make(std::uint64_t bytes, std::uint32_t max_record) {
  if (!std::has_single_bit(bytes) || bytes < wire::kMinRingBytes || bytes > wire::kMaxRingBytes)
    return make_error(errc::bad_config, "ring size " + std::to_string(bytes) +
                                            " B: must be a power of two between " + std::to_string(wire::kMinRingBytes) +
                                            " B and " + std::to_string(wire::kMaxRingBytes) + " B");
  if (wire::record_span(max_record) > bytes)
    return make_error(errc::bad_config, "max record " + std::to_string(max_record) + " B takes " +
                                            std::to_string(wire::record_span(max_record)) +
                                            " B with its header, more than the ring's " + std::to_string(bytes) + " B");
  return RingGeometry{bytes, max_record};
}

}  // namespace rdmaring
