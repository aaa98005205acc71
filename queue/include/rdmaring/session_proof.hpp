// Session secrets and the proofs that show a message comes from the holder of one
// (protocol-spec/sessions.md, "Proofs"): 16 bytes of keyed BLAKE2b (libsodium's
// crypto_generichash) over {purpose, session, epoch}. Binding the epoch is what makes a replayed
// message from an earlier epoch useless; binding the purpose keeps a connect proof from being
// replayed as a resume.
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

enum class ProofPurpose : std::uint8_t { connect = 1, resume = 2, heartbeat = 3, detach = 4 };

// Fresh random bytes from the kernel's CSPRNG (libsodium randombytes).
SessionSecret random_secret();
std::uint64_t random_session_id();

Proof make_proof(const SessionSecret& secret, ProofPurpose purpose, std::uint64_t session, std::uint64_t epoch) noexcept;
// Constant time in the proof's bytes. False for a proof of the wrong size.
bool proof_matches(const SessionSecret& secret, ProofPurpose purpose, std::uint64_t session, std::uint64_t epoch,
                   std::span<const std::byte> proof) noexcept;

}  // namespace rdmaring
