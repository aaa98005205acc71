#include "rdmaring/checksum.hpp"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace rdmaring {
namespace {

// Slicing-by-8 (Kounavis & Berry): table k advances a byte through k further zero bytes,
// so eight table lookups fold eight input bytes per step instead of one per byte.
using Tables = std::array<std::array<std::uint32_t, 256>, 8>;

constexpr Tables make_tables() noexcept {
  constexpr std::uint32_t kReflectedPoly = 0x82F63B78;  // 0x1EDC6F41 bit-reversed
  Tables t{};
  for (std::uint32_t n = 0; n < 256; ++n) {
    std::uint32_t c = n;
    for (int bit = 0; bit < 8; ++bit) c = (c & 1) ? (c >> 1) ^ kReflectedPoly : c >> 1;
    t[0][n] = c;
  }
  for (std::size_t k = 1; k < t.size(); ++k)
    for (std::size_t n = 0; n < 256; ++n) t[k][n] = (t[k - 1][n] >> 8) ^ t[0][t[k - 1][n] & 0xFF];
  return t;
}

constexpr Tables kTables = make_tables();
static_assert(kTables[0][1] == 0xF26B8303, "byte table disagrees with the Castagnoli polynomial");

// Assembled from bytes so the word order is right on any host. Written out rather than
// looped: GCC folds only the unrolled form into a single load on little-endian targets.
std::uint64_t load_le64(const std::byte* p) noexcept {
  const auto b = [p](int i) { return std::to_integer<std::uint64_t>(p[i]); };
  return b(0) | b(1) << 8 | b(2) << 16 | b(3) << 24 | b(4) << 32 | b(5) << 40 | b(6) << 48 | b(7) << 56;
}

std::uint32_t byte_step(std::uint32_t crc, std::byte b) noexcept {
  return kTables[0][(crc ^ std::to_integer<std::uint32_t>(b)) & 0xFF] ^ (crc >> 8);
}

#if defined(__x86_64__)
using Impl = std::uint32_t (*)(std::span<const std::byte>) noexcept;

Impl choose() noexcept {
  // Dispatch may first run from another translation unit's static constructor, before
  // libgcc has filled in the CPU model that __builtin_cpu_supports reads.
  __builtin_cpu_init();
  return __builtin_cpu_supports("sse4.2") ? detail::crc32c_sse42 : detail::crc32c_portable;
}
#endif

}  // namespace

namespace detail {

std::uint32_t crc32c_portable(std::span<const std::byte> bytes) noexcept {
  std::uint32_t crc = 0xFFFFFFFF;
  const std::byte* p = bytes.data();
  std::size_t n = bytes.size();
  for (; n >= 8; n -= 8, p += 8) {
    const std::uint64_t w = load_le64(p) ^ crc;
    crc = kTables[7][w & 0xFF] ^ kTables[6][(w >> 8) & 0xFF] ^ kTables[5][(w >> 16) & 0xFF] ^
          kTables[4][(w >> 24) & 0xFF] ^ kTables[3][(w >> 32) & 0xFF] ^ kTables[2][(w >> 40) & 0xFF] ^
          kTables[1][(w >> 48) & 0xFF] ^ kTables[0][w >> 56];
  }
  for (; n > 0; --n, ++p) crc = byte_step(crc, *p);
  return crc ^ 0xFFFFFFFF;
}

#if defined(__x86_64__)
// The target attribute, not -msse4.2, keeps the rest of the build runnable on CPUs
// without SSE4.2 (the test guest's qemu64); choose() sends calls here only where it exists.
__attribute__((target("sse4.2"))) std::uint32_t crc32c_sse42(std::span<const std::byte> bytes) noexcept {
  std::uint64_t crc = 0xFFFFFFFF;
  const std::byte* p = bytes.data();
  std::size_t n = bytes.size();
  for (; n >= 8; n -= 8, p += 8) {
    std::uint64_t w;
    std::memcpy(&w, p, sizeof w);  // x86 is little-endian and tolerates unaligned loads
    crc = _mm_crc32_u64(crc, w);
  }
  auto c = static_cast<std::uint32_t>(crc);
  for (; n > 0; --n, ++p) c = _mm_crc32_u8(c, std::to_integer<std::uint8_t>(*p));
  return c ^ 0xFFFFFFFF;
}
#endif

}  // namespace detail

std::uint32_t crc32c(std::span<const std::byte> bytes) noexcept {
#if defined(__x86_64__)
  static const Impl impl = choose();
  return impl(bytes);
#else
  return detail::crc32c_portable(bytes);
#endif
}

}  // namespace rdmaring
