// TLS for the control channel, as a ControlSecurity describes it (protocol-spec/sessions.md
// §2.1): the kj-tls context of either side, built once from the PEM material, and the identity
// the owner reads from a producer's certificate.
#pragma once

#include <kj/async-io.h>
#include <kj/compat/tls.h>

#include <chrono>
#include <optional>
#include <string>

#include "rdmaring/control_security.hpp"

namespace rdmaring::control {

class ControlTls {
 public:
  // Reads and checks the material (files or PEM text; the key must match the certificate).
  // Throws SetupError bad_config naming the field and the reason. `timer` bounds the owner's
  // handshakes.
  ControlTls(const ControlSecurity& security, bool owner, kj::Timer& timer, std::chrono::milliseconds handshake_timeout);
  ~ControlTls();

  // Owner: the handshake, verifying the producer's certificate against the CA; the stream's
  // peer identity is a kj::TlsPeerIdentity.
  kj::Promise<kj::AuthenticatedStream> accept(kj::AuthenticatedStream stream);
  // Producer: the handshake, verifying that the owner's certificate is the CA's and names
  // `server_name`.
  kj::Promise<kj::Own<kj::AsyncIoStream>> connect(kj::Own<kj::AsyncIoStream> stream, const std::string& server_name);

 private:
  struct Material;
  std::unique_ptr<Material> material_;
  kj::Own<kj::TlsContext> context_;
};

// The identity of a producer on a TLS channel: its certificate's subject common name; nullopt
// when the certificate has none (such a channel is refused as unauthenticated).
std::optional<std::string> identity_of(kj::PeerIdentity& peer);

}  // namespace rdmaring::control
