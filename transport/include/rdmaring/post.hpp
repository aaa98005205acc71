// Turning the cores' work requests into one chained ibv_post_send. Shared by both adapters so
// the mapping of Kind to opcode and flags exists once.
#pragma once

#include <infiniband/verbs.h>

#include <array>
#include <cstdint>
#include <span>

#include "rdmaring/producer_core.hpp"
#include "rdmaring/verbs/qp.hpp"

namespace rdmaring {

// Where a session's producer writes in one epoch, as the owner grants it (the tail fields are 0
// in mode imm).
struct RingKeys {
  std::uint64_t ring_addr = 0;
  std::uint32_t ring_rkey = 0;
  std::uint64_t tail_addr = 0;  // tail MR (mode tail)
  std::uint32_t tail_rkey = 0;
};

// Where the payload segments of a work request come from and go to.
struct WriteTarget {
  std::byte* local_base = nullptr;  // staging (producer) or unused (inline-only posts)
  std::uint32_t lkey = 0;
  RingKeys remote;
};

// The wr_id of every receive WR, on both sides: an error completion (whose opcode is undefined)
// is still told apart from a send's, whose id is a slot number or a credit write's, far below.
inline constexpr std::uint64_t kRecvWrId = ~std::uint64_t{0};

// Posts `wrs` as one chain. Errors: as QueuePair::post_send.
Result<void> post_chain(verbs::QueuePair& qp, std::span<const WorkRequest> wrs, const WriteTarget& target);

// Posts one inline RDMA_WRITE of `bytes` to remote `addr`/`rkey` (a credit record); with
// `notify`, an RDMA_WRITE_WITH_IMM (immediate 0) that also completes a receive of the peer's.
Result<void> post_inline_write(verbs::QueuePair& qp, std::span<const std::byte> bytes, std::uint64_t addr,
                               std::uint32_t rkey, const SendQueueBudget::Slot& slot, bool notify = false);

}  // namespace rdmaring
