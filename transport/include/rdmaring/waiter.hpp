// Waiter: sleeping until one of several descriptors is readable or another thread calls wake().
// One epoll descriptor over the descriptors watched plus an eventfd and a timerfd of its own, so
// that an application can put the single fd() into its own event loop (epoll nests).
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <initializer_list>
#include <optional>

#include "rdmaring/error.hpp"

namespace rdmaring {

class Waiter {
 public:
  // Watches `fds` for readability (level-triggered); they must stay open while watched.
  // Throws: SetupError system_failure with the errno of epoll_create1, eventfd or epoll_ctl.
  explicit Waiter(std::initializer_list<int> fds = {});
  ~Waiter();
  Waiter(const Waiter&) = delete;
  Waiter& operator=(const Waiter&) = delete;

  // Adds `fd` (level-triggered readability) until unwatch(fd), which must come before it closes.
  // Errors: system_failure with the errno of epoll_ctl.
  Result<void> watch(int fd) const;
  void unwatch(int fd) const noexcept;

  // Readable while a watched descriptor is, or a wake() is not yet cleared.
  int fd() const noexcept { return epoll_; }
  // Sleeps until fd() is readable or `timeout` passes (negative: no limit). true: readable.
  // Remembers which descriptors it found readable (was_ready()).
  // Errors: system_failure with the errno of epoll_wait (EINTR is a wake-up: true).
  Result<bool> wait(std::chrono::milliseconds timeout) const;
  // Looks, without sleeping, which descriptors are readable now, for was_ready(): one system
  // call, where reading each descriptor in case it has something would take one apiece.
  // Errors: as wait()'s.
  Result<void> look() const;
  // Whether `fd` was readable at the last wait() or look(). A descriptor that became readable
  // since is not lost: it ends the next wait() at once.
  bool was_ready(int fd) const noexcept;
  // From any thread: makes fd() readable until take_wake(). One write(2); never blocks.
  void wake() const noexcept;
  // Takes back the wake()s so far; whether there was one. A caller about to sleep takes them
  // first and does not sleep when there was one: a wake() is never lost, whenever it came.
  // No system call when none came (the common case on a sleeper's path): one read(2) when one did.
  bool take_wake() const noexcept;
  // Makes fd() readable from `at` on (steady_clock: CLOCK_MONOTONIC) until the next call, which
  // replaces it; nullopt: no such time. For a sleeper that must look again at a known time.
  // Errors: system_failure with the errno of timerfd_settime.
  Result<void> wake_at(std::optional<std::chrono::steady_clock::time_point> at) const;

 private:
  Result<bool> collect(int timeout_ms) const;

  int epoll_ = -1;
  int event_ = -1;
  mutable std::atomic<bool> woken_{false};  // set by wake() once its write is done
  int timer_ = -1;
  // What the last wait() or look() found readable: of the few descriptors a waiter watches (a
  // CQ's channel, an rdma_cm channel, an async descriptor, its eventfd and timer), all fit.
  static constexpr std::size_t kMaxReady = 8;
  mutable std::array<int, kMaxReady> ready_{};
  mutable std::size_t ready_count_ = 0;
};

// A descriptor in a Waiter's set for as long as this lives: declared after the object that owns
// the descriptor, so that it leaves the set before the descriptor closes.
class Watched {
 public:
  // Throws: SetupError, as Waiter::watch's error.
  Watched(const Waiter& waiter, int fd);
  ~Watched() { waiter_->unwatch(fd_); }
  Watched(const Watched&) = delete;
  Watched& operator=(const Watched&) = delete;

 private:
  const Waiter* waiter_;
  int fd_;
};

}  // namespace rdmaring
