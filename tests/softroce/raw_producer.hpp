// A producer written against the control protocol and the wire formats directly, to do what the
// library's Producer never does: keep an old rkey, send an old epoch's messages, forge a connect
// request. The device tests (control_test.cpp) and the chaos probe (tests/chaos/chaos_probe.cpp)
// play this peer; each attaches it in its own way (control.attach(), then grant).
#pragma once

#include <arpa/inet.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "control_client.hpp"
#include "rdmaring/session_proof.hpp"
#include "test_pki.hpp"
#include "rdmaring/verbs/cm_id.hpp"
#include "rdmaring/verbs/context.hpp"
#include "rdmaring/verbs/cq.hpp"
#include "rdmaring/verbs/event_channel.hpp"
#include "rdmaring/verbs/mr.hpp"
#include "rdmaring/verbs/pd.hpp"
#include "rdmaring/verbs/qp.hpp"

namespace rdmaring::testing {

struct RawProducer {
  std::string address, source;
  control::ControlClient control;
  control::RingGrant grant;
  // One channel per id: an old connection's DISCONNECTED must not reach a new one's set-up.
  struct Id {
    verbs::EventChannel channel;
    verbs::CmId id{channel};
  };
  std::vector<std::unique_ptr<Id>> ids;  // the first holds the device context open
  std::optional<verbs::ProtectionDomain> pd;
  std::optional<verbs::CompletionQueue> cq;
  verbs::AlignedBuffer buf{4096};
  std::optional<verbs::MemoryRegion> mr;
  std::optional<verbs::QueuePair> qp;

  // `source_address`: the local address for rdma_cm to bind (a test host sharing the namespace
  // with others is told apart by it); empty: the route's choice.
  RawProducer(std::string owner_address, std::uint16_t control_port, std::string source_address = {},
              const ControlSecurity& security = test_pki::producer())
      : address(std::move(owner_address)),
        source(std::move(source_address)),
        control(address, control_port, std::chrono::seconds(10), security) {}

  wire::ConnectData hello(SessionId session, const SessionSecret& secret, std::uint64_t epoch) const {
    return wire::ConnectData{session, epoch, make_proof(secret, ProofPurpose::connect, session, epoch),
                             reinterpret_cast<std::uintptr_t>(buf.data()), mr ? mr->rkey() : 0};
  }
  wire::ConnectData hello(std::uint64_t epoch) const { return hello(grant.session, grant.secret, epoch); }

  // Attaches over the control channel, then connects the grant's first epoch as an honest
  // producer would. Throws SetupError when either is refused.
  void attach_and_connect() {
    auto g = control.attach();
    if (!g) throw SetupError(g.error());
    grant = g.value();
    connect(hello(grant.at.epoch));
  }

  // Connects a new QP with `data` as the connect request's private data. Throws SetupError
  // when the owner rejects it.
  void connect(const wire::ConnectData& data) {
    auto holder = std::make_unique<Id>();
    verbs::CmId* id = &holder->id;
    id->resolve(address, grant.data_port, std::chrono::seconds(10), source);
    if (!pd) {
      pd.emplace(id->context());
      cq.emplace(id->context(), 16);
      mr.emplace(*pd, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    }
    qp.reset();
    verbs::QueuePairCaps caps;
    caps.max_send_wr = 8;
    caps.max_recv_wr = 1;
    qp.emplace(*id, *pd, *cq, *cq, caps);
    auto bytes = wire::encode(data);
    rdma_conn_param param{};
    param.private_data = bytes.data();
    param.private_data_len = static_cast<std::uint8_t>(bytes.size());
    param.retry_count = 1;
    param.rnr_retry_count = 1;
    ids.push_back(std::move(holder));
    id->connect(param, std::chrono::seconds(10));
  }

  // RDMA_WRITE of 64 bytes of 0xEE to the ring's start with `rkey`; the completion's status.
  // Throws std::runtime_error when the write cannot be posted or completes in no `timeout`: no
  // status to judge, unlike a failed completion.
  ibv_wc_status write(std::uint32_t rkey, std::chrono::seconds timeout) {
    return post_and_wait(rkey, std::nullopt, timeout);
  }
  // The same write as RDMA_WRITE_WITH_IMM carrying `imm` (host order; wire::encode of an
  // Immediate): the owner takes it as a publish, so any bits a broken peer might send can be.
  ibv_wc_status write_with_imm(std::uint32_t rkey, std::uint32_t imm, std::chrono::seconds timeout) {
    return post_and_wait(rkey, imm, timeout);
  }

  ibv_wc_status post_and_wait(std::uint32_t rkey, std::optional<std::uint32_t> imm, std::chrono::seconds timeout) {
    std::memset(buf.data(), 0xEE, 64);
    return post_and_wait(64, grant.ring_addr, rkey, imm, timeout);
  }
  // RDMA_WRITE of `bytes` to `remote_addr` with `rkey` (a forged tail record, say).
  ibv_wc_status write_bytes(std::span<const std::byte> bytes, std::uint64_t remote_addr, std::uint32_t rkey,
                            std::chrono::seconds timeout) {
    if (bytes.size() > buf.size()) throw std::invalid_argument("write_bytes: more than the buffer holds");
    std::memcpy(buf.data(), bytes.data(), bytes.size());
    return post_and_wait(static_cast<std::uint32_t>(bytes.size()), remote_addr, rkey, std::nullopt, timeout);
  }

  // The first `length` bytes of the buffer, written to `remote_addr`.
  ibv_wc_status post_and_wait(std::uint32_t length, std::uint64_t remote_addr, std::uint32_t rkey,
                              std::optional<std::uint32_t> imm, std::chrono::seconds timeout) {
    ibv_sge sge{reinterpret_cast<std::uintptr_t>(buf.data()), length, mr->lkey()};
    ibv_send_wr wr{};
    wr.wr_id = 1;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = imm ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE;
    if (imm) wr.imm_data = htonl(*imm);
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = remote_addr;
    wr.wr.rdma.rkey = rkey;
    if (!qp->post_send(wr)) throw std::runtime_error("post_send failed");
    std::array<ibv_wc, 1> wc;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      auto n = cq->poll(wc);
      if (!n) throw std::runtime_error("poll_cq failed");
      if (n.value() == 1) return wc[0].status;
      if (std::chrono::steady_clock::now() > deadline)
        throw std::runtime_error("no completion for the write in " + std::to_string(timeout.count()) + " s");
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

  // Each message is made for the session and epoch given, not the grant's: an old epoch's, or
  // another session's, is the point. (The proofs are made fresh, over this connection's nonce:
  // replays of captured messages are raw_control.hpp's.)
  Result<control::RingGrant> resume(SessionId session, const SessionSecret& secret, std::uint64_t epoch) {
    return control.resume(SessionCredentials{session, secret, epoch}, false, 0, 0);
  }
  Result<control::RingGrant> resume(std::uint64_t epoch) { return resume(grant.session, grant.secret, epoch); }
  Result<void> heartbeat(SessionId session, const SessionSecret& secret, std::uint64_t epoch) {
    return control.heartbeat(SessionCredentials{session, secret, epoch});
  }
  Result<void> detach(SessionId session, const SessionSecret& secret, std::uint64_t epoch) {
    return control.detach(SessionCredentials{session, secret, epoch});
  }
};

}  // namespace rdmaring::testing
