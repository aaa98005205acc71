#include "event_loop_thread.hpp"

#include <pthread.h>

#include <future>

namespace rdmaring::control {

Error control_error(const kj::Exception& e, const std::string& what) {
  return make_error(errc::control_failure, what + ": " + std::string(e.getDescription().cStr()));
}

EventLoopThread::EventLoopThread(std::function<void(kj::AsyncIoContext&)> setup, std::function<void()> teardown,
                                 const char* name) {
  std::promise<void> started;
  auto ready = started.get_future();
  thread_ = std::thread([this, &started, name, setup = std::move(setup), teardown = std::move(teardown)] {
    pthread_setname_np(pthread_self(), name);
    bool running = false;
    try {
      auto io = kj::setupAsyncIo();
      auto stop = kj::newPromiseAndFulfiller<void>();
      stop_ = kj::mv(stop.fulfiller);
      setup(io);
      executor_ = kj::getCurrentThreadExecutor().addRef();
      running = true;
      started.set_value();
      stop.promise.wait(io.waitScope);
      teardown();
      stop_ = nullptr;
    } catch (const kj::Exception& e) {
      if (!running) started.set_exception(std::make_exception_ptr(SetupError(control_error(e, "set-up"))));
    } catch (...) {
      if (!running) started.set_exception(std::current_exception());
    }
  });
  try {
    ready.get();
  } catch (...) {
    thread_.join();
    throw;
  }
}

EventLoopThread::~EventLoopThread() {
  try {
    executor_->executeSync([this] { stop_->fulfill(); });
  } catch (const kj::Exception&) {
    // The loop is gone already (an exception ended it): nothing to stop.
  }
  thread_.join();
}

}  // namespace rdmaring::control
