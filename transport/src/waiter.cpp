#include "rdmaring/waiter.hpp"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <string>

namespace rdmaring {
namespace {

Error failure(const char* call, int err) {
  return make_error(errc::system_failure, std::string(call) + " for a waiter", err);
}

}  // namespace

Waiter::Waiter(std::initializer_list<int> fds) {
  epoll_ = epoll_create1(EPOLL_CLOEXEC);
  if (epoll_ < 0) throw SetupError(failure("epoll_create1", errno));
  event_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (event_ < 0) {
    const int err = errno;
    close(epoll_);
    throw SetupError(failure("eventfd", err));
  }
  timer_ = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
  if (timer_ < 0) {
    const int err = errno;
    close(event_);
    close(epoll_);
    throw SetupError(failure("timerfd_create", err));
  }
  Result<void> ok = watch(event_);
  if (ok) ok = watch(timer_);
  for (auto it = fds.begin(); ok && it != fds.end(); ++it) ok = watch(*it);
  if (!ok) {
    close(timer_);
    close(event_);
    close(epoll_);
    throw SetupError(ok.error());
  }
}

Waiter::~Waiter() {
  close(timer_);
  close(event_);
  close(epoll_);
}

Result<void> Waiter::watch(int fd) const {
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = fd;
  if (epoll_ctl(epoll_, EPOLL_CTL_ADD, fd, &ev) != 0) return failure("epoll_ctl(EPOLL_CTL_ADD)", errno);
  return success();
}

void Waiter::unwatch(int fd) const noexcept { (void)epoll_ctl(epoll_, EPOLL_CTL_DEL, fd, nullptr); }

Result<bool> Waiter::wait(std::chrono::milliseconds timeout) const {
  return collect(timeout.count() < 0 ? -1 : static_cast<int>(timeout.count()));
}

Result<void> Waiter::look() const {
  BOOST_OUTCOME_TRYV(collect(0));
  return success();
}

bool Waiter::was_ready(int fd) const noexcept {
  const auto end = ready_.begin() + static_cast<std::ptrdiff_t>(ready_count_);
  return std::find(ready_.begin(), end, fd) != end;
}

Result<bool> Waiter::collect(int timeout_ms) const {
  std::array<epoll_event, kMaxReady> ev{};
  const int n = epoll_wait(epoll_, ev.data(), static_cast<int>(ev.size()), timeout_ms);
  ready_count_ = 0;
  if (n < 0) {
    if (errno != EINTR) return failure("epoll_wait", errno);
    return true;  // a signal: the caller looks again
  }
  for (int i = 0; i < n; ++i) ready_[ready_count_++] = ev[static_cast<std::size_t>(i)].data.fd;
  return n != 0;
}

void Waiter::wake() const noexcept {
  const std::uint64_t one = 1;
  // EAGAIN only when the counter is near 2^64: it is readable then anyway.
  (void)!write(event_, &one, sizeof one);
  // After the write: a take_wake() that sees the flag finds the counter set. One that misses it
  // leaves the counter readable, so the sleep that follows ends at once and the next take_wake()
  // sees the flag: a wake() is never lost, and no read(2) is spent where none came.
  woken_.store(true, std::memory_order_release);
}

bool Waiter::take_wake() const noexcept {
  if (!woken_.exchange(false, std::memory_order_acquire)) return false;
  std::uint64_t count = 0;
  (void)!read(event_, &count, sizeof count);
  return true;
}

Result<void> Waiter::wake_at(std::optional<std::chrono::steady_clock::time_point> at) const {
  // Setting the timer, even to nothing, also clears an expiry not yet read: fd() is readable for
  // this time only. A time already past expires at once.
  itimerspec spec{};
  if (at) {
    const std::int64_t ns =
        std::max<std::int64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(at->time_since_epoch()).count(), 1);
    spec.it_value.tv_sec = ns / 1'000'000'000;
    spec.it_value.tv_nsec = ns % 1'000'000'000;
  }
  if (timerfd_settime(timer_, TFD_TIMER_ABSTIME, &spec, nullptr) != 0) return failure("timerfd_settime", errno);
  return success();
}

Watched::Watched(const Waiter& waiter, int fd) : waiter_(&waiter), fd_(fd) {
  if (auto ok = waiter.watch(fd); !ok) throw SetupError(ok.error());
}

}  // namespace rdmaring
