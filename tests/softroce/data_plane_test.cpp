// The data plane on a real verbs device: two processes (rdmaring-bench pair) streaming verified
// records in both publish modes, and the refusals a user meets at the API: RingOwner::start
// refuses what its options forbid up front, and a ring the owner cannot register at a
// producer's attach (ODP on a device without it, RLIMIT_MEMLOCK) is a refused attach that says why.
#include <catch2/catch.hpp>
#include <infiniband/verbs.h>

#include <linux/capability.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <iterator>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../skip.hpp"
#include "device_address.hpp"
#include "test_pki.hpp"
#include "memlock_sandbox.hpp"
#include "rdmaring/producer.hpp"
#include "rdmaring/ring_owner.hpp"
#include "rdmaring/verbs/context.hpp"
#include "rdmaring/verbs/mr.hpp"

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
  // Both roles present the owner's test certificate: its name is the one the producer checks.
  const std::string tls = " --ca " + test_pki::path("ca.pem") + " --cert " + test_pki::path("owner.pem") + " --key " +
                          test_pki::path("owner.key") + " --server-name rdmaring-owner";
  const std::string cmd =
      std::string(RDMARING_BENCH_BINARY) + " pair -q --address " + device_address() + tls + " " + args + " 2>&1";
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
  // Coalescing: far fewer posts and completions than records. How many records a batch gathers
  // depends on how fast the consumer frees space, so the bounds leave room for a slow producer
  // (under ASan: about 5 records a post, 40 a signaled completion).
  CHECK(num(run.producer, "post_send_calls") < 1000000 / 3);
  CHECK(num(run.producer, "signaled") < 1000000 / 25);
  // The report's proof: what each side registered is what the kernel pinned for it, nothing
  // went wrong asynchronously, and the port exported its RNR/retry counters.
  for (const auto* side : {&run.consumer, &run.producer}) {
    CHECK(num(*side, "mr_bytes") >= 262144);
    CHECK(num(*side, "vm_pin") >= num(*side, "mr_bytes"));
    CHECK(num(*side, "async_events") == 0);
    CHECK(num(*side, "completion_errors") == 0);
  }
  CHECK(num(run.consumer, "hw_sent_pkts") > 0);
  CHECK(run.consumer.count("hw_rcvd_rnr_err") == 1);
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

TEST_CASE("payload check none: records go through unchecked by the queue, verified by the harness", "[softroce][data]") {
  for (const std::string mode : {"imm", "tail"}) {
    const Run run = bench_pair("--mode " + mode + " --payload-check none --records 100000 --ring 262144 --timeout 200");
    INFO(run.output);
    REQUIRE(run.status == 0);
    CHECK(num(run.consumer, "records") == 100000);
    CHECK(num(run.consumer, "bad") == 0);  // every byte compared by rdmaring-bench itself
  }
}

TEST_CASE("metrics: both sides' Prometheus text agrees with the run", "[softroce][data]") {
  char dir[] = "/tmp/rdmaring-metrics-XXXXXX";
  REQUIRE(mkdtemp(dir) != nullptr);
  const std::string prefix = std::string(dir) + "/run";
  const Run run = bench_pair("--mode imm --records 20000 --ring 262144 --metrics " + prefix + " --timeout 200");
  INFO(run.output);
  REQUIRE(run.status == 0);
  auto read = [](const std::string& path) {
    std::ifstream f(path);
    return std::string(std::istreambuf_iterator<char>(f), {});
  };
  const std::string owner = read(prefix + "-owner.prom"), producer = read(prefix + "-producer.prom");
  std::filesystem::remove_all(dir);
  INFO(owner << "\n" << producer);
  // Every sample's family was announced before it.
  for (const std::string* text : {&owner, &producer}) {
    std::istringstream lines(*text);
    std::set<std::string> typed;
    for (std::string line; std::getline(lines, line);) {
      if (line.rfind("# TYPE ", 0) == 0) typed.insert(line.substr(7, line.find(' ', 7) - 7));
      else if (line[0] != '#') CHECK(typed.count(line.substr(0, line.find_first_of("{ "))) == 1);
    }
  }
  const std::string device = run.consumer.at("device");
  CHECK_THAT(owner, Catch::Contains("rdmaring_owner_records_total 20000\n"));
  CHECK_THAT(owner, Catch::Contains("rdmaring_owner_registered_bytes{device=\"" + device + "\"} 262144\n"));
  CHECK_THAT(owner, Catch::Contains("rdmaring_session_ring_bytes{session="));
  CHECK_THAT(producer, Catch::Contains("rdmaring_producer_records_total 20000\n"));
  CHECK_THAT(producer, Catch::Contains("rdmaring_producer_registered_regions{device=\"" + device + "\"} 2\n"));
  CHECK_THAT(producer, Catch::Contains("rdmaring_producer_post_send_calls_total " + run.producer.at("post_send_calls") + "\n"));
}

TEST_CASE("a port that goes down and up: both sides take, acknowledge and count its async events", "[softroce][data]") {
  // Taking the device's netdev down is harmless only in the guest, where nothing else uses it.
  if (const char* g = std::getenv("RDMARING_GUEST"); g == nullptr || std::string(g) != "1")
    RDMARING_SKIP("not in the Soft-RoCE guest (RDMARING_GUEST=1): the port is not taken down");
  RingOwnerOptions oo;
  oo.address = device_address();
  oo.security = test_pki::owner();
  const auto owner = RingOwner::start(oo);
  ProducerOptions po;
  po.address = oo.address;
  po.security = test_pki::producer();
  po.control_port = owner->control_port();
  Producer producer = Producer::attach(po);
  const std::string device = owner->stats().device;
  std::ifstream ndev("/sys/class/infiniband/" + device + "/ports/1/gid_attrs/ndevs/0");
  std::string netdev;
  REQUIRE(ndev >> netdev);
  const std::string port_error = ibv_event_type_str(IBV_EVENT_PORT_ERR);
  const std::string port_active = ibv_event_type_str(IBV_EVENT_PORT_ACTIVE);

  REQUIRE(std::system(("ip link set dev " + netdev + " down").c_str()) == 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  REQUIRE(std::system(("ip link set dev " + netdev + " up").c_str()) == 0);

  // The owner takes them on its control thread; the producer every so many progress() calls.
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  auto seen = [&](const std::map<std::string, std::uint64_t>& events) {
    return events.count(port_error) == 1 && events.count(port_active) == 1;
  };
  while (!(seen(owner->stats().async_events) && seen(producer.stats().async_events)) && Clock::now() < deadline) {
    REQUIRE(producer.progress());
    REQUIRE(owner->poll([](const Delivery&) {}, 16));
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  INFO("owner: " << owner->metrics() << "\nproducer: " << producer.metrics());
  CHECK(seen(owner->stats().async_events));
  CHECK(seen(producer.stats().async_events));
  CHECK_THAT(owner->metrics(), Catch::Contains("rdmaring_owner_async_events_total{type=\"" + port_active + "\"} 1"));

  // A port event kills no QP: the same connection carries records on.
  std::uint64_t delivered = 0;
  const std::vector<std::byte> record(100, std::byte{1});
  for (int i = 0; i < 1000;) {
    if (producer.send(record)) ++i;
    REQUIRE(owner->poll([&](const Delivery&) { ++delivered; }, 64));
    REQUIRE(Clock::now() < deadline);
  }
  REQUIRE(producer.flush());
  while (delivered < 1000 && Clock::now() < deadline) {
    REQUIRE(producer.progress());
    REQUIRE(owner->poll([&](const Delivery&) { ++delivered; }, 64));
  }
  CHECK(delivered == 1000);
  CHECK(producer.stats().recoveries == 0);
  CHECK(owner->stats().error_completions == 0);
}

TEST_CASE("relaxed ordering with tail mode is refused, saying why", "[softroce][data]") {
  RingOwnerOptions o;
  o.address = device_address();
  o.security = test_pki::owner();
  o.mode = wire::PublishMode::tail;
  o.relaxed_ordering = true;
  try {
    (void)RingOwner::start(o);
    FAIL("RingOwner::start accepted relaxed ordering with tail mode");
  } catch (const SetupError& e) {
    CHECK(e.error() == errc::relaxed_ordering_refused);
    CHECK_THAT(e.what(), Catch::Contains("land before the payload"));
  }
}

TEST_CASE("over one connection: zero-copy claim, a record too large, a blocking send", "[softroce][data]") {
  RingOwnerOptions oo;
  oo.address = device_address();
  oo.security = test_pki::owner();
  oo.ring_bytes = 8192;
  oo.max_record = 4096;
  const auto owner = RingOwner::start(oo);
  ProducerOptions po;
  po.address = oo.address;
  po.security = test_pki::producer();
  po.control_port = owner->control_port();
  // The owner's control thread answers the attach and admits the QP: nobody polls yet.
  Producer producer = Producer::attach(po);
  CHECK(owner->session_count() == 1);

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
  // owner below releases the first, then goes through.
  REQUIRE(producer.send(full, std::chrono::seconds(5)));
  REQUIRE(producer.flush());

  std::vector<std::size_t> sizes;
  std::vector<std::uint64_t> sequences;
  std::set<SessionId> sessions;
  // Catch2 assertions are not thread-safe: the polling thread reports, the test asserts.
  auto consume = std::async(std::launch::async, [&]() -> std::string {
    const auto deadline = Clock::now() + std::chrono::seconds(20);
    // Nothing is released before the producer has asked for credit, however soon this thread
    // runs: its second 4 KiB send must block (would_block below). A record handed back with
    // abort is delivered again by the next poll.
    while (owner->stats().rings.credit_requests == 0) {
      if (Clock::now() > deadline) return "the blocked producer never asked for credit";
      auto n = owner->poll([](const Delivery&) { return HandlerAction::abort; }, 16);
      if (!n) return n.error().message();
    }
    while (sizes.size() < 3 && Clock::now() < deadline) {
      auto n = owner->poll(
          [&](const Delivery& d) {
            sizes.push_back(d.payload.size());
            sequences.push_back(d.sequence);
            sessions.insert(d.session);
          },
          16);
      if (!n) return n.error().message();
    }
    return {};
  });
  auto blocked = producer.send(full, std::chrono::seconds(20));
  REQUIRE(blocked);
  REQUIRE(producer.flush());
  CHECK(consume.get().empty());
  CHECK(sizes == std::vector<std::size_t>{10, 4096, 4096});
  CHECK(sequences == std::vector<std::uint64_t>{0, 1, 2});
  CHECK(sessions == std::set<SessionId>{producer.credentials().session});
  CHECK(producer.stats().core.would_block > 0);

  // detach() drains first, and the owner writes the credit that drain waits for from poll():
  // keep polling until the session is gone.
  std::uint64_t late = 0;
  auto polling = std::async(std::launch::async, [&]() -> std::string {
    const auto deadline = Clock::now() + std::chrono::seconds(20);
    while (owner->session_count() > 0 && Clock::now() < deadline) {
      auto n = owner->poll([&](const Delivery&) { ++late; }, 16);
      if (!n) return n.error().message();
    }
    return owner->session_count() == 0 ? std::string() : "the session outlived the detach";
  });
  const auto detached = producer.detach(std::chrono::seconds(10));
  INFO("detach: " << (detached ? std::string("ok") : detached.error().message()));
  CHECK(detached);
  CHECK(polling.get().empty());
  CHECK(late == 0);
  CHECK(owner->session_count() == 0);
  const RingOwnerStats s = owner->stats();
  INFO(owner->ledger_dump());
  CHECK(s.per_session.empty());  // the ring is freed with the session
  CHECK(s.sessions.attaches == 1);
  CHECK(s.sessions.detaches == 1);
  CHECK(s.rings.records == 3);  // the closed ring's counters are kept
  CHECK(s.error_completions == 0);
}

namespace {

// The owner could not register a session's ring: the attach is refused with the registration's
// own code (not no_capacity: the user must learn which limit to raise), the refusal's text names
// the reason, and no session is left behind.
template <class Matcher>
void expect_attach_refused(const RingOwner& owner, errc code, const Matcher& reason) {
  ProducerOptions po;
  po.address = device_address();
  po.security = test_pki::producer();
  po.control_port = owner.control_port();
  po.connect_timeout = std::chrono::seconds(5);
  try {
    (void)Producer::attach(po);
    FAIL("attach granted a ring the owner could not register");
  } catch (const SetupError& e) {
    INFO(e.what());
    CHECK(e.error() == code);
    CHECK_THAT(e.what(), reason);
  }
  CHECK(owner.session_count() == 0);
  CHECK(owner.stats().per_session.empty());
}

}  // namespace

TEST_CASE("a ring registered with on-demand paging is refused where the device has no ODP for RC WRITE, else it carries records", "[softroce][data]") {
  RingOwnerOptions oo;
  oo.address = device_address();
  oo.security = test_pki::owner();
  oo.on_demand_paging = true;
  // Rings are registered per session, at attach: the owner starts.
  const auto owner = RingOwner::start(oo);
  // The device's answer as the library reads it (context.cpp), the one mr.cpp refuses by.
  const bool odp_rc_write = verbs::Context::open(owner->stats().device).query_caps().odp_rc_write;
  INFO(owner->stats().device << " ODP for RC WRITE: " << (odp_rc_write ? "yes" : "no"));
  if (!odp_rc_write) {
    // mr.cpp's odp_unsupported message, carried in the refusal's text.
    expect_attach_refused(*owner, errc::odp_unsupported, Catch::Contains("on-demand paging requested") &&
                                      Catch::Contains("does not support ODP for RC RDMA WRITE"));
  } else {
    ProducerOptions po;
    po.address = oo.address;
    po.security = test_pki::producer();
    po.control_port = owner->control_port();
    Producer producer = Producer::attach(po);
    CHECK(owner->session_count() == 1);
    // The first write into the ring faults its pages in: the record must still land.
    const std::vector<std::byte> record(100, std::byte{1});
    REQUIRE(producer.send(record, std::chrono::seconds(5)));
    REQUIRE(producer.flush());
    std::uint64_t delivered = 0;
    const auto deadline = Clock::now() + std::chrono::seconds(20);
    while (delivered == 0 && Clock::now() < deadline) {
      REQUIRE(producer.progress());
      REQUIRE(owner->poll([&](const Delivery&) { ++delivered; }, 16));
    }
    CHECK(delivered == 1);
    CHECK(owner->stats().error_completions == 0);
  }
}

TEST_CASE("a ring beyond RLIMIT_MEMLOCK is refused at attach, saying why", "[softroce][data]") {
  constexpr std::uint64_t kRing = 16 << 20;
  // Room for 1 MiB more than is pinned now: far less than the ring. Before the owner starts, so
  // that its control thread is held to it too.
  const MemlockSandbox sandbox(verbs::read_memlock_state().pinned + (1 << 20));
  REQUIRE_FALSE(verbs::read_memlock_state().cap_ipc_lock);
  RingOwnerOptions oo;
  oo.address = device_address();
  oo.security = test_pki::owner();
  oo.ring_bytes = kRing;
  const auto owner = RingOwner::start(oo);
  expect_attach_refused(*owner, errc::memlock_too_low, Catch::Contains("RLIMIT_MEMLOCK is") && Catch::Contains("raise it"));
}
