#include "rdmaring/session_proof.hpp"

#include <sodium.h>

#include <stdexcept>

namespace rdmaring {
namespace {

void init_sodium() {
  static const int ok = sodium_init();
  if (ok < 0) throw std::runtime_error("sodium_init failed: no entropy source");
}

template <std::size_t N>
void put_le(std::array<unsigned char, N>& message, std::size_t at, std::uint64_t v) noexcept {
  for (std::size_t i = 0; i < 8; ++i) message[at + i] = static_cast<unsigned char>(v >> (8 * i));
}

// The 17 bytes every proof starts with: purpose u8, session u64 LE, epoch u64 LE.
template <std::size_t N>
std::array<unsigned char, N> message_of(ProofPurpose purpose, std::uint64_t session, std::uint64_t epoch) noexcept {
  std::array<unsigned char, N> message{};
  message[0] = static_cast<unsigned char>(purpose);
  put_le(message, 1, session);
  put_le(message, 9, epoch);
  return message;
}

template <std::size_t N>
Proof digest(const SessionSecret& secret, const std::array<unsigned char, N>& message) noexcept {
  Proof out;
  crypto_generichash(reinterpret_cast<unsigned char*>(out.data()), out.size(), message.data(), message.size(),
                     reinterpret_cast<const unsigned char*>(secret.data()), secret.size());
  return out;
}

bool same(const Proof& expected, std::span<const std::byte> proof) noexcept {
  if (proof.size() != wire::kProofSize) return false;
  return sodium_memcmp(expected.data(), proof.data(), expected.size()) == 0;
}

}  // namespace

SessionSecret random_secret() {
  init_sodium();
  SessionSecret s;
  randombytes_buf(s.data(), s.size());
  return s;
}

std::uint64_t random_session_id() {
  init_sodium();
  std::uint64_t id = 0;
  // 0 is never a session: it is what a zeroed message carries.
  while (id == 0) randombytes_buf(&id, sizeof id);
  return id;
}

ChannelNonce random_nonce() {
  init_sodium();
  ChannelNonce n;
  randombytes_buf(n.data(), n.size());
  return n;
}

Proof make_proof(const SessionSecret& secret, ProofPurpose purpose, std::uint64_t session, std::uint64_t epoch) noexcept {
  return digest(secret, message_of<17>(purpose, session, epoch));
}

Proof make_control_proof(const SessionSecret& secret, ProofPurpose purpose, std::uint64_t session, std::uint64_t epoch,
                         const ChannelBinding& binding) noexcept {
  auto message = message_of<17 + kNonceSize + 8>(purpose, session, epoch);
  for (std::size_t i = 0; i < kNonceSize; ++i) message[17 + i] = static_cast<unsigned char>(binding.nonce[i]);
  put_le(message, 17 + kNonceSize, binding.counter);
  return digest(secret, message);
}

bool proof_matches(const SessionSecret& secret, ProofPurpose purpose, std::uint64_t session, std::uint64_t epoch,
                   std::span<const std::byte> proof) noexcept {
  return same(make_proof(secret, purpose, session, epoch), proof);
}

bool proof_matches(const SessionSecret& secret, ProofPurpose purpose, std::uint64_t session, std::uint64_t epoch,
                   const ChannelBinding& binding, std::span<const std::byte> proof) noexcept {
  return same(make_control_proof(secret, purpose, session, epoch, binding), proof);
}

}  // namespace rdmaring
