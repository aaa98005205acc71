// rdmaring-bench (also `rdmaring bench`): a producer and a consumer exchanging records over a
// real verbs device, each record verified (sequence, length, every byte), with the per-record
// costs the library pays. Options: ROLE --help.
//
//   rdmaring-bench pair     [options]  both roles, as two processes; prints the report
//   rdmaring-bench consumer [options]  listen, receive --records, print its line
//   rdmaring-bench producer [options]  connect, send --records, print its line
//   rdmaring-bench phases   [--device NAME] [--sizes-mb 1,16,64]
//                           allocation, registration (ibv_reg_mr per MB) and re-registration (what
//                           a resume pays to revoke an rkey), measured apart, on one device
//   rdmaring-bench attach   --address A [--counts 1,16,64] [--ring BYTES] [--mode imm|tail]
//                           [--compare-plaintext]
//                           one owner, N producers of this process attached one after another,
//                           then resumed and rejoined: attach, resume and rejoin time and what
//                           each session registers and pins, per N; --compare-plaintext: over
//                           mutual TLS and over plain TCP, side by side
//   rdmaring-bench cores    [options]  no device: the library's CPU cost per record, its cores
//                           joined through memory, beside an spsc_queue and a memcpy (cores.cpp)
//   rdmaring-bench verbs-pingpong --server ADDR | --client ADDR --port P [--gap-ms G] ...
//                           raw verbs, no rdmaring: an event-driven SEND ping-pong, optionally
//                           after a lull, the reference for a wake-up (verbs_pingpong.cpp)
//
// Every role that starts an owner or a producer takes the control channel's options
// (tools/security_options.hpp): --ca, --cert, --key (or RDMARING_CA, RDMARING_CERT,
// RDMARING_KEY) and --server-name for mutual TLS, both sides of a pair or an attach run
// presenting the one certificate; or --insecure-plaintext. Neither: exit status 2.
//
// Record k's length and bytes are a function of (seed, k), so the consumer checks every byte
// without a side channel.
//
// Two measurements:
//   throughput (default)  the producer streams --records as fast as credit allows; records/s and
//                         MB/s (10^6 B/s) from connect to the last record released.
//   --latency             one record at a time: commit, flush, then Producer::drain until the
//                         consumer's credit write-back releases it (drain asks for credit). The
//                         round trip record -> credit is timed with steady_clock; p50/p99/p999
//                         of RTT/2 in microseconds, comparable to ib_write_lat's t_typical
//                         (also RTT/2). Filling the record is outside the timed span; the first
//                         --warmup round trips are not counted.
// --json FILE writes the run's results (both roles' fields for `pair`) as one JSON object.
// --metrics PREFIX writes each role's counters in the Prometheus text format to
// PREFIX-owner.prom (once every record is delivered, before the producer detaches) and
// PREFIX-producer.prom (after its detach). The consumer prints a progress line a second on
// stderr (records, rate); -q silences it.
// --payload-check none: the ring's records carry no payload CRC (RingOwnerOptions::core.payload_check):
// neither side makes its pass over the payload bytes.
// --no-fill: the producer leaves the records' bytes as staging holds them and the consumer checks
// only sequence and length (the library's own CRCs still check every byte): the per-byte work
// of this harness, not of the queue, is left out.
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_command.hpp"
#include "tools/security_options.hpp"
#include "tools/wire_names.hpp"
#include "bench_records.hpp"
#include "cores.hpp"
#include "verbs_pingpong.hpp"
#include "rdmaring/idle_strategy.hpp"
#include "rdmaring/producer.hpp"
#include "rdmaring/ring_owner.hpp"
#include "rdmaring/verbs/context.hpp"
#include "rdmaring/verbs/mr.hpp"
#include "rdmaring/verbs/pd.hpp"
#include "rdmaring/verbs/port_counters.hpp"

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
  std::optional<std::uint32_t> fixed_size;  // N of fixed:N, parsed once: size_of runs per record
  std::uint64_t seed = 1;
  std::uint64_t slow_every = 0;  // consumer sleeps slow_us every slow_every records
  std::uint64_t slow_us = 0;
  bool relaxed = false;
  wire::PayloadCheck payload_check = wire::PayloadCheck::crc32c;
  int ready_fd = -1;
  double timeout_s = 600;
  bool latency = false;
  std::uint64_t warmup = 16;  // latency: round trips not counted
  std::string json;           // write the results here as JSON
  bool no_fill = false;       // records are neither filled nor checked byte for byte
  std::string metrics;        // Prometheus text: PREFIX-owner.prom / PREFIX-producer.prom
  bool quiet = false;         // no progress lines
  std::string device;         // phases: the device to open (default: RDMARING_DEVICE, else the first)
  std::vector<std::uint64_t> sizes_mb{1, 16, 64};  // phases: buffer sizes, MB
  std::vector<std::uint32_t> counts{1, 16, 64};    // attach: session counts
  // spin: both sides poll without pause (the throughput and latency figures); sleep: the owner
  // polls with an IdleStrategy that ends in RingOwner::wait(), the producer waits in
  // Producer::wait() (protocol-spec/wakeup.md).
  std::string idle = "spin";
  std::uint64_t gap_ms = 0;  // latency: a lull before each record (the first record after it wakes the owner)
  double idle_s = 0;         // after the records, both sides idle this long: CPU per process over it
  // The control channel: mutual TLS from --ca/--cert/--key, both sides presenting the one
  // certificate (it must allow serverAuth and clientAuth: the test PKI's owner.pem does), or
  // --insecure-plaintext (tools/security_options.hpp).
  tools::SecurityFlags security;
  bool compare_plaintext = false;  // attach: every figure with TLS and again over plain TCP
};

// The options of the roles that move records (pair, consumer, producer, attach).
void add_run_options(CLI::App& app, Options& o) {
  app.add_option("-a,--address", o.address, "the owner's address (an RDMA device's)")->envname("RDMARING_ADDR")->required();
  app.add_option("-p,--port", o.port, "control port (0: the consumer picks one)")->transform(tools::whole_number())->capture_default_str();
  app.add_option("--mode", o.mode, "publish mode")->check(CLI::IsMember({"imm", "tail"}))->capture_default_str();
  app.add_option("--ring", o.ring, "ring bytes")->transform(tools::whole_number(1))->capture_default_str();
  app.add_option("--max-record", o.max_record, "largest record, bytes")->transform(tools::whole_number(1))->capture_default_str();
  app.add_option("--records", o.records, "records to send")->transform(tools::whole_number(1))->capture_default_str();
  app.add_option("--sizes", o.sizes, "record sizes: mixed, or fixed:N")
      ->check(CLI::Validator(
          [](const std::string& v) -> std::string {
            std::uint32_t n = 0;
            if (v == "mixed") return {};
            const char* first = v.data() + std::min<std::size_t>(v.size(), 6);
            const auto [end, ec] = std::from_chars(first, v.data() + v.size(), n);
            return v.rfind("fixed:", 0) == 0 && ec == std::errc{} && end == v.data() + v.size()
                       ? std::string{}
                       : "must be mixed or fixed:N (N bytes)";
          },
          "mixed|fixed:N"))
      ->capture_default_str();
  app.add_option("--seed", o.seed, "record contents are a function of (seed, sequence)")->transform(tools::whole_number())->capture_default_str();
  app.add_option("--slow-every", o.slow_every, "the consumer sleeps --slow-us every N records")->transform(tools::whole_number());
  app.add_option("--slow-us", o.slow_us, "how long the consumer sleeps, microseconds")->transform(tools::whole_number());
  app.add_flag("--relaxed", o.relaxed, "register the ring with relaxed ordering");
  app.add_option("--payload-check", o.payload_check, "crc32c or none")
      ->transform(tools::one_of(tools::kPayloadCheckNames))
      ->default_str("crc32c");
  app.add_option("--ready-fd", o.ready_fd)->group("");  // pair: the consumer writes its port here
  app.add_option("--timeout", o.timeout_s, "seconds before the run gives up")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_flag("--latency", o.latency, "one record at a time: RTT/2 percentiles");
  app.add_option("--warmup", o.warmup, "latency: round trips not counted")->transform(tools::whole_number())->capture_default_str();
  app.add_option("--json", o.json, "write the results to this file as one JSON object");
  app.add_flag("--no-fill", o.no_fill, "neither fill nor check the records' bytes");
  app.add_option("--metrics", o.metrics, "write Prometheus text to PREFIX-owner.prom and PREFIX-producer.prom");
  app.add_flag("-q", o.quiet, "no progress lines");
  app.add_option("--idle", o.idle, "spin, or sleep when idle")->check(CLI::IsMember({"spin", "sleep"}))->capture_default_str();
  app.add_option("--gap-ms", o.gap_ms, "latency: a lull before each record, ms")->transform(tools::whole_number());
  app.add_option("--idle-s", o.idle_s, "after the records both sides idle this long: CPU over it")->check(CLI::NonNegativeNumber);
  tools::add_security_options(app, o.security, tools::SecuritySide::both);
}

// Called once the role's options are parsed: what depends on several of them.
void finish(Options& o) {
  if (o.device.empty()) {
    if (const char* d = std::getenv("RDMARING_DEVICE")) o.device = d;
  }
  if (o.sizes.rfind("fixed:", 0) == 0) o.fixed_size = static_cast<std::uint32_t>(std::stoul(o.sizes.substr(6)));
}

using bench::mix;

// Mixed sizes: 90 % of 0..256 B, 9 % of 257 B..4 KiB, 1 % of 4 KiB..max_record.
std::uint32_t size_of(const Options& o, std::uint64_t seq) {
  if (o.fixed_size) return *o.fixed_size;
  const std::uint64_t h = mix(o.seed * 0x100000001b3ull ^ seq);
  const std::uint64_t pick = h % 1000, r = h >> 20;
  std::uint64_t n = pick < 900 ? r % 257 : pick < 990 ? 257 + r % (4096 - 256) : 4097 + r % (o.max_record - 4096 + 1);
  return static_cast<std::uint32_t>(std::min<std::uint64_t>(n, o.max_record));
}

void fill(const Options& o, std::uint64_t seq, std::span<std::byte> out) {
  if (!o.no_fill) bench::fill(o.seed, seq, out);
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

std::map<std::string, std::string> fields(const std::string& line) {
  std::map<std::string, std::string> out;
  std::istringstream in(line);
  for (std::string kv; in >> kv;)
    if (auto eq = kv.find('='); eq != std::string::npos) out[kv.substr(0, eq)] = kv.substr(eq + 1);
  return out;
}

// A finite number stays a JSON number; anything else ("?", "inf", a name) becomes a string.
nlohmann::json json_value(const std::string& v) {
  if (!v.empty()) {
    char* end = nullptr;
    const double d = std::strtod(v.c_str(), &end);
    if (end == v.c_str() + v.size() && std::isfinite(d) && v.find_first_of("xXnN") == std::string::npos) {
      std::uint64_t n = 0;
      const auto [int_end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
      if (ec == std::errc{} && int_end == v.data() + v.size()) return n;
      return d;
    }
  }
  return v;
}

nlohmann::json json_object(const std::map<std::string, std::string>& m) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [k, v] : m) out[k] = json_value(v);
  return out;
}

// {"role": ..., the run's options, "consumer": {...}, "producer": {...}, "ok": ...}
void write_json(const Options& o, const std::map<std::string, std::string>* consumer,
                const std::map<std::string, std::string>* producer, bool ok) {
  if (o.json.empty()) return;
  const char* device = std::getenv("RDMARING_DEVICE");
  nlohmann::json j{{"tool", "rdmaring-bench"},
                   {"role", o.role},
                   {"measurement", o.latency ? "latency" : "throughput"},
                   {"device", device ? device : ""},
                   {"address", o.address},
                   {"mode", o.mode},
                   {"sizes", o.sizes},
                   {"records", o.records},
                   {"ring", o.ring},
                   {"max_record", o.max_record},
                   {"seed", o.seed},
                   {"relaxed", o.relaxed},
                   {"payload_check", o.payload_check == wire::PayloadCheck::none ? "none" : "crc32c"},
                   {"fill", !o.no_fill},
                   {"control_channel", o.security.insecure_plaintext ? "plain TCP" : "mutual TLS"}};
  if (o.latency) j["warmup"] = o.warmup;
  if (consumer) j["consumer"] = json_object(*consumer);
  if (producer) j["producer"] = json_object(*producer);
  j["ok"] = ok;
  std::ofstream f(o.json);
  f << j.dump(1) << "\n";
  if (!f) std::cerr << "rdmaring-bench: cannot write " << o.json << "\n";
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream f(path);
  f << text;
  if (!f) std::cerr << "rdmaring-bench: cannot write " << path << "\n";
}

std::uint64_t total(const std::map<std::string, std::uint64_t>& counts) {
  std::uint64_t n = 0;
  for (const auto& [k, v] : counts) n += v;
  return n;
}

// What a side holds while records flow: its MRs, and what the kernel charged this process for
// them (VmPin) beside what mlock() holds (VmLck).
// CPU seconds this process has used, all threads (what /proc/PID/stat's utime + stime say).
double process_cpu_s() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  const auto s = [](const timeval& t) { return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) / 1e6; };
  return s(u.ru_utime) + s(u.ru_stime);
}

std::string memory_fields(const std::string& device, const RegistrationFootprint& mrs) {
  const verbs::MemlockState m = verbs::read_memlock_state();
  std::ostringstream out;
  out << " device=" << device << " mr_regions=" << mrs.regions << " mr_bytes=" << mrs.bytes << " vm_pin=" << m.pinned
      << " vm_lck=" << m.locked;
  return out.str();
}

// The port's counters over the run, as hw_NAME=delta: what moved, and every RNR/retry counter.
// They belong to the port, so a loopback run counts both ends.
struct PortCounterWindow {
  std::string device;
  std::optional<verbs::PortCounters> before;

  explicit PortCounterWindow(std::string dev) : device(std::move(dev)) {
    auto r = verbs::read_port_counters(device);
    if (r) before = std::move(r).value();
    else std::cerr << "rdmaring-bench: no port counters: " << r.error().message() << "\n";
  }
  std::string fields() const {
    if (!before) return " hw_counters=unavailable";
    auto after = verbs::read_port_counters(device);
    if (!after) return " hw_counters=unavailable";
    std::ostringstream out;
    for (const auto& [name, delta] : after.value().since(*before).values) out << " hw_" << name << "=" << delta;
    return out.str();
  }
};

// Allocation, registration and re-registration apart: what attach and every resume pay before
// a byte moves. Each figure is the median of 5, per MB (2^20 B).
int run_phases(const Options& o) {
  verbs::Context ctx = verbs::Context::open(o.device);
  verbs::ProtectionDomain pd(ctx);
  std::cout << "phases on " << ctx.name() << " (median of 5 per size; ms per MB)\n";
  for (const std::uint64_t mb : o.sizes_mb) {
    const std::uint64_t bytes = mb << 20;
    std::vector<double> alloc, reg, rereg;
    for (int i = 0; i < 5; ++i) {
      auto t0 = Clock::now();
      verbs::AlignedBuffer buf(bytes);
      std::memset(buf.data(), 0, bytes);  // the pages a ring really gets
      const int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
      const auto t1 = Clock::now();
      Clock::time_point t2, t3;
      {
        const verbs::MemoryRegion first(pd, buf.data(), bytes, access);
        t2 = Clock::now();
      }
      {
        // As RingOwner's fence: the old registration goes, a new one (new rkey) comes.
        const verbs::MemoryRegion again(pd, buf.data(), bytes, access);
        t3 = Clock::now();
      }
      const auto per_mb = [mb](auto d) { return std::chrono::duration<double, std::milli>(d).count() / double(mb); };
      alloc.push_back(per_mb(t1 - t0));
      reg.push_back(per_mb(t2 - t1));
      rereg.push_back(per_mb(t3 - t2));
    }
    for (auto* v : {&alloc, &reg, &rereg}) std::sort(v->begin(), v->end());
    std::cout << "phases size_mb=" << mb << " alloc_ms_per_mb=" << alloc[2] << " reg_mr_ms_per_mb=" << reg[2]
              << " rereg_ms_per_mb=" << rereg[2] << "\n";
  }
  return 0;
}

RingOwnerOptions owner_options(const Options& o) {
  RingOwnerOptions co;
  co.security = tools::owner_security(o.security);
  co.address = o.address;
  co.control_port = o.port;
  co.ring_bytes = o.ring;
  co.max_record = o.max_record;
  co.mode = mode_of(o);
  co.relaxed_ordering = o.relaxed;
  co.core.payload_check = o.payload_check;
  return co;
}

// What attaching and resuming cost at one session count, over one kind of control channel.
struct AttachRun {
  std::uint32_t sessions = 0;
  std::vector<double> attach_ms;  // Producer::attach: control round trip, ring and staging registration, QP connect
  std::vector<double> resume_ms;  // Producer::recover on a live session: a resume over the same control channel,
                                  // the ring zeroed and registered again, a new QP
  std::vector<double> rejoin_ms;  // Producer::rejoin after the producer is gone, as a restarted process: a new
                                  // control connection (its TLS handshake), the resume, staging, a new QP
  RegistrationFootprint owner_mrs, producer_mrs;
  std::uint64_t vm_pin_per_session = 0;
};

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
double largest(const std::vector<double>& v) { return v.empty() ? 0 : *std::max_element(v.begin(), v.end()); }

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

// Attaches `n` producers to `owner` one after another, resumes each, rejoins each as a restarted
// producer would, then detaches them all and waits until the owner has let every session go.
AttachRun attach_sessions(const Options& o, RingOwner& owner, const ProducerOptions& po, std::uint32_t n) {
  AttachRun run{.sessions = n};
  const auto timeout = std::chrono::duration_cast<std::chrono::nanoseconds>(Seconds(o.timeout_s));
  const std::uint64_t pinned_before = verbs::read_memlock_state().pinned;
  std::vector<std::optional<Producer>> producers(n);
  for (auto& p : producers) {
    const auto t0 = Clock::now();
    p.emplace(Producer::attach(po));
    run.attach_ms.push_back(ms_since(t0));
  }
  run.vm_pin_per_session = (verbs::read_memlock_state().pinned - pinned_before) / n;
  run.owner_mrs = owner.stats().registered;
  run.producer_mrs = producers.front()->stats().registered;
  for (auto& p : producers) {
    const auto t0 = Clock::now();
    must(p->recover(), "resume");
    run.resume_ms.push_back(ms_since(t0));
  }
  for (auto& p : producers) {
    const SessionCredentials credentials = p->credentials();
    p.reset();  // as a killed process: no detach, its QP and control connection gone
    const auto t0 = Clock::now();
    p.emplace(Producer::rejoin(po, credentials));
    run.rejoin_ms.push_back(ms_since(t0));
  }
  for (auto& p : producers) must(p->detach(timeout), "detach");
  producers.clear();
  const auto deadline = Clock::now() + Seconds(o.timeout_s);
  while (owner.session_count() > 0) {
    if (Clock::now() > deadline) {
      std::cerr << "attach: " << owner.session_count() << " sessions still open after the detaches\n";
      std::exit(1);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return run;
}

std::string attach_line(const AttachRun& r, const char* channel) {
  std::ostringstream out;
  out << "attach channel=" << channel << " sessions=" << r.sessions << " attach_ms_p50=" << median(r.attach_ms)
      << " attach_ms_max=" << largest(r.attach_ms) << " resume_ms_p50=" << median(r.resume_ms)
      << " resume_ms_max=" << largest(r.resume_ms) << " rejoin_ms_p50=" << median(r.rejoin_ms)
      << " rejoin_ms_max=" << largest(r.rejoin_ms) << " owner_mr_bytes_per_session=" << r.owner_mrs.bytes / r.sessions
      << " owner_mrs=" << r.owner_mrs.regions << " producer_mr_bytes=" << r.producer_mrs.bytes
      << " producer_mrs=" << r.producer_mrs.regions << " vm_pin_per_session=" << r.vm_pin_per_session;
  return out.str();
}

// Attach cost as sessions grow: one owner and N producers of this process, attached one after
// another (each: control round trip, the owner's ring allocated and registered, the producer's
// staging registered, the QP connected), then each resumed (recover) and rejoined (a new control
// connection, as a restarted producer's). Per N: attach, resume and rejoin time, median and
// slowest; the MR bytes each side holds per session; VmPin's growth per session (both sides: one
// process).
// --compare-plaintext: a second owner over plain TCP beside the TLS one, each warmed up by one
// attach (the device opened, the first ring made), then per N the TLS run and the plain run in
// turn; a last table puts their medians side by side.
int run_attach(const Options& o) {
  const std::vector<std::uint32_t>& counts = o.counts;
  struct Channel {
    const char* name;
    tools::SecurityFlags flags;
    std::unique_ptr<RingOwner> owner;
    ProducerOptions po;
    std::vector<AttachRun> runs;
  };
  std::vector<Channel> channels;
  channels.push_back({o.security.insecure_plaintext ? "plain" : "tls", o.security, nullptr, {}, {}});
  if (o.compare_plaintext) channels.push_back({"plain", tools::SecurityFlags{.insecure_plaintext = true}, nullptr, {}, {}});
  for (Channel& c : channels) {
    Options oc = o;
    oc.security = c.flags;
    RingOwnerOptions co = owner_options(oc);
    co.max_sessions = *std::max_element(counts.begin(), counts.end());
    // The second owner takes a free port when --port names the first's.
    if (&c != &channels.front()) co.control_port = 0;
    c.owner = RingOwner::start(co);
    c.po.address = o.address;
    c.po.control_port = c.owner->control_port();
    c.po.security = tools::producer_security(c.flags);
    if (o.compare_plaintext) (void)attach_sessions(o, *c.owner, c.po, 1);  // warm-up, not reported
  }
  for (const std::uint32_t n : counts) {
    for (Channel& c : channels) {
      c.runs.push_back(attach_sessions(o, *c.owner, c.po, n));
      std::cout << attach_line(c.runs.back(), c.name) << std::endl;
    }
  }
  nlohmann::json runs = nlohmann::json::array();
  for (const Channel& c : channels)
    for (const AttachRun& r : c.runs)
      runs.push_back({{"channel", c.name},
                      {"sessions", r.sessions},
                      {"attach_ms", r.attach_ms},
                      {"resume_ms", r.resume_ms},
                      {"rejoin_ms", r.rejoin_ms},
                      {"owner_mr_bytes_per_session", r.owner_mrs.bytes / r.sessions},
                      {"producer_mr_bytes", r.producer_mrs.bytes},
                      {"vm_pin_per_session", r.vm_pin_per_session}});
  if (o.compare_plaintext) {
    const std::vector<AttachRun>&tls = channels[0].runs, &plain = channels[1].runs;
    const auto cell = [](double t, double p) {
      std::ostringstream out;
      out << std::fixed << std::setprecision(1) << t << " / " << p << " (" << std::showpos << t - p << std::noshowpos
          << ")";
      return out.str();
    };
    std::cout << "attach and resume over mutual TLS against plain TCP, p50 ms: TLS / plain (TLS - plain)\n"
              << "  sessions  attach                    resume (recover)          rejoin (new control connection)\n";
    std::ostringstream lines;  // the same, as key=value lines after the table
    for (std::size_t i = 0; i < tls.size(); ++i) {
      std::cout << "  " << std::left << std::setw(8) << tls[i].sessions << "  " << std::setw(24)
                << cell(median(tls[i].attach_ms), median(plain[i].attach_ms)) << "  " << std::setw(24)
                << cell(median(tls[i].resume_ms), median(plain[i].resume_ms)) << "  "
                << cell(median(tls[i].rejoin_ms), median(plain[i].rejoin_ms)) << std::right << "\n";
      lines << "attach compare sessions=" << tls[i].sessions << " attach_ms_p50_tls=" << median(tls[i].attach_ms)
            << " attach_ms_p50_plain=" << median(plain[i].attach_ms) << " resume_ms_p50_tls=" << median(tls[i].resume_ms)
            << " resume_ms_p50_plain=" << median(plain[i].resume_ms) << " rejoin_ms_p50_tls=" << median(tls[i].rejoin_ms)
            << " rejoin_ms_p50_plain=" << median(plain[i].rejoin_ms) << "\n";
    }
    std::cout << lines.str() << std::flush;
  }
  if (!o.json.empty()) {
    const char* device = std::getenv("RDMARING_DEVICE");
    nlohmann::json j{{"tool", "rdmaring-bench"}, {"role", "attach"},      {"device", device ? device : ""},
                     {"address", o.address},     {"mode", o.mode},        {"ring", o.ring},
                     {"compare_plaintext", o.compare_plaintext},          {"runs", runs}};
    write_text(o.json, j.dump(1) + "\n");
  }
  return 0;
}

int run_consumer(const Options& o) {
  RingOwnerOptions co = owner_options(o);
  co.max_sessions = 1;
  const auto consumer = RingOwner::start(co);
  const PortCounterWindow counters(consumer->stats().device);
  if (o.ready_fd >= 0) {
    const std::string port = std::to_string(consumer->control_port()) + "\n";
    if (write(o.ready_fd, port.data(), port.size()) < 0) return 1;
    close(o.ready_fd);
  }
  std::uint64_t expect = 0, bad = 0, bytes = 0;
  std::vector<std::byte> want(o.max_record + 8);
  const auto deadline = Clock::now() + Seconds(o.timeout_s);
  Clock::time_point first{}, last{};
  auto next_progress = Clock::now() + Seconds(1);
  std::uint64_t at_last_progress = 0;
  const auto check = [&](const Delivery& r) {
    const std::uint32_t len = size_of(o, expect);
    fill(o, expect, std::span(want).first(len));
    if (r.sequence != expect || r.payload.size() != len ||
        (!o.no_fill && std::memcmp(r.payload.data(), want.data(), len) != 0)) {
      if (bad++ < 5)
        std::cerr << "consumer: record " << expect << " wrong (sequence " << r.sequence << ", " << r.payload.size()
                  << " B, want " << len << " B)\n";
    }
    bytes += r.payload.size();
    ++expect;
  };
  // --idle sleep: after an empty poll, spin, yield, then sleep until the next event.
  IdleStrategy idle;
  // Compared once: a string compare per poll showed in the guest's profile of the empty polls.
  const bool spin = o.idle == "spin";
  const auto pause = [&](std::size_t n) {
    if (spin) return;
    switch (idle.next(n)) {
      case IdleStrategy::Step::spin: break;
      case IdleStrategy::Step::yield: std::this_thread::yield(); break;
      case IdleStrategy::Step::sleep: must(consumer->wait(std::chrono::milliseconds(200)), "wait"); break;
    }
  };
  // The clock is read after deliveries and every so many empty polls: each read delays the
  // next poll, and so the delivery the latency runs time.
  for (std::uint64_t empty = 0; expect < o.records;) {
    const auto n = must(consumer->poll(check, 256), "poll");
    pause(n);
    if (n == 0 && ++empty % 256 != 0) continue;
    const auto now = Clock::now();
    if (n > 0) {
      last = now;
      if (first == Clock::time_point{}) first = now;
      if (o.slow_every && expect % o.slow_every < n) std::this_thread::sleep_for(std::chrono::microseconds(o.slow_us));
    }
    if (!o.quiet && now >= next_progress) {
      std::cerr << "progress records=" << expect << "/" << o.records << " rate=" << (expect - at_last_progress)
                << " rec/s" << std::endl;
      at_last_progress = expect;
      next_progress += Seconds(1);
    }
    if (now > deadline) {
      std::cerr << "consumer: timed out at record " << expect << "; " << consumer->ledger_dump() << "\n";
      return 1;
    }
  }
  // Taken while the session still holds its ring (detaching frees it), so that the metrics show
  // its registrations and its ledger.
  const auto flowing = consumer->stats();
  const std::string memory = memory_fields(flowing.device, flowing.registered);
  if (!o.metrics.empty()) write_text(o.metrics + "-owner.prom", consumer->metrics());
  // Keep answering credit requests until the producer has drained and detached: with --idle-s,
  // the lull whose CPU cost is measured.
  const double cpu_before = process_cpu_s();
  const auto lull_start = Clock::now();
  while (consumer->session_count() > 0 && Clock::now() < deadline) pause(must(consumer->poll([](const Delivery&) {}, 64), "poll"));
  const double lull_s = Seconds(Clock::now() - lull_start).count();
  const double lull_cpu_pct = 100 * (process_cpu_s() - cpu_before) / std::max(lull_s, 1e-9);
  const auto s = consumer->stats();
  const ConsumerCounters& core = s.rings;
  std::ostringstream line;
  line << "consumer records=" << expect << " bad=" << bad << " bytes=" << bytes
            << " seconds=" << Seconds(last - first).count() << " publishes=" << core.publishes
            << " credit_writes=" << core.credit_writes << " credit_requests=" << core.credit_requests
            << " recv_completions=" << s.recv_completions << " recv_posts=" << s.recv_posts
            << " padding=" << core.padding_records << " not_ready=" << core.not_ready
            << " torn_tail=" << core.torn_tail_reads << " async_events=" << total(s.async_events)
            << " completion_errors=" << total(s.completion_errors) << " sleeps=" << s.sleeps
            << " doorbells=" << core.doorbells << " lull_s=" << lull_s << " lull_cpu_pct=" << lull_cpu_pct << memory
            << counters.fields();
  std::cout << line.str() << std::endl;
  const auto m = fields(line.str());
  write_json(o, &m, nullptr, bad == 0);
  return bad == 0 ? 0 : 1;
}

// Nearest-rank percentile of sorted samples.
double percentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0;
  const auto rank = static_cast<std::size_t>(std::ceil(p * static_cast<double>(sorted.size())));
  return sorted[std::clamp<std::size_t>(rank, 1, sorted.size()) - 1];
}

// Latency: one record in flight. Returns the extra key=value fields of the producer's line.
Result<std::string> measure_latency(const Options& o, Producer& producer, std::uint64_t& bytes) {
  const auto timeout = std::chrono::duration_cast<std::chrono::nanoseconds>(Seconds(o.timeout_s));
  std::vector<double> half_rtt_us;
  half_rtt_us.reserve(o.records);
  for (std::uint64_t seq = 0; seq < o.records; ++seq) {
    const std::uint32_t len = size_of(o, seq);
    if (o.gap_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(o.gap_ms));
    // The previous round trip released everything: the claim fits at once.
    BOOST_OUTCOME_TRY(dst, producer.claim(len));
    fill(o, seq, dst);
    const auto t0 = Clock::now();
    BOOST_OUTCOME_TRYV(producer.commit());
    BOOST_OUTCOME_TRYV(producer.drain(timeout));  // flush, then wait for the credit write-back
    const auto t1 = Clock::now();
    bytes += len;
    if (seq >= o.warmup) half_rtt_us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / 2);
  }
  std::sort(half_rtt_us.begin(), half_rtt_us.end());
  double sum = 0;
  for (const double v : half_rtt_us) sum += v;
  const double n = static_cast<double>(std::max<std::size_t>(half_rtt_us.size(), 1));
  std::ostringstream out;
  out << " latency_samples=" << half_rtt_us.size() << " latency_min_us=" << percentile(half_rtt_us, 0)
      << " latency_p50_us=" << percentile(half_rtt_us, 0.5) << " latency_p99_us=" << percentile(half_rtt_us, 0.99)
      << " latency_p999_us=" << percentile(half_rtt_us, 0.999)
      << " latency_max_us=" << (half_rtt_us.empty() ? 0 : half_rtt_us.back()) << " latency_mean_us=" << sum / n;
  return out.str();
}

// Throughput: as many records in flight as the ring's credit allows.
Result<void> stream(const Options& o, Producer& producer, std::uint64_t& bytes) {
  const auto t0 = Clock::now();
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
      if (c.error() != errc::would_block) return std::move(c).error();
      if (Clock::now() - t0 > Seconds(o.timeout_s))
        return make_error(errc::timed_out, "producer: no credit; " + producer.ledger_dump());
    }
    fill(o, seq, dst);
    BOOST_OUTCOME_TRYV(producer.commit());
    bytes += len;
  }
  return success();
}

int run_producer(const Options& o) {
  ProducerOptions po;
  po.address = o.address;
  po.control_port = o.port;
  po.security = tools::producer_security(o.security);
  // --idle spin: drain() and a starved send never sleep, as before wait() existed.
  if (o.idle == "spin") po.idle.spins = std::numeric_limits<std::uint32_t>::max();
  const auto attach_start = Clock::now();
  Producer producer = Producer::attach(po);
  const auto t0 = Clock::now();
  std::uint64_t bytes = 0;
  std::string latency;
  if (o.latency) latency = must(measure_latency(o, producer, bytes), "latency");
  else must(stream(o, producer, bytes), "send");
  const auto timeout = std::chrono::duration_cast<std::chrono::nanoseconds>(Seconds(o.timeout_s));
  // The span ends when the consumer has released the last record, as ib_write_bw's ends at the
  // last completion; the detach's control round trip is teardown, not transfer.
  must(producer.drain(timeout), "drain");
  const auto secs = Seconds(Clock::now() - t0).count();
  const auto flowing = producer.stats();
  const std::string memory = memory_fields(flowing.device, flowing.registered);
  // The lull, as an application with nothing to send waits for credit or trouble: spinning on
  // progress() (all it could do before Producer::wait existed), or sleeping in wait().
  std::string lull;
  if (o.idle_s > 0) {
    const double cpu_before = process_cpu_s();
    for (const auto end = Clock::now() + Seconds(o.idle_s); Clock::now() < end;) {
      if (o.idle == "spin") must(producer.progress(), "progress");
      else must(producer.wait(std::chrono::milliseconds(200)), "wait");
    }
    lull = " lull_s=" + std::to_string(o.idle_s) +
           " lull_cpu_pct=" + std::to_string(100 * (process_cpu_s() - cpu_before) / o.idle_s);
  }
  must(producer.detach(timeout), "detach");
  const auto s = producer.stats();
  if (!o.metrics.empty()) write_text(o.metrics + "-producer.prom", producer.metrics());
  const double n = static_cast<double>(o.records);
  auto per = [n](std::uint64_t v) { return static_cast<double>(v) / n; };
  std::ostringstream line;
  line << "producer records=" << s.core.records << " bytes=" << bytes << " seconds=" << secs
       << " records_per_s=" << n / secs << " mb_per_s=" << static_cast<double>(bytes) / secs / 1e6
       << " post_send_calls=" << s.post_send_calls << " wrs=" << s.core.wrs << " signaled=" << s.core.signaled
       << " batches=" << s.core.batches << " wire_bytes=" << s.core.wire_bytes
       << " would_block=" << s.core.would_block << " credit_requests=" << s.core.credit_requests
       << " credit_updates=" << s.core.credit_updates << " post_send_per_record=" << per(s.post_send_calls)
       << " signaled_per_record=" << per(s.core.signaled) << " wrs_per_record=" << per(s.core.wrs)
       << " wire_per_payload=" << static_cast<double>(s.core.wire_bytes) / static_cast<double>(std::max<std::uint64_t>(bytes, 1))
       << " attach_ms=" << std::chrono::duration<double, std::milli>(t0 - attach_start).count()
       << " async_events=" << total(s.async_events) << " completion_errors=" << total(s.completion_errors)
       << " recoveries=" << s.recoveries << " sleeps=" << s.sleeps << " doorbells=" << s.core.doorbells
       << " credit_notifications=" << s.credit_notifications << memory << latency << lull;
  std::cout << line.str() << std::endl;
  const auto m = fields(line.str());
  write_json(o, nullptr, &m, true);
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
            << "  throughput   " << f(p, "records_per_s") << " records/s, " << f(p, "mb_per_s") << " MB/s"
            << (o.latency ? " (one record in flight: not a throughput measurement)" : "") << "\n";
  if (o.latency)
    std::cout << "  latency      RTT/2 record -> credit, " << f(p, "latency_samples") << " samples after " << o.warmup
              << " warm-up: p50 " << f(p, "latency_p50_us") << " us, p99 " << f(p, "latency_p99_us") << " us, p999 "
              << f(p, "latency_p999_us") << " us (min " << f(p, "latency_min_us") << ", max " << f(p, "latency_max_us")
              << ")\n";
  const auto ratio = [&](const std::string& num, const std::string& den) {
    const double d = std::atof(f(c, den.c_str()).c_str());
    return d > 0 ? std::to_string(std::atof(f(c, num.c_str()).c_str()) / d) : std::string("?");
  };
  std::cout << "  per record   " << f(p, "post_send_per_record") << " ibv_post_send, " << f(p, "wrs_per_record")
            << " WRs, " << f(p, "signaled_per_record") << " signaled completions, " << ratio("recv_completions", "records")
            << " receive WQEs consumed (" << ratio("recv_posts", "records") << " ibv_post_srq_recv); " << f(p, "wire_per_payload") << " ring bytes written per payload byte\n"
            << "  set-up       attach " << f(p, "attach_ms") << " ms over "
            << (o.security.insecure_plaintext ? "plain TCP" : "mutual TLS")
            << " (control connection" << (o.security.insecure_plaintext ? "" : " and TLS handshake")
            << ", control round trip, ring and staging registration, QP connect); TLS against plain TCP: "
               "rdmaring-bench attach --compare-plaintext; per-MB costs: rdmaring-bench phases\n";
  for (auto* side : {&c, &p})
    std::cout << "  memory       " << ((side == &c) ? "consumer" : "producer") << " on " << f(*side, "device") << ": "
              << f(*side, "mr_regions") << " MRs, " << f(*side, "mr_bytes") << " B registered; VmPin "
              << f(*side, "vm_pin") << " B, VmLck " << f(*side, "vm_lck") << " B\n";
  std::cout << "  idle         " << o.idle << ": owner slept " << f(c, "sleeps") << " times, " << f(c, "doorbells")
            << " doorbells; producer slept " << f(p, "sleeps") << " times";
  if (o.idle_s > 0)
    std::cout << "; over the " << f(p, "lull_s") << " s lull: owner process " << f(c, "lull_cpu_pct")
              << " % of a core, producer process " << f(p, "lull_cpu_pct") << " %";
  std::cout << "\n";
  std::cout << "  events       async events: consumer " << f(c, "async_events") << ", producer " << f(p, "async_events")
            << "; error completions: consumer " << f(c, "completion_errors") << ", producer "
            << f(p, "completion_errors") << "; recoveries " << f(p, "recoveries") << "\n";
  // The port's counters (both ends of a loopback run): RNR and retry first, then the rest that moved.
  std::string rnr, moved;
  for (const auto& [k, v] : c) {
    if (k.rfind("hw_", 0) != 0) continue;
    (verbs::is_rnr_or_retry_counter(k) ? rnr : moved) += " " + k.substr(3) + "=" + v;
  }
  if (c.count("hw_counters")) rnr = " unavailable (no /sys/class/infiniband counters for the device)";
  std::cout << "  port         RNR/retry:" << (rnr.empty() ? " none exported" : rnr) << "\n"
            << "  port         traffic:" << (moved.empty() ? " none" : moved) << "\n"
            << "  result       " << (ok ? "ok" : "FAILED") << std::endl;
}

// The arguments after `pair`, as typed (CLI11 keeps them converted: a name as its enum's number),
// less --json (the pair writes it): its two children get them. `skip`: the words before them.
std::vector<std::string> child_options(std::size_t skip) {
  std::ifstream cmdline("/proc/self/cmdline", std::ios::binary);
  std::vector<std::string> words, out;
  for (std::string w; std::getline(cmdline, w, '\0');) words.push_back(w);
  for (std::size_t i = skip; i < words.size(); ++i) {
    if (words[i] == "--json") ++i;
    else if (words[i].rfind("--json=", 0) != 0) out.push_back(words[i]);
  }
  return out;
}

// `self`: the arguments that make this program run a role again ({"bench"} for `rdmaring bench`).
int run_pair(const Options& o, const std::vector<std::string>& self) {
  const std::vector<std::string> common = child_options(1 + self.size() + 1);
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return 1;
  std::vector<std::string> cargs{"rdmaring"};
  cargs.insert(cargs.end(), self.begin(), self.end());
  cargs.insert(cargs.end(), {"consumer", "--ready-fd", std::to_string(fds[1])});
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
  std::vector<std::string> pargs{"rdmaring"};
  pargs.insert(pargs.end(), self.begin(), self.end());
  pargs.push_back("producer");
  pargs.insert(pargs.end(), common.begin(), common.end());
  pargs.insert(pargs.end(), {"--port", std::string(buf, std::strcspn(buf, "\n"))});
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
  auto line_of = [](const std::string& out, const std::string& prefix) {
    std::istringstream lines(out);
    for (std::string l; std::getline(lines, l);)
      if (l.rfind(prefix, 0) == 0) return fields(l);
    return std::map<std::string, std::string>{};
  };
  const auto cm = line_of(c_out, "consumer "), pm = line_of(p_out, "producer ");
  write_json(o, &cm, &pm, ok);
  return ok ? 0 : 1;
}

}  // namespace

namespace rdmaring::tools {

std::vector<Command> add_bench_roles(CLI::App& app, const std::vector<std::string>& self) {
  auto o = std::make_shared<Options>();
  std::vector<Command> roles;
  // Each role's run: SetupError (no device, a port in use, …) is its one line and exit 1.
  // `endpoint`: it starts an owner or a producer, so its control channel options must say one
  // way (exit status 2 before anything is opened: tools/security_options.hpp).
  const auto role = [&](const char* name, const char* what, auto run, bool endpoint = false) {
    CLI::App* sub = app.add_subcommand(name, what);
    roles.push_back({sub, [o, name, run, endpoint] {
                       o->role = name;
                       if (endpoint) tools::require_security(o->security);
                       finish(*o);
                       return run(*o);
                     }});
    return sub;
  };
  add_run_options(*role("pair", "both roles, as two processes; prints the report",
                        [self](const Options& opt) { return run_pair(opt, self); }, true),
                  *o);
  add_run_options(*role("consumer", "listen, receive --records, print its line",
                        [](const Options& opt) { return run_consumer(opt); }, true),
                  *o);
  add_run_options(*role("producer", "connect, send --records, print its line",
                        [](const Options& opt) { return run_producer(opt); }, true),
                  *o);
  CLI::App* attach = role(
      "attach", "one owner, N producers of this process: attach, resume and rejoin time and pinned bytes per N",
      [](const Options& opt) {
        if (opt.compare_plaintext && opt.security.insecure_plaintext)
          throw CLI::ValidationError("--compare-plaintext compares mutual TLS (--ca, --cert, --key) with plain TCP: "
                                     "not with --insecure-plaintext");
        return run_attach(opt);
      },
      true);
  add_run_options(*attach, *o);
  attach->add_option("--counts", o->counts, "session counts, 1 to 4096")
      ->delimiter(',')
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  attach->add_flag("--compare-plaintext", o->compare_plaintext,
                   "measure every count over mutual TLS and again over plain TCP (a second owner), and print both");
  CLI::App* phases = role("phases", "allocation, registration and re-registration per MB, on one device",
                          [](const Options& opt) { return run_phases(opt); });
  phases->add_option("--device", o->device, "the device (default: RDMARING_DEVICE, else the first)");
  phases->add_option("--sizes-mb", o->sizes_mb, "buffer sizes, MB")->delimiter(',')->check(CLI::Range(1, 65536))->capture_default_str();
  roles.push_back(add_cores_command(app));
  roles.push_back(add_verbs_pingpong_command(app));
  return roles;
}

Command add_bench_command(CLI::App& parent) {
  CLI::App* bench = parent.add_subcommand("bench", "records over a real device, measured (pair, latency, phases, attach, cores, verbs-pingpong)");
  bench->require_subcommand(1);
  const std::vector<Command> roles = add_bench_roles(*bench, {"bench"});
  return {bench, [roles] {
            for (const Command& r : roles)
              if (r.app->parsed()) return r.run();
            return 2;
          }};
}

}  // namespace rdmaring::tools
