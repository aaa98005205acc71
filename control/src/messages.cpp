#include "messages.hpp"

#include <algorithm>
#include <string>

#include "rdmaring/ring_geometry.hpp"

namespace rdmaring::control {
namespace {

using Code = schema::Refusal::Code;

Code to_code(const Error& e) {
  if (e == errc::unknown_session) return Code::UNKNOWN_SESSION;
  if (e == errc::bad_proof) return Code::BAD_PROOF;
  if (e == errc::stale_epoch) return Code::STALE_EPOCH;
  if (e == errc::no_capacity) return Code::NO_CAPACITY;
  if (e == errc::memlock_too_low) return Code::MEMLOCK_TOO_LOW;
  if (e == errc::odp_unsupported) return Code::ODP_UNSUPPORTED;
  if (e == errc::ring_changed) return Code::RING_CHANGED;
  if (e == errc::unauthenticated) return Code::UNAUTHENTICATED;
  if (e == errc::unauthorized) return Code::UNAUTHORIZED;
  if (e == errc::quota_exceeded) return Code::QUOTA_EXCEEDED;
  return Code::BAD_REQUEST;
}

errc to_errc(Code c) {
  switch (c) {
    case Code::BAD_REQUEST: return errc::invalid_argument;
    case Code::VERSION_MISMATCH: return errc::protocol_violation;
    case Code::UNKNOWN_SESSION: return errc::unknown_session;
    case Code::BAD_PROOF: return errc::bad_proof;
    case Code::STALE_EPOCH: return errc::stale_epoch;
    case Code::NO_CAPACITY: return errc::no_capacity;
    case Code::RING_CHANGED: return errc::ring_changed;
    case Code::MEMLOCK_TOO_LOW: return errc::memlock_too_low;
    case Code::ODP_UNSUPPORTED: return errc::odp_unsupported;
    case Code::UNAUTHENTICATED: return errc::unauthenticated;
    case Code::UNAUTHORIZED: return errc::unauthorized;
    case Code::QUOTA_EXCEEDED: return errc::quota_exceeded;
  }
  return errc::protocol_violation;
}

Error bad_grant(const std::string& what) { return make_error(errc::protocol_violation, "ring grant: " + what); }

}  // namespace

void write(schema::RingGrant::Builder out, const RingGrant& g, bool with_secret) {
  out.setSession(g.session);
  if (with_secret)
    out.setSecret(kj::arrayPtr(reinterpret_cast<const kj::byte*>(g.secret.data()), g.secret.size()));
  out.setEpoch(g.at.epoch);
  out.setMode(g.mode == wire::PublishMode::imm ? schema::PublishMode::IMM : schema::PublishMode::TAIL);
  out.setRelaxedOrdering(g.relaxed_ordering);
  out.setRingAddr(g.ring_addr);
  out.setRingRkey(g.ring_rkey);
  out.setRingBytes(g.ring_bytes);
  out.setMaxRecord(g.max_record);
  out.setTailAddr(g.tail_addr);
  out.setTailRkey(g.tail_rkey);
  out.setPosition(g.at.position);
  out.setReleased(g.at.released);
  out.setNextSequence(g.at.next_sequence);
  out.setDataPort(g.data_port);
  out.setLeaseMillis(static_cast<std::uint32_t>(g.lease.count()));
  out.setPayloadCheck(g.payload_check == wire::PayloadCheck::none ? schema::PayloadCheck::NONE
                                                                   : schema::PayloadCheck::CRC32C);
  out.setRecvBudget(g.recv_budget);
}

void write(schema::Refusal::Builder out, const Error& e) {
  out.setCode(to_code(e));
  // The code travels on its own; the reader's Error::message() adds its text again.
  out.setMessage(e.context.empty() ? make_error_code(e.code).message() : e.context);
}

void write(schema::Credentials::Builder out, const Credentials& c) {
  out.setSession(c.session);
  out.setEpoch(c.epoch);
  out.setProof(kj::arrayPtr(reinterpret_cast<const kj::byte*>(c.proof.data()), c.proof.size()));
  if (c.binding) out.setCounter(c.binding->counter);
}

void write(schema::Channel::Builder out, const Channel& c) {
  out.setNonce(kj::arrayPtr(reinterpret_cast<const kj::byte*>(c.nonce.data()), c.nonce.size()));
  out.setIdentity(c.identity);
}

Result<Channel> read(schema::ChannelOrRefusal::Reader in) {
  if (in.isRefused()) return read(in.getRefused());
  if (!in.isChannel()) return make_error(errc::protocol_violation, "hello: neither a channel nor a refusal");
  const auto nonce = in.getChannel().getNonce();
  if (nonce.size() != kNonceSize)
    return make_error(errc::protocol_violation, "hello: nonce of " + std::to_string(nonce.size()) + " bytes");
  Channel out;
  std::transform(nonce.begin(), nonce.end(), out.nonce.begin(), [](kj::byte b) { return std::byte{b}; });
  out.identity = in.getChannel().getIdentity().cStr();
  return out;
}

Error read(schema::Refusal::Reader in) {
  return make_error(to_errc(in.getCode()), "ring owner refused: " + std::string(in.getMessage().cStr()));
}

Result<RingGrant> read(schema::GrantOrRefusal::Reader in, bool with_secret) {
  if (in.isRefused()) return read(in.getRefused());
  if (!in.isGrant()) return bad_grant("neither a grant nor a refusal");
  const auto g = in.getGrant();
  RingGrant out;
  out.session = g.getSession();
  if (with_secret) {
    const auto secret = g.getSecret();
    if (secret.size() != kSecretSize) return bad_grant("secret of " + std::to_string(secret.size()) + " bytes");
    std::transform(secret.begin(), secret.end(), out.secret.begin(), [](kj::byte b) { return std::byte{b}; });
  }
  switch (g.getMode()) {
    case schema::PublishMode::IMM: out.mode = wire::PublishMode::imm; break;
    case schema::PublishMode::TAIL: out.mode = wire::PublishMode::tail; break;
    default: return bad_grant("unknown publish mode");
  }
  switch (g.getPayloadCheck()) {
    case schema::PayloadCheck::CRC32C: out.payload_check = wire::PayloadCheck::crc32c; break;
    case schema::PayloadCheck::NONE: out.payload_check = wire::PayloadCheck::none; break;
    default: return bad_grant("unknown payload check");
  }
  out.relaxed_ordering = g.getRelaxedOrdering();
  if (out.relaxed_ordering && out.mode == wire::PublishMode::tail)
    return make_error(errc::relaxed_ordering_refused,
                      "ring grant: tail mode over a relaxed-ordering ring; a tail write could land before the payload "
                      "it publishes");
  out.ring_addr = g.getRingAddr();
  out.ring_rkey = g.getRingRkey();
  out.ring_bytes = g.getRingBytes();
  out.max_record = g.getMaxRecord();
  if (auto geometry = RingGeometry::make(out.ring_bytes, out.max_record); !geometry)
    return bad_grant(geometry.error().context);
  out.tail_addr = g.getTailAddr();
  out.tail_rkey = g.getTailRkey();
  if (out.mode == wire::PublishMode::tail && out.tail_addr == 0) return bad_grant("tail mode without a tail MR");
  out.at = ResumePoint{g.getEpoch(), g.getPosition(), g.getReleased(), g.getNextSequence()};
  if (out.at.epoch == 0) return bad_grant("epoch 0");
  if (out.at.released > out.at.position || out.at.position - out.at.released > out.ring_bytes ||
      out.at.position % wire::kRecordAlign != 0 || out.at.released % wire::kRecordAlign != 0)
    return bad_grant("position " + std::to_string(out.at.position) + " / released " + std::to_string(out.at.released));
  out.data_port = g.getDataPort();
  if (out.data_port == 0) return bad_grant("no data port");
  out.lease = std::chrono::milliseconds(g.getLeaseMillis());
  out.recv_budget = g.getRecvBudget();
  return out;
}

Result<Credentials> read(schema::Credentials::Reader in) {
  const auto proof = in.getProof();
  if (proof.size() != wire::kProofSize)
    return make_error(errc::invalid_argument, "proof of " + std::to_string(proof.size()) + " bytes, not " +
                                                  std::to_string(wire::kProofSize));
  return Credentials{in.getSession(), in.getEpoch(),
                     std::span<const std::byte>(reinterpret_cast<const std::byte*>(proof.begin()), proof.size())};
}

}  // namespace rdmaring::control
