#include <catch2/catch.hpp>

#include <array>
#include <boost/crc.hpp>
#include <random>
#include <string_view>
#include <vector>

#include "../skip.hpp"
#include "rdmaring/checksum.hpp"

using namespace rdmaring;

namespace {

using Impl = std::uint32_t (*)(std::span<const std::byte>, std::uint32_t) noexcept;
using Prefixed = std::uint32_t (*)(std::span<const std::byte, 12>, std::span<const std::byte>) noexcept;

// The byte-wise implementation crc32c had before slicing-by-8 and SSE4.2: the oracle.
std::uint32_t boost_crc32c(std::span<const std::byte> bytes) {
  boost::crc_optimal<32, 0x1EDC6F41, 0xFFFFFFFF, 0xFFFFFFFF, true, true> crc;
  crc.process_bytes(bytes.data(), bytes.size());
  return crc.checksum();
}

void check_known_vectors(Impl crc) {
  constexpr std::string_view check = "123456789";
  CHECK(crc(std::as_bytes(std::span{check}), 0) == 0xE3069283u);
  CHECK(crc({}, 0) == 0u);
  const std::vector<std::byte> zeros(32, std::byte{0x00});
  CHECK(crc(zeros, 0) == 0x8A9136AAu);
  const std::vector<std::byte> ones(32, std::byte{0xFF});
  CHECK(crc(ones, 0) == 0x62A8AB43u);
}

// Every start offset modulo 8 and lengths spanning whole 8-byte steps plus each tail length,
// since those are where a sliced or word-wise loop goes wrong; and a CRC continued from a split
// (a record's check runs over its header, then its payload).
void check_against_boost(Impl crc) {
  constexpr std::size_t kMaxLen = 5000;
  std::mt19937_64 rng(0xC4C32C);
  std::vector<std::byte> buf(kMaxLen + 8);
  for (auto& b : buf) b = static_cast<std::byte>(rng());
  std::uniform_int_distribution<std::size_t> random_len(0, kMaxLen);
  for (std::size_t offset = 0; offset < 8; ++offset) {
    std::vector<std::size_t> lengths;
    for (std::size_t len = 0; len <= 64; ++len) lengths.push_back(len);
    for (int i = 0; i < 100; ++i) lengths.push_back(random_len(rng));
    lengths.push_back(kMaxLen);
    for (std::size_t len : lengths) {
      const auto bytes = std::span<const std::byte>(buf).subspan(offset, len);
      INFO("offset " << offset << ", length " << len);
      REQUIRE(crc(bytes, 0) == boost_crc32c(bytes));
      const std::size_t split = len / 3;
      REQUIRE(crc(bytes.subspan(split), crc(bytes.first(split), 0)) == boost_crc32c(bytes));
    }
  }
}

// A record's check: its header's first 12 bytes, then the covered payload (none, or one at any
// length and alignment), as one CRC over both; every byte of the prefix changes the result.
void check_prefixed(Prefixed crc) {
  constexpr std::size_t kMaxLen = 2000;
  std::mt19937_64 rng(0x12C4C);
  std::vector<std::byte> buf(12 + kMaxLen + 8);
  for (auto& b : buf) b = static_cast<std::byte>(rng());
  for (std::size_t offset = 0; offset < 8; ++offset) {
    const auto prefix = std::span<const std::byte>(buf).subspan(offset).first<12>();
    for (std::size_t len : {0u, 1u, 3u, 7u, 8u, 13u, 64u, 255u, 256u, 1000u, 2000u}) {
      const auto both = std::span<const std::byte>(buf).subspan(offset, 12 + len);
      INFO("offset " << offset << ", length after the prefix " << len);
      REQUIRE(crc(prefix, both.subspan(12)) == boost_crc32c(both));
    }
  }
  std::array<std::byte, 12> prefix{};
  const std::uint32_t zeros = crc(prefix, {});
  for (std::size_t i = 0; i < prefix.size(); ++i) {
    prefix[i] = std::byte{0x80};
    CHECK(crc(prefix, {}) != zeros);
    prefix[i] = std::byte{0x00};
  }
}

}  // namespace

TEST_CASE("crc32c gives the CRC-32C check values", "[checksum]") {
  check_known_vectors(crc32c);
}

TEST_CASE("crc32c agrees with Boost.CRC at every length and alignment", "[checksum]") {
  check_against_boost(crc32c);
}

TEST_CASE("crc32c_prefixed is the CRC-32C of its 12-byte prefix followed by the rest", "[checksum]") {
  check_prefixed(crc32c_prefixed);
  check_prefixed(detail::crc32c_prefixed_portable);
}

TEST_CASE("portable slicing-by-8 CRC-32C matches the check values and Boost.CRC", "[checksum]") {
  check_known_vectors(detail::crc32c_portable);
  check_against_boost(detail::crc32c_portable);
}

#if defined(__x86_64__)
TEST_CASE("SSE4.2 CRC-32C matches the check values and Boost.CRC", "[checksum]") {
  if (!__builtin_cpu_supports("sse4.2")) RDMARING_SKIP("CPU lacks SSE4.2: hardware CRC-32C path not tested");
  check_known_vectors(detail::crc32c_sse42);
  check_against_boost(detail::crc32c_sse42);
  check_prefixed(detail::crc32c_prefixed_sse42);
}

TEST_CASE("folded (ISA-L) CRC-32C matches the check values and Boost.CRC, up to 64 KiB", "[checksum]") {
  if (!__builtin_cpu_supports("sse4.2") || !__builtin_cpu_supports("pclmul"))
    RDMARING_SKIP("CPU lacks SSE4.2 or PCLMUL: ISA-L's folded CRC-32C path not tested");
  check_known_vectors(detail::crc32c_folded);
  check_against_boost(detail::crc32c_folded);
  check_prefixed(detail::crc32c_prefixed_folded);
  std::vector<std::byte> big(64 * 1024 + 3);
  std::mt19937_64 rng(0xF01D);
  for (auto& b : big) b = static_cast<std::byte>(rng());
  for (const std::size_t len : {255u, 256u, 257u, 4096u, 65536u, 65539u})
    REQUIRE(detail::crc32c_folded(std::span<const std::byte>(big).first(len)) ==
            boost_crc32c(std::span<const std::byte>(big).first(len)));
}
#endif
