// An embedding as a service writes it, against the installed rdmaring only (tests/install/check
// builds it with find_package(rdmaring) and with `pkg-config --cflags --libs rdmaring`).
//   rdmaring-embed owner ADDRESS              serve a ring owner, print what arrives
//   rdmaring-embed produce ADDRESS PORT TEXT  send TEXT to the owner at ADDRESS:PORT
// The control channel is mutual TLS: RDMARING_CA, RDMARING_CERT and RDMARING_KEY name the PEM
// files (a producer also RDMARING_SERVER_NAME, the owner's certificate's name); with
// RDMARING_INSECURE_PLAINTEXT=1 instead, plain TCP.
// Without arguments it prints its usage and exits 0: the check runs it where there is no RDMA
// device, to prove it links and loads.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <span>
#include <string>

#include "rdmaring/control_security.hpp"
#include "rdmaring/producer.hpp"
#include "rdmaring/ring_owner.hpp"

namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

rdmaring::ControlSecurity security(bool producer) {
  if (env("RDMARING_INSECURE_PLAINTEXT") == "1") return rdmaring::ControlSecurity{.insecure_plaintext = true};
  return rdmaring::ControlSecurity{.ca = env("RDMARING_CA"),
                                   .certificate = env("RDMARING_CERT"),
                                   .private_key = env("RDMARING_KEY"),
                                   .server_name = producer ? env("RDMARING_SERVER_NAME") : std::string{}};
}

}  // namespace

int main(int argc, char** argv) try {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "owner" && argc == 3) {
    rdmaring::RingOwnerOptions options{.address = argv[2], .security = security(false)};
    // Who may attach: any identity the CA vouches for, one session each at most.
    options.allow = {rdmaring::IdentityRule{.pattern = "*", .max_sessions = 1}};
    // The durable record to keep (an upsert by session) for a restart to restore.
    options.on_session = [](const rdmaring::SessionRecord& r) {
      std::printf("session %llu of '%s' from epoch %llu\n", static_cast<unsigned long long>(r.session),
                  r.identity.c_str(), static_cast<unsigned long long>(r.min_epoch));
    };
    auto owner = rdmaring::RingOwner::start(options);
    std::printf("control port %u\n", unsigned{owner->control_port()});
    for (;;) {
      auto delivered = owner->poll(
          [](const rdmaring::Delivery& d) {
            std::printf("session %llu #%llu: %.*s\n", static_cast<unsigned long long>(d.session),
                        static_cast<unsigned long long>(d.sequence), static_cast<int>(d.payload.size()),
                        reinterpret_cast<const char*>(d.payload.data()));
          },
          64);
      if (!delivered) {
        std::fprintf(stderr, "poll: %s\n", delivered.error().message().c_str());
        return 1;
      }
      // Nothing came: sleep until something does, rather than spin (protocol-spec/wakeup.md).
      if (delivered.value() == 0) {
        if (auto woke = owner->wait(std::chrono::milliseconds(-1)); !woke) {
          std::fprintf(stderr, "wait: %s\n", woke.error().message().c_str());
          return 1;
        }
      }
    }
  }
  if (mode == "produce" && argc == 5) {
    auto producer = rdmaring::Producer::attach(rdmaring::ProducerOptions{
        .address = argv[2],
        .control_port = static_cast<std::uint16_t>(std::atoi(argv[3])),
        .security = security(true)});
    const std::string text = argv[4];
    auto sent = producer.send(std::as_bytes(std::span(text)), std::chrono::seconds(5));
    if (sent) sent = producer.detach(std::chrono::seconds(5));
    if (!sent) {
      std::fprintf(stderr, "send: %s\n", sent.error().message().c_str());
      return 1;
    }
    return 0;
  }
  std::printf("usage: %s owner ADDRESS | produce ADDRESS PORT TEXT (TLS: RDMARING_CA, RDMARING_CERT, RDMARING_KEY)\n",
              argv[0]);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 1;
}
