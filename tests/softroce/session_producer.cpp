// A producer process for the session tests: attaches (or, when its credentials file exists,
// rejoins the session in it after a restart), keeps the file current at every epoch, and sends
// records session_records.hpp defines up to --records, recovering from every connection failure.
// The tests kill it with SIGKILL at arbitrary points and start it again.
//
// rdmaring-session-producer --address A --port P --credentials FILE --records N
//                           [--fault-every K] [--source ADDR] [--mode-note TEXT]
//                           [--heartbeat-ms MS] [--tag T] [--signals 1] [--log-recoveries 1]
//                           [--recover-attempts N] [--start-attempts N] [--rate-hz R]
//                           [--detach-retries N]
// For tests/chaos: --heartbeat-ms sets ProducerOptions::heartbeat_interval; --tag T sends the
// chaos records of producer T (tests/chaos/chaos_records.hpp) instead of session_records.hpp's;
// --signals 1 makes SIGUSR1 force the QP to the error state at the next record and SIGTERM end
// the run at the next record (detach, remove the credentials file, exit 0); --log-recoveries 1
// prints a line with the CLOCK_MONOTONIC time (t=ns) at start, at every recovery and at the end;
// --recover-attempts (default 50) and --start-attempts (default 1) bound the retries of a
// recovery and of the first attach/rejoin while the owner does not answer; --rate-hz R sends at
// most R records a second (0, the default: as fast as the ring allows); --detach-retries N
// retries a detach that failed on the control channel (a cut connection fails one call), and
// then takes unknown_session as done: the failed attempt may have reached the owner after the
// drain.
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <string>
#include <thread>

#include "../chaos/chaos_records.hpp"
#include "credentials_file.hpp"
#include "producer_test_access.hpp"
#include "rdmaring/producer.hpp"
#include "session_records.hpp"
#include "test_pki.hpp"

using namespace rdmaring;

namespace {

volatile sig_atomic_t g_force_error = 0;
volatile sig_atomic_t g_finish = 0;
void on_usr1(int) { g_force_error = 1; }
void on_term(int) { g_finish = 1; }

bool g_log_recoveries = false;
int g_recover_attempts = 50;

std::uint64_t monotonic_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1000000000u + static_cast<std::uint64_t>(ts.tv_nsec);
}

// Recovers until the owner answers (a cut control connection costs one failed call).
void recover(Producer& p, const std::string& credentials, const Error& cause) {
  int attempt = 0;
  for (;; ++attempt) {
    auto r = p.recover();
    if (r) break;
    if (attempt == g_recover_attempts || (r.error() != errc::control_failure && r.error() != errc::timed_out &&
                                          r.error() != errc::verbs_failure))
      throw SetupError(r.error());
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  testing::save_credentials(credentials, p.credentials());
  if (g_log_recoveries)
    std::cerr << "session-producer " << getpid() << ": recovered session " << p.credentials().session << " epoch "
              << p.credentials().epoch << " at sequence " << p.next_sequence() << " after " << attempt + 1
              << " attempt(s), cause: " << cause.message() << " t=" << monotonic_ns() << std::endl;
}

}  // namespace

int main(int argc, char** argv) {
  ProducerOptions o;
  // The test PKI's producer-a unless --identity names another of its certificates, or
  // --insecure-plaintext 1 (an owner started plain).
  o.security = test_pki::producer();
  std::string credentials;
  std::uint64_t records = 0, fault_every = 0;
  std::uint32_t tag = 0;
  bool tagged = false, signals = false;
  int start_attempts = 1;
  std::uint64_t rate_hz = 0;
  int detach_retries = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--address") o.address = v;
    else if (k == "--port") o.control_port = static_cast<std::uint16_t>(std::stoul(v));
    else if (k == "--credentials") credentials = v;
    else if (k == "--records") records = std::stoull(v);
    else if (k == "--fault-every") fault_every = std::stoull(v);
    else if (k == "--source") o.source_address = v;
    else if (k == "--heartbeat-ms") o.heartbeat_interval = std::chrono::milliseconds(std::stoll(v));
    else if (k == "--tag") tagged = true, tag = static_cast<std::uint32_t>(std::stoul(v));
    else if (k == "--signals") signals = v == "1";
    else if (k == "--log-recoveries") g_log_recoveries = v == "1";
    else if (k == "--recover-attempts") g_recover_attempts = std::stoi(v);
    else if (k == "--start-attempts") start_attempts = std::max(1, std::stoi(v));
    else if (k == "--rate-hz") rate_hz = std::stoull(v);
    else if (k == "--detach-retries") detach_retries = std::stoi(v);
    else if (k == "--identity") o.security = test_pki::producer(v);
    else if (k == "--insecure-plaintext" && v == "1") o.security = ControlSecurity{.insecure_plaintext = true};
    else {
      std::cerr << "session-producer: unknown option " << k << "\n";
      return 2;
    }
  }
  if (signals) {
    signal(SIGUSR1, on_usr1);
    signal(SIGTERM, on_term);
  }
  // Each epoch's credentials are on disk before its QP connects: once it has, the owner no longer
  // admits a resume from the epoch before, so a process killed between the connect and a save
  // after recover() returned could not rejoin.
  o.on_credentials = [&credentials](const SessionCredentials& c) { testing::save_credentials(credentials, c); };
  try {
    const auto saved = testing::load_credentials(credentials);
    auto open = [&] {
      for (int attempt = 1;; ++attempt) {
        try {
          return saved ? Producer::rejoin(o, *saved) : Producer::attach(o);
        } catch (const SetupError& e) {
          if (attempt >= start_attempts || (e.error() != errc::control_failure && e.error() != errc::timed_out &&
                                            e.error() != errc::verbs_failure))
            throw;
          std::cerr << "session-producer " << getpid() << ": start attempt " << attempt << ": " << e.what()
                    << std::endl;
          std::this_thread::sleep_for(std::chrono::milliseconds(200));
        }
      }
    };
    Producer p = open();
    testing::save_credentials(credentials, p.credentials());
    std::cerr << "session-producer " << getpid() << ": " << (saved ? "rejoined" : "attached") << " session "
              << p.credentials().session << " epoch " << p.credentials().epoch << " at sequence "
              << p.next_sequence() << std::endl;
    if (g_log_recoveries)
      std::cerr << "session-producer " << getpid() << ": start session " << p.credentials().session << " epoch "
                << p.credentials().epoch << " at sequence " << p.next_sequence() << " t=" << monotonic_ns()
                << std::endl;
    // Pacing: the record due now, a burst of at most 100 ms to catch up after a stall.
    using PaceClock = std::chrono::steady_clock;
    const auto period = rate_hz ? std::chrono::nanoseconds(1000000000 / rate_hz) : std::chrono::nanoseconds(0);
    auto due = PaceClock::now();
    for (std::uint64_t seq = p.next_sequence(); seq < records && !g_finish;) {
      if (rate_hz) {
        const auto now = PaceClock::now();
        if (now + std::chrono::milliseconds(2) < due) {
          if (auto pr = p.progress(); !pr && needs_recover(pr.error())) recover(p, credentials, pr.error());
          std::this_thread::sleep_for(due - PaceClock::now());
        } else if (now > due + std::chrono::milliseconds(100)) {
          due = now;
        }
        due += period;
      }
      if (g_force_error) {
        g_force_error = 0;
        const auto forced = ProducerTestAccess::force_error(p);
        if (g_log_recoveries)
          std::cerr << "session-producer " << getpid() << ": forced the QP to error at sequence " << seq
                    << (forced ? "" : " (failed: " + forced.error().message() + ")") << " t=" << monotonic_ns()
                    << std::endl;
      }
      const auto payload = tagged ? chaos::record_bytes(tag, seq) : testing::record_bytes(seq);
      auto r = p.send(payload, std::chrono::seconds(30));
      if (r) {
        ++seq;
        if (fault_every && seq % fault_every == 0) (void)ProducerTestAccess::force_error(p);
        continue;
      }
      if (!needs_recover(r.error())) throw SetupError(r.error());
      recover(p, credentials, r.error());
    }
    for (int failed_calls = 0;;) {
      auto r = p.detach(std::chrono::seconds(60));
      if (r) break;
      if (failed_calls > 0 && r.error() == errc::unknown_session) break;
      if (failed_calls < detach_retries && (r.error() == errc::control_failure || r.error() == errc::timed_out)) {
        ++failed_calls;
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        continue;
      }
      if (!needs_recover(r.error())) throw SetupError(r.error());
      recover(p, credentials, r.error());
    }
    std::filesystem::remove(credentials);
    if (g_log_recoveries)
      std::cerr << "session-producer " << getpid() << ": finished session " << p.credentials().session
                << " next_sequence " << p.next_sequence() << " t=" << monotonic_ns() << std::endl;
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "session-producer " << getpid() << ": " << e.what() << std::endl;
    return 1;
  }
}
