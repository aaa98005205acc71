// The control channel spoken by hand, to do what ControlClient never does: send a message whose
// proof and counter were made for another connection (a replay), send one twice, speak plain TCP
// to a TLS owner, or offer no certificate. One KJ event loop on the calling thread carries every
// connection, so a test can hold several at once (one RawControl per thread).
#pragma once

#include <capnp/rpc-twoparty.h>
#include <kj/async-io.h>
#include <kj/compat/tls.h>

#include <chrono>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "control_tls.hpp"
#include "messages.hpp"

namespace rdmaring::testing {

class RawControl {
 public:
  // A control message exactly as it goes on the wire: a replay sends one made for another
  // connection.
  struct Message {
    SessionId session = 0;
    std::uint64_t epoch = 0;
    Proof proof{};
    std::uint64_t counter = 0;
  };

  RawControl() : io_(kj::setupAsyncIo()) {}

  // A new connection; its index. `security` nullopt: plain TCP. `offer_certificate` false: TLS
  // trusting the owner's CA but presenting no certificate of its own. Throws kj::Exception when
  // the connection or handshake fails.
  std::size_t connect(const std::string& address, std::uint16_t port, std::optional<ControlSecurity> security,
                      bool offer_certificate = true) {
    auto stream = io_.provider->getNetwork().parseAddress(address, port).wait(io_.waitScope)->connect().wait(io_.waitScope);
    if (security && offer_certificate) {
      tls_.push_back(std::make_unique<control::ControlTls>(*security, false, io_.provider->getTimer(), std::chrono::seconds(10)));
      stream = tls_.back()->connect(kj::mv(stream), security->server_name).wait(io_.waitScope);
    } else if (security) {
      ca_.emplace_back(control_ca(security->ca));
      kj::TlsContext::Options o;
      o.useSystemTrustStore = false;
      o.trustedCertificates = kj::arrayPtr(&ca_.back(), 1);
      bare_.push_back(kj::heap<kj::TlsContext>(kj::mv(o)));
      stream = bare_.back()->wrapClient(kj::mv(stream), security->server_name).wait(io_.waitScope);
    }
    connections_.push_back(std::make_unique<Connection>(kj::mv(stream)));
    return connections_.size() - 1;
  }

  // Throws kj::Exception when the connection fails.
  template <class F>
  auto call(std::size_t c, F f) {
    return f(connections_.at(c)->service).wait(io_.waitScope);
  }

  Result<control::Channel> hello(std::size_t c, std::uint32_t version = wire::kVersion) {
    return call(c, [version](auto& s) {
      auto r = s.helloRequest();
      r.setVersion(version);
      return r.send().then([](auto&& reply) { return control::read(reply.getReply()); });
    });
  }
  Result<control::RingGrant> attach(std::size_t c, std::uint32_t version = wire::kVersion) {
    return call(c, [version](auto& s) {
      auto r = s.attachRequest();
      r.setVersion(version);
      return r.send().then([](auto&& reply) { return control::read(reply.getReply(), true); });
    });
  }
  Result<control::RingGrant> resume(std::size_t c, const Message& m) {
    return call(c, [&m](auto& s) {
      auto r = s.resumeRequest();
      write(r.initWho(), m);
      return r.send().then([](auto&& reply) { return control::read(reply.getReply(), false); });
    });
  }
  Result<void> heartbeat(std::size_t c, const Message& m) {
    return call(c, [&m](auto& s) {
      auto r = s.heartbeatRequest();
      write(r.initWho(), m);
      return r.send().then([](auto&& reply) { return answered(reply); });
    });
  }
  Result<void> detach(std::size_t c, const Message& m) {
    return call(c, [&m](auto& s) {
      auto r = s.detachRequest();
      write(r.initWho(), m);
      return r.send().then([](auto&& reply) { return answered(reply); });
    });
  }

  // The message the holder of `secret` sends for `purpose` on a connection with `channel`'s
  // nonce, as its `counter`-th call there.
  static Message sign(const SessionSecret& secret, ProofPurpose purpose, SessionId session, std::uint64_t epoch,
                      const control::Channel& channel, std::uint64_t counter) {
    return Message{session, epoch,
                   make_control_proof(secret, purpose, session, epoch, ChannelBinding{channel.nonce, counter}), counter};
  }

 private:
  struct Connection {
    kj::Own<kj::AsyncIoStream> stream;
    capnp::TwoPartyVatNetwork network;
    capnp::RpcSystem<capnp::rpc::twoparty::VatId> rpc;
    control::schema::RingService::Client service;
    explicit Connection(kj::Own<kj::AsyncIoStream> s)
        : stream(kj::mv(s)),
          network(*stream, capnp::rpc::twoparty::Side::CLIENT),
          rpc(capnp::makeRpcClient(network)),
          service(bootstrap(rpc)) {}
    static control::schema::RingService::Client bootstrap(capnp::RpcSystem<capnp::rpc::twoparty::VatId>& rpc) {
      capnp::MallocMessageBuilder message;
      auto owner = message.getRoot<capnp::rpc::twoparty::VatId>();
      owner.setSide(capnp::rpc::twoparty::Side::SERVER);
      return rpc.bootstrap(owner).castAs<control::schema::RingService>();
    }
  };

  static kj::TlsCertificate control_ca(const std::string& path_or_pem) {
    std::string pem = path_or_pem;
    if (pem.rfind("-----BEGIN", 0) != 0) {
      std::ifstream in(path_or_pem);
      pem.assign(std::istreambuf_iterator<char>(in), {});
    }
    return kj::TlsCertificate(kj::StringPtr(pem.c_str()));
  }

  static void write(control::schema::Credentials::Builder out, const Message& m) {
    out.setSession(m.session);
    out.setEpoch(m.epoch);
    out.setProof(kj::arrayPtr(reinterpret_cast<const kj::byte*>(m.proof.data()), m.proof.size()));
    out.setCounter(m.counter);
  }
  template <class Results>
  static Result<void> answered(const Results& r) {
    if (r.getOk()) return success();
    return control::read(r.getRefused());
  }


  kj::AsyncIoContext io_;
  std::vector<std::unique_ptr<control::ControlTls>> tls_;
  std::vector<kj::TlsCertificate> ca_;
  std::vector<kj::Own<kj::TlsContext>> bare_;
  std::vector<std::unique_ptr<Connection>> connections_;
};

}  // namespace rdmaring::testing
