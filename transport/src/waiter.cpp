#include "rdmaring/waiter.hpp"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <string>

namespace rdmaring {
namespace {

[[noreturn]] void fail(const char* call) {
  throw SetupError(make_error(errc::system_failure, std::string(call) + " for the owner's waiter", errno));
}

}  // namespace

Waiter::Waiter(std::initializer_list<int> fds) {
  epoll_ = epoll_create1(EPOLL_CLOEXEC);
  if (epoll_ < 0) fail("epoll_create1");
  event_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (event_ < 0) {
    const int err = errno;
    close(epoll_);
    errno = err;
    fail("eventfd");
  }
  const auto watch = [this](int fd) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    if (epoll_ctl(epoll_, EPOLL_CTL_ADD, fd, &ev) != 0) fail("epoll_ctl");
  };
  try {
    for (int fd : fds) watch(fd);
    watch(event_);
  } catch (...) {
    close(event_);
    close(epoll_);
    throw;
  }
}

Waiter::~Waiter() {
  close(event_);
  close(epoll_);
}

Result<bool> Waiter::wait(std::chrono::milliseconds timeout) const {
  epoll_event ev{};
  const int n = epoll_wait(epoll_, &ev, 1, timeout.count() < 0 ? -1 : static_cast<int>(timeout.count()));
  if (n < 0 && errno != EINTR) return make_error(errc::system_failure, "epoll_wait for the owner's waiter", errno);
  return n != 0;
}

void Waiter::wake() const noexcept {
  const std::uint64_t one = 1;
  // EAGAIN only when the counter is near 2^64: it is readable then anyway.
  (void)!write(event_, &one, sizeof one);
}

bool Waiter::take_wake() const noexcept {
  std::uint64_t count = 0;
  return read(event_, &count, sizeof count) == static_cast<ssize_t>(sizeof count) && count > 0;
}

}  // namespace rdmaring
