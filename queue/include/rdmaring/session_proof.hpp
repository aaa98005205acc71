// Session secrets and the proofs that show a message comes from the holder of one
// (protocol-spec/sessions.md, "Proofs"): 16 bytes of keyed BLAKE2b (libsodium's
// crypto_generichash). Binding the epoch is what makes a replayed message from an earlier epoch
// useless; binding the purpose keeps a connect proof from being replayed as a resume. A control
// message's proof binds its channel too (the connection's nonce and the message's counter), so a
// message captured in the current epoch is useless on any other connection, or again on its own.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

#include "rdmaring/wire.hpp"

namespace rdmaring {

inline constexpr std::size_t kSecretSize = 32;
using SessionSecret = std::array<std::byte, kSecretSize>;
using Proof = std::array<std::byte, wire::kProofSize>;

inline constexpr std::size_t kNonceSize = 16;
using ChannelNonce = std::array<std::byte, kNonceSize>;

enum class ProofPurpose : std::uint8_t { connect = 1, resume = 2, heartbeat = 3, detach = 4 };

// What a control message's proof covers beside purpose, session and epoch: the nonce the owner
// gave its connection (hello) and the message's counter, strictly increasing per connection
// from 1.
struct ChannelBinding {
  ChannelNonce nonce{};
  std::uint64_t counter = 0;
};

// Fresh random bytes from the kernel's CSPRNG (libsodium randombytes).
SessionSecret random_secret();
std::uint64_t random_session_id();
ChannelNonce random_nonce();

// A connect request's proof: rdma_cm's private data travels on no control channel, so it binds
// none (purpose connect only).
Proof make_proof(const SessionSecret& secret, ProofPurpose purpose, std::uint64_t session, std::uint64_t epoch) noexcept;
// A control message's proof (purposes resume, heartbeat and detach).
Proof make_control_proof(const SessionSecret& secret, ProofPurpose purpose, std::uint64_t session, std::uint64_t epoch,
                         const ChannelBinding& binding) noexcept;
// Constant time in the proof's bytes. False for a proof of the wrong size.
bool proof_matches(const SessionSecret& secret, ProofPurpose purpose, std::uint64_t session, std::uint64_t epoch,
                   std::span<const std::byte> proof) noexcept;
bool proof_matches(const SessionSecret& secret, ProofPurpose purpose, std::uint64_t session, std::uint64_t epoch,
                   const ChannelBinding& binding, std::span<const std::byte> proof) noexcept;

}  // namespace rdmaring
