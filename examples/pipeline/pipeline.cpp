// An exactly-once event pipeline between two services, and its check (README.md next to this
// file):
//   pipeline consumer ADDRESS DATABASE [--control-port P] [--events N]
//   pipeline producer ADDRESS STATE_DIR [--control-port P] [--events N] [--threads T]
//   pipeline check DATABASE [--events N] [--threads T]
// The consumer serves a ring owner on ADDRESS:P (default 7481) and stores every event in the
// SQLite DATABASE; with --events N it stops once N are stored and every session has ended. The
// producer sends N events (default 20000) from T threads (default 4), keeping its session's
// credentials and journal in STATE_DIR; started again after a kill, it carries on. The check
// compares the database with the N events of T sources (the producer's defaults).
#include <kj/exception.h>

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <exception>
#include <functional>
#include <initializer_list>
#include <iostream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "pipeline.hpp"

namespace {

using pipeline::UsageError;

constexpr std::string_view kUsage =
    "usage: pipeline consumer ADDRESS DATABASE [--control-port P] [--events N] | "
    "pipeline producer ADDRESS STATE_DIR [--control-port P] [--events N] [--threads T] | "
    "pipeline check DATABASE [--events N] [--threads T]";

template <class Number>
Number parse_number(std::string_view flag, std::string_view text, Number least) {
  Number n{};
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), n);
  if (error != std::errc{} || end != text.data() + text.size() || n < least)
    throw UsageError(std::string(flag) + " takes a number in range, not '" + std::string(text) + "'");
  return n;
}

// The positional arguments (`positional` of them after the role), then `--flag value` pairs,
// each flag one of `flags`: a parser of its value.
using Flags = std::initializer_list<std::pair<std::string_view, std::function<void(std::string_view)>>>;
std::vector<std::string_view> parse(int argc, char** argv, std::size_t positional, Flags flags) {
  std::vector<std::string_view> args(argv + 2, argv + argc);
  if (args.size() < positional) throw UsageError("expected " + std::to_string(positional) + " arguments after the role");
  for (std::size_t i = positional; i < args.size(); i += 2) {
    const std::string_view flag = args[i];
    const auto known = std::find_if(flags.begin(), flags.end(), [&](const auto& f) { return f.first == flag; });
    if (known == flags.end()) throw UsageError("unknown option '" + std::string(flag) + "'");
    if (i + 1 == args.size()) throw UsageError(std::string(flag) + " needs a value");
    known->second(args[i + 1]);
  }
  args.resize(positional);
  return args;
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
  const auto threads = [](std::uint32_t& to) {
    return [&to](std::string_view v) { to = parse_number<std::uint32_t>("--threads", v, 1); };
  };
  if (role == "consumer") {
    pipeline::ConsumerOptions o;
    std::uint64_t until = 0;
    const auto args = parse(argc, argv, 2, {{"--control-port", port(o.control_port)}, {"--events", events(until)}});
    o.address = args[0];
    o.database = args[1];
    if (until > 0) o.events = until;
    return pipeline::run_consumer(o);
  }
  if (role == "producer") {
    pipeline::ProducerOptions o;
    const auto args = parse(argc, argv, 2,
                            {{"--control-port", port(o.control_port)},
                             {"--events", events(o.events)},
                             {"--threads", threads(o.threads)}});
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
