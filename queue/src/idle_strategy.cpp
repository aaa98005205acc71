#include "rdmaring/idle_strategy.hpp"

#include <algorithm>
#include <thread>

namespace rdmaring {

IdleStrategy::Step IdleStrategy::next(std::size_t work) noexcept {
  if (work > 0) {
    reset();
    return Step::spin;
  }
  if (slept_) sleep_ = std::min(sleep_ * 2, policy_.max_sleep);
  slept_ = false;
  const std::uint64_t round = rounds_++;
  if (round < policy_.spins) return Step::spin;
  if (round < std::uint64_t{policy_.spins} + policy_.yields) return Step::yield;
  slept_ = true;
  return Step::sleep;
}

void IdleStrategy::reset() noexcept {
  rounds_ = 0;
  sleep_ = policy_.min_sleep;
  slept_ = false;
}

void IdleStrategy::idle(std::size_t work) {
  switch (next(work)) {
    case Step::spin: break;
    case Step::yield: std::this_thread::yield(); break;
    case Step::sleep: std::this_thread::sleep_for(sleep_); break;
  }
}

}  // namespace rdmaring
