#include "rdmaring/control_connection.hpp"

#include <utility>

namespace rdmaring {

ControlConnection::ControlConnection(std::string identity, ChannelNonce nonce)
    : identity_(std::move(identity)), nonce_(nonce) {}

Result<ChannelBinding> ControlConnection::bind(std::uint64_t counter) {
  if (counter <= last_)
    return make_error(errc::bad_proof, "counter " + std::to_string(counter) + " after " + std::to_string(last_) +
                                           ": a replay");
  last_ = counter;
  return ChannelBinding{nonce_, counter};
}

}  // namespace rdmaring
