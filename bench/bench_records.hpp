// The records the benchmarks send: record k's bytes are a function of (seed, k), so a receiver
// checks every byte without a side channel. Shared by rdmaring-bench and zmq-baseline, so both
// do the same work per record.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

namespace rdmaring::bench {

inline std::uint64_t mix(std::uint64_t x) {  // splitmix64
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

inline void fill(std::uint64_t seed, std::uint64_t seq, std::span<std::byte> out) {
  std::uint64_t s = mix(seed ^ (seq << 1));
  for (std::size_t i = 0; i < out.size(); i += 8) {
    s = mix(s);
    std::memcpy(out.data() + i, &s, std::min<std::size_t>(8, out.size() - i));
  }
}

}  // namespace rdmaring::bench
