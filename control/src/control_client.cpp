#include "control_client.hpp"

#include <capnp/rpc-twoparty.h>

#include <atomic>
#include <mutex>

#include "event_loop_thread.hpp"

namespace rdmaring::control {

struct ControlClient::Loop {
  std::string host;
  std::uint16_t port;
  std::chrono::milliseconds timeout;

  // Owned by the control thread: made, used and destroyed there.
  kj::AsyncIoContext* io = nullptr;
  // The owner's replies are read with the same limits the owner applies to requests.
  struct Connection {
    kj::Own<kj::AsyncIoStream> stream;
    capnp::TwoPartyVatNetwork network;
    capnp::RpcSystem<capnp::rpc::twoparty::VatId> rpc;
    schema::RingService::Client service;
    explicit Connection(kj::Own<kj::AsyncIoStream> s)
        : stream(kj::mv(s)),
          network(*stream, capnp::rpc::twoparty::Side::CLIENT, capnp::ReaderOptions{kTraversalLimitWords, kNestingLimit}),
          rpc(capnp::makeRpcClient(network)),
          service(bootstrap(rpc)) {}
    static schema::RingService::Client bootstrap(capnp::RpcSystem<capnp::rpc::twoparty::VatId>& rpc) {
      capnp::word scratch[4] = {};
      capnp::MallocMessageBuilder message(scratch);
      auto owner = message.getRoot<capnp::rpc::twoparty::VatId>();
      owner.setSide(capnp::rpc::twoparty::Side::SERVER);
      return rpc.bootstrap(owner).castAs<schema::RingService>();
    }
  };
  kj::Maybe<kj::Own<Connection>> connection;
  kj::Maybe<kj::Promise<void>> heartbeats;
  int failed_beats = 0;  // control thread only

  // Written by the control thread, read by the producer's: the flag is the cheap check.
  std::atomic<bool> alarmed{false};
  mutable std::mutex alarm_mutex;
  std::optional<Error> alarm;
  void raise(Error e) {
    std::lock_guard lock(alarm_mutex);
    alarm = std::move(e);
    alarmed.store(true, std::memory_order_release);
  }
  void clear() {
    std::lock_guard lock(alarm_mutex);
    alarm.reset();
    alarmed.store(false, std::memory_order_release);
  }

  std::optional<EventLoopThread> thread;

  kj::Duration kj_timeout() const { return static_cast<std::int64_t>(timeout.count()) * kj::MILLISECONDS; }

  // The service, connecting first when there is no live connection.
  kj::Promise<schema::RingService::Client> service() {
    KJ_IF_MAYBE(c, connection) { return (*c)->service; }
    auto connect = io->provider->getNetwork().parseAddress(host, port).then(
        [](kj::Own<kj::NetworkAddress> a) { return a->connect(); });
    return io->provider->getTimer()
        .timeoutAfter(kj_timeout(), kj::mv(connect))
        .then([this](kj::Own<kj::AsyncIoStream> stream) -> schema::RingService::Client {
          auto c = kj::heap<Connection>(kj::mv(stream));
          auto client = c->service;
          connection = kj::mv(c);
          return client;
        });
  }

  // Bounds a call by the timeout; a failed call drops the connection so the next one reconnects.
  template <class T>
  kj::Promise<T> bounded(kj::Promise<T> call) {
    return io->provider->getTimer().timeoutAfter(kj_timeout(), kj::mv(call)).catch_([this](kj::Exception&& e) -> kj::Promise<T> {
      connection = nullptr;
      return kj::mv(e);
    });
  }
};

ControlClient::ControlClient(const std::string& host, std::uint16_t port, std::chrono::milliseconds timeout)
    : loop_(std::make_unique<Loop>()) {
  Loop& l = *loop_;
  l.host = host;
  l.port = port;
  l.timeout = timeout;
  try {
    l.thread.emplace(
        [&l](kj::AsyncIoContext& io) {
          l.io = &io;
          l.service().wait(io.waitScope);
        },
        [&l] {
          l.heartbeats = nullptr;
          l.connection = nullptr;
        },
        kThreadName);
  } catch (const SetupError& e) {
    throw SetupError(make_error(errc::control_failure, "control channel to " + host + ":" + std::to_string(port) +
                                                           ": " + e.error().context));
  }
}

ControlClient::~ControlClient() = default;

Result<RingGrant> ControlClient::attach() {
  Loop& l = *loop_;
  return l.thread->call("attach", [&l] {
    return l.bounded(l.service().then([](schema::RingService::Client s) {
      auto request = s.attachRequest();
      request.setVersion(wire::kVersion);
      return request.send().then([](capnp::Response<schema::RingService::AttachResults>&& r) {
        return read(r.getReply(), true);
      });
    }));
  });
}

Result<RingGrant> ControlClient::resume(const Credentials& who, bool restarted, std::uint64_t released,
                                        std::uint64_t released_sequence) {
  Loop& l = *loop_;
  return l.thread->call("resume", [&] {
    return l.bounded(l.service().then([&](schema::RingService::Client s) {
      auto request = s.resumeRequest();
      write(request.initWho(), who);
      request.setRestarted(restarted);
      request.setReleased(released);
      request.setReleasedSequence(released_sequence);
      return request.send().then([](capnp::Response<schema::RingService::ResumeResults>&& r) {
        return read(r.getReply(), false);
      });
    }));
  });
}

namespace {

// heartbeat and detach answer alike: ok, or a refusal.
template <class Results>
Result<void> answered(const Results& r) {
  if (r.getOk()) return success();
  return read(r.getRefused());
}

// A call whose only parameter is `who` and whose answer is ok-or-refusal; `make` picks the method.
template <class MakeRequest>
kj::Promise<Result<void>> who_call(kj::Promise<schema::RingService::Client> service, const Credentials& who,
                                   MakeRequest make) {
  return service.then([&who, make](schema::RingService::Client s) {
    auto request = make(s);
    write(request.initWho(), who);
    return request.send().then([](auto&& r) { return answered(r); });
  });
}

}  // namespace

Result<void> ControlClient::heartbeat(const Credentials& who) {
  Loop& l = *loop_;
  return l.thread->call("heartbeat", [&] {
    return l.bounded(who_call(l.service(), who, [](auto& s) { return s.heartbeatRequest(); }));
  });
}

Result<void> ControlClient::detach(const Credentials& who) {
  Loop& l = *loop_;
  return l.thread->call("detach", [&] {
    return l.bounded(who_call(l.service(), who, [](auto& s) { return s.detachRequest(); }));
  });
}

void ControlClient::keep_alive(SessionId session, const SessionSecret& secret, std::uint64_t epoch,
                               std::chrono::milliseconds interval) {
  Loop& l = *loop_;
  (void)l.thread->call("keep_alive", [&l, session, secret, epoch, interval]() -> Result<void> {
    l.heartbeats = nullptr;
    l.failed_beats = 0;
    l.clear();
    if (interval.count() == 0) return success();
    const auto delay = static_cast<std::int64_t>(interval.count()) * kj::MILLISECONDS;
    const Proof proof = make_proof(secret, ProofPurpose::heartbeat, session, epoch);
    // One beat, then the next. A refused beat (the session moved on or is gone) raises the alarm
    // and ends the chain; unanswered beats (owner down, connection cut) raise it after
    // kOwnerLostBeats in a row, and go on, each on a new connection.
    struct Beat {
      static kj::Promise<void> next(Loop& loop, kj::Duration d, SessionId s, std::uint64_t e, Proof p) {
        return loop.io->provider->getTimer().afterDelay(d).then([&loop, d, s, e, p]() {
          return loop.bounded(loop.service().then([s, e, p](schema::RingService::Client svc) {
                   auto request = svc.heartbeatRequest();
                   write(request.initWho(), Credentials{s, e, p});
                   return request.send().then(
                       [](capnp::Response<schema::RingService::HeartbeatResults>&& r) { return answered(r); });
                 }))
              .then(
                  [&loop](Result<void> r) {
                    loop.failed_beats = 0;
                    if (!r) loop.raise(r.error());
                    return bool(r);
                  },
                  [&loop](kj::Exception&& x) {
                    if (++loop.failed_beats >= kOwnerLostBeats)
                      loop.raise(make_error(errc::owner_lost, std::to_string(loop.failed_beats) +
                                                                  " heartbeats unanswered, the last: " +
                                                                  std::string(x.getDescription().cStr())));
                    return true;
                  })
              .then([&loop, d, s, e, p](bool go_on) -> kj::Promise<void> {
                if (!go_on) return kj::READY_NOW;
                return next(loop, d, s, e, p);
              });
        });
      }
    };
    l.heartbeats = Beat::next(l, delay, session, epoch, proof).eagerlyEvaluate(nullptr);
    return success();
  });
}

std::optional<Error> ControlClient::alarm() const {
  if (!loop_->alarmed.load(std::memory_order_acquire)) return std::nullopt;
  std::lock_guard lock(loop_->alarm_mutex);
  return loop_->alarm;
}

}  // namespace rdmaring::control
