#include "rdmaring/checksum.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>

#if defined(__x86_64__)
#include <isa-l/crc.h>
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

using BytesFn = std::uint32_t (*)(std::span<const std::byte>, std::uint32_t) noexcept;
using PrefixedFn = std::uint32_t (*)(std::span<const std::byte, 12>, std::span<const std::byte>) noexcept;

struct Impls {
  BytesFn bytes;
  PrefixedFn prefixed;
};

Impls choose() noexcept {
#if defined(__x86_64__)
  // Dispatch may first run from another translation unit's static constructor, before
  // libgcc has filled in the CPU model that __builtin_cpu_supports reads.
  __builtin_cpu_init();
  if (__builtin_cpu_supports("sse4.2")) {
    // Without PCLMUL ISA-L falls back to a byte table, slower than slicing-by-8: the emulated
    // guest's CPU is one such.
    if (__builtin_cpu_supports("pclmul")) return {detail::crc32c_folded, detail::crc32c_prefixed_folded};
    return {detail::crc32c_sse42, detail::crc32c_prefixed_sse42};
  }
#endif
  return {detail::crc32c_portable, detail::crc32c_prefixed_portable};
}

// The implementations in use, resolved by the first call (any thread's: each resolves to the
// same): a call is then one load and a jump, where a function-local static's guard cost a call
// of its own, twice per record. Constant-initialized, so a static constructor elsewhere that
// checksums before this file's statics are set up finds the resolvers, not null.
Impls resolve() noexcept;
std::uint32_t bytes_first(std::span<const std::byte> bytes, std::uint32_t prior) noexcept {
  return resolve().bytes(bytes, prior);
}
std::uint32_t prefixed_first(std::span<const std::byte, 12> prefix, std::span<const std::byte> rest) noexcept {
  return resolve().prefixed(prefix, rest);
}
constinit std::atomic<BytesFn> bytes_impl{bytes_first};
constinit std::atomic<PrefixedFn> prefixed_impl{prefixed_first};
Impls resolve() noexcept {
  const Impls impls = choose();
  bytes_impl.store(impls.bytes, std::memory_order_relaxed);
  prefixed_impl.store(impls.prefixed, std::memory_order_relaxed);
  return impls;
}

}  // namespace

namespace detail {

std::uint32_t crc32c_portable(std::span<const std::byte> bytes, std::uint32_t prior) noexcept {
  std::uint32_t crc = prior ^ 0xFFFFFFFF;
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

std::uint32_t crc32c_prefixed_portable(std::span<const std::byte, 12> prefix, std::span<const std::byte> rest) noexcept {
  return crc32c_portable(rest, crc32c_portable(prefix));
}

#if defined(__x86_64__)
// Folds one Word from `p` into `c` when at least one is left.
template <class Word>
__attribute__((target("sse4.2"))) void crc_tail_step(std::uint32_t& c, const std::byte*& p, std::size_t& n) noexcept {
  if (n < sizeof(Word)) return;
  Word w;
  std::memcpy(&w, p, sizeof w);
  if constexpr (sizeof(Word) == 4) c = _mm_crc32_u32(c, w);
  else if constexpr (sizeof(Word) == 2) c = _mm_crc32_u16(c, w);
  else c = _mm_crc32_u8(c, w);
  p += sizeof w;
  n -= sizeof w;
}

// The target attribute, not -msse4.2, keeps the rest of the build runnable on CPUs
// without SSE4.2 (the test guest's qemu64); choose() sends calls here only where it exists.
__attribute__((target("sse4.2"))) std::uint32_t crc32c_sse42(std::span<const std::byte> bytes, std::uint32_t prior) noexcept {
  std::uint64_t crc = prior ^ 0xFFFFFFFF;
  const std::byte* p = bytes.data();
  std::size_t n = bytes.size();
  for (; n >= 8; n -= 8, p += 8) {
    std::uint64_t w;
    std::memcpy(&w, p, sizeof w);  // x86 is little-endian and tolerates unaligned loads
    crc = _mm_crc32_u64(crc, w);
  }
  // The tail in at most three steps, not one per byte: a header's 20 bytes take three in all.
  auto c = static_cast<std::uint32_t>(crc);
  crc_tail_step<std::uint32_t>(c, p, n);
  crc_tail_step<std::uint16_t>(c, p, n);
  crc_tail_step<std::uint8_t>(c, p, n);
  return c ^ 0xFFFFFFFF;
}

// ISA-L folds the input with carry-less multiplies: about five times the speed of one crc32
// instruction chain from 1 KiB up, but slower below 256 B (bench/README.md, "Native cost"):
// headers and small records stay on the instruction chain.
constexpr std::size_t kFoldFrom = 256;

std::uint32_t crc32c_folded(std::span<const std::byte> bytes, std::uint32_t prior) noexcept {
  if (bytes.size() < kFoldFrom) return crc32c_sse42(bytes, prior);
  // ISA-L takes the running CRC and returns it without the final inversion; its length is an
  // int, so a span past 2 GiB goes in pieces. (It only reads the buffer its signature takes
  // as mutable.)
  constexpr std::size_t kPiece = std::size_t{1} << 30;
  auto* p = const_cast<unsigned char*>(reinterpret_cast<const unsigned char*>(bytes.data()));
  unsigned int crc = prior ^ 0xFFFFFFFF;
  for (std::size_t left = bytes.size(); left > 0;) {
    const std::size_t n = std::min(left, kPiece);
    crc = crc32_iscsi(p, static_cast<int>(n), crc);
    p += n;
    left -= n;
  }
  return crc ^ 0xFFFFFFFF;
}

namespace {

// The prefix as one 8-byte and one 4-byte step, with no loop or tail test; `Rest` continues
// over what follows.
template <std::uint32_t (*Rest)(std::span<const std::byte>, std::uint32_t) noexcept>
__attribute__((target("sse4.2"))) std::uint32_t prefixed_sse42(std::span<const std::byte, 12> prefix,
                                                               std::span<const std::byte> rest) noexcept {
  std::uint64_t low;
  std::uint32_t high;
  std::memcpy(&low, prefix.data(), sizeof low);
  std::memcpy(&high, prefix.data() + sizeof low, sizeof high);
  const std::uint32_t crc = _mm_crc32_u32(static_cast<std::uint32_t>(_mm_crc32_u64(0xFFFFFFFF, low)), high) ^ 0xFFFFFFFF;
  return rest.empty() ? crc : Rest(rest, crc);
}

}  // namespace

std::uint32_t crc32c_prefixed_sse42(std::span<const std::byte, 12> prefix, std::span<const std::byte> rest) noexcept {
  return prefixed_sse42<crc32c_sse42>(prefix, rest);
}

std::uint32_t crc32c_prefixed_folded(std::span<const std::byte, 12> prefix, std::span<const std::byte> rest) noexcept {
  return prefixed_sse42<crc32c_folded>(prefix, rest);
}
#endif

}  // namespace detail

std::uint32_t crc32c(std::span<const std::byte> bytes, std::uint32_t prior) noexcept {
  return bytes_impl.load(std::memory_order_relaxed)(bytes, prior);
}

std::uint32_t crc32c_prefixed(std::span<const std::byte, 12> prefix, std::span<const std::byte> rest) noexcept {
  return prefixed_impl.load(std::memory_order_relaxed)(prefix, rest);
}

}  // namespace rdmaring
