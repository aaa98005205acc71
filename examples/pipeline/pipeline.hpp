// What the pipeline's three roles share (README.md next to this file): the events, their
// options, and the roles' entry points (consumer.cpp, producer.cpp, check.cpp).
#pragma once

#include <rdmaring/control_security.hpp>

#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <optional>
#include <stdexcept>
#include <string>

namespace pipeline {

// An event as the application sees it. Event `index` of source `source` is a pure function of the
// two, as a record read back from a replayable input (a log partition at an offset) would be: the
// producer makes it again after a restart, and the check compares the database against it.
struct Event {
  std::uint32_t source = 0;
  std::uint32_t account = 0;
  std::uint64_t index = 0;
  std::int64_t amount_cents = 0;
  std::string memo;
  bool operator==(const Event&) const = default;
};

inline Event make_event(std::uint32_t source, std::uint64_t index) {
  // Memos of 0 to 96 bytes, so that records differ in size and wrap the ring at odd places.
  const std::uint64_t mix = (source + 1) * 0x9e3779b97f4a7c15u ^ index * 0xbf58476d1ce4e5b9u;
  std::string memo = "source " + std::to_string(source) + " event " + std::to_string(index);
  memo.resize(mix % 97, '.');
  return Event{.source = source,
               .account = static_cast<std::uint32_t>(mix >> 40) % 1000,
               .index = index,
               .amount_cents = static_cast<std::int64_t>(mix % 200001) - 100000,
               .memo = std::move(memo)};
}

// How many of `events` events source `source` of `sources` makes: an even split, the first
// sources taking the remainder.
inline std::uint64_t events_of(std::uint32_t source, std::uint64_t events, std::uint32_t sources) {
  return events / sources + (source < events % sources ? 1 : 0);
}

inline constexpr std::uint16_t kDefaultControlPort = 7481;

struct ConsumerOptions {
  std::string address;
  std::filesystem::path database;
  std::uint16_t control_port = kDefaultControlPort;
  rdmaring::ControlSecurity security;  // mutual TLS unless insecure_plaintext
  std::optional<std::uint64_t> events;  // stop once this many are stored and every session ended
  // A crash test: SIGKILL itself once this many are stored, right after the transaction that
  // stored them commits and before the handler returns (the owner has released none of them).
  std::optional<std::uint64_t> kill_self_at;
};

struct ProducerOptions {
  std::string address;
  std::filesystem::path state;  // the credentials and the journal live here
  std::uint16_t control_port = kDefaultControlPort;
  rdmaring::ControlSecurity security;  // mutual TLS unless insecure_plaintext; server_name: the owner's
  std::uint64_t events = 20000;
  std::uint32_t threads = 4;
  // A crash test: SIGKILL itself once the session's records up to sequence N - 1 are committed
  // (in staging, not yet all published or delivered).
  std::optional<std::uint64_t> kill_self_at;
};

struct CheckOptions {
  std::filesystem::path database;
  std::uint64_t events = 20000;
  std::uint32_t threads = 4;
};

// --kill-self-at: says where, then dies as kill -9 would make it (no destructor, no flush).
[[noreturn]] inline void kill_self(const std::string& where) {
  std::cout << where << ": sending itself SIGKILL (--kill-self-at)" << std::endl;
  std::raise(SIGKILL);
  std::abort();  // SIGKILL cannot be caught or blocked: not reached
}

// A bad command line: one line, exit status 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Exit status 0 done, 1 failed. Set-up errors throw (SetupError, std::system_error,
// std::runtime_error); the main() prints them.
int run_consumer(const ConsumerOptions& options);
int run_producer(const ProducerOptions& options);
int run_check(const CheckOptions& options);

}  // namespace pipeline
