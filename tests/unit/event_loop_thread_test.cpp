// The control thread runs without a device, so its naming is checked here; a Producer's, which
// needs one, in tests/softroce/control_test.cpp.
#include "event_loop_thread.hpp"

#include <catch2/catch.hpp>

#include "../thread_names.hpp"

using namespace rdmaring;

TEST_CASE("EventLoopThread names its thread before set-up runs", "[control]") {
  const auto before = test::threads_named("rdmaring-test");
  std::size_t seen_by_setup = 0;
  control::EventLoopThread loop([&](kj::AsyncIoContext&) { seen_by_setup = test::threads_named("rdmaring-test"); },
                                [] {}, "rdmaring-test");
  INFO("threads: " << Catch::Detail::stringify(test::thread_names()));
  CHECK(seen_by_setup == before + 1);
  CHECK(test::threads_named("rdmaring-test") == before + 1);
}
