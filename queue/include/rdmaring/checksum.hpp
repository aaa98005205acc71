// CRC-32C (Castagnoli), the check of every record, tail and credit record.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace rdmaring {

std::uint32_t crc32c(std::span<const std::byte> bytes) noexcept;

}  // namespace rdmaring
