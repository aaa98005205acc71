// The producer side of the GPU delivery's tests, on the GPU (gpu/tests/) and over the stand-in
// CUDA runtime (tests/gpu_host/): records of fill.hpp's sizes and bytes through the loopback
// fabric.
#pragma once

#include <catch2/catch.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "fabric/loopback.hpp"
#include "fill.hpp"

namespace rdmaring::gpu::test {

// Sends records from `sequence` until the ring is full or `until` is reached, each of
// record_length(sequence, max_payload) bytes; publishes them.
inline std::uint64_t send_some(rdmaring::test::LoopbackFabric& f, std::uint64_t sequence, std::uint64_t until,
                               std::uint32_t max_payload) {
  std::vector<std::byte> payload(max_payload);
  for (; sequence < until; ++sequence) {
    const auto bytes = std::span(payload).first(record_length(sequence, max_payload));
    for (std::uint32_t i = 0; i < bytes.size(); ++i) bytes[i] = std::byte{record_byte(sequence, i)};
    auto sent = f.producer->send(bytes, std::chrono::steady_clock::now());
    if (!sent) {
      REQUIRE(sent.error() == errc::would_block);
      break;
    }
  }
  f.flush();
  f.deliver_publishes();
  return sequence;
}

}  // namespace rdmaring::gpu::test
