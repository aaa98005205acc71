// The ring owner's side of one producer connection over real verbs: the ConsumerCore driven by
// an RC QP, the registered ring, and (mode tail) the tail MR.
//
// Single-threaded. Set-up throws SetupError; the data path returns Result. Records handed out
// by poll() point into the registered ring and are valid until the handler returns; those from
// poll_batch() until release().
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "rdmaring/consumer_core.hpp"
#include "rdmaring/error.hpp"

namespace rdmaring {

struct ConsumerOptions {
  std::string address;  // local address to listen on (rdma_cm picks the device from it)
  std::uint16_t port = 0;  // 0: ephemeral, see Consumer::port()
  std::uint64_t ring_bytes = 1 << 20;
  std::uint32_t max_record = 64 * 1024;
  wire::PublishMode mode = wire::PublishMode::imm;
  // Register the ring with IBV_ACCESS_RELAXED_ORDERING: mode imm only, where the immediate's
  // completion, not the order of placement, makes the bytes valid.
  bool relaxed_ordering = false;
  // Register the ring with On-Demand Paging; refused where the device has no ODP for RC WRITE.
  bool on_demand_paging = false;
  std::uint32_t recv_depth = 256;  // receives kept posted for immediates (mode imm)
  ConsumerConfig core;
  std::chrono::milliseconds accept_timeout = std::chrono::seconds(30);

  // errc::bad_config / relaxed_ordering_refused with the reason.
  Result<void> validate() const;
};

struct ConsumerStats {
  ConsumerCounters core;
  std::uint64_t recv_completions = 0;
  std::uint64_t recv_posts = 0;  // ibv_post_recv calls
  std::uint64_t post_send_calls = 0;
  std::uint64_t resumes = 0;            // producer reconnections admitted (each a new epoch and rkey)
  std::uint64_t refused_requests = 0;   // connect requests refused: not a resume of the current epoch
  std::uint64_t stale_completions = 0;  // completions of an earlier epoch's QP, ignored
  std::uint64_t error_completions = 0;  // error completions: each marks the connection dead
  ConsumerLedger ledger;
};

class Consumer {
 public:
  // Binds and listens; accept() takes the producer. Throws: SetupError.
  static Consumer listen(const ConsumerOptions& options);
  Consumer(Consumer&&) noexcept;
  Consumer& operator=(Consumer&&) noexcept;
  ~Consumer();

  std::uint16_t port() const;
  // Waits for one producer, registers its ring and accepts it. Throws: SetupError
  // (odp_unsupported, memlock_too_low, timed_out, a foreign connect request).
  void accept();

  using Handler = std::function<void(const DeliveredRecord&)>;
  // Delivers up to `max` records in order, releasing them when the handler has returned.
  // Returns how many. Errors: protocol_violation, completion_error.
  Result<std::size_t> poll(const Handler& handler, std::size_t max);
  // Fills `out` with records now being consumed; release() gives them back, in order.
  Result<std::size_t> poll_batch(std::span<DeliveredRecord> out);
  Result<void> release(const DeliveredRecord& last);

  // False once the producer disconnected (or its QP failed) and has not resumed. Records
  // published before that remain deliverable. A producer whose connection died reconnects with
  // a resume request; poll() admits it for the current epoch only, re-registers the ring (the
  // old rkey stops working) and hands it the point to continue from.
  bool connected();

  ConsumerStats stats() const;
  std::string ledger_dump() const;

 private:
  struct Connection;
  explicit Consumer(std::unique_ptr<Connection> c) noexcept;
  Result<void> progress();
  Result<void> return_credit();
  std::unique_ptr<Connection> c_;
};

}  // namespace rdmaring
