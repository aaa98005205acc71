// A thread that runs a KJ event loop (with async I/O) for the control channel, so neither the
// application's threads nor the data path ever wait inside Cap'n Proto. Other threads hand it
// work with call(), which runs a function on the loop and waits for the promise it returns.
#pragma once

#include <kj/async-io.h>

#include <functional>
#include <optional>
#include <thread>
#include <type_traits>

#include "rdmaring/error.hpp"

namespace rdmaring::control {

// kj::Exception (what Cap'n Proto throws) as an Error: control_failure with its description.
Error control_error(const kj::Exception& e, const std::string& what);

template <class T>
struct PromisedType {
  using type = T;
};
template <class T>
struct PromisedType<kj::Promise<T>> {
  using type = T;
};

class EventLoopThread {
 public:
  // Runs `setup` on the new thread before returning (its kj::Exception or SetupError is rethrown
  // here as SetupError); `teardown` runs on the thread when it stops, to destroy what setup made
  // while the loop still exists. The thread is named `name` (at most 15 characters, the kernel's
  // limit) before setup runs, so top -H, gdb and perf tell the library's threads from the
  // application's.
  EventLoopThread(std::function<void(kj::AsyncIoContext&)> setup, std::function<void()> teardown,
                  const char* name);
  EventLoopThread(const EventLoopThread&) = delete;
  EventLoopThread& operator=(const EventLoopThread&) = delete;
  ~EventLoopThread();

  // Runs `f` on the loop and waits for the Result it returns (directly or as a kj::Promise). A
  // kj::Exception becomes control_failure naming `what`.
  template <class F>
  auto call(const std::string& what, F&& f) -> typename PromisedType<decltype(f())>::type {
    using R = typename PromisedType<decltype(f())>::type;
    try {
      return executor_->executeSync(std::forward<F>(f));
    } catch (const kj::Exception& e) {
      return R(control_error(e, what));
    }
  }

 private:
  std::thread thread_;
  kj::Own<const kj::Executor> executor_;
  kj::Own<kj::PromiseFulfiller<void>> stop_;
};

}  // namespace rdmaring::control
