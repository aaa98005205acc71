// The control messages as C++ values, and their checked conversion from and to Cap'n Proto
// (control/ring_service.capnp). Every reader here treats its input as hostile: the Cap'n Proto
// reader bounds traversal, and these functions check every field's range before a value leaves.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "rdmaring/error.hpp"
#include "rdmaring/producer_core.hpp"
#include "rdmaring/session_proof.hpp"
#include "rdmaring/session_table.hpp"
#include "ring_service.capnp.h"

namespace rdmaring::control {

struct RingGrant {
  SessionId session = 0;
  SessionSecret secret{};  // attach only
  wire::PublishMode mode = wire::PublishMode::imm;
  bool relaxed_ordering = false;
  std::uint64_t ring_addr = 0;
  std::uint32_t ring_rkey = 0;
  std::uint64_t ring_bytes = 0;
  std::uint32_t max_record = 0;
  std::uint64_t tail_addr = 0;
  std::uint32_t tail_rkey = 0;
  ResumePoint at;
  std::uint16_t data_port = 0;
  std::chrono::milliseconds lease{0};
  wire::PayloadCheck payload_check = wire::PayloadCheck::crc32c;
  // Mode imm: the WRITE_WITH_IMM publishes the producer should keep unacknowledged at most, its
  // share of the receives the owner keeps posted on the SRQ all sessions share. 0 in mode tail.
  std::uint32_t recv_budget = 0;
};

// What hello answers (sessions.md §2.3).
struct Channel {
  ChannelNonce nonce{};
  std::string identity;
};

// Reading limits for untrusted control messages: far above any legal message (a few hundred
// bytes), far below what would let a peer make the owner walk or allocate much.
inline constexpr std::uint64_t kTraversalLimitWords = 8 * 1024;
inline constexpr unsigned kNestingLimit = 8;

void write(schema::RingGrant::Builder out, const RingGrant& g, bool with_secret);
void write(schema::Refusal::Builder out, const Error& e);
// The counter is the binding's (the nonce is the connection's and does not travel).
void write(schema::Credentials::Builder out, const Credentials& c);
void write(schema::Channel::Builder out, const Channel& c);
// Errors: the refusal's; protocol_violation for a nonce of the wrong size.
Result<Channel> read(schema::ChannelOrRefusal::Reader in);

// The grant, or the owner's refusal as an Error with the errc it names. Errors:
// protocol_violation for a grant that breaks the schema's rules (sizes, modes, positions).
Result<RingGrant> read(schema::GrantOrRefusal::Reader in, bool with_secret);
// A Refusal as an Error (for heartbeat/detach replies).
Error read(schema::Refusal::Reader in);
// Credentials, with the proof's size checked; no binding (the reader's connection adds its own
// nonce to the counter). Errors: invalid_argument.
Result<Credentials> read(schema::Credentials::Reader in);

}  // namespace rdmaring::control
