// zmq-baseline: the ZeroMQ PUSH/PULL over TCP baseline of bench/side-by-side.
//
//   zmq-baseline [--size BYTES] [--records N] [--seed S] [--hwm N] [--timeout SECONDS] [--json FILE] [--no-fill]
//
// Two processes on one host: the child PULLs (bound to tcp://127.0.0.1, ephemeral port), the
// parent PUSHes --records fixed-size records. The records are rdmaring-bench's (bench_records.hpp):
// the pusher fills every byte, the puller checks the length and every byte, so both benchmarks
// do the same work per record. The pusher times from its first send until the puller reports
// the last record received and checked; records/s and MB/s (10^6 B/s) come from that span.
// --no-fill (as rdmaring-bench's): the bytes are left as they are, the puller checks the length.
// Prints one line of key=value (`zmq records=... records_per_s=... mb_per_s=...`); exit 0 when
// every record arrived intact.
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "bench_records.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using Seconds = std::chrono::duration<double>;

struct Options {
  std::uint32_t size = 64;
  std::uint64_t records = 100000;
  std::uint64_t seed = 1;
  int hwm = 1000;
  double timeout_s = 120;
  std::string json;
  bool no_fill = false;  // records are neither filled nor checked byte for byte
};

[[noreturn]] void usage(const std::string& why) {
  std::cerr << "zmq-baseline: " << why << "\n"
            << "usage: zmq-baseline [--size BYTES] [--records N] [--seed S] [--hwm N] [--timeout SECONDS] [--json FILE] [--no-fill]\n";
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) usage(k + " needs a value");
      return argv[++i];
    };
    if (k == "--size") o.size = static_cast<std::uint32_t>(std::stoul(next()));
    else if (k == "--records") o.records = std::stoull(next());
    else if (k == "--seed") o.seed = std::stoull(next());
    else if (k == "--hwm") o.hwm = std::stoi(next());
    else if (k == "--timeout") o.timeout_s = std::stod(next());
    else if (k == "--json") o.json = next();
    else if (k == "--no-fill") o.no_fill = true;
    else usage("unknown option " + k);
  }
  if (o.records == 0) usage("--records must be positive");
  return o;
}

[[noreturn]] void fail(const char* what) {
  std::cerr << "zmq-baseline: " << what << ": " << zmq_strerror(zmq_errno()) << "\n";
  std::exit(1);
}

void write_all(int fd, const std::string& s) {
  for (std::size_t at = 0; at < s.size();) {
    const ssize_t n = write(fd, s.data() + at, s.size() - at);
    if (n <= 0) std::exit(1);
    at += static_cast<std::size_t>(n);
  }
}

// The child: bind, tell the parent where, receive and check every record, report on `report_fd`.
int pull(const Options& o, int report_fd) {
  void* ctx = zmq_ctx_new();
  void* sock = zmq_socket(ctx, ZMQ_PULL);
  const int timeout_ms = static_cast<int>(o.timeout_s * 1000);
  zmq_setsockopt(sock, ZMQ_RCVHWM, &o.hwm, sizeof o.hwm);
  zmq_setsockopt(sock, ZMQ_RCVTIMEO, &timeout_ms, sizeof timeout_ms);
  if (zmq_bind(sock, "tcp://127.0.0.1:*") != 0) fail("bind");
  char endpoint[256] = {};
  std::size_t len = sizeof endpoint;
  if (zmq_getsockopt(sock, ZMQ_LAST_ENDPOINT, endpoint, &len) != 0) fail("ZMQ_LAST_ENDPOINT");
  write_all(report_fd, std::string(endpoint) + "\n");

  std::vector<std::byte> got(o.size + 1), want(o.size);
  std::uint64_t bad = 0, bytes = 0, k = 0;
  Clock::time_point first{};
  for (; k < o.records; ++k) {
    const int n = zmq_recv(sock, got.data(), got.size(), 0);
    if (n < 0) {
      std::cerr << "zmq-baseline pull: record " << k << ": " << zmq_strerror(zmq_errno()) << "\n";
      break;
    }
    if (k == 0) first = Clock::now();
    if (!o.no_fill) rdmaring::bench::fill(o.seed, k, want);
    if (static_cast<std::uint32_t>(n) != o.size || (!o.no_fill && std::memcmp(got.data(), want.data(), o.size) != 0))
      if (bad++ < 5) std::cerr << "zmq-baseline pull: record " << k << " wrong (" << n << " B)\n";
    bytes += static_cast<std::uint64_t>(n);
  }
  const double secs = Seconds(Clock::now() - first).count();
  std::ostringstream line;
  line << "received=" << k << " bad=" << bad << " received_bytes=" << bytes << " pull_seconds=" << secs << "\n";
  write_all(report_fd, line.str());
  zmq_close(sock);
  zmq_ctx_term(ctx);
  return k == o.records && bad == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  int to_parent[2];
  if (pipe(to_parent) != 0) return 1;
  // Fork before any ZeroMQ context exists: a context does not survive fork().
  const pid_t child = fork();
  if (child < 0) return 1;
  if (child == 0) {
    close(to_parent[0]);
    _exit(pull(o, to_parent[1]));
  }
  close(to_parent[1]);
  FILE* from_child = fdopen(to_parent[0], "r");
  char endpoint[256] = {};
  if (std::fgets(endpoint, sizeof endpoint, from_child) == nullptr) {
    std::cerr << "zmq-baseline: the puller did not start\n";
    return 1;
  }
  endpoint[std::strcspn(endpoint, "\n")] = '\0';

  void* ctx = zmq_ctx_new();
  void* sock = zmq_socket(ctx, ZMQ_PUSH);
  const int timeout_ms = static_cast<int>(o.timeout_s * 1000);
  zmq_setsockopt(sock, ZMQ_SNDHWM, &o.hwm, sizeof o.hwm);
  zmq_setsockopt(sock, ZMQ_SNDTIMEO, &timeout_ms, sizeof timeout_ms);
  if (zmq_connect(sock, endpoint) != 0) fail("connect");
  std::vector<std::byte> buf(o.size);
  const auto t0 = Clock::now();
  for (std::uint64_t k = 0; k < o.records; ++k) {
    if (!o.no_fill) rdmaring::bench::fill(o.seed, k, buf);
    if (zmq_send(sock, buf.data(), buf.size(), 0) != static_cast<int>(o.size)) fail("send");
  }
  char report[256] = {};
  const bool reported = std::fgets(report, sizeof report, from_child) != nullptr;
  const double secs = Seconds(Clock::now() - t0).count();
  int status = 0;
  waitpid(child, &status, 0);
  const bool ok = reported && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  report[std::strcspn(report, "\n")] = '\0';

  std::ostringstream line;
  line << "zmq records=" << o.records << " size=" << o.size << " bytes=" << o.records * o.size << " seconds=" << secs
       << " records_per_s=" << static_cast<double>(o.records) / secs
       << " mb_per_s=" << static_cast<double>(o.records * o.size) / secs / 1e6 << " hwm=" << o.hwm << " fill=" << (o.no_fill ? 0 : 1) << " " << report
       << " ok=" << (ok ? 1 : 0);
  std::cout << line.str() << std::endl;
  if (!o.json.empty()) {
    std::ofstream f(o.json);
    f << "{\"tool\": \"zmq-baseline\", \"transport\": \"tcp://127.0.0.1\", \"pattern\": \"PUSH/PULL\"";
    std::istringstream in(line.str());
    std::string kv;
    in >> kv;  // "zmq"
    while (in >> kv) {
      const auto eq = kv.find('=');
      if (eq == std::string::npos) continue;
      f << ", \"" << kv.substr(0, eq) << "\": " << kv.substr(eq + 1);
    }
    f << "}\n";
  }
  zmq_close(sock);
  zmq_ctx_term(ctx);
  return ok ? 0 : 1;
}
