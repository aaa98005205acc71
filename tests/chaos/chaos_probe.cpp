// rdmaring-chaos-probe: the hostile peer of a chaos run, written against the control protocol and
// the wire formats directly (tests/softroce/raw_producer.hpp) to do what the library's Producer
// never does.
//
//   --mode stale-rkey  attaches a session of its own, connects epoch 1 and writes with its rkey
//                      (must succeed), resumes (epoch 2 fences epoch 1), connects epoch 2 and
//                      writes again with the epoch-1 rkey: the write must fail
//                      (IBV_WC_REM_ACCESS_ERR) and the owner's ring checksum, asked for over the
//                      owner's audit socket before and after, must not change.
//   --mode replay      the same session, in epoch 2: replays its epoch-1 resume, heartbeat,
//                      detach and connect request; then, with a live producer's credentials file
//                      (--credentials), that session's previous-epoch resume, heartbeat, detach
//                      and connect and its current-epoch connect while its QP is connected. Every
//                      one must be refused.
//
// rdmaring-chaos-probe --mode M --address OWNER --port CONTROL --source ADDR --owner-socket PATH
//                      [--credentials FILE]
// Prints one line "probe MODE: checks=N accepted=A ..." and exits 0 when A is 0 (and the stale
// write failed with a remote access error, the ring unchanged), 1 when something was accepted,
// 2 when the probe itself could not run (not a verdict).
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cinttypes>
#include <cstring>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../softroce/credentials_file.hpp"
#include "../softroce/raw_producer.hpp"
#include "rdmaring/producer.hpp"

using namespace rdmaring;
using namespace std::chrono_literals;

namespace {

struct Args {
  std::string mode, address, source, owner_socket, credentials;
  std::uint16_t port = 0;
};

struct Inconclusive : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct OwnerView {
  bool found = false;
  std::uint64_t epoch = 0;
  std::string state;
  std::uint32_t crc = 0;
};

// One query on the owner's audit socket (chaos_owner.cpp).
OwnerView ask_owner(const std::string& path, SessionId session) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  std::snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path.c_str());
  if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
    if (fd >= 0) ::close(fd);
    throw Inconclusive("owner audit socket " + path + ": " + std::strerror(errno));
  }
  const std::string q = "Q " + std::to_string(session) + "\n";
  (void)!::write(fd, q.data(), q.size());
  std::string reply;
  char buf[256];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof buf)) > 0) reply.append(buf, static_cast<std::size_t>(n));
  ::close(fd);
  OwnerView v;
  std::istringstream in(reply);
  std::string kv;
  while (in >> kv) {
    const auto eq = kv.find('=');
    if (eq == std::string::npos) continue;
    const std::string k = kv.substr(0, eq), val = kv.substr(eq + 1);
    if (k == "found") v.found = val == "1";
    else if (k == "epoch") v.epoch = std::stoull(val);
    else if (k == "state") v.state = val;
    else if (k == "crc") v.crc = static_cast<std::uint32_t>(std::stoul(val));
  }
  return v;
}

// The owner runs in another process: what it made of the probe's session is asked of its audit
// socket.
struct RawSession : testing::RawProducer {
  const Args& args;

  explicit RawSession(const Args& a) : testing::RawProducer(a.address, a.port, a.source), args(a) {}

  void attach() {
    auto g = control.attach();
    if (!g) throw Inconclusive("attach: " + g.error().message());
    grant = g.value();
  }

  // Waits until the owner reports the session connected in `epoch` (its ESTABLISHED event is
  // handled on the owner's control thread, after ours).
  void await_connected(std::uint64_t epoch) {
    const auto deadline = std::chrono::steady_clock::now() + 20s;
    for (;;) {
      const auto v = ask_owner(args.owner_socket, grant.session);
      if (v.found && v.epoch == epoch && v.state == "connected") return;
      if (std::chrono::steady_clock::now() > deadline)
        throw Inconclusive("the owner does not report session " + std::to_string(grant.session) +
                           " connected in epoch " + std::to_string(epoch) + " (state " + v.state + ", epoch " +
                           std::to_string(v.epoch) + ")");
      std::this_thread::sleep_for(20ms);
    }
  }

  // Attach, connect epoch 1, resume to epoch 2, connect it. Returns the epoch-1 rkey.
  std::uint32_t into_epoch_two(bool write_in_epoch_one, std::vector<std::string>& notes) {
    attach();
    connect(hello(1));
    const std::uint32_t old_rkey = grant.ring_rkey;
    if (write_in_epoch_one) {
      const auto st = write(old_rkey, 60s);
      if (st != IBV_WC_SUCCESS)
        throw Inconclusive(std::string("the epoch-1 write with the epoch-1 rkey failed: ") + ibv_wc_status_str(st));
      notes.push_back("epoch1_write=ok");
    }
    auto g2 = resume(grant.session, grant.secret, 1);
    if (!g2) throw Inconclusive("resume to epoch 2: " + g2.error().message());
    const SessionSecret secret = grant.secret;
    grant = g2.value();
    grant.secret = secret;
    if (grant.at.epoch != 2) throw Inconclusive("resume granted epoch " + std::to_string(grant.at.epoch));
    connect(hello(2));
    await_connected(2);
    return old_rkey;
  }
};

struct Tally {
  int checks = 0;
  int accepted = 0;
  std::vector<std::string> notes;
  void refused(const std::string& what, bool was_refused, const std::string& detail = {}) {
    ++checks;
    if (!was_refused) ++accepted;
    notes.push_back(what + "=" + (was_refused ? "refused" : "ACCEPTED") + (detail.empty() ? "" : "(" + detail + ")"));
  }
};

bool connect_refused(RawSession& raw, const wire::ConnectData& hello, std::string& detail) {
  try {
    raw.connect(hello);
    return false;
  } catch (const SetupError& e) {
    detail = e.error() == errc::timed_out ? "timed out" : "rejected";
    return true;
  }
}

int stale_rkey(const Args& args) {
  RawSession raw(args);
  Tally t;
  const std::uint32_t old_rkey = raw.into_epoch_two(true, t.notes);
  if (raw.grant.ring_rkey == old_rkey) t.notes.push_back("rkey_unchanged_across_resume");
  const auto before = ask_owner(args.owner_socket, raw.grant.session);
  const auto status = raw.write(old_rkey, 60s);
  const auto after = ask_owner(args.owner_socket, raw.grant.session);
  if (!before.found || !after.found) throw Inconclusive("the owner lost the probe's session during the write");
  ++t.checks;
  const bool failed_right = status == IBV_WC_REM_ACCESS_ERR;
  const bool unchanged = before.crc == after.crc;
  if (!failed_right || !unchanged) ++t.accepted;
  t.notes.push_back(std::string("stale_write=") + ibv_wc_status_str(status));
  t.notes.push_back(std::string("ring=") + (unchanged ? "unchanged" : "CHANGED"));
  // The QP is in error now; the session ends with its current epoch's detach.
  const auto d = raw.detach(raw.grant.session, raw.grant.secret, 2);
  std::cout << "probe stale-rkey: session " << raw.grant.session << " checks=" << t.checks
            << " accepted=" << t.accepted;
  for (const auto& n : t.notes) std::cout << " " << n;
  std::cout << " detach=" << (d ? "ok" : d.error().message()) << std::endl;
  return t.accepted == 0 && raw.grant.ring_rkey != old_rkey ? 0 : 1;
}

int replay(const Args& args) {
  RawSession raw(args);
  Tally t;
  raw.into_epoch_two(false, t.notes);
  const SessionId own = raw.grant.session;
  const SessionSecret secret = raw.grant.secret;
  {
    auto r = raw.resume(own, secret, 1);
    t.refused("own_resume_e1", !r, r ? "" : r.error().message());
    auto h = raw.heartbeat(own, secret, 1);
    t.refused("own_heartbeat_e1", !h);
    auto d = raw.detach(own, secret, 1);
    t.refused("own_detach_e1", !d);
    std::string detail;
    t.refused("own_connect_e1", connect_refused(raw, raw.hello(1), detail), detail);
  }
  // A live producer's session: its secret from its credentials file, its epoch from the owner.
  if (!args.credentials.empty()) {
    const auto c = testing::load_credentials(args.credentials);
    if (!c) {
      t.notes.push_back("live=no_credentials");
    } else {
      const auto v = ask_owner(args.owner_socket, c->session);
      if (!v.found || v.state != "connected") {
        t.notes.push_back("live=not_connected(" + v.state + ")");
      } else {
        const std::uint64_t e = v.epoch;
        t.notes.push_back("live_session=" + std::to_string(c->session) + "@" + std::to_string(e));
        std::string detail;
        if (e >= 2) {
          auto r = raw.resume(c->session, c->secret, e - 1);
          t.refused("live_resume_prev", !r, r ? "" : r.error().message());
          auto h = raw.heartbeat(c->session, c->secret, e - 1);
          t.refused("live_heartbeat_prev", !h);
          auto d = raw.detach(c->session, c->secret, e - 1);
          t.refused("live_detach_prev", !d);
          t.refused("live_connect_prev", connect_refused(raw, raw.hello(c->session, c->secret, e - 1), detail), detail);
        }
        t.refused("live_connect_current", connect_refused(raw, raw.hello(c->session, c->secret, e), detail), detail);
      }
    }
  }
  const auto d = raw.detach(own, secret, 2);
  std::cout << "probe replay: session " << own << " checks=" << t.checks << " accepted=" << t.accepted;
  for (const auto& n : t.notes) std::cout << " " << n;
  std::cout << " detach=" << (d ? "ok" : d.error().message()) << std::endl;
  return t.accepted == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--mode") a.mode = v;
    else if (k == "--address") a.address = v;
    else if (k == "--port") a.port = static_cast<std::uint16_t>(std::stoul(v));
    else if (k == "--source") a.source = v;
    else if (k == "--owner-socket") a.owner_socket = v;
    else if (k == "--credentials") a.credentials = v;
    else {
      std::cerr << "chaos-probe: unknown option " << k << "\n";
      return 2;
    }
  }
  try {
    if (a.mode == "stale-rkey") return stale_rkey(a);
    if (a.mode == "replay") return replay(a);
    std::cerr << "chaos-probe: --mode stale-rkey|replay\n";
    return 2;
  } catch (const std::exception& e) {
    std::cout << "probe " << a.mode << ": inconclusive: " << e.what() << std::endl;
    return 2;
  }
}
