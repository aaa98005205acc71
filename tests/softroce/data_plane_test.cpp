// The data plane on a real verbs device: two processes (rdmaring-bench pair) streaming verified
// records in both publish modes, and the refusals a user meets at the API.
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstdlib>
#include <future>
#include <map>
#include <sstream>
#include <string>

#include "rdmaring/consumer.hpp"
#include "device_address.hpp"
#include "rdmaring/producer.hpp"

using namespace rdmaring;

namespace {


struct Run {
  int status = -1;
  std::string output;
  std::map<std::string, std::string> consumer, producer;
};

std::map<std::string, std::string> fields(const std::string& line) {
  std::map<std::string, std::string> out;
  std::istringstream in(line);
  std::string kv;
  while (in >> kv)
    if (auto eq = kv.find('='); eq != std::string::npos) out[kv.substr(0, eq)] = kv.substr(eq + 1);
  return out;
}

Run bench_pair(const std::string& args) {
  const std::string cmd = std::string(RDMARING_BENCH_BINARY) + " pair --address " + device_address() + " " + args + " 2>&1";
  Run run;
  FILE* p = popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  char buf[4096];
  while (fgets(buf, sizeof buf, p) != nullptr) {
    const std::string line = buf;
    run.output += line;
    if (line.rfind("consumer ", 0) == 0) run.consumer = fields(line);
    if (line.rfind("producer ", 0) == 0) run.producer = fields(line);
  }
  run.status = pclose(p);
  INFO(cmd << "\n" << run.output);
  return run;
}

std::uint64_t num(const std::map<std::string, std::string>& m, const std::string& k) {
  auto it = m.find(k);
  REQUIRE(it != m.end());
  return std::stoull(it->second);
}

void check_stream(const std::string& mode) {
  // Mixed sizes 0 B .. 64 KiB into a 256 KiB ring: ~740 MB on the wire, ~2,800 laps.
  const Run run = bench_pair("--mode " + mode + " --records 1000000 --ring 262144 --max-record 65536 --timeout 500");
  INFO(run.output);
  REQUIRE(run.status == 0);
  CHECK(num(run.consumer, "records") == 1000000);
  CHECK(num(run.consumer, "bad") == 0);
  CHECK(num(run.producer, "records") == 1000000);
  CHECK(num(run.consumer, "bytes") == num(run.producer, "bytes"));
  CHECK(num(run.consumer, "padding") > 1000);  // the ring wrapped thousands of times
  // Coalescing: far fewer posts and completions than records.
  CHECK(num(run.producer, "post_send_calls") < 1000000 / 5);
  CHECK(num(run.producer, "signaled") < 1000000 / 50);
}

}  // namespace

TEST_CASE("imm mode: a million mixed records, verified, in order, through a wrapping ring", "[softroce][data]") {
  check_stream("imm");
}

TEST_CASE("tail mode: a million mixed records, verified, in order, through a wrapping ring", "[softroce][data]") {
  check_stream("tail");
}

TEST_CASE("a slow consumer makes the producer wait for credit, and it resumes", "[softroce][data]") {
  for (const std::string mode : {"imm", "tail"}) {
    const Run run =
        bench_pair("--mode " + mode + " --records 20000 --ring 65536 --max-record 16384 --slow-every 500 --slow-us 20000 --timeout 200");
    INFO(run.output);
    REQUIRE(run.status == 0);
    CHECK(num(run.consumer, "bad") == 0);
    CHECK(num(run.consumer, "records") == 20000);
    CHECK(num(run.producer, "would_block") > 0);
    CHECK(num(run.producer, "credit_requests") > 0);
    CHECK(num(run.consumer, "credit_requests") > 0);
  }
}

TEST_CASE("relaxed ordering on the payload MR works in imm mode", "[softroce][data]") {
  const Run run = bench_pair("--mode imm --relaxed --records 50000 --ring 65536 --max-record 16384 --timeout 200");
  INFO(run.output);
  REQUIRE(run.status == 0);
  CHECK(num(run.consumer, "bad") == 0);
}

TEST_CASE("relaxed ordering with tail mode is refused, saying why", "[softroce][data]") {
  ConsumerOptions o;
  o.address = device_address();
  o.mode = wire::PublishMode::tail;
  o.relaxed_ordering = true;
  try {
    (void)Consumer::listen(o);
    FAIL("listen accepted relaxed ordering with tail mode");
  } catch (const SetupError& e) {
    CHECK(e.error() == errc::relaxed_ordering_refused);
    CHECK_THAT(e.what(), Catch::Contains("land before the payload"));
  }
}

TEST_CASE("over one connection: zero-copy claim, a record too large, a blocking send", "[softroce][data]") {
  ConsumerOptions co;
  co.address = device_address();
  co.ring_bytes = 8192;
  co.max_record = 4096;
  Consumer consumer = Consumer::listen(co);
  auto accepted = std::async(std::launch::async, [&] { consumer.accept(); });
  ProducerOptions po;
  po.address = co.address;
  po.port = consumer.port();
  Producer producer = Producer::connect(po);
  accepted.get();

  std::vector<std::byte> big(4097);
  auto r = producer.send(big);
  REQUIRE_FALSE(r);
  CHECK(r.error() == errc::record_too_large);
  CHECK_THAT(r.error().message(), Catch::Contains("4097 B") && Catch::Contains("max_record 4096 B"));

  auto span = producer.claim(100);
  REQUIRE(span);
  std::fill(span.value().begin(), span.value().end(), std::byte{0x42});
  REQUIRE(producer.commit(10));
  std::vector<std::byte> full(4096, std::byte{7});
  // Two 4 KiB records do not fit in 8 KiB with their headers: the second blocks until the
  // consumer below releases the first, then goes through.
  REQUIRE(producer.send(full, std::chrono::seconds(5)));
  REQUIRE(producer.flush());

  std::vector<std::size_t> sizes;
  // Catch2 assertions are not thread-safe: the consumer thread reports, the test asserts.
  auto consume = std::async(std::launch::async, [&]() -> std::string {
    const auto deadline = Clock::now() + std::chrono::seconds(20);
    while (sizes.size() < 3 && Clock::now() < deadline) {
      auto n = consumer.poll([&](const DeliveredRecord& d) { sizes.push_back(d.payload.size()); }, 16);
      if (!n) return n.error().message();
    }
    return {};
  });
  auto blocked = producer.send(full, std::chrono::seconds(20));
  REQUIRE(blocked);
  REQUIRE(producer.flush());
  CHECK(consume.get().empty());
  CHECK(sizes == std::vector<std::size_t>{10, 4096, 4096});
  CHECK(producer.stats().core.would_block > 0);
}

TEST_CASE("a ring registered with on-demand paging is refused where the device has none", "[softroce][data]") {
  ConsumerOptions co;
  co.address = device_address();
  co.on_demand_paging = true;
  co.accept_timeout = std::chrono::seconds(10);
  Consumer consumer = Consumer::listen(co);
  auto accepted = std::async(std::launch::async, [&]() -> std::string {
    try {
      consumer.accept();
      return "accepted";
    } catch (const SetupError& e) {
      return std::string(e.error() == errc::odp_unsupported ? "odp_unsupported: " : "other: ") + e.what();
    }
  });
  ProducerOptions po;
  po.address = co.address;
  po.port = consumer.port();
  po.connect_timeout = std::chrono::seconds(5);
  CHECK_THROWS_AS(Producer::connect(po), SetupError);  // the consumer never accepts
  const std::string what = accepted.get();
  CHECK_THAT(what, Catch::StartsWith("odp_unsupported: "));
}
