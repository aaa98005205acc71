// An exactly-once event pipeline between two services, and its check (README.md next to this
// file):
//   pipeline consumer ADDRESS DATABASE [--control-port P] [--events N] [--kill-self-at K] [TLS]
//   pipeline producer ADDRESS STATE_DIR [--control-port P] [--events N] [--threads T]
//                     [--kill-self-at K] [TLS] [--server-name NAME]
//   pipeline check DATABASE [--events N] [--threads T]
// TLS: --ca FILE --cert FILE --key FILE (default: RDMARING_CA, RDMARING_CERT, RDMARING_KEY; the
// producer's --server-name: RDMARING_SERVER_NAME), the control channel's mutual TLS; or
// --insecure-plaintext, plain TCP.
// The consumer serves a ring owner on ADDRESS:P (default 7481) and stores every event in the
// SQLite DATABASE; with --events N it stops once N are stored and every session has ended. The
// producer sends N events (default 20000) from T threads (default 4), keeping its session's
// credentials and journal in STATE_DIR; started again after a kill, it carries on. The check
// compares the database with the N events of T sources (the producer's defaults). --kill-self-at K
// is a crash test: the process sends itself SIGKILL at a point no outside kill can hit reliably,
// the consumer once K events are stored and not yet released, the producer once K records are
// committed to its session.
#include <kj/exception.h>

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <functional>
#include <initializer_list>
#include <iostream>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "pipeline.hpp"

namespace {

using pipeline::UsageError;

constexpr std::string_view kUsage =
    "usage: pipeline consumer ADDRESS DATABASE [--control-port P] [--events N] [--kill-self-at K] [TLS] | "
    "pipeline producer ADDRESS STATE_DIR [--control-port P] [--events N] [--threads T] [--kill-self-at K] [TLS] "
    "[--server-name NAME] | "
    "pipeline check DATABASE [--events N] [--threads T]; "
    "TLS: --ca FILE --cert FILE --key FILE (default: RDMARING_CA, RDMARING_CERT, RDMARING_KEY) or --insecure-plaintext";

template <class Number>
Number parse_number(std::string_view flag, std::string_view text, Number least) {
  Number n{};
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), n);
  if (error != std::errc{} || end != text.data() + text.size() || n < least)
    throw UsageError(std::string(flag) + " takes a number in range, not '" + std::string(text) + "'");
  return n;
}

// The positional arguments (`positional` of them after the role), then `--flag value` pairs,
// each flag one of `flags`: a parser of its value; `--insecure-plaintext` (no value) sets
// `*plaintext` where the role takes it.
using Flags = std::initializer_list<std::pair<std::string_view, std::function<void(std::string_view)>>>;
std::vector<std::string_view> parse(int argc, char** argv, std::size_t positional, Flags flags,
                                    bool* plaintext = nullptr) {
  std::vector<std::string_view> args(argv + 2, argv + argc);
  if (args.size() < positional) throw UsageError("expected " + std::to_string(positional) + " arguments after the role");
  for (std::size_t i = positional; i < args.size(); i += 2) {
    const std::string_view flag = args[i];
    if (plaintext && flag == "--insecure-plaintext") {
      *plaintext = true;
      --i;  // it takes no value
      continue;
    }
    const auto known = std::find_if(flags.begin(), flags.end(), [&](const auto& f) { return f.first == flag; });
    if (known == flags.end()) throw UsageError("unknown option '" + std::string(flag) + "'");
    if (i + 1 == args.size()) throw UsageError(std::string(flag) + " needs a value");
    known->second(args[i + 1]);
  }
  args.resize(positional);
  return args;
}

std::string from_env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// The control channel: the environment's material unless a flag names another file.
rdmaring::ControlSecurity security_from_env(bool producer) {
  return {.ca = from_env("RDMARING_CA"),
          .certificate = from_env("RDMARING_CERT"),
          .private_key = from_env("RDMARING_KEY"),
          .server_name = producer ? from_env("RDMARING_SERVER_NAME") : std::string{}};
}

// Mutual TLS with all three, or --insecure-plaintext alone; else a usage error saying which.
void settle_security(rdmaring::ControlSecurity& s, bool plaintext) {
  const bool any = !s.ca.empty() || !s.certificate.empty() || !s.private_key.empty();
  if (plaintext) {
    if (any)
      throw UsageError("--insecure-plaintext with TLS material (flags or RDMARING_CA/CERT/KEY): say one or the other");
    s = {.insecure_plaintext = true};
  } else if (s.ca.empty() || s.certificate.empty() || s.private_key.empty()) {
    throw UsageError("the control channel is mutual TLS: give --ca, --cert and --key (or RDMARING_CA, RDMARING_CERT, "
                     "RDMARING_KEY), or --insecure-plaintext");
  }
}

int run(int argc, char** argv) {
  if (argc < 2) throw UsageError("no role given");
  const std::string_view role = argv[1];
  const auto port = [](std::uint16_t& to) {
    return [&to](std::string_view v) { to = parse_number<std::uint16_t>("--control-port", v, 0); };
  };
  const auto events = [](std::uint64_t& to) {
    return [&to](std::string_view v) { to = parse_number<std::uint64_t>("--events", v, 1); };
  };
  const auto kill_self_at = [](std::optional<std::uint64_t>& to) {
    return [&to](std::string_view v) { to = parse_number<std::uint64_t>("--kill-self-at", v, 1); };
  };
  const auto threads = [](std::uint32_t& to) {
    return [&to](std::string_view v) { to = parse_number<std::uint32_t>("--threads", v, 1); };
  };
  const auto text = [](std::string& to) { return [&to](std::string_view v) { to = v; }; };
  if (role == "consumer") {
    pipeline::ConsumerOptions o;
    o.security = security_from_env(false);
    std::uint64_t until = 0;
    bool plaintext = false;
    const auto args = parse(argc, argv, 2,
                            {{"--control-port", port(o.control_port)},
                             {"--events", events(until)},
                             {"--kill-self-at", kill_self_at(o.kill_self_at)},
                             {"--ca", text(o.security.ca)},
                             {"--cert", text(o.security.certificate)},
                             {"--key", text(o.security.private_key)}},
                            &plaintext);
    settle_security(o.security, plaintext);
    o.address = args[0];
    o.database = args[1];
    if (until > 0) o.events = until;
    return pipeline::run_consumer(o);
  }
  if (role == "producer") {
    pipeline::ProducerOptions o;
    o.security = security_from_env(true);
    bool plaintext = false;
    const auto args = parse(argc, argv, 2,
                            {{"--control-port", port(o.control_port)},
                             {"--events", events(o.events)},
                             {"--threads", threads(o.threads)},
                             {"--kill-self-at", kill_self_at(o.kill_self_at)},
                             {"--ca", text(o.security.ca)},
                             {"--cert", text(o.security.certificate)},
                             {"--key", text(o.security.private_key)},
                             {"--server-name", text(o.security.server_name)}},
                            &plaintext);
    if (plaintext && !o.security.server_name.empty())
      throw UsageError(
          "--insecure-plaintext with --server-name (or RDMARING_SERVER_NAME): plain TCP checks no certificate");
    settle_security(o.security, plaintext);
    o.address = args[0];
    o.state = args[1];
    return pipeline::run_producer(o);
  }
  if (role == "check") {
    pipeline::CheckOptions o;
    const auto args = parse(argc, argv, 1, {{"--events", events(o.events)}, {"--threads", threads(o.threads)}});
    o.database = args[0];
    return pipeline::run_check(o);
  }
  throw UsageError("unknown role '" + std::string(role) + "'");
}

}  // namespace

int main(int argc, char** argv) try {
  return run(argc, argv);
} catch (const UsageError& e) {
  std::cerr << "pipeline: " << e.what() << " (" << kUsage << ")\n";
  return 2;
} catch (const std::exception& e) {
  // SetupError (no RDMA device, no owner, a session the owner refuses), SQLite, the journal.
  std::cerr << "pipeline: " << e.what() << '\n';
  return 1;
} catch (const kj::Exception& e) {
  // Cap'n Proto's: a record that is no Event.
  std::cerr << "pipeline: " << e.getDescription().cStr() << '\n';
  return 1;
}
