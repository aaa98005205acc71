// Slots of one send queue under selective signaling.
//
// Only one WR in `signal_interval` asks for a completion; its completion retires it and every
// WR posted before it (an RC send queue completes in order). A slot is free again only when
// retired, so with depth >= 2 * interval there is always a signaled WR among the outstanding
// ones and a full queue always drains.
#pragma once

#include <cstdint>

#include "rdmaring/error.hpp"

namespace rdmaring {

inline constexpr std::uint32_t kDefaultSqDepth = 128;
inline constexpr std::uint32_t kDefaultSignalInterval = 16;
static_assert(kDefaultSqDepth >= 2 * kDefaultSignalInterval, "a full send queue must hold a signaled WR");

// errc::bad_config unless depth >= 2 * signal_interval >= 2 and depth >= signal_interval +
// max_batch - 1, where max_batch is the most WRs one post needs free at once: up to
// signal_interval - 1 unsignaled WRs can be outstanding with no completion coming to retire them,
// and the batch must still fit beside them.
Result<void> validate_send_queue(std::uint32_t depth, std::uint32_t signal_interval, std::uint32_t max_batch);

class SendQueueBudget {
 public:
  struct Slot {
    std::uint64_t wr_id;  // the WR's number in posting order, used as ibv_send_wr::wr_id
    bool signaled;
  };

  // Assumes depth >= 2 * signal_interval and signal_interval >= 1 (checked by callers' configs).
  SendQueueBudget(std::uint32_t depth, std::uint32_t signal_interval) noexcept
      : depth_(depth), interval_(signal_interval) {}

  std::uint32_t free() const noexcept { return depth_ - static_cast<std::uint32_t>(posted_ - retired_); }
  std::uint64_t outstanding() const noexcept { return posted_ - retired_; }

  // Assumes free() > 0. `force_signal` asks for a completion regardless of the interval.
  Slot take(bool force_signal = false) noexcept {
    const bool signaled = force_signal || ++since_signal_ >= interval_;
    if (signaled) since_signal_ = 0;
    return Slot{posted_++, signaled};
  }

  // A signaled WR completed successfully: it and all WRs before it are done.
  void retire_through(std::uint64_t wr_id) noexcept {
    if (wr_id + 1 > retired_ && wr_id < posted_) retired_ = wr_id + 1;
  }

 private:
  std::uint32_t depth_;
  std::uint32_t interval_;
  std::uint32_t since_signal_ = 0;
  std::uint64_t posted_ = 0;
  std::uint64_t retired_ = 0;
};

}  // namespace rdmaring
