#include "control_tls.hpp"

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <fstream>
#include <memory>
#include <sstream>
#include <vector>

namespace rdmaring {
namespace {

constexpr std::string_view kPemStart = "-----BEGIN";

Error bad(const std::string& what) { return make_error(errc::bad_config, "control security: " + what); }

bool is_pem(const std::string& v) { return v.compare(0, kPemStart.size(), kPemStart) == 0; }

}  // namespace

Result<void> ControlSecurity::validate(bool owner) const {
  const bool any = !ca.empty() || !certificate.empty() || !private_key.empty();
  if (insecure_plaintext) {
    if (any) return bad("insecure_plaintext with TLS material: say one or the other");
    return success();
  }
  for (const auto& [name, value] : {std::pair{"ca", &ca}, {"certificate", &certificate}, {"private_key", &private_key}})
    if (value->empty())
      return bad(std::string("no ") + name +
                 ": the control channel is mutual TLS unless insecure_plaintext is set by name");
  if (owner && !server_name.empty()) return bad("server_name is the producer's check of the owner's certificate");
  return success();
}

namespace control {
namespace {

// The last OpenSSL error, as one line.
std::string openssl_reason() {
  const unsigned long e = ERR_peek_last_error();
  ERR_clear_error();
  if (e == 0) return "not PEM";
  char buf[256];
  ERR_error_string_n(e, buf, sizeof buf);
  return buf;
}

// PEM text, or the contents of the file the value names.
std::string pem_of(const char* field, const std::string& value) {
  if (is_pem(value)) return value;
  std::ifstream in(value, std::ios::binary);
  if (!in) throw SetupError(bad(std::string(field) + ": cannot read " + value + ": " + std::strerror(errno)));
  std::ostringstream text;
  text << in.rdbuf();
  if (text.str().find(kPemStart) == std::string::npos)
    throw SetupError(bad(std::string(field) + ": " + value + " holds no PEM block"));
  return text.str();
}

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct KeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};

std::unique_ptr<BIO, BioFree> bio_of(const std::string& pem) {
  return std::unique_ptr<BIO, BioFree>(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

// Every certificate of a PEM text, in order. Throws bad_config when there is none or one does
// not parse.
std::vector<std::unique_ptr<X509, X509Free>> certificates_of(const char* field, const std::string& pem) {
  std::vector<std::unique_ptr<X509, X509Free>> out;
  auto bio = bio_of(pem);
  while (X509* x = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) out.emplace_back(x);
  const unsigned long e = ERR_peek_last_error();
  // Reading stops at the end of the text with "no start line": anything else is a broken block.
  if (e != 0 && !(ERR_GET_LIB(e) == ERR_LIB_PEM && ERR_GET_REASON(e) == PEM_R_NO_START_LINE))
    throw SetupError(bad(std::string(field) + ": " + openssl_reason()));
  ERR_clear_error();
  if (out.empty()) throw SetupError(bad(std::string(field) + ": no certificate in it"));
  return out;
}

}  // namespace

// The parsed material, kept alive as long as the context that points into it.
struct ControlTls::Material {
  std::vector<kj::TlsCertificate> trusted;
  kj::TlsKeypair keypair;
};

ControlTls::ControlTls(const ControlSecurity& security, bool owner, kj::Timer& timer,
                       std::chrono::milliseconds handshake_timeout) {
  const std::string ca = pem_of("ca", security.ca);
  const std::string certificate = pem_of("certificate", security.certificate);
  const std::string key = pem_of("private_key", security.private_key);
  const auto cas = certificates_of("ca", ca);
  const auto chain = certificates_of("certificate", certificate);
  std::unique_ptr<EVP_PKEY, KeyFree> pkey(PEM_read_bio_PrivateKey(bio_of(key).get(), nullptr, nullptr, nullptr));
  if (!pkey) throw SetupError(bad("private_key: " + openssl_reason()));
  if (X509_check_private_key(chain.front().get(), pkey.get()) != 1) {
    ERR_clear_error();
    throw SetupError(bad("private_key does not belong to the certificate"));
  }

  std::vector<kj::TlsCertificate> trusted;
  // kj-tls trusts the first certificate of each TlsCertificate: one per CA.
  for (const auto& x : cas) {
    auto bio = std::unique_ptr<BIO, BioFree>(BIO_new(BIO_s_mem()));
    PEM_write_bio_X509(bio.get(), x.get());
    char* data = nullptr;
    const long n = BIO_get_mem_data(bio.get(), &data);
    trusted.emplace_back(kj::StringPtr(kj::heapString(data, static_cast<std::size_t>(n))));
  }
  material_ = std::unique_ptr<Material>(new Material{
      std::move(trusted), kj::TlsKeypair{kj::TlsPrivateKey(kj::StringPtr(key.c_str())),
                                         kj::TlsCertificate(kj::StringPtr(certificate.c_str()))}});

  kj::TlsContext::Options o;
  o.useSystemTrustStore = false;  // only the application's CA decides who is trusted
  o.verifyClients = true;
  o.minVersion = kj::TlsVersion::TLS_1_2;
  o.trustedCertificates = kj::arrayPtr(material_->trusted.data(), material_->trusted.size());
  o.defaultKeypair = material_->keypair;
  if (owner) {
    o.timer = timer;
    o.acceptTimeout = static_cast<std::int64_t>(handshake_timeout.count()) * kj::MILLISECONDS;
  }
  context_ = kj::heap<kj::TlsContext>(kj::mv(o));
}

ControlTls::~ControlTls() = default;

kj::Promise<kj::AuthenticatedStream> ControlTls::accept(kj::AuthenticatedStream stream) {
  return context_->wrapServer(kj::mv(stream));
}

kj::Promise<kj::Own<kj::AsyncIoStream>> ControlTls::connect(kj::Own<kj::AsyncIoStream> stream,
                                                            const std::string& server_name) {
  return context_->wrapClient(kj::mv(stream), server_name);
}

std::optional<std::string> identity_of(kj::PeerIdentity& peer) {
  auto* tls = dynamic_cast<kj::TlsPeerIdentity*>(&peer);
  if (!tls || !tls->hasCertificate()) return std::nullopt;
  std::optional<std::string> name;
  // kj-tls throws when the subject has no common name.
  KJ_IF_MAYBE(e, kj::runCatchingExceptions([&] { name = std::string(tls->getCommonName().cStr()); })) {
    return std::nullopt;
  }
  if (name && name->empty()) return std::nullopt;
  return name;
}

}  // namespace control
}  // namespace rdmaring
