// `rdmaring listen`: a ring owner that writes every record it receives to stdout (or a file),
// framed as lines or length-prefixed, as netcat -l does with bytes. It sleeps when idle: one epoll
// over the owner's fd() (protocol-spec/wakeup.md) and a signalfd for SIGINT/SIGTERM; a session's
// end makes fd() readable too, so the last detach ends it without a timer. The control channel
// is mutual TLS (--ca, --cert, --key; --allow says which producer identities may attach and how
// much they may hold), or plain TCP with --insecure-plaintext (security_options.hpp).
#include <signal.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <system_error>
#include <thread>

#include "commands.hpp"
#include "endpoint_options.hpp"
#include "rdmaring/idle_strategy.hpp"
#include "rdmaring/ring_owner.hpp"
#include "security_options.hpp"
#include "unique_fd.hpp"
#include "wire_names.hpp"

namespace rdmaring::tools {

namespace {

struct ListenOptions {
  Endpoint endpoint;
  SecurityFlags security;
  std::vector<std::string> allow;  // --allow PATTERN[:SESSIONS[:RING_BYTES]], in order
  std::string output;  // empty: stdout
  wire::PublishMode mode = wire::PublishMode::imm;
  std::uint64_t ring = 1 << 20;
  std::uint32_t max_record = 64 * 1024;
  wire::PayloadCheck payload_check = wire::PayloadCheck::crc32c;
  std::uint64_t records = 0;  // 0: until the producers are gone
  bool keep_listening = false;
};

struct Tally {
  std::uint64_t records = 0;
  std::uint64_t bytes = 0;
  std::atomic<std::uint64_t> sessions_closed{0};
};

[[noreturn]] void system_failure(const char* what) { throw std::system_error(errno, std::generic_category(), what); }

int run_listen(const ListenOptions& o) {
  // Wrong together: refused (exit status 2) before anything is opened.
  require_security(o.security);
  const std::vector<IdentityRule> allow = allow_rules(o.allow);
  // Blocked before the owner's threads start, so that they inherit the mask and the signals
  // arrive at the signalfd only.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  if (pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr) != 0) system_failure("pthread_sigmask");
  // A reader that went away is EPIPE from the write, reported, rather than a silent death.
  signal(SIGPIPE, SIG_IGN);
  const UniqueFd signals(signalfd(-1, &stop_signals, SFD_CLOEXEC | SFD_NONBLOCK));
  if (!signals) system_failure("signalfd");

  Tally tally;
  RingOwnerOptions options{.address = o.endpoint.address,
                           .control_port = o.endpoint.port,
                           .ring_bytes = o.ring,
                           .max_record = o.max_record,
                           .mode = o.mode};
  options.core.payload_check = o.payload_check;
  options.security = owner_security(o.security);
  options.allow = allow;
  options.on_session_closed = [&tally](SessionId, CloseReason, const std::string&) {
    tally.sessions_closed.fetch_add(1, std::memory_order_relaxed);
  };
  const auto owner = RingOwner::start(options);
  // Opened once the owner runs: a refused start leaves no empty file behind.
  std::FILE* out = stdout;
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> file(nullptr, &std::fclose);
  if (!o.output.empty()) {
    file.reset(std::fopen(o.output.c_str(), "wb"));
    if (!file) throw std::system_error(errno, std::generic_category(), "opening " + o.output);
    out = file.get();
  }

  if (!o.endpoint.quiet)
    std::cerr << "rdmaring listen: owner on " << o.endpoint.address << " control port " << owner->control_port()
              << ", " << security_words(o.security)
              << (allow.empty() ? std::string{}
                                : ", " + std::to_string(allow.size()) + (allow.size() == 1 ? " allow rule" : " allow rules"))
              << ", mode " << (o.mode == wire::PublishMode::imm ? "imm" : "tail") << ", " << o.ring
              << " B ring per producer" << std::endl;

  const UniqueFd ep(epoll_create1(EPOLL_CLOEXEC));
  if (!ep) system_failure("epoll_create1");
  for (const int fd : {owner->fd(), signals.get()}) {
    epoll_event ev{.events = EPOLLIN, .data = {.fd = fd}};
    if (epoll_ctl(ep.get(), EPOLL_CTL_ADD, fd, &ev) != 0) system_failure("epoll_ctl");
  }

  const auto start = std::chrono::steady_clock::now();
  bool write_failed = false, stopped = false;
  auto handler = [&](const Delivery& d) {
    if (!write_record(out, o.endpoint.framing, d.payload)) {
      write_failed = true;
      return HandlerAction::abort;  // not handled: it stays in the ring, not lost in a pipe
    }
    ++tally.records;
    tally.bytes += d.payload.size();
    return o.records != 0 && tally.records == o.records ? HandlerAction::stop : HandlerAction::consume;
  };
  const auto done = [&] {
    if (o.records != 0) return tally.records >= o.records;
    return !o.keep_listening && tally.sessions_closed.load(std::memory_order_relaxed) > 0 &&
           owner->session_count() == 0;
  };
  IdleStrategy idle;
  for (;;) {
    const auto polled = owner->poll(handler, 256);
    if (!polled) throw SetupError(polled.error());
    if (write_failed || std::fflush(out) != 0) {
      std::cerr << "rdmaring listen: writing " << (o.output.empty() ? "stdout" : o.output) << ": "
                << std::strerror(errno) << " after " << tally.records << " records" << std::endl;
      return 1;
    }
    if (polled.value() > 0) {
      idle.reset();
      if (done() || stopped) break;
      continue;
    }
    // Nothing waiting: a session that closed has had its last record taken by this poll.
    if (done() || stopped) break;
    const IdleStrategy::Step step = idle.next(0);
    if (step == IdleStrategy::Step::yield) std::this_thread::yield();
    if (step != IdleStrategy::Step::sleep) continue;
    const auto armed = owner->arm();
    if (!armed) throw SetupError(armed.error());
    if (!armed.value()) continue;
    epoll_event events[2];
    const int n = epoll_wait(ep.get(), events, 2, -1);
    if (n < 0 && errno != EINTR) system_failure("epoll_wait");
    for (int i = 0; i < n; ++i)
      if (events[i].data.fd == signals.get()) stopped = true;  // one more poll, then out
  }

  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const std::uint64_t producers = tally.sessions_closed.load();
  // Producers turned away at the door: no certificate, or one the CA did not sign.
  const std::uint64_t handshakes_failed = owner->stats().handshakes_failed;
  report(o.endpoint,
         {{"command", "listen"},
          {"records", tally.records},
          {"bytes", tally.bytes},
          {"sessions_closed", producers},
          {"seconds", seconds},
          {"stopped_by_signal", stopped},
          {"insecure_plaintext", o.security.insecure_plaintext},
          {"handshakes_failed", handshakes_failed}},
         "rdmaring listen: " + std::to_string(tally.records) + " records, " + std::to_string(tally.bytes) +
             " bytes from " + std::to_string(producers) + (producers == 1 ? " producer" : " producers") + " in " +
             std::to_string(seconds) + " s" +
             (handshakes_failed == 0 ? std::string{}
                                     : "; " + std::to_string(handshakes_failed) + " TLS handshake(s) refused"));
  return 0;
}

}  // namespace

Command add_listen_command(CLI::App& parent) {
  auto o = std::make_shared<ListenOptions>();
  CLI::App* app = parent.add_subcommand(
      "listen", "Own a ring and write every record it receives to stdout (or --output), as netcat -l does");
  add_endpoint_options(*app, o->endpoint, "the local address to listen on (an RDMA device's)");
  add_security_options(*app, o->security, SecuritySide::owner);
  add_allow_option(*app, o->allow);
  app->add_option("-o,--output", o->output, "write the records to this file instead of stdout");
  app->add_option("-m,--mode", o->mode, "how producers publish: imm (RDMA_WRITE_WITH_IMM) or tail (a tail record)")
      ->transform(one_of(kPublishModeNames))
      ->default_str("imm");
  app->add_option("--ring", o->ring, "ring bytes per producer (a power of two)")->transform(whole_number(1))->capture_default_str();
  app->add_option("--max-record", o->max_record, "largest record a producer may send, bytes")
      ->transform(whole_number(1))
      ->capture_default_str();
  app->add_option("--payload-check", o->payload_check, "crc32c: every record's payload checked; none")
      ->transform(one_of(kPayloadCheckNames))
      ->default_str("crc32c");
  app->add_option("-n,--records", o->records, "stop after this many records (default: once every producer detached)")
      ->transform(whole_number(1));
  app->add_flag("-k,--keep-listening", o->keep_listening, "keep listening after the producers detached (stop: SIGINT)");
  return {app, [o] { return run_listen(*o); }};
}

}  // namespace rdmaring::tools
