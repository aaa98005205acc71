#include "rdmaring/checksum.hpp"

#include <boost/crc.hpp>

namespace rdmaring {

std::uint32_t crc32c(std::span<const std::byte> bytes) noexcept {
  // Table-driven: the test guest runs `-cpu qemu64`, which has no SSE4.2 crc32 instruction.
  boost::crc_optimal<32, 0x1EDC6F41, 0xFFFFFFFF, 0xFFFFFFFF, true, true> crc;
  crc.process_bytes(bytes.data(), bytes.size());
  return crc.checksum();
}

}  // namespace rdmaring
