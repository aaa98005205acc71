#include "control_client.hpp"

#include <capnp/rpc-twoparty.h>

#include <atomic>
#include <mutex>

#include "control_tls.hpp"
#include "event_loop_thread.hpp"

namespace rdmaring::control {

namespace {

// heartbeat and detach answer alike: ok, or a refusal.
template <class Results>
Result<void> answered(const Results& r) {
  if (r.getOk()) return success();
  return read(r.getRefused());
}

}  // namespace

struct ControlClient::Loop {
  std::string host;
  std::uint16_t port;
  std::chrono::milliseconds timeout;
  ControlSecurity security;

  // Owned by the control thread: made, used and destroyed there.
  kj::AsyncIoContext* io = nullptr;
  std::optional<ControlTls> tls;  // none: insecure_plaintext
  // Refcounted: a call that got it keeps it while a failing call on another promise drops it.
  struct Connection : kj::Refcounted {
    kj::Own<kj::AsyncIoStream> stream;
    // The owner's replies are read with the same limits the owner applies to requests.
    capnp::TwoPartyVatNetwork network;
    capnp::RpcSystem<capnp::rpc::twoparty::VatId> rpc;
    schema::RingService::Client service;
    Channel channel;            // hello's answer
    std::uint64_t counter = 0;  // the last one used on this connection
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
    // `who`'s credentials for one call on this connection: the next counter, and the proof over
    // it and the connection's nonce. `proof` must outlive the request's building.
    Credentials sign(const SessionCredentials& who, ProofPurpose purpose, Proof& proof) {
      const ChannelBinding binding{channel.nonce, ++counter};
      proof = make_control_proof(who.secret, purpose, who.session, who.epoch, binding);
      Credentials c{who.session, who.epoch, proof};
      c.binding = binding;
      return c;
    }
  };
  using Connected = Result<kj::Own<Connection>>;
  kj::Maybe<kj::Own<Connection>> connection;
  kj::Maybe<kj::Promise<void>> heartbeats;
  int failed_beats = 0;  // control thread only

  // Written by the control thread, read by the producer's: the flag is the cheap check.
  std::atomic<bool> alarmed{false};
  mutable std::mutex alarm_mutex;
  std::optional<Error> alarm;
  std::function<void()> on_alarm;
  void raise(Error e) {
    {
      std::lock_guard lock(alarm_mutex);
      alarm = std::move(e);
      alarmed.store(true, std::memory_order_release);
    }
    if (on_alarm) on_alarm();
  }
  void clear() {
    std::lock_guard lock(alarm_mutex);
    alarm.reset();
    alarmed.store(false, std::memory_order_release);
  }

  std::optional<EventLoopThread> thread;

  kj::Duration kj_timeout() const { return static_cast<std::int64_t>(timeout.count()) * kj::MILLISECONDS; }

  kj::Promise<kj::Own<kj::AsyncIoStream>> secured(kj::Own<kj::AsyncIoStream> stream) {
    if (!tls) return kj::mv(stream);
    const std::string name = security.server_name.empty() ? host : security.server_name;
    return tls->connect(kj::mv(stream), name).catch_([name](kj::Exception&& e) -> kj::Own<kj::AsyncIoStream> {
      kj::throwFatalException(kj::Exception(e.getType(), __FILE__, __LINE__,
                                            kj::str("TLS handshake (the owner's certificate must be the CA's and name ",
                                                    name.c_str(), "): ", e.getDescription())));
    });
  }

  // The live connection, made (connect, TLS, hello) when there is none. A refused hello is the
  // Result's error; a failure to connect is an exception.
  kj::Promise<Connected> connected() {
    KJ_IF_MAYBE(c, connection) { return Connected(kj::addRef(**c)); }
    auto connect = io->provider->getNetwork()
                       .parseAddress(host, port)
                       .then([](kj::Own<kj::NetworkAddress> a) { return a->connect(); })
                       .then([this](kj::Own<kj::AsyncIoStream> s) { return secured(kj::mv(s)); })
                       .then([](kj::Own<kj::AsyncIoStream> s) {
                         auto c = kj::refcounted<Connection>(kj::mv(s));
                         auto request = c->service.helloRequest();
                         request.setVersion(wire::kVersion);
                         return request.send().then(
                             [c = kj::mv(c)](capnp::Response<schema::RingService::HelloResults>&& r) mutable
                             -> Connected {
                               BOOST_OUTCOME_TRY(channel, read(r.getReply()));
                               c->channel = std::move(channel);
                               return Connected(kj::mv(c));
                             });
                       });
    return io->provider->getTimer().timeoutAfter(kj_timeout(), kj::mv(connect)).then([this](Connected&& c) {
      if (c) connection = kj::addRef(*c.value());
      return kj::mv(c);
    });
  }

  // `call(Connection&)` on the live connection, bounded by the timeout; a failed call drops the
  // connection so the next one reconnects.
  template <class T, class Call>
  kj::Promise<Result<T>> on_connection(Call call) {
    auto done = connected().then([call](Connected&& c) mutable -> kj::Promise<Result<T>> {
      if (!c) return Result<T>(c.error());
      Connection& conn = *c.value();
      return call(conn).attach(kj::mv(c.value()));
    });
    return io->provider->getTimer().timeoutAfter(kj_timeout(), kj::mv(done)).catch_([this](kj::Exception&& e) -> kj::Promise<Result<T>> {
      connection = nullptr;
      return kj::mv(e);
    });
  }
  // A call whose only parameter is `who` and whose answer is ok-or-refusal; `make` picks the
  // method.
  template <class MakeRequest>
  kj::Promise<Result<void>> who_call(const SessionCredentials& who, ProofPurpose purpose, MakeRequest make) {
    return on_connection<void>([who, purpose, make](Connection& c) {
      auto request = make(c.service);
      Proof proof;
      write(request.initWho(), c.sign(who, purpose, proof));
      return request.send().then([](auto&& r) { return answered(r); });
    });
  }
};

ControlClient::ControlClient(const std::string& host, std::uint16_t port, std::chrono::milliseconds timeout,
                             const ControlSecurity& security, std::function<void()> on_alarm)
    : loop_(std::make_unique<Loop>()) {
  if (auto ok = security.validate(false); !ok) throw SetupError(ok.error());
  Loop& l = *loop_;
  l.host = host;
  l.port = port;
  l.timeout = timeout;
  l.security = security;
  l.on_alarm = std::move(on_alarm);
  std::optional<Error> refused;
  try {
    l.thread.emplace(
        [&l, &refused](kj::AsyncIoContext& io) {
          l.io = &io;
          if (!l.security.insecure_plaintext) l.tls.emplace(l.security, false, io.provider->getTimer(), l.timeout);
          auto c = l.connected().wait(io.waitScope);
          if (!c) refused = c.error();
        },
        [&l] {
          l.heartbeats = nullptr;
          l.connection = nullptr;
          l.tls.reset();
        },
        kThreadName);
  } catch (const SetupError& e) {
    if (e.error() == errc::bad_config) throw;
    throw SetupError(make_error(errc::control_failure, "control channel to " + host + ":" + std::to_string(port) +
                                                           ": " + e.error().context));
  }
  if (refused) throw SetupError(*refused);
}

ControlClient::~ControlClient() = default;

Result<RingGrant> ControlClient::attach() {
  Loop& l = *loop_;
  return l.thread->call("attach", [&l] {
    return l.on_connection<RingGrant>([](Loop::Connection& c) {
      auto request = c.service.attachRequest();
      request.setVersion(wire::kVersion);
      return request.send().then([](capnp::Response<schema::RingService::AttachResults>&& r) {
        return read(r.getReply(), true);
      });
    });
  });
}

Result<RingGrant> ControlClient::resume(const SessionCredentials& who, bool restarted, std::uint64_t released,
                                        std::uint64_t released_sequence) {
  Loop& l = *loop_;
  return l.thread->call("resume", [&] {
    return l.on_connection<RingGrant>([&](Loop::Connection& c) {
      auto request = c.service.resumeRequest();
      Proof proof;
      write(request.initWho(), c.sign(who, ProofPurpose::resume, proof));
      request.setRestarted(restarted);
      request.setReleased(released);
      request.setReleasedSequence(released_sequence);
      return request.send().then([](capnp::Response<schema::RingService::ResumeResults>&& r) {
        return read(r.getReply(), false);
      });
    });
  });
}

Result<void> ControlClient::heartbeat(const SessionCredentials& who) {
  Loop& l = *loop_;
  return l.thread->call("heartbeat", [&] {
    return l.who_call(who, ProofPurpose::heartbeat, [](auto& s) { return s.heartbeatRequest(); });
  });
}

Result<void> ControlClient::detach(const SessionCredentials& who) {
  Loop& l = *loop_;
  return l.thread->call("detach", [&] {
    return l.who_call(who, ProofPurpose::detach, [](auto& s) { return s.detachRequest(); });
  });
}

void ControlClient::keep_alive(const SessionCredentials& who, std::chrono::milliseconds interval) {
  Loop& l = *loop_;
  (void)l.thread->call("keep_alive", [&l, who, interval]() -> Result<void> {
    l.heartbeats = nullptr;
    l.failed_beats = 0;
    l.clear();
    if (interval.count() == 0) return success();
    const auto delay = static_cast<std::int64_t>(interval.count()) * kj::MILLISECONDS;
    // One beat, then the next. A refused beat (the session moved on or is gone) raises the alarm
    // and ends the chain; unanswered beats (owner down, connection cut) raise it after
    // kOwnerLostBeats in a row, and go on, each on a new connection.
    struct Beat {
      static kj::Promise<void> next(Loop& loop, kj::Duration d, SessionCredentials who) {
        return loop.io->provider->getTimer().afterDelay(d).then([&loop, d, who]() {
          return loop.who_call(who, ProofPurpose::heartbeat, [](auto& s) { return s.heartbeatRequest(); })
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
              .then([&loop, d, who](bool go_on) -> kj::Promise<void> {
                if (!go_on) return kj::READY_NOW;
                return next(loop, d, who);
              });
        });
      }
    };
    l.heartbeats = Beat::next(l, delay, who).eagerlyEvaluate(nullptr);
    return success();
  });
}

std::optional<Error> ControlClient::alarm() const {
  if (!loop_->alarmed.load(std::memory_order_acquire)) return std::nullopt;
  std::lock_guard lock(loop_->alarm_mutex);
  return loop_->alarm;
}

}  // namespace rdmaring::control
