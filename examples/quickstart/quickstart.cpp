// README.md's "Using it", as a whole program: a ring owner that prints the records it receives,
// and a producer that sends them, in two processes (README.md next to this file).
//   quickstart owner ADDRESS [CONTROL_PORT]      serve until 1000 records came and their producer left
//   quickstart producer ADDRESS [CONTROL_PORT]   send 1000 records, then detach
// CONTROL_PORT: 7471 by default; an owner given 0 takes a free one and prints it. The control
// channel is mutual TLS: RDMARING_CA, RDMARING_CERT and RDMARING_KEY name the PEM files, and a
// producer checks the owner's certificate for RDMARING_SERVER_NAME (default: ADDRESS).
// README.md's "Using it" code block is the region between the two [quickstart] markers, line for
// line: the unit test examples_readme_quickstart_in_step fails when they differ.
#include <charconv>
#include <exception>
#include <optional>

// [quickstart]
#include <rdmaring/producer.hpp>    // find_package(rdmaring) → rdmaring::control, or pkg-config rdmaring
#include <rdmaring/ring_owner.hpp>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <span>
#include <string>
#include <string_view>

using namespace std::chrono_literals;

// The control channel is mutual TLS: the CA that signed both sides' certificates, and this side's
// certificate and key, PEM files named by RDMARING_CA, RDMARING_CERT and RDMARING_KEY.
rdmaring::ControlSecurity tls_from_env() {
  const auto env = [](const char* name) { const char* v = std::getenv(name); return std::string(v ? v : ""); };
  return {.ca = env("RDMARING_CA"), .certificate = env("RDMARING_CERT"), .private_key = env("RDMARING_KEY")};
}

constexpr std::uint64_t kRecords = 1000;

std::string record_text(std::uint64_t sequence) { return "record " + std::to_string(sequence); }

// The data path returns rdmaring::Result, [[nodiscard]]: a full ring or a broken connection is a
// value to branch on. Set-up (start, attach) throws rdmaring::SetupError instead.
int fail(std::string_view what, const rdmaring::Error& e) {
  std::cerr << "quickstart: " << what << ": " << e.message() << '\n';
  return 1;
}

// The service that owns the rings.
int run_owner(const std::string& address, std::uint16_t control_port) {
  auto owner =
      rdmaring::RingOwner::start({.address = address, .control_port = control_port, .security = tls_from_env()});
  std::cout << "owner: listening on " << address << " port " << owner->control_port() << std::endl;
  std::uint64_t received = 0;
  // The producer's detach waits for the owner to release its last records: poll until it is gone.
  while (received < kRecords || owner->session_count() > 0) {
    auto polled = owner->poll([&](const rdmaring::Delivery& d) {
      // d.payload lies in the ring, valid until the handler returns; d.sequence counts from 0.
      const std::string_view text(reinterpret_cast<const char*>(d.payload.data()), d.payload.size());
      std::cout << "session " << d.session << " #" << d.sequence << ": " << text << '\n';
      ++received;
    }, 256);
    if (!polled) return fail("poll", polled.error());
    if (polled.value() > 0) continue;
    // Nothing came: sleep until a record does, or the session ends (no CPU spent meanwhile).
    if (auto woke = owner->wait(-1ms); !woke) return fail("wait", woke.error());
  }
  return 0;
}

// A producer, anywhere that reaches the owner.
int run_producer(const std::string& address, std::uint16_t control_port) {
  rdmaring::ProducerOptions options{.address = address, .control_port = control_port, .security = tls_from_env()};
  // The name the owner's certificate carries, where it is not the address (the test PKI's: rdmaring-owner).
  if (const char* name = std::getenv("RDMARING_SERVER_NAME")) options.security.server_name = name;
  auto producer = rdmaring::Producer::attach(options);
  // Zero-copy: claim() lends space in the registered staging buffer (the ring is empty yet, so it
  // fits at once); the record is built there and goes out as it is once committed.
  const std::string first = record_text(0);
  auto claimed = producer.claim(static_cast<std::uint32_t>(first.size()));
  if (!claimed) return fail("claim", claimed.error());
  std::memcpy(claimed.value().data(), first.data(), first.size());
  if (auto committed = producer.commit(); !committed) return fail("commit", committed.error());
  for (std::uint64_t sequence = 1; sequence < kRecords; ++sequence) {
    const std::string text = record_text(sequence);
    const auto bytes = std::as_bytes(std::span(text));
    // Copies the record in, waiting up to 5 s for ring space. An error means it was not taken.
    for (auto sent = producer.send(bytes, 5s); !sent; sent = producer.send(bytes, 5s)) {
      if (!rdmaring::needs_recover(sent.error())) return fail("send", sent.error());
      // The connection died: new epoch, new rkey; every record taken is delivered once, in order.
      if (auto resumed = producer.recover(); !resumed) return fail("recover", resumed.error());
    }
  }
  // Publishes what coalescing still holds, waits until the owner has released every record, and
  // ends the session (the owner frees its ring).
  if (auto detached = producer.detach(5s); !detached) return fail("detach", detached.error());
  std::cout << "producer: " << kRecords << " records sent" << std::endl;
  return 0;
}
// [quickstart]

namespace {

constexpr std::uint16_t kDefaultControlPort = 7471;

std::optional<std::uint16_t> parse_port(std::string_view text) {
  std::uint16_t port = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), port);
  if (error != std::errc{} || end != text.data() + text.size()) return std::nullopt;
  return port;
}

int usage(std::string_view problem) {
  std::cerr << "quickstart: " << problem
            << " (usage: quickstart owner ADDRESS [CONTROL_PORT] | quickstart producer ADDRESS [CONTROL_PORT])\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) try {
  if (argc < 3 || argc > 4) return usage("expected a role and an address");
  const std::string_view role = argv[1];
  const std::optional<std::uint16_t> port = argc == 4 ? parse_port(argv[3]) : kDefaultControlPort;
  if (!port) return usage("CONTROL_PORT must be a number from 0 to 65535, not '" + std::string(argv[3]) + "'");
  if (role == "owner") return run_owner(argv[2], *port);
  if (role == "producer") return run_producer(argv[2], *port);
  return usage("unknown role '" + std::string(role) + "'");
} catch (const std::exception& e) {
  // SetupError: a bad address, no RDMA device behind it, no owner listening, ...
  std::cerr << "quickstart: " << e.what() << '\n';
  return 1;
}
