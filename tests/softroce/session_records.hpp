// The records the session tests send: record `seq` is a function of `seq` alone, so a producer
// restarted from any sequence sends exactly the bytes its predecessor would have, and a consumer
// checks every byte without a log of what was sent.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace rdmaring::testing {

inline std::uint32_t record_size(std::uint64_t seq) { return static_cast<std::uint32_t>((seq * 2654435761u) % 700); }

inline void record_fill(std::uint64_t seq, std::span<std::byte> out) {
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<std::byte>(seq * 31 + i * 7);
}

inline std::vector<std::byte> record_bytes(std::uint64_t seq) {
  std::vector<std::byte> b(record_size(seq));
  record_fill(seq, b);
  return b;
}

inline bool record_matches(std::uint64_t seq, std::span<const std::byte> payload) {
  if (payload.size() != record_size(seq)) return false;
  for (std::size_t i = 0; i < payload.size(); ++i)
    if (payload[i] != static_cast<std::byte>(seq * 31 + i * 7)) return false;
  return true;
}

}  // namespace rdmaring::testing
