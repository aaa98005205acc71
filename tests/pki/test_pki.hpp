// The test PKI (tests/pki/make-test-pki), made at build time in RDMARING_TEST_PKI: the control
// channel's mutual TLS as the tests, the bench and the examples' tests configure it.
#pragma once

#include <string>

#include "rdmaring/control_security.hpp"

namespace rdmaring::test_pki {

inline std::string path(const std::string& file) { return std::string(RDMARING_TEST_PKI) + "/" + file; }

// `name`: a certificate of the directory (owner, producer-a, producer-b, nameless, stranger).
inline ControlSecurity security(const std::string& name, const std::string& ca = "ca") {
  ControlSecurity s;
  s.ca = path(ca + ".pem");
  s.certificate = path(name + ".pem");
  s.private_key = path(name + ".key");
  return s;
}

inline ControlSecurity owner() { return security("owner"); }

// A producer's side: its certificate, and the owner's name its certificate carries.
inline ControlSecurity producer(const std::string& name = "producer-a") {
  ControlSecurity s = security(name);
  s.server_name = "rdmaring-owner";
  return s;
}

}  // namespace rdmaring::test_pki
