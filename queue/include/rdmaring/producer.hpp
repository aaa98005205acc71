// A producer connection over real verbs: the ProducerCore driven by an RC QP.
//
// Single-threaded: one thread calls everything on a Producer. Set-up throws SetupError; the data
// path returns Result. Ownership: the Producer owns every verbs object of its connection; spans
// returned by claim() point into its registered staging buffer and are valid until commit() or
// abort().
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "rdmaring/error.hpp"
#include "rdmaring/producer_core.hpp"

namespace rdmaring {

struct ProducerOptions {
  std::string address;  // the consumer's address (rdma_cm resolves the device from it)
  std::uint16_t port = 0;
  ProducerConfig core;
  std::chrono::milliseconds connect_timeout = std::chrono::seconds(10);
};

// Per-record costs are these divided by core.records.
struct ProducerStats {
  ProducerCounters core;
  std::uint64_t post_send_calls = 0;
  std::uint64_t completions = 0;  // signaled send completions polled
  std::uint64_t stale_completions = 0;  // completions of a replaced connection, ignored
  std::uint64_t recoveries = 0;
  ProducerLedger ledger;
};

class Producer {
 public:
  // Resolves, connects and registers the staging mirror of the consumer's ring.
  // Throws: SetupError (bad options, no route, rejected, memlock too low, device lacks inline).
  static Producer connect(const ProducerOptions& options);
  Producer(Producer&&) noexcept;
  Producer& operator=(Producer&&) noexcept;
  ~Producer();

  // Copies `payload` into staging as one record; posts when a coalescing threshold is reached.
  // Errors: would_block (ring full: call progress() and retry), record_too_large, the
  // connection's error.
  Result<void> send(std::span<const std::byte> payload);
  // send(), retried with progress() until it fits or `timeout` passes (errc::timed_out).
  Result<void> send(std::span<const std::byte> payload, std::chrono::nanoseconds timeout);
  // Zero-copy: fill the returned span, then commit() (optionally fewer bytes) or abort().
  Result<std::span<std::byte>> claim(std::uint32_t len);
  Result<void> commit(std::optional<std::uint32_t> len = std::nullopt);
  void abort() noexcept;
  // Publishes everything committed now, whatever the thresholds.
  Result<void> flush();
  // Polls completions and credit, publishes what the coalescing delay has made due. Call it
  // whenever the application is idle.
  Result<void> progress();
  // Flushes and waits until the consumer has released every record (errc::timed_out).
  Result<void> drain(std::chrono::nanoseconds timeout);
  // drain(), then disconnect.
  Result<void> close(std::chrono::nanoseconds timeout);

  // After the connection failed (a call returned completion_error): connects
  // again and resumes in the consumer's next epoch. Every record not yet delivered goes out
  // again from staging, unchanged; the consumer reads from exactly the record after its last
  // delivery, so each record is delivered once, in order. Returns where it resumed.
  // Errors: as set-up (timed_out, verbs_failure: the consumer is not there), stale_epoch /
  // protocol_violation when the consumer refuses or answers inconsistently.
  Result<ResumePoint> recover();

  // Fault injection: moves the QP to the error state, as a dead link would.
  Result<void> force_error();

  ProducerStats stats() const;
  std::string ledger_dump() const;
  wire::PublishMode mode() const;

 private:
  struct Connection;
  explicit Producer(std::unique_ptr<Connection> c) noexcept;
  Result<void> post_due(bool force);
  std::unique_ptr<Connection> c_;
};

}  // namespace rdmaring
