// rdmaring-chaos: the chaos run. Inside the Soft-RoCE guest it sets up test hosts
// (tests/softroce/testhosts: host 0 the ring owner, hosts 1..P the producers, host P+1 the
// probe), starts rdmaring-chaos-owner and P rdmaring-session-producer processes, and injects a
// seeded schedule of faults while records flow, one fault at a time: each is healed and every
// producer must deliver again before the next. Then it stops the producers (they drain and
// detach), audits the owner's delivery log and prints the table. Exit status: 0 pass, 1 a fault
// or an audit failure (the seed, the schedule file and the command to replay are printed),
// 2 usage, 77 not in the guest (testhosts needs it).
//
// rdmaring-chaos [--events N] [--seed S] [--producers P] [--mode imm|tail] [--out DIR]
//                [--schedule FILE | --regressions FILE] [--disable KIND,...] [--only KIND,...]
//                [--rate-hz R] [--recover-timeout S] [--replay-command TEXT] [--insecure-plaintext 1]
// The control channel is mutual TLS with the test PKI (tests/pki: the owner's certificate, the
// producers' producer-a, the probe's too) unless --insecure-plaintext 1 runs it plain; the probe
// speaks TLS only, so that leaves stale-rkey and replay out.
// --regressions FILE runs each seed the file lists (README.md: "Regression seeds") with the same
// options, then the run's own seed; results go to OUT/seed-S per run.
// Kinds: producer-kill owner-restart link-short link-long netem qp-error stale-rkey replay
// control-cut (README.md: what each does and what recovery means for it).
#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/pkt_sched.h>
#include <linux/rtnetlink.h>
#include <linux/sock_diag.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iomanip>
#include <iostream>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "chaos_records.hpp"

using namespace rdmaring;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

std::uint64_t now_ns() {
  const auto t = std::chrono::steady_clock::now().time_since_epoch();
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(t).count());
}
constexpr std::uint64_t kMs = 1000000;
using SessionId = std::uint64_t;

// ---- the schedule ---------------------------------------------------------------------------

enum class Kind {
  producer_kill, owner_restart, link_short, link_long, netem, qp_error, stale_rkey, replay, control_cut
};
constexpr int kKinds = 9;
constexpr std::array<const char*, kKinds> kKindNames{"producer-kill", "owner-restart", "link-short",
                                                     "link-long",     "netem",         "qp-error",
                                                     "stale-rkey",    "replay",        "control-cut"};
// Share of the events each kind gets (the schedule is a shuffled deck with these proportions).
constexpr std::array<int, kKinds> kWeights{15, 8, 12, 7, 14, 15, 5, 5, 15};

const char* name(Kind k) { return kKindNames[static_cast<int>(k)]; }
std::optional<Kind> kind_named(const std::string& s) {
  for (int i = 0; i < kKinds; ++i)
    if (s == kKindNames[i]) return static_cast<Kind>(i);
  return std::nullopt;
}

struct Event {
  int index = 0;
  int gap_ms = 0;  // quiet time before it
  Kind kind = Kind::producer_kill;
  int target = -1;       // producer (kill, qp-error, control-cut, replay) or host (link, netem)
  int duration_ms = 0;   // link down, netem on, or the pause before a restart
  std::string netem;     // tc netem arguments, words joined by ','

  std::string line() const {
    std::ostringstream o;
    o << "#" << index << " gap_ms=" << gap_ms << " kind=" << name(kind) << " target=" << target
      << " duration_ms=" << duration_ms;
    if (!netem.empty()) o << " netem=" << netem;
    return o.str();
  }
  static std::optional<Event> parse(const std::string& line) {
    std::istringstream in(line);
    std::string w;
    Event e;
    bool have_kind = false;
    while (in >> w) {
      if (w[0] == '#') {
        e.index = std::stoi(w.substr(1));
        continue;
      }
      const auto eq = w.find('=');
      if (eq == std::string::npos) return std::nullopt;
      const std::string k = w.substr(0, eq), v = w.substr(eq + 1);
      if (k == "gap_ms") e.gap_ms = std::stoi(v);
      else if (k == "kind") {
        const auto kk = kind_named(v);
        if (!kk) return std::nullopt;
        e.kind = *kk;
        have_kind = true;
      } else if (k == "target") e.target = std::stoi(v);
      else if (k == "duration_ms") e.duration_ms = std::stoi(v);
      else if (k == "netem") e.netem = v;
    }
    if (!have_kind) return std::nullopt;
    return e;
  }
};

struct Config {
  std::uint64_t seed = 0;
  int events = 100;
  int producers = 3;
  std::string mode = "imm";
  std::string out_dir;
  std::string schedule_file;
  std::set<Kind> kinds;  // enabled
  int rate_hz = 1000;
  int recover_timeout_s = 90;
  int lease_ms = 5000;
  int link_short_min = 50, link_short_max = 400;
  int link_long_min = 2000, link_long_max = 8000;
  int netem_min = 1000, netem_max = 3000;
  int gap_min = 100, gap_max = 600;
  std::uint16_t control_port = 7600, data_port = 7601;
  std::string replay_command;
  bool keep_logs = false;  // copy the processes' logs to the out dir also when the run passes
  bool show_netem = false;  // note `tc qdisc show` of each netem event (checks the netlink encoding)
  bool plaintext = false;   // the control channel plain TCP instead of mutual TLS
  std::string owner_bin = RDMARING_CHAOS_OWNER, producer_bin = RDMARING_SESSION_PRODUCER,
              probe_bin = RDMARING_CHAOS_PROBE, testhosts = RDMARING_TESTHOSTS, bind_shim = RDMARING_CHAOS_BIND_SHIM;
};

// Portable draws (std::uniform_int_distribution differs between standard libraries): a schedule
// is a function of the seed alone.
struct Rng {
  std::mt19937_64 g;
  explicit Rng(std::uint64_t seed) : g(seed) {}
  int uniform(int lo, int hi) { return lo + static_cast<int>(g() % static_cast<std::uint64_t>(hi - lo + 1)); }
  bool chance(int percent) { return uniform(0, 99) < percent; }
};

std::vector<Event> make_schedule(const Config& c) {
  Rng r(c.seed);
  std::vector<Kind> enabled(c.kinds.begin(), c.kinds.end());
  int total_weight = 0;
  for (Kind k : enabled) total_weight += kWeights[static_cast<int>(k)];
  // Counts in proportion to the weights, at least one of each kind when there is room.
  std::vector<Kind> deck;
  std::vector<std::pair<double, Kind>> rest;
  for (Kind k : enabled) {
    const double exact = static_cast<double>(c.events) * kWeights[static_cast<int>(k)] / total_weight;
    int n = static_cast<int>(exact);
    if (n == 0 && c.events >= static_cast<int>(enabled.size())) n = 1;
    for (int i = 0; i < n; ++i) deck.push_back(k);
    rest.emplace_back(exact - n, k);
  }
  std::stable_sort(rest.begin(), rest.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  for (std::size_t i = 0; static_cast<int>(deck.size()) < c.events; ++i) deck.push_back(rest[i % rest.size()].second);
  while (static_cast<int>(deck.size()) > c.events) deck.pop_back();
  for (std::size_t i = deck.size(); i > 1; --i) std::swap(deck[i - 1], deck[static_cast<std::size_t>(r.g() % i)]);

  std::vector<Event> out;
  const int hosts = c.producers + 1;  // the owner's and the producers' (the probe's is left alone)
  for (int i = 0; i < c.events; ++i) {
    Event e;
    e.index = i + 1;
    e.kind = deck[static_cast<std::size_t>(i)];
    e.gap_ms = r.uniform(c.gap_min, c.gap_max);
    switch (e.kind) {
      case Kind::producer_kill:
        e.target = r.uniform(0, c.producers - 1);
        e.duration_ms = r.uniform(0, 500);
        break;
      case Kind::owner_restart:
        e.duration_ms = r.uniform(0, 1000);
        break;
      case Kind::link_short:
        e.target = r.uniform(0, hosts - 1);
        e.duration_ms = r.uniform(c.link_short_min, c.link_short_max);
        break;
      case Kind::link_long:
        e.target = r.uniform(0, hosts - 1);
        e.duration_ms = r.uniform(c.link_long_min, c.link_long_max);
        break;
      case Kind::netem: {
        e.target = r.uniform(0, hosts - 1);
        e.duration_ms = r.uniform(c.netem_min, c.netem_max);
        const int loss = r.uniform(1, 5), delay = r.uniform(1, 20), reorder = r.uniform(10, 50);
        switch (r.uniform(0, 3)) {
          case 0: e.netem = "loss," + std::to_string(loss) + "%"; break;
          case 1: e.netem = "delay," + std::to_string(delay) + "ms," + std::to_string(delay / 2 + 1) + "ms"; break;
          case 2:
            e.netem = "delay," + std::to_string(std::max(delay, 5)) + "ms,reorder," + std::to_string(reorder) + "%,50%";
            break;
          default:
            e.netem = "delay," + std::to_string(delay) + "ms,loss," + std::to_string(loss) + "%,reorder," +
                      std::to_string(reorder) + "%";
        }
        break;
      }
      case Kind::qp_error:
      case Kind::control_cut:
      case Kind::replay:
        e.target = r.uniform(0, c.producers - 1);
        break;
      case Kind::stale_rkey:
        break;
    }
    out.push_back(e);
  }
  return out;
}

// ---- processes and files --------------------------------------------------------------------

pid_t spawn(const std::vector<std::string>& args, const std::string& log, const std::vector<std::string>& env = {}) {
  std::vector<std::string> envs;
  for (char** e = environ; *e; ++e) envs.emplace_back(*e);
  envs.insert(envs.end(), env.begin(), env.end());
  std::vector<char*> envp;
  for (auto& e : envs) envp.push_back(e.data());
  envp.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
      ::close(fd);
    }
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execve(argv[0], argv.data(), envp.data());
    _exit(127);
  }
  return pid;
}

// A shell command's status and output (stdout and stderr); the seconds all of them took so far.
double g_command_seconds = 0;
std::pair<int, std::string> run(const std::string& cmd) {
  const std::uint64_t t = now_ns();
  struct Account {
    std::uint64_t t;
    ~Account() { g_command_seconds += static_cast<double>(now_ns() - t) / 1e9; }
  } account{t};
  std::string out;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return {-1, ""};
  char buf[4096];
  std::size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int st = pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st), out};
}

// ---- cutting a TCP connection: what `ss -K` does, without a process start --------------------
// (CONFIG_INET_DIAG_DESTROY, which Debian's kernel has.)

struct TcpSocket {
  inet_diag_sockid id{};
  std::uint32_t inode = 0;
};

// A sock_diag socket with one request about IPv4 TCP sockets sent on it, for the caller to read
// the answer from and close; -1 when the socket or the send failed.
int sock_diag_request(std::uint16_t type, std::uint16_t flags, std::uint32_t states, const inet_diag_sockid& id = {}) {
  const int fd = ::socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
  if (fd < 0) return -1;
  struct {
    nlmsghdr nlh;
    inet_diag_req_v2 req;
  } msg{};
  msg.nlh.nlmsg_len = sizeof msg;
  msg.nlh.nlmsg_type = type;
  msg.nlh.nlmsg_flags = flags;
  msg.req.sdiag_family = AF_INET;
  msg.req.sdiag_protocol = IPPROTO_TCP;
  msg.req.idiag_states = states;
  msg.req.id = id;
  if (::send(fd, &msg, sizeof msg, 0) != static_cast<ssize_t>(sizeof msg)) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Established IPv4 TCP sockets with `port` at either end.
std::vector<TcpSocket> tcp_sockets(std::uint16_t port) {
  std::vector<TcpSocket> out;
  const int fd = sock_diag_request(SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, 1u << TCP_ESTABLISHED);
  if (fd < 0) return out;
  std::vector<char> buf(1 << 16);
  for (bool done = false; !done;) {
    const ssize_t n = ::recv(fd, buf.data(), buf.size(), 0);
    if (n <= 0) break;
    int len = static_cast<int>(n);
    for (auto* h = reinterpret_cast<nlmsghdr*>(buf.data()); NLMSG_OK(h, len); h = NLMSG_NEXT(h, len)) {
      if (h->nlmsg_type == NLMSG_DONE || h->nlmsg_type == NLMSG_ERROR) {
        done = true;
        break;
      }
      const auto* m = static_cast<const inet_diag_msg*>(NLMSG_DATA(h));
      if (ntohs(m->id.idiag_sport) == port || ntohs(m->id.idiag_dport) == port) out.push_back({m->id, m->idiag_inode});
    }
  }
  ::close(fd);
  return out;
}

bool destroy_socket(const inet_diag_sockid& id) {
  const int fd = sock_diag_request(SOCK_DESTROY, NLM_F_REQUEST | NLM_F_ACK, ~0u, id);
  if (fd < 0) return false;
  bool ok = false;
  std::array<char, 4096> buf;
  const ssize_t n = ::recv(fd, buf.data(), buf.size(), 0);
  const auto* h = reinterpret_cast<const nlmsghdr*>(buf.data());
  if (n >= static_cast<ssize_t>(sizeof(nlmsghdr) + sizeof(nlmsgerr)) && h->nlmsg_type == NLMSG_ERROR)
    ok = static_cast<const nlmsgerr*>(NLMSG_DATA(h))->error == 0;
  ::close(fd);
  return ok;
}

// The socket inodes a process holds (/proc/PID/fd -> "socket:[INODE]").
std::set<std::uint32_t> socket_inodes(pid_t pid) {
  std::set<std::uint32_t> out;
  std::error_code ec;
  for (const auto& f : fs::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec)) {
    const auto target = fs::read_symlink(f.path(), ec).string();
    if (target.rfind("socket:[", 0) == 0) out.insert(static_cast<std::uint32_t>(std::stoul(target.substr(8))));
  }
  return out;
}

// ---- netem: what `tc qdisc replace dev D root netem ...` does, without a process start ----------

struct Netem {
  std::int64_t delay_ns = 0, jitter_ns = 0;
  double loss = 0, reorder = 0, reorder_corr = 0;  // percent
};

// "delay 9ms [5ms] loss 3% reorder 42% [50%]" (the subset of tc's syntax the schedule uses).
std::optional<Netem> parse_netem(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> w;
  for (std::string x; in >> x;) w.push_back(x);
  auto time_ns = [](const std::string& t) -> std::optional<std::int64_t> {
    char* end = nullptr;
    const double v = std::strtod(t.c_str(), &end);
    const std::string unit = end;
    if (unit == "ms") return static_cast<std::int64_t>(v * 1e6);
    if (unit == "us") return static_cast<std::int64_t>(v * 1e3);
    if (unit == "s") return static_cast<std::int64_t>(v * 1e9);
    return std::nullopt;
  };
  auto percent = [](const std::string& t) -> std::optional<double> {
    if (t.empty() || t.back() != '%') return std::nullopt;
    return std::strtod(t.c_str(), nullptr);
  };
  Netem n;
  for (std::size_t i = 0; i < w.size(); ++i) {
    if (w[i] == "delay" && i + 1 < w.size()) {
      const auto d = time_ns(w[++i]);
      if (!d) return std::nullopt;
      n.delay_ns = *d;
      if (i + 1 < w.size())
        if (const auto j = time_ns(w[i + 1])) n.jitter_ns = *j, ++i;
    } else if (w[i] == "loss" && i + 1 < w.size()) {
      const auto l = percent(w[++i]);
      if (!l) return std::nullopt;
      n.loss = *l;
    } else if (w[i] == "reorder" && i + 1 < w.size()) {
      const auto r = percent(w[++i]);
      if (!r) return std::nullopt;
      n.reorder = *r;
      if (i + 1 < w.size())
        if (const auto c = percent(w[i + 1])) n.reorder_corr = *c, ++i;
    } else {
      return std::nullopt;
    }
  }
  return n;
}

// Replaces the root qdisc of `dev` with netem `n`, or deletes it (n null). Returns the error.
std::string set_netem(const std::string& dev, const Netem* n) {
  const unsigned ifindex = if_nametoindex(dev.c_str());
  if (ifindex == 0) return "no device " + dev;
  alignas(NLMSG_ALIGNTO) std::array<char, 512> buf{};
  auto* h = reinterpret_cast<nlmsghdr*>(buf.data());
  h->nlmsg_len = NLMSG_LENGTH(sizeof(tcmsg));
  h->nlmsg_type = n ? RTM_NEWQDISC : RTM_DELQDISC;
  h->nlmsg_flags = NLM_F_REQUEST | NLM_F_ACK | (n ? NLM_F_CREATE | NLM_F_REPLACE : 0);
  auto* t = static_cast<tcmsg*>(NLMSG_DATA(h));
  t->tcm_family = AF_UNSPEC;
  t->tcm_ifindex = static_cast<int>(ifindex);
  t->tcm_parent = TC_H_ROOT;
  auto add = [&](unsigned short type, const void* data, std::size_t len) {
    auto* a = reinterpret_cast<rtattr*>(buf.data() + NLMSG_ALIGN(h->nlmsg_len));
    a->rta_type = type;
    a->rta_len = static_cast<unsigned short>(RTA_LENGTH(len));
    if (len) std::memcpy(RTA_DATA(a), data, len);
    h->nlmsg_len = NLMSG_ALIGN(h->nlmsg_len) + RTA_ALIGN(a->rta_len);
    return a;
  };
  if (n) {
    add(TCA_KIND, "netem", 6);
    auto scaled = [](double percent) {
      return static_cast<std::uint32_t>(std::min(1.0, percent / 100.0) * static_cast<double>(UINT32_MAX));
    };
    // TCA_OPTIONS: struct tc_netem_qopt, then netem's own attributes (not a nested set).
    tc_netem_qopt q{};
    q.limit = 1000;
    q.loss = scaled(n->loss);
    q.gap = n->reorder > 0 ? 1 : 0;  // as tc: reordering needs a gap
    rtattr* options = add(TCA_OPTIONS, &q, sizeof q);
    if (n->delay_ns) add(TCA_NETEM_LATENCY64, &n->delay_ns, sizeof n->delay_ns);
    if (n->jitter_ns) add(TCA_NETEM_JITTER64, &n->jitter_ns, sizeof n->jitter_ns);
    if (n->reorder > 0) {
      const tc_netem_reorder r{scaled(n->reorder), scaled(n->reorder_corr)};
      add(TCA_NETEM_REORDER, &r, sizeof r);
    }
    options->rta_len = static_cast<unsigned short>(buf.data() + h->nlmsg_len - reinterpret_cast<char*>(options));
  }
  const int fd = ::socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE);
  if (fd < 0) return "netlink socket";
  std::string err;
  if (::send(fd, buf.data(), h->nlmsg_len, 0) != static_cast<ssize_t>(h->nlmsg_len)) {
    err = "netlink send";
  } else {
    std::array<char, 4096> reply;
    const ssize_t got = ::recv(fd, reply.data(), reply.size(), 0);
    const auto* r = reinterpret_cast<const nlmsghdr*>(reply.data());
    if (got < static_cast<ssize_t>(sizeof(nlmsghdr) + sizeof(nlmsgerr)) || r->nlmsg_type != NLMSG_ERROR)
      err = "no netlink ack";
    else if (const int e = static_cast<const nlmsgerr*>(NLMSG_DATA(r))->error; e != 0)
      err = std::strerror(-e);
  }
  ::close(fd);
  return err;
}

// New complete lines of a growing text file.
struct LineTail {
  std::string path;
  std::uint64_t offset = 0;
  std::string partial;
  std::vector<std::string> read() {
    std::vector<std::string> lines;
    std::ifstream f(path, std::ios::binary);
    if (!f) return lines;
    f.seekg(static_cast<std::streamoff>(offset));
    std::string chunk((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    offset += chunk.size();
    partial += chunk;
    std::size_t start = 0, nl;
    while ((nl = partial.find('\n', start)) != std::string::npos) {
      lines.push_back(partial.substr(start, nl - start));
      start = nl + 1;
    }
    partial.erase(0, start);
    return lines;
  }
};

// The delivery log, read as the owner appends: an entry failing its check is not there yet.
struct LogTail {
  std::string path;
  int fd = -1;
  std::uint64_t next = 0;  // entries read
  template <class F>
  void read(F&& each) {
    if (fd < 0) fd = ::open(path.c_str(), O_RDONLY);
    if (fd < 0) return;
    std::vector<std::byte> buf(chaos::kLogEntrySize * 8192);
    for (;;) {
      const ssize_t n = ::pread(fd, buf.data(), buf.size(), static_cast<off_t>(next * chaos::kLogEntrySize));
      if (n < static_cast<ssize_t>(chaos::kLogEntrySize)) return;
      const std::size_t entries = static_cast<std::size_t>(n) / chaos::kLogEntrySize;
      for (std::size_t i = 0; i < entries; ++i) {
        const auto e = chaos::decode(buf.data() + i * chaos::kLogEntrySize);
        if (!e) return;
        each(*e);
        ++next;
      }
      if (entries < 8192) return;
    }
  }
};

std::optional<std::uint64_t> field(const std::string& line, const std::string& key) {
  const auto at = line.find(key);
  if (at == std::string::npos) return std::nullopt;
  return std::strtoull(line.c_str() + at + key.size(), nullptr, 10);
}

// ---- the run --------------------------------------------------------------------------------

struct Producer {
  int index = 0;
  pid_t pid = -1;
  std::string credentials, log;
  LineTail tail;
  std::optional<SessionId> session;
  std::vector<std::uint64_t> starts, recoveries, forced;  // t= of those lines
  std::optional<std::uint64_t> final_next;
  std::uint64_t delivered = 0;
  std::vector<std::uint64_t> window;  // delivery times since the current event began
  std::deque<std::string> last_lines;
  int restarts = 0;
};

// What recovery of one producer after one event waits for.
struct Waiter {
  enum class After { known, start_line, recovery_line } how = After::known;
  int producer = 0;
  bool affected = false;      // its time to recover counts for the event
  std::uint64_t origin = 0;   // the time to recover is measured from here
  std::uint64_t after = 0;    // a delivery later than this proves recovery (0: not known yet)
  std::uint64_t resolved = 0;
};

struct EventResult {
  Event event;
  std::uint64_t t_inject = 0, t_heal = 0, t_done = 0;
  std::optional<double> ttr_ms;  // max over the affected producers
  int recoveries = 0;
  std::string note;
};

struct ProbeTally {
  int runs = 0, checks = 0, accepted = 0, inconclusive = 0;
  std::set<SessionId> sessions;
};

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t rank = static_cast<std::size_t>(std::ceil(p / 100.0 * static_cast<double>(v.size())));
  return v[std::min(v.size() - 1, rank == 0 ? 0 : rank - 1)];
}

class Run {
 public:
  Run(Config c, std::vector<Event> schedule) : c_(std::move(c)), schedule_(std::move(schedule)) {}

  int execute();

 private:
  std::string host_addr(int host) const { return "169.254.1." + std::to_string(host + 1); }
  std::string owner_addr() const { return host_addr(0); }
  double rel_s(std::uint64_t t) const { return static_cast<double>(t - t0_) / 1e9; }
  void say(const std::string& s) {
    std::cout << "[" << std::fixed << std::setprecision(1) << std::setw(7) << rel_s(now_ns()) << " s] " << s
              << std::endl;
  }
  void fail(const std::string& why) {
    if (failure_.empty()) failure_ = why;
    say("FAILURE: " + why);
  }

  void start_owner();
  void start_producer(Producer& p);
  void pump();
  void watch_children();
  void sleep_pumping(std::uint64_t ns) {
    const std::uint64_t until = now_ns() + ns;
    while (now_ns() < until && failure_.empty()) {
      pump();
      const std::uint64_t left = until > now_ns() ? until - now_ns() : 0;
      std::this_thread::sleep_for(std::chrono::nanoseconds(std::min<std::uint64_t>(left, 20 * kMs)));
    }
  }
  // Pumps until `done` or the timeout; by default also gives up at the first failure.
  bool wait_until(const std::function<bool()>& done, std::uint64_t timeout_ns, bool through_failure = false) {
    const std::uint64_t until = now_ns() + timeout_ns;
    for (;;) {
      pump();
      if (done()) return true;
      if ((!through_failure && !failure_.empty()) || now_ns() > until) return false;
      std::this_thread::sleep_for(20ms);
    }
  }
  void set_link(int host, bool up);
  // Producer recoveries (recover() that succeeded, and restarts that rejoined) in [from, to).
  int count_recoveries(std::uint64_t from, std::uint64_t to) const {
    int n = 0;
    for (const auto& p : producers_) {
      for (std::uint64_t t : p.recoveries) n += t >= from && t < to;
      for (std::size_t i = 1; i < p.starts.size(); ++i) n += p.starts[i] >= from && p.starts[i] < to;
    }
    return n;
  }
  void inject(const Event& e, EventResult& r);
  int run_probe(const std::string& mode, int producer, std::string& line);
  void stop_all();
  void audit_and_report(std::uint64_t t_end);

  Config c_;
  std::vector<Event> schedule_;
  std::string work_;
  std::uint64_t t0_ = 0;
  pid_t owner_pid_ = -1;
  int incarnation_ = -1;
  LineTail owner_tail_;
  std::deque<std::string> owner_last_;
  std::vector<Producer> producers_;
  std::map<SessionId, int> session_producer_;
  LogTail log_;
  std::uint64_t delivered_ = 0;
  std::vector<Waiter> waiters_;
  std::vector<EventResult> results_;
  ProbeTally probes_;
  std::string failure_;
  bool stopping_ = false;
};

void Run::start_owner() {
  ++incarnation_;
  std::vector<std::string> args{c_.owner_bin,  "--address",    owner_addr(),
                                "--control-port", std::to_string(c_.control_port),
                                "--data-port",  std::to_string(c_.data_port),
                                "--dir",        work_,
                                "--mode",       c_.mode,
                                "--lease-ms",   std::to_string(c_.lease_ms),
                                "--incarnation", std::to_string(incarnation_)};
  if (c_.plaintext) args.insert(args.end(), {"--insecure-plaintext", "1"});
  owner_pid_ = spawn(args, work_ + "/owner.log");
  const std::string ready = "incarnation " + std::to_string(incarnation_) + ": control";
  bool up = false;
  wait_until(
      [&] {
        for (const auto& l : owner_last_)
          if (l.find(ready) != std::string::npos) up = true;
        return up;
      },
      60000 * kMs);
  if (!up) fail("owner incarnation " + std::to_string(incarnation_) + " did not start in 60 s");
}

void Run::start_producer(Producer& p) {
  // TLS: rdmaring-session-producer presents the test PKI's producer-a.
  std::vector<std::string> args{c_.producer_bin, "--address", owner_addr(), "--port", std::to_string(c_.control_port),
                                "--credentials", p.credentials, "--records", "1000000000000", "--source",
                                host_addr(p.index + 1), "--tag", std::to_string(p.index), "--heartbeat-ms", "200",
                                "--signals", "1", "--log-recoveries", "1", "--recover-attempts", "600",
                                "--start-attempts", "100", "--rate-hz", std::to_string(c_.rate_hz),
                                "--detach-retries", "100"};
  if (c_.plaintext) args.insert(args.end(), {"--insecure-plaintext", "1"});
  p.pid = spawn(args, p.log, {"LD_PRELOAD=" + c_.bind_shim, "RDMARING_CHAOS_BIND=" + host_addr(p.index + 1)});
}

void Run::watch_children() {
  auto describe = [](int st) {
    return WIFEXITED(st) ? "exited with status " + std::to_string(WEXITSTATUS(st))
                         : "was killed by signal " + std::to_string(WTERMSIG(st));
  };
  for (auto& p : producers_) {
    if (p.pid <= 0) continue;
    int st = 0;
    if (waitpid(p.pid, &st, WNOHANG) == p.pid) {
      p.pid = -1;
      if (stopping_ && WIFEXITED(st) && WEXITSTATUS(st) == 0) continue;
      std::string tail;
      for (const auto& l : p.last_lines) tail += "\n    " + l;
      fail("producer " + std::to_string(p.index) + " " + describe(st) + "; its last lines:" + tail);
    }
  }
  if (owner_pid_ > 0) {
    int st = 0;
    if (waitpid(owner_pid_, &st, WNOHANG) == owner_pid_) {
      owner_pid_ = -1;
      if (stopping_ && WIFEXITED(st) && WEXITSTATUS(st) == 0) return;
      std::string tail;
      for (const auto& l : owner_last_) tail += "\n    " + l;
      fail("the owner " + describe(st) + "; its last lines:" + tail);
    }
  }
}

void Run::pump() {
  for (const auto& l : owner_tail_.read()) {
    owner_last_.push_back(l);
    if (owner_last_.size() > 12) owner_last_.pop_front();
  }
  for (auto& p : producers_) {
    for (const auto& l : p.tail.read()) {
      p.last_lines.push_back(l);
      if (p.last_lines.size() > 12) p.last_lines.pop_front();
      const auto t = field(l, " t=");
      if (l.find(": start session ") != std::string::npos && t) {
        const SessionId s = *field(l, "start session ");
        if (p.session && *p.session != s)
          fail("producer " + std::to_string(p.index) + " changed session from " + std::to_string(*p.session) + " to " +
               std::to_string(s));
        p.session = s;
        session_producer_[s] = p.index;
        p.starts.push_back(*t);
      } else if (l.find(": recovered session ") != std::string::npos && t) {
        p.recoveries.push_back(*t);
      } else if (l.find(": forced the QP to error") != std::string::npos && t) {
        p.forced.push_back(*t);
      } else if (l.find(": finished session ") != std::string::npos) {
        p.final_next = field(l, "next_sequence ");
      }
    }
  }
  log_.read([&](const chaos::LogEntry& e) {
    ++delivered_;
    const auto it = session_producer_.find(e.session);
    if (it == session_producer_.end()) return;
    Producer& p = producers_[static_cast<std::size_t>(it->second)];
    ++p.delivered;
    p.window.push_back(e.time_ns);
  });
  // The log keeps 48 bits of the clock: compare in that space.
  constexpr std::uint64_t kMask = (std::uint64_t{1} << 48) - 1;
  for (auto& w : waiters_) {
    if (w.resolved) continue;
    const Producer& p = producers_[static_cast<std::size_t>(w.producer)];
    if (!w.after) {
      const auto& lines = w.how == Waiter::After::start_line ? p.starts : p.recoveries;
      for (std::uint64_t t : lines)
        if (t > w.origin) {
          w.after = t;
          break;
        }
      if (!w.after) continue;
    }
    const auto it = std::upper_bound(p.window.begin(), p.window.end(), w.after & kMask);
    if (it != p.window.end()) w.resolved = (w.after & ~kMask) | *it;
  }
  watch_children();
}

void Run::set_link(int host, bool up) {
  const int fd = ::socket(AF_INET, SOCK_DGRAM, 0);
  ifreq ifr{};
  std::snprintf(ifr.ifr_name, IFNAMSIZ, "rr-h%d-br", host);
  bool ok = fd >= 0 && ioctl(fd, SIOCGIFFLAGS, &ifr) == 0;
  if (ok) {
    if (up) ifr.ifr_flags = static_cast<short>(ifr.ifr_flags | IFF_UP);
    else ifr.ifr_flags = static_cast<short>(ifr.ifr_flags & ~IFF_UP);
    ok = ioctl(fd, SIOCSIFFLAGS, &ifr) == 0;
  }
  if (fd >= 0) ::close(fd);
  if (!ok) fail(std::string("cannot set ") + ifr.ifr_name + (up ? " up" : " down") + ": " + std::strerror(errno));
}

int Run::run_probe(const std::string& mode, int producer, std::string& line) {
  const std::string log = work_ + "/probe.log";
  LineTail tail{log};
  tail.offset = fs::exists(log) ? fs::file_size(log) : 0;
  std::vector<std::string> args{c_.probe_bin,     "--mode",   mode, "--address", owner_addr(), "--port",
                                std::to_string(c_.control_port), "--source", host_addr(c_.producers + 1),
                                "--owner-socket", work_ + "/owner.sock"};
  if (producer >= 0) {
    args.push_back("--credentials");
    args.push_back(producers_[static_cast<std::size_t>(producer)].credentials);
  }
  const pid_t pid =
      spawn(args, log, {"LD_PRELOAD=" + c_.bind_shim, "RDMARING_CHAOS_BIND=" + host_addr(c_.producers + 1)});
  int st = 0;
  bool exited = false;
  wait_until(
      [&] {
        exited = waitpid(pid, &st, WNOHANG) == pid;
        return exited;
      },
      120000 * kMs);
  if (!exited) {
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
    line = "probe " + mode + ": killed after 120 s";
    return 2;
  }
  for (const auto& l : tail.read())
    if (l.rfind("probe ", 0) == 0) line = l;
  return WIFEXITED(st) ? WEXITSTATUS(st) : 2;
}

void Run::inject(const Event& e, EventResult& r) {
  const int P = c_.producers;
  std::vector<int> affected;
  auto all = [&] {
    std::vector<int> v;
    for (int i = 0; i < P; ++i) v.push_back(i);
    return v;
  };
  auto add_waiters = [&](const std::vector<int>& which, Waiter::After how, std::uint64_t origin, std::uint64_t after) {
    for (int i = 0; i < P; ++i) {
      Waiter w;
      w.producer = i;
      w.affected = std::find(which.begin(), which.end(), i) != which.end();
      w.how = w.affected ? how : Waiter::After::known;
      w.origin = origin;
      w.after = w.affected && how != Waiter::After::known ? 0 : after;
      waiters_.push_back(w);
    }
  };
  r.t_inject = now_ns();
  switch (e.kind) {
    case Kind::producer_kill: {
      Producer& p = producers_[static_cast<std::size_t>(e.target)];
      const pid_t pid = p.pid;
      p.pid = -1;  // not watched while it is down
      kill(pid, SIGKILL);
      int st = 0;
      waitpid(pid, &st, 0);
      sleep_pumping(static_cast<std::uint64_t>(e.duration_ms) * kMs);
      ++p.restarts;
      start_producer(p);
      r.t_heal = now_ns();
      add_waiters({e.target}, Waiter::After::start_line, r.t_inject, r.t_heal);
      break;
    }
    case Kind::owner_restart: {
      const pid_t pid = owner_pid_;
      owner_pid_ = -1;
      kill(pid, SIGKILL);
      int st = 0;
      waitpid(pid, &st, 0);
      sleep_pumping(static_cast<std::uint64_t>(e.duration_ms) * kMs);
      start_owner();
      r.t_heal = now_ns();
      add_waiters(all(), Waiter::After::known, r.t_inject, r.t_inject);
      break;
    }
    case Kind::link_short:
    case Kind::link_long: {
      set_link(e.target, false);
      sleep_pumping(static_cast<std::uint64_t>(e.duration_ms) * kMs);
      set_link(e.target, true);
      r.t_heal = now_ns();
      affected = e.target == 0 ? all() : std::vector<int>{e.target - 1};
      add_waiters(affected, Waiter::After::known, r.t_heal, r.t_heal);
      break;
    }
    case Kind::netem: {
      std::string args = e.netem;
      std::replace(args.begin(), args.end(), ',', ' ');
      // What `testhosts netem HOST ARGS` does (tc qdisc replace dev rr-hI root netem ARGS), over
      // rtnetlink directly: a process start costs a good part of a second in a busy TCG guest.
      const std::string dev = "rr-h" + std::to_string(e.target);
      const auto spec = parse_netem(args);
      if (!spec) {
        fail("netem arguments not understood: " + args);
        break;
      }
      if (const auto err = set_netem(dev, &*spec); !err.empty()) fail("netem " + args + " on " + dev + ": " + err);
      if (c_.show_netem) r.note = run("tc qdisc show dev " + dev).second;
      sleep_pumping(static_cast<std::uint64_t>(e.duration_ms) * kMs);
      if (const auto err = set_netem(dev, nullptr); !err.empty()) fail("removing netem from " + dev + ": " + err);
      r.t_heal = now_ns();
      affected = e.target == 0 ? all() : std::vector<int>{e.target - 1};
      add_waiters(affected, Waiter::After::known, r.t_heal, r.t_heal);
      break;
    }
    case Kind::qp_error: {
      kill(producers_[static_cast<std::size_t>(e.target)].pid, SIGUSR1);
      r.t_heal = r.t_inject;
      add_waiters({e.target}, Waiter::After::recovery_line, r.t_inject, r.t_inject);
      break;
    }
    case Kind::control_cut: {
      // The producer's control connection (its socket's inode is among its fds) and the owner's
      // end of it, both destroyed as `ss -K` would (SOCK_DESTROY): each side sees the
      // connection aborted.
      const Producer& p = producers_[static_cast<std::size_t>(e.target)];
      const auto mine = socket_inodes(p.pid);
      const auto sockets = tcp_sockets(c_.control_port);
      int cut = 0;
      for (const auto& s : sockets) {
        if (!mine.count(s.inode) || ntohs(s.id.idiag_dport) != c_.control_port) continue;
        const std::uint16_t lport = ntohs(s.id.idiag_sport);
        cut += destroy_socket(s.id);
        for (const auto& o : sockets)
          if (ntohs(o.id.idiag_sport) == c_.control_port && ntohs(o.id.idiag_dport) == lport)
            cut += destroy_socket(o.id);
      }
      r.note = cut ? std::to_string(cut) + " sockets destroyed" : "no control connection at that moment";
      r.t_heal = now_ns();
      add_waiters({e.target}, Waiter::After::known, r.t_inject, r.t_inject);
      break;
    }
    case Kind::stale_rkey:
    case Kind::replay: {
      std::string line;
      const bool stale = e.kind == Kind::stale_rkey;
      const int rc = run_probe(stale ? "stale-rkey" : "replay", stale ? -1 : e.target, line);
      ++probes_.runs;
      if (const auto s = field(line, ": session ")) probes_.sessions.insert(*s);
      const auto checks = field(line, "checks="), accepted = field(line, "accepted=");
      if (rc == 2 || !checks) {
        ++probes_.inconclusive;
      } else {
        probes_.checks += static_cast<int>(*checks);
        probes_.accepted += static_cast<int>(accepted.value_or(0));
        if (rc != 0) fail("stale or replayed access accepted: " + line);
      }
      r.note = line.substr(std::min(line.size(), line.find(':') + 2));
      r.t_heal = now_ns();
      add_waiters({}, Waiter::After::known, r.t_heal, r.t_heal);
      break;
    }
  }
}

void Run::stop_all() {
  stopping_ = true;
  for (auto& p : producers_)
    if (p.pid > 0) kill(p.pid, SIGTERM);
  const bool done = wait_until(
      [&] {
        for (const auto& p : producers_)
          if (p.pid > 0) return false;
        return true;
      },
      180000 * kMs, true);
  if (!done) {
    for (auto& p : producers_)
      if (p.pid > 0) {
        fail("producer " + std::to_string(p.index) + " did not finish (drain and detach) within 180 s of SIGTERM");
        kill(p.pid, SIGKILL);
        waitpid(p.pid, nullptr, 0);
        p.pid = -1;
      }
  }
  pump();
  if (owner_pid_ > 0) {
    const pid_t pid = owner_pid_;
    kill(pid, SIGTERM);
    wait_until([&] { return owner_pid_ < 0; }, 60000 * kMs, true);
    if (owner_pid_ > 0) {
      kill(owner_pid_, SIGKILL);
      waitpid(owner_pid_, nullptr, 0);
      owner_pid_ = -1;
    }
  }
}

int Run::execute() {
  t0_ = now_ns();
  work_ = "/tmp/rdmaring-chaos-" + std::to_string(getpid());
  fs::remove_all(work_);
  fs::create_directories(work_);
  fs::create_directories(c_.out_dir);
  {
    std::ofstream f(c_.out_dir + "/schedule.txt");
    f << "# rdmaring chaos schedule: seed " << c_.seed << ", " << schedule_.size() << " events, " << c_.producers
      << " producers, mode " << c_.mode << ", control channel " << (c_.plaintext ? "plain TCP" : "mutual TLS") << "\n";
    for (const auto& e : schedule_) f << e.line() << "\n";
  }
  say("seed " + std::to_string(c_.seed) + ", " + std::to_string(schedule_.size()) + " events, " +
      std::to_string(c_.producers) + " producers, mode " + c_.mode + ", schedule " + c_.out_dir + "/schedule.txt");
  const auto [rc, out] = run(c_.testhosts + " up " + std::to_string(c_.producers + 2));
  if (rc != 0) {
    std::cerr << "rdmaring-chaos: testhosts up failed: " << out << "\n";
    return 1;
  }
  owner_tail_.path = work_ + "/owner.log";
  log_.path = work_ + "/deliveries.log";
  start_owner();
  producers_.resize(static_cast<std::size_t>(c_.producers));
  for (int i = 0; i < c_.producers; ++i) {
    Producer& p = producers_[static_cast<std::size_t>(i)];
    p.index = i;
    p.credentials = work_ + "/producer-" + std::to_string(i) + ".credentials";
    p.log = work_ + "/producer-" + std::to_string(i) + ".log";
    p.tail.path = p.log;
    start_producer(p);
  }
  if (failure_.empty() && !wait_until(
                              [&] {
                                for (const auto& p : producers_)
                                  if (p.delivered == 0) return false;
                                return true;
                              },
                              120000 * kMs))
    fail("the producers did not all deliver a first record within 120 s");
  say("owner and " + std::to_string(c_.producers) + " producers up, records flowing");

  for (const auto& e : schedule_) {
    if (!failure_.empty()) break;
    sleep_pumping(static_cast<std::uint64_t>(e.gap_ms) * kMs);
    if (!failure_.empty()) break;
    EventResult r;
    r.event = e;
    const double commands_before = g_command_seconds;
    waiters_.clear();
    for (auto& p : producers_) p.window.clear();
    inject(e, r);
    const bool recovered = wait_until(
        [&] {
          for (const auto& w : waiters_)
            if (!w.resolved) return false;
          return true;
        },
        static_cast<std::uint64_t>(c_.recover_timeout_s) * 1000 * kMs);
    r.t_done = now_ns();
    for (const auto& w : waiters_) {
      if (!w.resolved && failure_.empty()) {
        const Producer& p = producers_[static_cast<std::size_t>(w.producer)];
        std::string tail;
        for (const auto& l : p.last_lines) tail += "\n    " + l;
        fail("event #" + std::to_string(e.index) + " (" + e.line() + "): producer " + std::to_string(w.producer) +
             " delivered nothing new within " + std::to_string(c_.recover_timeout_s) + " s; its last lines:" + tail);
      }
      if (w.affected && w.resolved) {
        const double ms = static_cast<double>(w.resolved - w.origin) / 1e6;
        r.ttr_ms = std::max(r.ttr_ms.value_or(0.0), ms);
      }
    }
    // Recoveries so far in this event's window; a late one (a producer that finds out about a
    // fault only when its heartbeats time out) is added to it up to the next event's injection.
    r.recoveries = count_recoveries(r.t_inject, now_ns() + 1);
    std::ostringstream msg;
    msg << "#" << e.index << "/" << schedule_.size() << " " << name(e.kind);
    if (e.target >= 0)
      msg << ((e.kind == Kind::link_short || e.kind == Kind::link_long || e.kind == Kind::netem) ? " host "
                                                                                                 : " producer ")
          << e.target;
    if (e.duration_ms) msg << " " << e.duration_ms << " ms";
    if (!e.netem.empty()) msg << " netem " << e.netem;
    if (recovered && r.ttr_ms) msg << " -> recovered in " << std::fixed << std::setprecision(0) << *r.ttr_ms << " ms";
    if (recovered && !r.ttr_ms) msg << " -> ok";
    msg << ", " << r.recoveries << " recover" << (r.recoveries == 1 ? "y" : "ies");
    if (g_command_seconds - commands_before > 1.0)
      msg << " (its commands took " << std::setprecision(1) << g_command_seconds - commands_before << " s)";
    if (!r.note.empty()) msg << " [" << r.note << "]";
    say(msg.str());
    if (!results_.empty()) results_.back().recoveries = count_recoveries(results_.back().t_inject, r.t_inject);
    results_.push_back(r);
  }
  if (!results_.empty()) results_.back().recoveries = count_recoveries(results_.back().t_inject, now_ns() + 1);
  say(failure_.empty() ? "schedule done; stopping the producers (drain, detach)" : "stopping after the failure");
  stop_all();
  const std::uint64_t t_end = now_ns();
  audit_and_report(t_end);
  run(c_.testhosts + " down");
  if (failure_.empty()) fs::remove_all(work_);
  return failure_.empty() ? 0 : 1;
}

void Run::audit_and_report(std::uint64_t t_end) {
  // ---- the audit: the whole log, read again from its start ----
  struct SessionAudit {
    int producer = -1;
    std::uint64_t next = 0;           // in-order position
    std::vector<std::uint8_t> seen;   // by sequence
    std::uint64_t delivered = 0, duplicated = 0, out_of_order = 0, corrupt = 0;
  };
  std::map<SessionId, SessionAudit> sessions;
  std::uint64_t total = 0, unknown = 0, probe_deliveries = 0;
  LogTail full{log_.path};
  std::string first_problem;
  auto problem = [&](const std::string& s) {
    if (first_problem.empty()) first_problem = s;
  };
  full.read([&](const chaos::LogEntry& e) {
    ++total;
    if (probes_.sessions.count(e.session)) {
      ++probe_deliveries;
      problem("a delivery in the probe's session " + std::to_string(e.session));
      return;
    }
    const auto it = session_producer_.find(e.session);
    if (it == session_producer_.end()) {
      ++unknown;
      problem("a delivery in unknown session " + std::to_string(e.session));
      return;
    }
    SessionAudit& a = sessions[e.session];
    a.producer = it->second;
    ++a.delivered;
    if (e.sequence >= a.seen.size()) a.seen.resize(std::max<std::size_t>(e.sequence + 1, a.seen.size() * 2), 0);
    const auto want_len = chaos::record_length(e.sequence);
    if (e.length != want_len || e.crc != chaos::record_crc(static_cast<std::uint32_t>(a.producer), e.sequence)) {
      ++a.corrupt;
      problem("producer " + std::to_string(a.producer) + " record " + std::to_string(e.sequence) + ": " +
              std::to_string(e.length) + " B crc " + std::to_string(e.crc) + ", expected " + std::to_string(want_len) +
              " B crc " + std::to_string(chaos::record_crc(static_cast<std::uint32_t>(a.producer), e.sequence)));
    }
    if (a.seen[e.sequence]) {
      ++a.duplicated;
      problem("producer " + std::to_string(a.producer) + " record " + std::to_string(e.sequence) + " delivered again");
      return;
    }
    a.seen[e.sequence] = 1;
    if (e.sequence != a.next) {
      ++a.out_of_order;
      problem("producer " + std::to_string(a.producer) + " record " + std::to_string(e.sequence) + " where " +
              std::to_string(a.next) + " was due");
    }
    a.next = std::max(a.next, e.sequence + 1);
  });
  std::uint64_t lost = 0, duplicated = 0, out_of_order = 0, corrupt = unknown;
  std::vector<std::string> per_producer;
  for (const auto& p : producers_) {
    SessionAudit empty;
    SessionAudit& a = p.session && sessions.count(*p.session) ? sessions[*p.session] : empty;
    // A producer that finished says how many records it sent; every one must be there.
    const std::uint64_t sent = p.final_next.value_or(a.next);
    if (!p.final_next) problem("producer " + std::to_string(p.index) + " did not report its final sequence");
    std::uint64_t missing = 0;
    for (std::uint64_t s = 0; s < sent; ++s) missing += s >= a.seen.size() || !a.seen[s];
    for (std::uint64_t s = sent; s < a.seen.size(); ++s)
      if (a.seen[s]) {
        ++corrupt;  // a sequence its producer never sent
        problem("producer " + std::to_string(p.index) + " record " + std::to_string(s) + " delivered but never sent");
      }
    if (missing)
      problem("producer " + std::to_string(p.index) + ": " + std::to_string(missing) + " of " + std::to_string(sent) +
              " records lost");
    lost += missing;
    duplicated += a.duplicated;
    out_of_order += a.out_of_order;
    corrupt += a.corrupt;
    std::ostringstream o;
    o << "p" << p.index << " " << a.delivered << " (sent " << sent << ", restarts " << p.restarts << ")";
    per_producer.push_back(o.str());
  }
  const std::uint64_t stale_accepted = static_cast<std::uint64_t>(probes_.accepted) + probe_deliveries;
  if (lost || duplicated || out_of_order || corrupt || stale_accepted)
    fail("audit: " + first_problem);

  // ---- owner counters, summed over its incarnations ----
  std::map<std::string, std::uint64_t> owner;
  std::string last_failure;
  for (int i = 0; i <= incarnation_; ++i) {
    std::ifstream f(work_ + "/owner-stats." + std::to_string(i));
    std::string k;
    while (f >> k) {
      if (k == "last_session_failure") {
        std::string rest;
        std::getline(f, rest);
        if (rest.size() > 1) last_failure = rest.substr(1);
        continue;
      }
      std::uint64_t v = 0;
      f >> v;
      if (k != "incarnation" && k != "logged") owner[k] += v;
    }
  }
  if (owner["sessions_failed"]) fail("the owner closed " + std::to_string(owner["sessions_failed"]) +
                                     " session(s) for a protocol violation: " + last_failure);

  // ---- the table ----
  std::ostringstream t;
  t << "\n== rdmaring chaos: seed " << c_.seed << ", " << results_.size() << " of " << schedule_.size() << " events, "
    << c_.producers << " producers, mode " << c_.mode << ", " << (c_.plaintext ? "plain TCP" : "mutual TLS") << ", "
    << std::fixed << std::setprecision(0)
    << static_cast<double>(t_end - t0_) / 1e9 << " s ==\n";
  t << std::left << std::setw(15) << "kind" << std::right << std::setw(7) << "events" << std::setw(12) << "recoveries"
    << std::setw(11) << "ttr p50 ms" << std::setw(11) << "ttr p99 ms" << std::setw(11) << "ttr max ms" << "\n";
  int total_events = 0, total_recoveries = 0;
  std::vector<double> all_ttr;
  for (int k = 0; k < kKinds; ++k) {
    int n = 0, rec = 0;
    std::vector<double> ttr;
    for (const auto& r : results_)
      if (static_cast<int>(r.event.kind) == k) {
        ++n;
        rec += r.recoveries;
        if (r.ttr_ms) ttr.push_back(*r.ttr_ms);
      }
    if (!n) continue;
    total_events += n;
    total_recoveries += rec;
    all_ttr.insert(all_ttr.end(), ttr.begin(), ttr.end());
    t << std::left << std::setw(15) << kKindNames[k] << std::right << std::setw(7) << n << std::setw(12) << rec;
    if (ttr.empty()) t << std::setw(11) << "-" << std::setw(11) << "-" << std::setw(11) << "-";
    else
      t << std::setprecision(0) << std::setw(11) << percentile(ttr, 50) << std::setw(11) << percentile(ttr, 99)
        << std::setw(11) << percentile(ttr, 100);
    t << "\n";
  }
  t << std::left << std::setw(15) << "all" << std::right << std::setw(7) << total_events << std::setw(12)
    << total_recoveries;
  if (all_ttr.empty()) t << "\n";
  else
    t << std::setw(11) << percentile(all_ttr, 50) << std::setw(11) << percentile(all_ttr, 99) << std::setw(11)
      << percentile(all_ttr, 100) << "\n";
  t << "records delivered: " << total << " (";
  for (std::size_t i = 0; i < per_producer.size(); ++i) t << (i ? ", " : "") << per_producer[i];
  t << ")\n";
  t << "owner: " << incarnation_ + 1 << " incarnations, resumes " << owner["resumes"] << ", restores "
    << owner["restores"] << ", duplicates dropped after restarts " << owner["duplicates_dropped"]
    << ", refused stale " << owner["refused_stale"] << ", refused state " << owner["refused_state"]
    << ", connects refused " << owner["connect_refused"] << ", error completions " << owner["error_completions"]
    << ", sessions failed " << owner["sessions_failed"] << "; it slept " << owner["sleeps"] << " times between bursts, "
    << owner["doorbells"] << " doorbells woke it\n";
  t << "probes: " << probes_.runs << " runs, " << probes_.checks << " stale writes and replays tried, "
    << probes_.accepted << " accepted, " << probes_.inconclusive << " inconclusive\n";
  t << "lost " << lost << " | duplicated " << duplicated << " | out of order " << out_of_order << " | corrupt "
    << corrupt << " | stale-epoch writes accepted " << stale_accepted << "\n";
  t << (failure_.empty() ? "PASS" : "FAIL: " + failure_) << "\n";
  std::cout << t.str() << std::flush;
  {
    std::ofstream f(c_.out_dir + "/summary.txt");
    f << t.str();
    std::ofstream ev(c_.out_dir + "/events.tsv");
    ev << "index\tkind\ttarget\tduration_ms\tnetem\tt_inject_s\tt_heal_s\tttr_ms\trecoveries\tnote\n";
    for (const auto& r : results_)
      ev << r.event.index << "\t" << name(r.event.kind) << "\t" << r.event.target << "\t" << r.event.duration_ms << "\t"
         << r.event.netem << "\t" << rel_s(r.t_inject) << "\t" << rel_s(r.t_heal) << "\t"
         << (r.ttr_ms ? std::to_string(*r.ttr_ms) : "") << "\t" << r.recoveries << "\t" << r.note << "\n";
  }
  if (!failure_.empty() || c_.keep_logs) {
    // Keep the evidence where the host can read it.
    std::error_code ec;
    fs::create_directories(c_.out_dir + "/work", ec);
    for (const auto& f : fs::directory_iterator(work_, ec))
      if (f.path().extension() == ".log" && f.path().filename() != "deliveries.log")
        fs::copy_file(f.path(), c_.out_dir + "/work/" + f.path().filename().string(),
                      fs::copy_options::overwrite_existing, ec);
  }
  if (!failure_.empty()) {
    std::cout << "\nFAILED with seed " << c_.seed << ". Schedule (" << c_.out_dir << "/schedule.txt):\n";
    const std::size_t shown = results_.size() + 1;
    const std::size_t from = shown > 40 ? shown - 40 : 0;
    if (from) std::cout << "  ... " << from << " earlier events in the file\n";
    for (std::size_t i = from; i < std::min(shown, schedule_.size()); ++i)
      std::cout << "  " << schedule_[i].line() << "\n";
    const std::string plain = c_.plaintext ? " --insecure-plaintext 1" : "";
    std::cout << "Replay: " << c_.replay_command << " --seed " << c_.seed << " --events " << schedule_.size()
              << " --producers " << c_.producers << " --mode " << c_.mode << plain << "\n"
              << "    or: " << c_.replay_command << " --schedule " << c_.out_dir << "/schedule.txt --producers "
              << c_.producers << " --mode " << c_.mode << plain << "\n"
              << "Logs: " << c_.out_dir << "/work/ (owner, producers, probe), delivery log kept in " << work_ << "\n";
  }
}

std::set<Kind> parse_kinds(const std::string& list) {
  std::set<Kind> out;
  std::istringstream in(list);
  std::string w;
  while (std::getline(in, w, ',')) {
    if (w.empty()) continue;
    const auto k = kind_named(w);
    if (!k) throw std::invalid_argument("unknown kind '" + w + "'");
    out.insert(*k);
  }
  return out;
}

// One seed per line, each with a `#` comment saying what it found; blank and comment-only lines
// are skipped. A seed without its comment is refused: the file is the record of why it is there.
std::vector<std::uint64_t> read_regressions(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw std::invalid_argument("cannot read " + path);
  std::vector<std::uint64_t> seeds;
  std::string line;
  for (int number = 1; std::getline(f, line); ++number) {
    const auto hash = line.find('#');
    std::istringstream in(line.substr(0, hash));
    std::string word, more;
    if (!(in >> word)) continue;
    const std::string where = path + ":" + std::to_string(number) + ": ";
    std::uint64_t seed = 0;
    const char* end = word.data() + word.size();
    if (const auto [ptr, ec] = std::from_chars(word.data(), end, seed); ec != std::errc{} || ptr != end || in >> more)
      throw std::invalid_argument(where + "not one seed: " + line);
    if (hash == std::string::npos) throw std::invalid_argument(where + "seed " + word + " has no comment saying what it found");
    seeds.push_back(seed);
  }
  return seeds;
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  for (int i = 0; i < kKinds; ++i) c.kinds.insert(static_cast<Kind>(i));
  std::optional<std::uint64_t> seed;
  if (const char* s = std::getenv("RDMARING_CHAOS_SEED"); s && *s) seed = std::stoull(s);
  c.replay_command = argv[0];
  std::string regressions_file;
  std::vector<std::uint64_t> regressions;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string k = argv[i];
      if (i + 1 >= argc) throw std::invalid_argument(k + " needs a value");
      const std::string v = argv[++i];
      if (k == "--events") c.events = std::stoi(v);
      else if (k == "--seed") seed = std::stoull(v);
      else if (k == "--producers") c.producers = std::stoi(v);
      else if (k == "--mode") c.mode = v;
      else if (k == "--out") c.out_dir = v;
      else if (k == "--schedule") c.schedule_file = v;
      else if (k == "--regressions") regressions_file = v;
      else if (k == "--disable") for (Kind d : parse_kinds(v)) c.kinds.erase(d);
      else if (k == "--only") c.kinds = parse_kinds(v);
      else if (k == "--rate-hz") c.rate_hz = std::stoi(v);
      else if (k == "--recover-timeout") c.recover_timeout_s = std::stoi(v);
      else if (k == "--lease-ms") c.lease_ms = std::stoi(v);
      else if (k == "--keep-logs") c.keep_logs = v == "1";
      else if (k == "--show-netem") c.show_netem = v == "1";
      else if (k == "--netem-ms") {
        const auto colon = v.find(':');
        c.netem_min = std::stoi(v.substr(0, colon));
        c.netem_max = colon == std::string::npos ? c.netem_min : std::stoi(v.substr(colon + 1));
      }
      else if (k == "--link-long-ms") {
        const auto colon = v.find(':');
        c.link_long_min = std::stoi(v.substr(0, colon));
        c.link_long_max = colon == std::string::npos ? c.link_long_min : std::stoi(v.substr(colon + 1));
      } else if (k == "--link-short-ms") {
        const auto colon = v.find(':');
        c.link_short_min = std::stoi(v.substr(0, colon));
        c.link_short_max = colon == std::string::npos ? c.link_short_min : std::stoi(v.substr(colon + 1));
      } else if (k == "--gap-ms") {
        const auto colon = v.find(':');
        c.gap_min = std::stoi(v.substr(0, colon));
        c.gap_max = colon == std::string::npos ? c.gap_min : std::stoi(v.substr(colon + 1));
      } else if (k == "--replay-command") c.replay_command = v;
      else if (k == "--insecure-plaintext") c.plaintext = v == "1";
      else throw std::invalid_argument("unknown option " + k);
    }
    if (c.producers < 1 || c.producers > 200) throw std::invalid_argument("--producers 1..200");
    if (c.mode != "imm" && c.mode != "tail") throw std::invalid_argument("--mode imm|tail");
    if (c.plaintext && (c.kinds.erase(Kind::stale_rkey) + c.kinds.erase(Kind::replay)) > 0)
      std::cout << "rdmaring-chaos: --insecure-plaintext 1: the probe speaks mutual TLS only, so stale-rkey and replay "
                   "are left out"
                << std::endl;
    if (c.kinds.empty()) throw std::invalid_argument("no kind of fault left");
    if (!regressions_file.empty()) {
      if (!c.schedule_file.empty()) throw std::invalid_argument("--schedule replays one schedule: no --regressions with it");
      // Read before the guest check: a malformed file fails wherever the test runs.
      regressions = read_regressions(regressions_file);
    }
  } catch (const std::exception& e) {
    std::cerr << "rdmaring-chaos: " << e.what() << "\n";
    return 2;
  }
  if (std::getenv("RDMARING_GUEST") == nullptr || std::string(std::getenv("RDMARING_GUEST")) != "1") {
    std::cout << "rdmaring-chaos: not inside the Soft-RoCE guest (RDMARING_GUEST=1): the test hosts rewire routing "
                 "and need the guest's rdma_rxe; run tests/chaos/run-chaos. Skipped.\n";
    return 77;
  }
  if (!seed) seed = std::random_device{}() ^ (static_cast<std::uint64_t>(std::random_device{}()) << 32);
  signal(SIGPIPE, SIG_IGN);
  auto out_dir_for = [&, out = c.out_dir](std::uint64_t s) {
    const std::string leaf = "seed-" + std::to_string(s);
    if (out.empty()) return fs::absolute("chaos-out/" + leaf).string();
    return regressions_file.empty() ? out : out + "/" + leaf;
  };
  if (!c.schedule_file.empty()) {
    c.seed = *seed;
    c.out_dir = out_dir_for(c.seed);
    std::vector<Event> schedule;
    std::ifstream f(c.schedule_file);
    if (!f) {
      std::cerr << "rdmaring-chaos: cannot read " << c.schedule_file << "\n";
      return 2;
    }
    std::string line;
    while (std::getline(f, line)) {
      if (line.empty() || line[0] != '#' || line.size() < 2 || !std::isdigit(static_cast<unsigned char>(line[1]))) {
        if (const auto s = field(line, "seed "); s && line.rfind("# rdmaring chaos schedule", 0) == 0) c.seed = *s;
        continue;
      }
      const auto e = Event::parse(line);
      if (!e) {
        std::cerr << "rdmaring-chaos: bad schedule line: " << line << "\n";
        return 2;
      }
      if (!c.kinds.count(e->kind)) continue;
      schedule.push_back(*e);
    }
    Run chaos(c, schedule);
    return chaos.execute();
  }
  // The seeds that failed before come first, with the same options: a failure among them is a
  // known bug come back, told apart from whatever the fresh seed finds.
  if (!regressions_file.empty()) {
    std::cout << "rdmaring-chaos: seed " << *seed << ", after " << regressions.size() << " regression seed"
              << (regressions.size() == 1 ? "" : "s") << " from " << regressions_file;
    for (std::size_t i = 0; i < regressions.size(); ++i) std::cout << (i ? ", " : ": ") << regressions[i];
    std::cout << std::endl;
  }
  std::vector<std::uint64_t> seeds = regressions;
  seeds.push_back(*seed);
  for (const std::uint64_t s : seeds) {
    c.seed = s;
    c.out_dir = out_dir_for(s);
    Run chaos(c, make_schedule(c));
    // One failure fails the run; the seeds after it would only add time.
    if (const int status = chaos.execute(); status != 0) return status;
  }
  return 0;
}
