// What a poll loop does after a round that found nothing to do: spin, then yield the core, then
// sleep for growing periods, so a short lull costs no latency and a long one costs no CPU.
// Aeron's BackoffIdleStrategy is the model: counted rounds, no clock reads. Work resets it.
//
// Sans I/O: next() decides, the loop acts. idle() acts the usual way (sleep_for); a ring owner's
// loop turns Step::sleep into RingOwner::wait(), which sleeps until the next event instead.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>

namespace rdmaring {

struct IdlePolicy {
  std::uint32_t spins = 64;   // idle rounds that return at once
  std::uint32_t yields = 64;  // then idle rounds that yield the core
  std::chrono::nanoseconds min_sleep = std::chrono::microseconds(1);  // then sleeps, doubling
  std::chrono::nanoseconds max_sleep = std::chrono::milliseconds(1);  // up to this
};

class IdleStrategy {
 public:
  enum class Step { spin, yield, sleep };

  explicit IdleStrategy(const IdlePolicy& policy = {}) noexcept : policy_(policy), sleep_(policy.min_sleep) {}

  // After a round that did `work` things: Step::spin when it did any (and the back-off starts
  // over), else the next step of the back-off.
  Step next(std::size_t work) noexcept;
  // How long Step::sleep sleeps: min_sleep at first, doubled by each sleep, at most max_sleep.
  std::chrono::nanoseconds sleep_period() const noexcept { return sleep_; }
  void reset() noexcept;
  // next(work), acted on: nothing, std::this_thread::yield() or std::this_thread::sleep_for().
  void idle(std::size_t work);

 private:
  IdlePolicy policy_;
  std::uint64_t rounds_ = 0;
  std::chrono::nanoseconds sleep_;
  bool slept_ = false;
};

}  // namespace rdmaring
