// rdmaring-bench: a producer and a consumer exchanging records over a real verbs device, each
// record verified (sequence, length, every byte), with the per-record costs the library pays.
//
//   rdmaring-bench pair     [options]  both roles, as two processes; prints the report
//   rdmaring-bench consumer [options]  listen, receive --records, print its line
//   rdmaring-bench producer [options]  connect, send --records, print its line
//
// Record k's length and bytes are a function of (seed, k), so the consumer checks every byte
// without a side channel.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "rdmaring/consumer.hpp"
#include "rdmaring/producer.hpp"

namespace {

using namespace rdmaring;
using Seconds = std::chrono::duration<double>;

struct Options {
  std::string role;
  std::string address = std::getenv("RDMARING_ADDR") ? std::getenv("RDMARING_ADDR") : "";
  std::uint16_t port = 0;
  std::string mode = "imm";
  std::uint64_t ring = 1 << 20;
  std::uint32_t max_record = 64 * 1024;
  std::uint64_t records = 100000;
  std::string sizes = "mixed";  // mixed | fixed:N
  std::uint64_t seed = 1;
  std::uint64_t slow_every = 0;  // consumer sleeps slow_us every slow_every records
  std::uint64_t slow_us = 0;
  bool relaxed = false;
  int ready_fd = -1;
  double timeout_s = 600;
};

[[noreturn]] void usage(const std::string& why) {
  std::cerr << "rdmaring-bench: " << why << "\n"
            << "usage: rdmaring-bench pair|consumer|producer [--address A] [--port P] [--mode imm|tail]\n"
               "  [--ring BYTES] [--max-record BYTES] [--records N] [--sizes mixed|fixed:N] [--seed S]\n"
               "  [--slow-every N --slow-us U] [--relaxed] [--timeout SECONDS]\n";
  std::exit(2);
}

Options parse(int argc, char** argv) {
  if (argc < 2) usage("no role");
  Options o;
  o.role = argv[1];
  for (int i = 2; i < argc; ++i) {
    const std::string k = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) usage(k + " needs a value");
      return argv[++i];
    };
    if (k == "--address") o.address = next();
    else if (k == "--port") o.port = static_cast<std::uint16_t>(std::stoul(next()));
    else if (k == "--mode") o.mode = next();
    else if (k == "--ring") o.ring = std::stoull(next());
    else if (k == "--max-record") o.max_record = static_cast<std::uint32_t>(std::stoul(next()));
    else if (k == "--records") o.records = std::stoull(next());
    else if (k == "--sizes") o.sizes = next();
    else if (k == "--seed") o.seed = std::stoull(next());
    else if (k == "--slow-every") o.slow_every = std::stoull(next());
    else if (k == "--slow-us") o.slow_us = std::stoull(next());
    else if (k == "--relaxed") o.relaxed = true;
    else if (k == "--ready-fd") o.ready_fd = std::stoi(next());
    else if (k == "--timeout") o.timeout_s = std::stod(next());
    else usage("unknown option " + k);
  }
  if (o.address.empty()) usage("no --address and no RDMARING_ADDR");
  if (o.mode != "imm" && o.mode != "tail") usage("--mode must be imm or tail");
  return o;
}

std::uint64_t mix(std::uint64_t x) {  // splitmix64
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Mixed sizes: 90 % of 0..256 B, 9 % of 257 B..4 KiB, 1 % of 4 KiB..max_record.
std::uint32_t size_of(const Options& o, std::uint64_t seq) {
  if (o.sizes.rfind("fixed:", 0) == 0) return static_cast<std::uint32_t>(std::stoul(o.sizes.substr(6)));
  const std::uint64_t h = mix(o.seed * 0x100000001b3ull ^ seq);
  const std::uint64_t pick = h % 1000, r = h >> 20;
  std::uint64_t n = pick < 900 ? r % 257 : pick < 990 ? 257 + r % (4096 - 256) : 4097 + r % (o.max_record - 4096 + 1);
  return static_cast<std::uint32_t>(std::min<std::uint64_t>(n, o.max_record));
}

void fill(const Options& o, std::uint64_t seq, std::span<std::byte> out) {
  std::uint64_t s = mix(o.seed ^ (seq << 1));
  for (std::size_t i = 0; i < out.size(); i += 8) {
    s = mix(s);
    std::memcpy(out.data() + i, &s, std::min<std::size_t>(8, out.size() - i));
  }
}

wire::PublishMode mode_of(const Options& o) { return o.mode == "tail" ? wire::PublishMode::tail : wire::PublishMode::imm; }

template <class T>
T must(Result<T> r, const char* what) {
  if (!r) {
    std::cerr << "rdmaring-bench: " << what << ": " << r.error().message() << "\n";
    std::exit(1);
  }
  if constexpr (!std::is_void_v<T>) return std::move(r).value();
}

int run_consumer(const Options& o) {
  ConsumerOptions co;
  co.address = o.address;
  co.port = o.port;
  co.ring_bytes = o.ring;
  co.max_record = o.max_record;
  co.mode = mode_of(o);
  co.relaxed_ordering = o.relaxed;
  Consumer consumer = Consumer::listen(co);
  if (o.ready_fd >= 0) {
    const std::string port = std::to_string(consumer.port()) + "\n";
    if (write(o.ready_fd, port.data(), port.size()) < 0) return 1;
    close(o.ready_fd);
  }
  consumer.accept();
  std::uint64_t expect = 0, bad = 0, bytes = 0;
  std::vector<std::byte> want(o.max_record + 8);
  const auto deadline = Clock::now() + Seconds(o.timeout_s);
  Clock::time_point first{}, last{};
  while (expect < o.records) {
    const auto n = must(consumer.poll(
                            [&](const DeliveredRecord& r) {
                              const std::uint32_t len = size_of(o, expect);
                              fill(o, expect, std::span(want).first(len));
                              if (r.sequence != expect || r.payload.size() != len ||
                                  std::memcmp(r.payload.data(), want.data(), len) != 0) {
                                if (bad++ < 5)
                                  std::cerr << "consumer: record " << expect << " wrong (sequence " << r.sequence
                                            << ", " << r.payload.size() << " B, want " << len << " B)\n";
                              }
                              bytes += r.payload.size();
                              ++expect;
                            },
                            256),
                        "poll");
    if (n > 0) {
      if (first == Clock::time_point{}) first = Clock::now();
      last = Clock::now();
      if (o.slow_every && expect % o.slow_every < n) std::this_thread::sleep_for(std::chrono::microseconds(o.slow_us));
    }
    if (Clock::now() > deadline) {
      std::cerr << "consumer: timed out at record " << expect << "; " << consumer.ledger_dump() << "\n";
      return 1;
    }
  }
  // Keep answering credit requests until the producer has drained and left.
  while (consumer.connected() && Clock::now() < deadline) must(consumer.poll([](const DeliveredRecord&) {}, 64), "poll");
  const auto s = consumer.stats();
  std::cout << "consumer records=" << expect << " bad=" << bad << " bytes=" << bytes
            << " seconds=" << Seconds(last - first).count() << " publishes=" << s.core.publishes
            << " credit_writes=" << s.core.credit_writes << " credit_requests=" << s.core.credit_requests
            << " recv_completions=" << s.recv_completions << " recv_posts=" << s.recv_posts
            << " padding=" << s.core.padding_records << " not_ready=" << s.core.not_ready
            << " torn_tail=" << s.core.torn_tail_reads << std::endl;
  return bad == 0 ? 0 : 1;
}

int run_producer(const Options& o) {
  ProducerOptions po;
  po.address = o.address;
  po.port = o.port;
  Producer producer = Producer::connect(po);
  const auto t0 = Clock::now();
  std::uint64_t bytes = 0;
  for (std::uint64_t seq = 0; seq < o.records; ++seq) {
    const std::uint32_t len = size_of(o, seq);
    // Zero-copy: the record is built in the registered staging buffer.
    std::span<std::byte> dst;
    for (;;) {
      auto c = producer.claim(len);
      if (c) {
        dst = c.value();
        break;
      }
      if (c.error() != errc::would_block) must(std::move(c), "claim");
      if (Clock::now() - t0 > Seconds(o.timeout_s)) {
        std::cerr << "producer: no credit; " << producer.ledger_dump() << "\n";
        return 1;
      }
    }
    fill(o, seq, dst);
    must(producer.commit(), "commit");
    bytes += len;
  }
  must(producer.close(std::chrono::duration_cast<std::chrono::nanoseconds>(Seconds(o.timeout_s))), "close");
  const auto secs = Seconds(Clock::now() - t0).count();
  const auto s = producer.stats();
  const double n = static_cast<double>(o.records);
  auto per = [n](std::uint64_t v) { return static_cast<double>(v) / n; };
  std::cout << "producer records=" << s.core.records << " bytes=" << bytes << " seconds=" << secs
            << " records_per_s=" << n / secs << " mb_per_s=" << static_cast<double>(bytes) / secs / 1e6
            << " post_send_calls=" << s.post_send_calls << " wrs=" << s.core.wrs << " signaled=" << s.core.signaled
            << " batches=" << s.core.batches << " wire_bytes=" << s.core.wire_bytes
            << " would_block=" << s.core.would_block << " credit_requests=" << s.core.credit_requests
            << " credit_updates=" << s.core.credit_updates << " post_send_per_record=" << per(s.post_send_calls)
            << " signaled_per_record=" << per(s.core.signaled) << " wrs_per_record=" << per(s.core.wrs) << std::endl;
  return 0;
}

// Starts this program again with `args`, its stdout into a pipe returned in `out_fd`.
pid_t spawn(const std::vector<std::string>& args, int keep_fd, int& out_fd) {
  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) return -1;
  const pid_t pid = fork();
  if (pid != 0) {
    close(out[1]);
    out_fd = out[0];
    return pid;
  }
  dup2(out[1], STDOUT_FILENO);
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  if (keep_fd >= 0) fcntl(keep_fd, F_SETFD, 0);
  execv("/proc/self/exe", argv.data());
  _exit(127);
}

std::string read_all(int fd) {
  std::string s;
  char buf[4096];
  for (ssize_t n; (n = read(fd, buf, sizeof buf)) > 0;) s.append(buf, static_cast<std::size_t>(n));
  close(fd);
  return s;
}

std::map<std::string, std::string> fields(const std::string& line) {
  std::map<std::string, std::string> out;
  std::istringstream in(line);
  for (std::string kv; in >> kv;)
    if (auto eq = kv.find('='); eq != std::string::npos) out[kv.substr(0, eq)] = kv.substr(eq + 1);
  return out;
}

void report(const Options& o, const std::string& c_out, const std::string& p_out, bool ok) {
  auto c = fields(c_out), p = fields(p_out);
  auto f = [](std::map<std::string, std::string>& m, const char* k) { return m.count(k) ? m[k] : std::string("?"); };
  const char* device = std::getenv("RDMARING_DEVICE");
  std::cout << "rdmaring report\n"
            << "  device       " << (device ? device : "(chosen by rdma_cm)") << " at " << o.address << "\n"
            << "  route        producer staging MR -> RNIC DMA read -> RC QP -> wire -> RNIC DMA write -> consumer ring MR ("
            << o.ring << " B)\n"
            << "  publish      " << (o.mode == "imm" ? "imm: RDMA_WRITE_WITH_IMM; its receive completion hands the bytes to the consumer"
                                                     : "tail: RDMA_WRITE of the tail record after the payload, on one RC QP")
            << "\n"
            << "  space back   credit record RDMA_WRITE into the producer's credit MR: " << f(c, "credit_writes")
            << " write-backs, " << f(c, "credit_requests") << " asked for; producer found the ring full "
            << f(p, "would_block") << " times\n"
            << "  records      " << f(p, "records") << " sent, " << f(c, "records") << " delivered in order, " << f(c, "bad")
            << " wrong; " << f(c, "bytes") << " payload bytes\n"
            << "  throughput   " << f(p, "records_per_s") << " records/s, " << f(p, "mb_per_s") << " MB/s\n"
            << "  per record   " << f(p, "post_send_per_record") << " ibv_post_send, " << f(p, "wrs_per_record") << " WRs, "
            << f(p, "signaled_per_record") << " signaled completions\n"
            << "  result       " << (ok ? "ok" : "FAILED") << std::endl;
}

int run_pair(const Options& o, int argc, char** argv) {
  std::vector<std::string> common;
  for (int i = 2; i < argc; ++i) common.push_back(argv[i]);
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return 1;
  std::vector<std::string> cargs{"rdmaring-bench", "consumer", "--ready-fd", std::to_string(fds[1])};
  cargs.insert(cargs.end(), common.begin(), common.end());
  int c_fd = -1, p_fd = -1;
  const pid_t consumer = spawn(cargs, fds[1], c_fd);
  close(fds[1]);
  char buf[32] = {};
  const auto got = read(fds[0], buf, sizeof buf - 1);
  close(fds[0]);
  if (got <= 0) {
    std::cerr << "pair: the consumer did not start\n";
    kill(consumer, SIGKILL);
    waitpid(consumer, nullptr, 0);
    return 1;
  }
  std::vector<std::string> pargs{"rdmaring-bench", "producer", "--port", std::string(buf, std::strcspn(buf, "\n"))};
  pargs.insert(pargs.end(), common.begin(), common.end());
  const pid_t producer = spawn(pargs, -1, p_fd);
  const std::string p_out = read_all(p_fd);
  int ps = 0, cs = 0;
  waitpid(producer, &ps, 0);
  if (!(WIFEXITED(ps) && WEXITSTATUS(ps) == 0)) kill(consumer, SIGKILL);
  const std::string c_out = read_all(c_fd);
  waitpid(consumer, &cs, 0);
  const bool ok = WIFEXITED(ps) && WEXITSTATUS(ps) == 0 && WIFEXITED(cs) && WEXITSTATUS(cs) == 0;
  std::cout << c_out << p_out;
  report(o, c_out, p_out, ok);
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  try {
    if (o.role == "pair") return run_pair(o, argc, argv);
    if (o.role == "consumer") return run_consumer(o);
    if (o.role == "producer") return run_producer(o);
  } catch (const SetupError& e) {
    std::cerr << "rdmaring-bench " << o.role << ": " << e.what() << "\n";
    return 1;
  }
  usage("unknown role " + o.role);
}
