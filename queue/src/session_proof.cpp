#include "rdmaring/session_proof.hpp"

#include <sodium.h>

#include <stdexcept>

namespace rdmaring {
namespace {

void init_sodium() {
  static const int ok = sodium_init();
  if (ok < 0) throw std::runtime_error("sodium_init failed: no entropy source");
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

Proof make_proof(const SessionSecret& secret, ProofPurpose purpose, std::uint64_t session, std::uint64_t epoch) noexcept {
  std::array<unsigned char, 17> message{};
  message[0] = static_cast<unsigned char>(purpose);
  for (int i = 0; i < 8; ++i) {
    message[1 + i] = static_cast<unsigned char>(session >> (8 * i));
    message[9 + i] = static_cast<unsigned char>(epoch >> (8 * i));
  }
  Proof out;
  crypto_generichash(reinterpret_cast<unsigned char*>(out.data()), out.size(), message.data(), message.size(),
                     reinterpret_cast<const unsigned char*>(secret.data()), secret.size());
  return out;
}

bool proof_matches(const SessionSecret& secret, ProofPurpose purpose, std::uint64_t session, std::uint64_t epoch,
                   std::span<const std::byte> proof) noexcept {
  if (proof.size() != wire::kProofSize) return false;
  const Proof expected = make_proof(secret, purpose, session, epoch);
  return sodium_memcmp(expected.data(), proof.data(), expected.size()) == 0;
}

}  // namespace rdmaring
