// The producer's end of the control channel: attach, resume, heartbeat and detach calls to the
// ring owner, made from the producer's thread and carried out on a control thread. Each
// connection is TLS (unless insecure_plaintext) and starts with hello, whose nonce every proof
// on it covers, with a counter per call (sessions.md §3): the proofs are made here, on the
// control thread, from the session's secret. The connection is made again on the next call after
// it broke, so a cut control connection costs one failed call, not the session.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "messages.hpp"
#include "rdmaring/control_security.hpp"
#include "rdmaring/producer.hpp"

namespace rdmaring::control {

class ControlClient {
 public:
  // The control thread's name, as producer.hpp states it.
  static constexpr const char* kThreadName = "rdmaring-ctl";

  // Connects to the owner's control port and says hello. Throws: SetupError bad_config (the
  // TLS material), control_failure (refused, timed out, the TLS handshake failed), the hello's
  // refusal (unauthenticated, protocol_violation). `on_alarm` (may be empty) runs on the control
  // thread, no lock held, each time the alarm is raised: it wakes a producer asleep.
  ControlClient(const std::string& host, std::uint16_t port, std::chrono::milliseconds timeout,
                const ControlSecurity& security, std::function<void()> on_alarm = {});
  ~ControlClient();

  Result<RingGrant> attach();
  // `who.epoch`: the epoch the call speaks for (resume: the one being left).
  Result<RingGrant> resume(const SessionCredentials& who, bool restarted, std::uint64_t released,
                           std::uint64_t released_sequence);
  Result<void> heartbeat(const SessionCredentials& who);
  Result<void> detach(const SessionCredentials& who);

  // From now on the control thread heartbeats for this session and epoch every `interval` (zero:
  // never); a refused heartbeat stops it. Clears the alarm.
  void keep_alive(const SessionCredentials& who, std::chrono::milliseconds interval);
  // Set when heartbeats say the session is gone: refused (unknown_session, stale_epoch), or
  // kOwnerLostBeats in a row unanswered (owner_lost). Cheap: the data path checks it.
  std::optional<Error> alarm() const;
  static constexpr int kOwnerLostBeats = 2;

 private:
  struct Loop;
  std::unique_ptr<Loop> loop_;
};

}  // namespace rdmaring::control
