// rdmaring-chaos-owner: the ring owner of a chaos run, a process the driver kills with SIGKILL
// and starts again. Its durable store is its delivery log (chaos_records.hpp): one entry per
// record, written in the poll handler before the handler returns, because the owner releases a
// record (and may tell its producer so) when the handler returns. On start it rebuilds, for the
// restore callback, every session's durable record (secret, identity, min_epoch: the last entry
// of the sessions file written in on_session) and next sequence (from the log), so producers
// resume across its restart exactly once, and only from their own identity and epochs.
//
// rdmaring-chaos-owner --address A --control-port P --data-port Q --dir DIR
//                      [--mode imm|tail] [--ring-bytes N] [--lease-ms MS] [--incarnation I]
//                      [--insecure-plaintext 1]
// The control channel is mutual TLS with the test PKI's owner certificate (tests/pki), unless
// --insecure-plaintext 1.
//
// DIR/deliveries.log  the delivery log (MAP_SHARED, grown with ftruncate)
// DIR/sessions        128-byte SessionRecord entries {id, secret, min_epoch, identity, check},
//                     appended in on_session, the last of a session its record (chaos_records.hpp)
// DIR/owner.sock      audit queries: "Q <session>\n" -> "found=0|1 epoch=E state=S crc=C\n"
//                     (RingOwner::ring_checksum and the session's epoch and state)
// DIR/owner-stats.I   the RingOwner's counters, rewritten every 250 ms and at exit
// DIR/checkpoint      every session's next sequence as of log entry K, rewritten with the stats:
//                     a restart scans the log from K only (derived from the log, never ahead of it)
// SIGTERM/SIGINT: stop polling, write the stats, exit 0.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <mutex>
#include <span>
#include <sstream>
#include <string>
#include <thread>
#include <unordered_map>

#include "chaos_records.hpp"
#include "rdmaring/idle_strategy.hpp"
#include "rdmaring/ring_owner.hpp"
#include "test_pki.hpp"

using namespace rdmaring;
using namespace std::chrono_literals;

namespace {

volatile sig_atomic_t g_stop = 0;
void on_stop(int) { g_stop = 1; }

std::uint64_t now_ns() {
  const auto t = std::chrono::steady_clock::now().time_since_epoch();
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(t).count());
}

[[noreturn]] void die(const std::string& what) {
  std::cerr << "chaos-owner " << getpid() << ": " << what << std::endl;
  std::exit(3);
}

// The delivery log: a MAP_SHARED window of 16 GiB of address space over a file grown in 64 MiB
// steps (pages past the file's end are never touched).
class DeliveryLog {
 public:
  static constexpr std::uint64_t kWindow = std::uint64_t{16} << 30;
  static constexpr std::uint64_t kGrow = std::uint64_t{64} << 20;

  explicit DeliveryLog(const std::string& path) {
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT, 0644);
    if (fd_ < 0) die("open " + path + ": " + std::strerror(errno));
    struct stat st {};
    if (fstat(fd_, &st) != 0) die("fstat " + path);
    size_ = static_cast<std::uint64_t>(st.st_size);
    void* p = mmap(nullptr, kWindow, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd_, 0);
    if (p == MAP_FAILED) die("mmap " + path + ": " + std::strerror(errno));
    base_ = static_cast<std::byte*>(p);
  }

  // Scans the entries an earlier incarnation left from entry `from` (a checkpoint covers those
  // below); the first entry failing its check is where this one writes (a torn entry of a
  // killed owner is written over).
  template <class F>
  void recover(std::uint64_t from, F&& each) {
    std::uint64_t n = from;
    while ((n + 1) * chaos::kLogEntrySize <= size_) {
      const auto e = chaos::decode(base_ + n * chaos::kLogEntrySize);
      if (!e) break;
      each(*e);
      ++n;
    }
    next_ = n;
  }

  void append(const chaos::LogEntry& e) {
    const std::uint64_t end = (next_ + 1) * chaos::kLogEntrySize;
    if (end > size_) {
      const std::uint64_t grown = size_ + kGrow;
      if (grown > kWindow) die("delivery log full");
      if (ftruncate(fd_, static_cast<off_t>(grown)) != 0) die(std::string("ftruncate: ") + std::strerror(errno));
      size_ = grown;
    }
    chaos::encode(e, base_ + next_ * chaos::kLogEntrySize);
    ++next_;
  }

  std::uint64_t entries() const { return next_; }

 private:
  int fd_ = -1;
  std::byte* base_ = nullptr;
  std::uint64_t size_ = 0;
  std::uint64_t next_ = 0;
};

struct Durable {
  SessionSecret secret{};
  std::string identity;
  std::uint64_t min_epoch = 1;
  std::uint64_t next = 0;
  bool known = false;  // a record from the sessions file
};

// Counters that other work on the library adds or renames: reported when the RingOwnerStats of
// this build has them.
template <class S>
std::uint64_t optional_counter_control_errors(const S& s) {
  if constexpr (requires { s.control_errors; }) return s.control_errors;
  else if constexpr (requires { s.control_task_failures; }) return s.control_task_failures;
  else return 0;
}
template <class S>
std::uint64_t optional_counter_restore_gaps(const S& s) {
  if constexpr (requires { s.restore_gaps; }) return s.restore_gaps;
  else return 0;
}

std::string stats_text(const RingOwnerStats& s, std::uint64_t incarnation, std::uint64_t logged) {
  std::ostringstream o;
  o << "incarnation " << incarnation << "\n"
    << "logged " << logged << "\n"
    << "attaches " << s.sessions.attaches << "\n"
    << "resumes " << s.sessions.resumes << "\n"
    << "restores " << s.sessions.restores << "\n"
    << "connects " << s.sessions.connects << "\n"
    << "detaches " << s.sessions.detaches << "\n"
    << "expired " << s.sessions.expired << "\n"
    << "refused_unknown " << s.sessions.refused_unknown << "\n"
    << "refused_proof " << s.sessions.refused_proof << "\n"
    << "refused_stale " << s.sessions.refused_stale << "\n"
    << "refused_state " << s.sessions.refused_state << "\n"
    << "refused_capacity " << s.sessions.refused_capacity << "\n"
    << "control_calls " << s.control_calls << "\n"
    << "control_errors " << optional_counter_control_errors(s) << "\n"
    << "restore_gaps " << optional_counter_restore_gaps(s) << "\n"
    << "connect_refused " << s.connect_refused << "\n"
    << "sessions_failed " << s.sessions_failed << "\n"
    << "error_completions " << s.error_completions << "\n"
    << "stale_completions " << s.stale_completions << "\n"
    << "records " << s.rings.records << "\n"
    << "duplicates_dropped " << s.rings.duplicates_dropped << "\n"
    << "stale_epoch_publishes " << s.rings.stale_epoch << "\n"
    << "sleeps " << s.sleeps << "\n"
    << "doorbells " << s.rings.doorbells << "\n"
    << "last_session_failure " << s.last_session_failure << "\n";
  return o.str();
}

// {K, n, n x {session, next}, check}: what the log says up to entry K.
std::string checkpoint_bytes(std::uint64_t covered, const std::unordered_map<SessionId, Durable>& durable) {
  std::string b(16, '\0');
  std::uint64_t n = 0;
  for (const auto& [id, d] : durable) {
    if (d.next == 0) continue;
    char e[16];
    std::memcpy(e, &id, 8);
    std::memcpy(e + 8, &d.next, 8);
    b.append(e, 16);
    ++n;
  }
  std::memcpy(b.data(), &covered, 8);
  std::memcpy(b.data() + 8, &n, 8);
  const std::uint32_t check = crc32c(std::as_bytes(std::span(b.data(), b.size()))) ^ chaos::kLogSalt;
  b.append(reinterpret_cast<const char*>(&check), 4);
  return b;
}

// The entries the checkpoint covers (0 without a valid one); fills `durable` with its sequences.
std::uint64_t load_checkpoint(const std::string& path, std::unordered_map<SessionId, Durable>& durable) {
  std::ifstream f(path, std::ios::binary);
  const std::string b((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (b.size() < 20) return 0;
  std::uint64_t covered, n;
  std::memcpy(&covered, b.data(), 8);
  std::memcpy(&n, b.data() + 8, 8);
  if (b.size() != 20 + 16 * n) return 0;
  std::uint32_t check;
  std::memcpy(&check, b.data() + b.size() - 4, 4);
  if (check != (crc32c(std::as_bytes(std::span(b.data(), b.size() - 4))) ^ chaos::kLogSalt)) return 0;
  for (std::uint64_t i = 0; i < n; ++i) {
    SessionId id;
    std::uint64_t next;
    std::memcpy(&id, b.data() + 16 + 16 * i, 8);
    std::memcpy(&next, b.data() + 24 + 16 * i, 8);
    durable[id].next = next;
  }
  return covered;
}

void write_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    f << text;
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
}

// Audit queries from rdmaring-chaos-probe, one per connection.
void serve_queries(int listen_fd, RingOwner& owner) {
  while (!g_stop) {
    pollfd p{listen_fd, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    const int fd = ::accept(listen_fd, nullptr, nullptr);
    if (fd < 0) continue;
    char buf[128] = {};
    std::size_t got = 0;
    while (got < sizeof buf - 1) {
      const ssize_t n = ::read(fd, buf + got, sizeof buf - 1 - got);
      if (n <= 0) break;
      got += static_cast<std::size_t>(n);
      if (std::memchr(buf, '\n', got)) break;
    }
    std::uint64_t session = 0;
    std::string reply = "error\n";
    if (std::sscanf(buf, "Q %" SCNu64, &session) == 1) {
      const auto crc = owner.ring_checksum(session);
      std::uint64_t epoch = 0;
      std::string state = "none";
      for (const auto& s : owner.stats().per_session)
        if (s.session == session) {
          epoch = s.epoch;
          state = to_string(s.state);
        }
      reply = "found=" + std::string(crc ? "1" : "0") + " epoch=" + std::to_string(epoch) + " state=" + state +
              " crc=" + std::to_string(crc.value_or(0)) + "\n";
    }
    (void)!::write(fd, reply.data(), reply.size());
    ::close(fd);
  }
}

}  // namespace

int main(int argc, char** argv) {
  RingOwnerOptions o;
  o.ring_bytes = 1 << 18;
  o.max_record = 1024;
  o.security = test_pki::owner();
  std::string dir;
  std::uint64_t incarnation = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--address") o.address = v;
    else if (k == "--control-port") o.control_port = static_cast<std::uint16_t>(std::stoul(v));
    else if (k == "--data-port") o.data_port = static_cast<std::uint16_t>(std::stoul(v));
    else if (k == "--dir") dir = v;
    else if (k == "--mode") o.mode = v == "tail" ? wire::PublishMode::tail : wire::PublishMode::imm;
    else if (k == "--ring-bytes") o.ring_bytes = std::stoull(v);
    else if (k == "--lease-ms") o.lease = std::chrono::milliseconds(std::stoll(v));
    else if (k == "--incarnation") incarnation = std::stoull(v);
    else if (k == "--insecure-plaintext" && v == "1") o.security = ControlSecurity{.insecure_plaintext = true};
    else {
      std::cerr << "chaos-owner: unknown option " << k << "\n";
      return 2;
    }
  }
  if (dir.empty() || o.address.empty()) {
    std::cerr << "usage: rdmaring-chaos-owner --address A --control-port P --data-port Q --dir DIR [...]\n";
    return 2;
  }
  signal(SIGTERM, on_stop);
  signal(SIGINT, on_stop);
  signal(SIGPIPE, SIG_IGN);
  const auto t0 = std::chrono::steady_clock::now();

  // ---- durable state left by earlier incarnations ----
  std::mutex m;
  std::unordered_map<SessionId, Durable> durable;
  // The sessions file: upserts, the last entry of a session its record. A short entry left by a
  // failed write ends it; it is cut there, so that this incarnation's entries follow the last
  // good one.
  std::uint64_t session_entries = 0;
  {
    std::ifstream f(dir + "/sessions", std::ios::binary);
    std::array<std::byte, chaos::kSessionEntrySize> e;
    while (f.read(reinterpret_cast<char*>(e.data()), e.size())) {
      const auto entry = chaos::decode_session(e.data());
      if (!entry) break;
      Durable& d = durable[entry->session];
      d.secret = entry->secret;
      d.identity = entry->identity;
      d.min_epoch = entry->min_epoch;
      d.known = true;
      ++session_entries;
    }
  }
  {
    std::error_code ec;
    const auto good = session_entries * chaos::kSessionEntrySize;
    if (std::filesystem::exists(dir + "/sessions", ec) && std::filesystem::file_size(dir + "/sessions", ec) > good) {
      std::cerr << "chaos-owner " << getpid() << ": sessions file cut to its " << session_entries << " good entries"
                << std::endl;
      std::filesystem::resize_file(dir + "/sessions", good, ec);
      if (ec) die("cutting the sessions file: " + ec.message());
    }
  }
  DeliveryLog log(dir + "/deliveries.log");
  const std::uint64_t covered = load_checkpoint(dir + "/checkpoint", durable);
  log.recover(covered, [&](const chaos::LogEntry& e) {
    Durable& d = durable[e.session];
    d.next = std::max(d.next, e.sequence + 1);
  });
  const int sessions_fd = ::open((dir + "/sessions").c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (sessions_fd < 0) die("open sessions file");

  o.on_session = [&](const SessionRecord& r) {
    std::array<std::byte, chaos::kSessionEntrySize> e{};
    if (!chaos::encode(chaos::SessionEntry{r.session, r.secret, r.min_epoch, r.identity}, e.data()))
      die("session " + std::to_string(r.session) + ": identity '" + r.identity + "' longer than " +
          std::to_string(chaos::kIdentityBytes) + " bytes");
    // Durable before the producer hears of the session (the grant is sent after this returns),
    // and before a resumed epoch's floor is relied on.
    if (::write(sessions_fd, e.data(), e.size()) != static_cast<ssize_t>(e.size())) die("write sessions file");
    std::lock_guard lock(m);
    Durable& d = durable[r.session];
    d.secret = r.secret;
    d.identity = r.identity;
    d.min_epoch = r.min_epoch;
    d.known = true;
  };
  o.restore = [&](SessionId id) -> std::optional<DurableSession> {
    std::lock_guard lock(m);
    const auto it = durable.find(id);
    if (it == durable.end() || !it->second.known) {
      std::cerr << "chaos-owner " << getpid() << ": restore of unknown session " << id << std::endl;
      return std::nullopt;
    }
    const Durable& d = it->second;
    return DurableSession{
        .secret = d.secret, .next_sequence = d.next, .identity = d.identity, .min_epoch = d.min_epoch};
  };

  std::unique_ptr<RingOwner> owner;
  try {
    owner = RingOwner::start(o);
  } catch (const std::exception& e) {
    die(std::string("start: ") + e.what());
  }
  const std::string sock_path = dir + "/owner.sock";
  ::unlink(sock_path.c_str());
  const int qfd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  std::snprintf(sa.sun_path, sizeof sa.sun_path, "%s", sock_path.c_str());
  if (qfd < 0 || ::bind(qfd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 || ::listen(qfd, 8) != 0)
    die("audit socket " + sock_path + ": " + std::strerror(errno));
  std::thread queries([&] { serve_queries(qfd, *owner); });

  std::cerr << "chaos-owner " << getpid() << " incarnation " << incarnation << ": control " << owner->control_port()
            << " data " << owner->data_port() << ", " << log.entries() << " log entries (" << log.entries() - covered
            << " scanned), " << durable.size() << " sessions known (" << session_entries << " session records), "
            << (o.security.insecure_plaintext ? "plain TCP" : "mutual TLS") << ", start "
            << std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count()
            << " ms t=" << now_ns() << std::endl;

  const std::string stats_path = dir + "/owner-stats." + std::to_string(incarnation);
  // The last session whose durable entry the handler touched: most records follow their
  // predecessor's session, so the map is looked up once per run of them.
  SessionId last_id = 0;
  Durable* last = nullptr;
  auto handler = [&](const Delivery& d) {
    chaos::LogEntry e{d.session, d.sequence, now_ns(), static_cast<std::uint32_t>(d.payload.size()), crc32c(d.payload)};
    log.append(e);
    std::lock_guard lock(m);
    if (!last || last_id != d.session) {
      last = &durable[d.session];  // unordered_map: references stay valid across inserts
      last_id = d.session;
    }
    last->next = d.sequence + 1;
  };
  auto next_stats = std::chrono::steady_clock::now();
  // Idle, the owner sleeps as a service would (RingOwner::wait: protocol-spec/wakeup.md), so
  // every chaos run also checks that no record waits for a sleeping owner. The wait is bounded
  // by the stats interval, and by SIGTERM: the signal interrupts it.
  IdleStrategy idle;
  int rc = 0;
  while (!g_stop) {
    auto n = owner->poll(handler, 256);
    if (!n) {
      std::cerr << "chaos-owner " << getpid() << ": poll: " << n.error().message() << std::endl;
      rc = 3;
      break;
    }
    switch (idle.next(n.value())) {
      case IdleStrategy::Step::spin: break;
      case IdleStrategy::Step::yield: std::this_thread::yield(); break;
      case IdleStrategy::Step::sleep:
        if (auto w = owner->wait(250ms); !w) {
          std::cerr << "chaos-owner " << getpid() << ": wait: " << w.error().message() << std::endl;
          rc = 3;
        }
        break;
    }
    if (rc != 0) break;
    const auto now = std::chrono::steady_clock::now();
    if (now >= next_stats) {
      write_atomically(stats_path, stats_text(owner->stats(), incarnation, log.entries()));
      std::string cp;
      {
        std::lock_guard lock(m);
        cp = checkpoint_bytes(log.entries(), durable);
      }
      write_atomically(dir + "/checkpoint", cp);
      next_stats = now + 250ms;
    }
  }
  write_atomically(stats_path, stats_text(owner->stats(), incarnation, log.entries()));
  g_stop = 1;
  queries.join();
  ::close(qfd);
  ::unlink(sock_path.c_str());
  std::cerr << "chaos-owner " << getpid() << ": stopped, " << log.entries() << " log entries" << std::endl;
  owner.reset();
  return rc;
}
