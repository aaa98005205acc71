// `rdmaring send`: reads records from stdin (or --input), one per line or length-prefixed, and
// sends them to a ring owner, as netcat does with bytes; it ends once the owner has released
// every record (detach drains), so a zero exit status means every record was delivered. The
// control channel is mutual TLS (--ca, --cert, --key, --server-name), or plain TCP with
// --insecure-plaintext (security_options.hpp).
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <system_error>

#include "commands.hpp"
#include "endpoint_options.hpp"
#include "rdmaring/producer.hpp"
#include "security_options.hpp"

namespace rdmaring::tools {

namespace {

using Clock = std::chrono::steady_clock;

struct SendOptions {
  Endpoint endpoint;
  SecurityFlags security;
  std::string input;      // empty: stdin
  double timeout_s = 30;  // for credit, for the final drain and detach
};

// A connection that failed is resumed (nothing lost, nothing doubled) this many times in a row
// before the command gives up.
constexpr int kRecoveries = 3;

int run_send(const SendOptions& o) {
  // Wrong together: refused (exit status 2) before anything is opened.
  require_security(o.security);
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> file(nullptr, &std::fclose);
  std::FILE* in = stdin;
  if (!o.input.empty()) {
    // Opened before attaching: a missing file costs the owner no session.
    file.reset(std::fopen(o.input.c_str(), "rb"));
    if (!file) throw std::system_error(errno, std::generic_category(), "opening " + o.input);
    in = file.get();
  }
  const auto timeout = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::duration<double>(o.timeout_s));
  Producer producer = Producer::attach(
      {.address = o.endpoint.address, .control_port = o.endpoint.port, .security = producer_security(o.security)});

  RecordInput records(in, o.endpoint.framing);
  std::uint64_t bytes = 0;
  const auto start = Clock::now();
  auto next_progress = start + std::chrono::seconds(1);
  std::uint64_t sent_records = 0;
  const auto fail = [&](const std::string& what, const Error& e) {
    std::cerr << "rdmaring send: " << what << ": " << e.message() << " (" << sent_records << " records sent before it)"
              << std::endl;
    return 1;
  };
  while (const auto record = records.next()) {
    auto sent = producer.send(*record, timeout);
    for (int tries = 0; !sent && needs_recover(sent.error()) && tries < kRecoveries; ++tries) {
      if (const auto resumed = producer.recover(); !resumed) return fail("resuming the session", resumed.error());
      sent = producer.send(*record, timeout);
    }
    if (!sent)
      return fail("record " + std::to_string(records.records()) + " (" + std::to_string(record->size()) + " bytes)",
                  sent.error());
    ++sent_records;
    bytes += record->size();
    if (!o.endpoint.quiet && Clock::now() >= next_progress) {
      const double s = std::chrono::duration<double>(Clock::now() - start).count();
      std::cerr << "rdmaring send: " << sent_records << " records, " << bytes << " bytes, "
                << static_cast<std::uint64_t>(static_cast<double>(sent_records) / s) << " records/s" << std::endl;
      next_progress += std::chrono::seconds(1);
    }
  }
  if (const auto detached = producer.detach(timeout); !detached)
    return fail("detaching (the owner did not release every record)", detached.error());

  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  report(o.endpoint, {{"command", "send"}, {"records", sent_records}, {"bytes", bytes}, {"seconds", seconds}},
         "rdmaring send: " + std::to_string(sent_records) + " records, " + std::to_string(bytes) + " bytes delivered in " +
             std::to_string(seconds) + " s");
  return 0;
}

}  // namespace

Command add_send_command(CLI::App& parent) {
  auto o = std::make_shared<SendOptions>();
  CLI::App* app = parent.add_subcommand(
      "send", "Send records read from stdin (or --input) to a ring owner, as netcat does; exits once all are delivered");
  add_endpoint_options(*app, o->endpoint, "the ring owner's address");
  add_security_options(*app, o->security, SecuritySide::producer);
  app->add_option("-i,--input", o->input, "read the records from this file instead of stdin")->check(CLI::ExistingFile);
  app->add_option("-t,--timeout", o->timeout_s, "seconds to wait for the owner's credit, and for the final drain")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  return {app, [o] { return run_send(*o); }};
}

}  // namespace rdmaring::tools
