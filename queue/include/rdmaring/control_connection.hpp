// The owner's guard of one control connection (protocol-spec/sessions.md §3, §7): every resume,
// heartbeat and detach on it proves the session secret over the connection's nonce and a counter
// that rises with each message, so a message captured on one connection is refused on any other
// (its proof covers another nonce) and on its own (its counter was used). Sans I/O: the adapter
// makes one per accepted connection and asks it for each message's binding before the session
// table checks the proof.
#pragma once

#include <cstdint>
#include <string>

#include "rdmaring/error.hpp"
#include "rdmaring/session_proof.hpp"

namespace rdmaring {

// One control connection as the owner sees it: who the channel authenticated and the nonce it
// was given; refuses a counter that does not exceed the last one it accepted (a replay on the
// same connection).
class ControlConnection {
 public:
  ControlConnection(std::string identity, ChannelNonce nonce);
  const std::string& identity() const noexcept { return identity_; }
  const ChannelNonce& nonce() const noexcept { return nonce_; }
  // The binding a message with this counter must prove; errc::bad_proof ("counter 3 after 5:
  // a replay") when counter <= the last accepted one. Advances on success.
  Result<ChannelBinding> bind(std::uint64_t counter);

 private:
  std::string identity_;
  ChannelNonce nonce_;
  std::uint64_t last_ = 0;  // counters start at 1
};

}  // namespace rdmaring
