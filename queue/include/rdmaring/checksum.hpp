// CRC-32C (Castagnoli), the check of every record, tail and credit record.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace rdmaring {

// `prior` continues a CRC: crc32c(b, crc32c(a)) == crc32c(a followed by b).
std::uint32_t crc32c(std::span<const std::byte> bytes, std::uint32_t prior = 0) noexcept;

// crc32c(rest, crc32c(prefix)) in one call: a record's check (protocol-spec/wire-formats.md §2)
// starts with its header's 12 bytes, which take two crc32 instructions where the CPU has them
// instead of a dispatch of their own.
std::uint32_t crc32c_prefixed(std::span<const std::byte, 12> prefix, std::span<const std::byte> rest) noexcept;

// The implementations crc32c chooses between, declared for tests and benchmarks.
namespace detail {

std::uint32_t crc32c_portable(std::span<const std::byte> bytes, std::uint32_t prior = 0) noexcept;
std::uint32_t crc32c_prefixed_portable(std::span<const std::byte, 12> prefix, std::span<const std::byte> rest) noexcept;
#if defined(__x86_64__)
// Executes the SSE4.2 crc32 instruction unconditionally: call only where the CPU has it.
std::uint32_t crc32c_sse42(std::span<const std::byte> bytes, std::uint32_t prior = 0) noexcept;
std::uint32_t crc32c_prefixed_sse42(std::span<const std::byte, 12> prefix, std::span<const std::byte> rest) noexcept;
// ISA-L's crc32_iscsi from 256 B up, crc32c_sse42 below: needs SSE4.2 and PCLMUL.
std::uint32_t crc32c_folded(std::span<const std::byte> bytes, std::uint32_t prior = 0) noexcept;
std::uint32_t crc32c_prefixed_folded(std::span<const std::byte, 12> prefix, std::span<const std::byte> rest) noexcept;
#endif

}  // namespace detail
}  // namespace rdmaring
