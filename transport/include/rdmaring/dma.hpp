// Reading memory that a NIC writes behind the compiler's back (tail and credit MRs).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

namespace rdmaring {

// Copies N bytes (a multiple of 8, 8-byte aligned source) that a NIC may be placing right now.
// Volatile word loads keep the compiler from hoisting the read out of a polling loop; the
// acquire fence keeps later reads of the ring (which the copied words publish) after them.
// The copy may be torn across words: every such record carries a check for that.
template <std::size_t N>
void read_dma(const std::byte* src, std::span<std::byte, N> dst) noexcept {
  static_assert(N % 8 == 0);
  const volatile std::uint64_t* words = reinterpret_cast<const volatile std::uint64_t*>(src);
  for (std::size_t i = 0; i < N / 8; ++i) {
    const std::uint64_t w = words[i];
    std::memcpy(dst.data() + 8 * i, &w, 8);
  }
  std::atomic_thread_fence(std::memory_order_acquire);
}

}  // namespace rdmaring
