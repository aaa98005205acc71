// An embedding as a service writes it, against the installed rdmaring only (tests/install/check
// builds it with find_package(rdmaring) and with `pkg-config --cflags --libs rdmaring`).
//   rdmaring-embed owner ADDRESS              serve a ring owner, print what arrives
//   rdmaring-embed produce ADDRESS PORT TEXT  send TEXT to the owner at ADDRESS:PORT
// Without arguments it prints its usage and exits 0: the check runs it where there is no RDMA
// device, to prove it links and loads.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <span>
#include <string>

#include "rdmaring/producer.hpp"
#include "rdmaring/ring_owner.hpp"

int main(int argc, char** argv) try {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "owner" && argc == 3) {
    auto owner = rdmaring::RingOwner::start(rdmaring::RingOwnerOptions{.address = argv[2]});
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
        .address = argv[2], .control_port = static_cast<std::uint16_t>(std::atoi(argv[3]))});
    const std::string text = argv[4];
    auto sent = producer.send(std::as_bytes(std::span(text)), std::chrono::seconds(5));
    if (sent) sent = producer.detach(std::chrono::seconds(5));
    if (!sent) {
      std::fprintf(stderr, "send: %s\n", sent.error().message().c_str());
      return 1;
    }
    return 0;
  }
  std::printf("usage: %s owner ADDRESS | produce ADDRESS PORT TEXT\n", argv[0]);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 1;
}
