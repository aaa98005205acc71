// How the control channel is protected (protocol-spec/sessions.md §2.1). By default it is
// mutual TLS, 1.2 or later: each side presents a certificate signed by `ca` and checks the
// other's against it, and the owner knows each producer by its certificate's subject common
// name (its identity: what RingOwnerOptions::allow rules match). Plain TCP only when the
// application sets insecure_plaintext: then whoever reads the channel can act as any producer.
#pragma once

#include <string>

#include "rdmaring/error.hpp"

namespace rdmaring {

struct ControlSecurity {
  // Each is PEM text (it starts with "-----BEGIN") or the path of a PEM file.
  std::string ca;           // the certificate authority both sides' certificates are signed by
  std::string certificate;  // this side's certificate (or chain, leaf first)
  std::string private_key;  // its key, unencrypted
  // Producer only: the DNS name the owner's certificate must carry (subjectAltName or common
  // name). Empty: the address the producer connects to.
  std::string server_name;
  bool insecure_plaintext = false;

  // bad_config naming what is missing or contradictory (material with insecure_plaintext,
  // material missing without it, server_name on the owner).
  Result<void> validate(bool owner) const;
};

}  // namespace rdmaring
