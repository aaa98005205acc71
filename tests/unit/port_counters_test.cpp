// Port counters read from a made-up sysfs tree shaped like rxe's and mlx5's.
#include "rdmaring/verbs/port_counters.hpp"

#include <catch2/catch.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>

using namespace rdmaring;
using namespace rdmaring::verbs;
namespace fs = std::filesystem;

namespace {

struct FakeSysfs {
  fs::path root = fs::temp_directory_path() / ("rdmaring-sysfs-" + std::to_string(getpid()));
  FakeSysfs() { fs::remove_all(root); }
  ~FakeSysfs() { fs::remove_all(root); }
  void put(const std::string& rel, const std::string& text) const {
    const fs::path p = root / rel;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
  }
};

}  // namespace

TEST_CASE("port counters: both directories, hw_counters winning a shared name", "[verbs][counters]") {
  FakeSysfs sys;
  sys.put("rxe0/ports/1/hw_counters/sent_pkts", "120\n");
  sys.put("rxe0/ports/1/hw_counters/rcvd_rnr_err", "0\n");
  sys.put("rxe0/ports/1/hw_counters/lifespan", "10\n");
  sys.put("rxe0/ports/1/hw_counters/odd_format", "N/A (no PMA)\n");
  sys.put("rxe0/ports/1/counters/port_xmit_data", "7\n");
  sys.put("rxe0/ports/1/counters/lifespan", "99\n");
  const auto r = read_port_counters("rxe0", 1, sys.root);
  REQUIRE(r);
  const auto& v = r.value().values;
  CHECK(v.at("sent_pkts") == 120);
  CHECK(v.at("port_xmit_data") == 7);
  CHECK(v.at("lifespan") == 10);
  CHECK(v.count("odd_format") == 0);
}

TEST_CASE("port counters: the difference keeps what moved and every RNR/retry counter", "[verbs][counters]") {
  PortCounters before, after;
  before.values = {{"sent_pkts", 100}, {"rcvd_rnr_err", 0}, {"link_downed", 3}, {"rnr_nak_retry_err", 5}};
  after.values = {{"sent_pkts", 150}, {"rcvd_rnr_err", 0}, {"link_downed", 3}, {"rnr_nak_retry_err", 2},
                  {"local_ack_timeout_err", 4}};
  const auto d = after.since(before).values;
  CHECK(d.at("sent_pkts") == 50);
  CHECK(d.at("rcvd_rnr_err") == 0);  // stayed 0, and says so
  CHECK(d.count("link_downed") == 0);
  CHECK(d.at("rnr_nak_retry_err") == 2);  // went down: reset, so the new value is the count
  CHECK(d.at("local_ack_timeout_err") == 4);
  CHECK(is_rnr_or_retry_counter("retry_exceeded_err"));
  CHECK(is_rnr_or_retry_counter("out_of_seq_request"));
  CHECK_FALSE(is_rnr_or_retry_counter("sent_pkts"));
}

TEST_CASE("port counters: a missing port is no_device naming the path", "[verbs][counters]") {
  FakeSysfs sys;
  sys.put("rxe0/ports/1/hw_counters/sent_pkts", "1\n");
  const auto r = read_port_counters("rxe0", 2, sys.root);
  REQUIRE_FALSE(r);
  CHECK(r.error() == errc::no_device);
  CHECK_THAT(r.error().context, Catch::Contains("rxe0/ports/2"));
  // A port whose driver exports nothing is an empty reading, not an error.
  sys.put("mlx5_0/ports/1/gids/0", "fe80::\n");
  const auto empty = read_port_counters("mlx5_0", 1, sys.root);
  REQUIRE(empty);
  CHECK(empty.value().values.empty());
}
