// What the owner's device tests share: an auditing poll loop (every session's records exactly
// once, in order, intact, as session_records.hpp makes them), a producer loop that recovers, and
// the options both sides start from.
#pragma once

#include <catch2/catch.hpp>

#include <pthread.h>
#include <time.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "device_address.hpp"
#include "rdmaring/producer.hpp"
#include "rdmaring/ring_owner.hpp"
#include "session_records.hpp"
#include "test_pki.hpp"

namespace rdmaring::testing {

using namespace std::chrono_literals;

// The owner's poll loop on a thread of its own, checking every delivery against
// session_records.hpp: each session's records must arrive exactly once, in order, intact.
class Auditor {
 public:
  enum class Idle { yield, sleep };  // what the loop does after an empty poll: yield, or RingOwner::wait()

  // `on_delivery` runs for every record after the audit's checks (on the poll thread); `next`:
  // sequences already delivered by an earlier owner.
  explicit Auditor(RingOwner& owner, std::function<void(const Delivery&)> on_delivery = {},
                   std::map<SessionId, std::uint64_t> next = {}, Idle idle = Idle::yield)
      : owner_(owner),
        on_delivery_(std::move(on_delivery)),
        next_(std::move(next)),
        idle_(idle),
        thread_([this] { loop(); }) {}
  ~Auditor() { stop(); }

  void stop() {
    stop_ = true;
    owner_.wake();
    if (thread_.joinable()) thread_.join();
  }
  // CPU time the poll thread has used so far.
  std::chrono::nanoseconds cpu_time() {
    clockid_t clock{};
    timespec ts{};
    if (pthread_getcpuclockid(thread_.native_handle(), &clock) != 0 || clock_gettime(clock, &ts) != 0) return {};
    return std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec);
  }
  std::uint64_t delivered() const { return delivered_; }
  std::uint64_t wrong() const { return wrong_; }
  std::string error() const {
    std::lock_guard lock(m_);
    return error_;
  }
  std::map<SessionId, std::uint64_t> next() const {
    std::lock_guard lock(m_);
    return next_;
  }
  // Records delivered per session while `measuring` is set.
  std::atomic<bool> measuring{false};
  std::map<SessionId, std::uint64_t> measured_bytes() const {
    std::lock_guard lock(m_);
    return measured_;
  }

 private:
  void loop() {
    while (!stop_) {
      auto n = owner_.poll(
          [&](const Delivery& d) {
            std::lock_guard lock(m_);
            std::uint64_t& expect = next_[d.session];
            if (d.sequence != expect || !record_matches(d.sequence, d.payload)) {
              if (wrong_++ < 5 && error_.empty())
                error_ = "session " + std::to_string(d.session) + ": record " + std::to_string(d.sequence) +
                         " (" + std::to_string(d.payload.size()) + " B) where " + std::to_string(expect) +
                         " was due";
            }
            expect = d.sequence + 1;
            if (measuring) measured_[d.session] += d.payload.size();
            if (on_delivery_) on_delivery_(d);
            ++delivered_;
          },
          256);
      if (!n) {
        std::lock_guard lock(m_);
        error_ = "poll: " + n.error().message();
        return;
      }
      if (n.value() > 0) continue;
      if (idle_ == Idle::yield) {
        std::this_thread::yield();
      } else if (auto w = owner_.wait(std::chrono::milliseconds(-1)); !w) {
        // No time limit: only an event (or stop()'s wake()) ends the wait, so a lost wake-up
        // shows as a record that never arrives.
        std::lock_guard lock(m_);
        error_ = "wait: " + w.error().message();
        return;
      }
    }
  }

  RingOwner& owner_;
  std::function<void(const Delivery&)> on_delivery_;
  mutable std::mutex m_;
  std::map<SessionId, std::uint64_t> next_;
  std::map<SessionId, std::uint64_t> measured_;
  std::string error_;
  Idle idle_;
  std::atomic<std::uint64_t> delivered_{0};
  std::atomic<std::uint64_t> wrong_{0};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

template <class Pred>
bool wait_for(Pred pred, std::chrono::seconds limit,
              std::chrono::milliseconds step = std::chrono::milliseconds(10)) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(step);
  }
  return true;
}

// What an application keeps durably for its owner's restart (sessions.md §10.1), in memory:
// the records on_session upserts, and the sequence after the last record processed.
class DurableStore {
 public:
  // on_session and restore of `o` keep and read this store.
  void serve(RingOwnerOptions& o) {
    o.on_session = [this](const SessionRecord& r) {
      std::lock_guard lock(m_);
      DurableSession& d = store_[r.session];
      d.secret = r.secret;
      d.identity = r.identity;
      d.min_epoch = r.min_epoch;
    };
    o.restore = [this](SessionId id) { return find(id); };
  }
  // From the handler, before it returns: the record is processed.
  void processed(const Delivery& d) {
    std::lock_guard lock(m_);
    store_[d.session].next_sequence = d.sequence + 1;
  }
  std::optional<DurableSession> find(SessionId id) const {
    std::lock_guard lock(m_);
    const auto it = store_.find(id);
    if (it == store_.end()) return std::nullopt;
    return it->second;
  }

 private:
  mutable std::mutex m_;
  std::map<SessionId, DurableSession> store_;
};

inline RingOwnerOptions owner_options(wire::PublishMode mode) {
  RingOwnerOptions o;
  o.address = device_address();
  o.mode = mode;
  o.ring_bytes = 1 << 16;
  o.max_record = 1024;
  o.security = test_pki::owner();
  return o;
}

inline ProducerOptions producer_options(const RingOwner& owner) {
  ProducerOptions o;
  o.address = device_address();
  o.control_port = owner.control_port();
  o.security = test_pki::producer();
  return o;
}

// Sends records [next_sequence, end) of session_records.hpp, recovering from failures.
inline Result<void> send_records(Producer& p, std::uint64_t end) {
  for (std::uint64_t seq = p.next_sequence(); seq < end;) {
    auto r = p.send(record_bytes(seq), 30s);
    if (r) {
      ++seq;
      continue;
    }
    if (!needs_recover(r.error())) return r;
    for (int attempt = 0;; ++attempt) {
      auto resumed = p.recover();
      if (resumed) break;
      if (attempt == 100) return resumed.error();
      std::this_thread::sleep_for(100ms);
    }
  }
  return success();
}

}  // namespace rdmaring::testing
