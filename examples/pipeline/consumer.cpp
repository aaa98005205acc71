// The consumer service: a ring owner that stores every event in SQLite, in one transaction with
// its session's delivered sequence, so that a restart (kill -9 included) resumes each session at
// exactly the first event not stored (README.md next to this file).
#include <capnp/serialize.h>
#include <rdmaring/ring_owner.hpp>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <map>
#include <mutex>
#include <optional>
#include <string>

#include "event.capnp.h"
#include "pipeline.hpp"
#include "store.hpp"

namespace pipeline {
namespace {

using namespace std::chrono_literals;

// The record as Cap'n Proto words, where it lies in the ring. Records start 16-byte aligned in
// a page-aligned ring and their 16-byte header keeps the payload 16-byte aligned
// (protocol-spec/wire-formats.md §2), and the producer commits whole words: a payload that is
// not is no event of this pipeline.
kj::ArrayPtr<const capnp::word> words_of(const rdmaring::Delivery& d) {
  const auto at = reinterpret_cast<std::uintptr_t>(d.payload.data());
  if (at % alignof(capnp::word) != 0 || d.payload.size() % sizeof(capnp::word) != 0) {
    throw std::runtime_error("session " + std::to_string(d.session) + " #" + std::to_string(d.sequence) +
                             ": payload of " + std::to_string(d.payload.size()) +
                             " bytes at an address or of a size that is not whole 8-byte words");
  }
  return {reinterpret_cast<const capnp::word*>(d.payload.data()), d.payload.size() / sizeof(capnp::word)};
}

// The owner calls on_session, restore and on_session_closed on its control thread and the
// handler on the polling thread: one connection, one transaction at a time, under one mutex.
class Store {
 public:
  explicit Store(const std::filesystem::path& path) : db_(path, false) {}

  // An upsert: the first record of a session (its attach, or its restore) inserts its row, a
  // later one (a resumed epoch's QP established: the floor rose) replaces the record and keeps
  // the sequence.
  void save_session(const rdmaring::SessionRecord& r) {
    std::lock_guard lock(m_);
    save_session_.bind(1, to_sql(r.session))
        .bind_blob(2, r.secret.data(), r.secret.size())
        .bind(3, std::string_view(r.identity))
        .bind(4, to_sql(r.min_epoch))
        .run();
  }

  // The record of a session that has not ended: a session that detached must not come back.
  std::optional<rdmaring::DurableSession> durable(rdmaring::SessionId id) {
    std::lock_guard lock(m_);
    find_session_.bind(1, to_sql(id));
    if (!find_session_.step()) return std::nullopt;
    rdmaring::DurableSession d{.next_sequence = from_sql(find_session_.integer(1)),
                               .identity = std::string(find_session_.text(2)),
                               .min_epoch = from_sql(find_session_.integer(3))};
    const auto secret = find_session_.blob(0);
    const bool whole = secret.size() == d.secret.size();
    if (whole) std::memcpy(d.secret.data(), secret.data(), secret.size());
    find_session_.reset();
    if (!whole) throw std::runtime_error("session " + std::to_string(id) + ": stored secret of " +
                                         std::to_string(secret.size()) + " bytes");
    return d;
  }

  void close_session(rdmaring::SessionId id, rdmaring::CloseReason reason) {
    std::lock_guard lock(m_);
    close_session_.bind(1, std::string_view(rdmaring::to_string(reason))).bind(2, to_sql(id)).run();
  }

  // A poll's events and each of their sessions' next sequence, in one transaction, committed
  // before the handler returns: the owner releases the records (their producers may then
  // overwrite them) only after that. A throw rolls it all back, and poll_batch() gives the whole
  // batch back with it: stored and released go together.
  void store(const rdmaring::DeliveryBatch& batch) {
    std::lock_guard lock(m_);
    begin_.run();
    try {
      std::map<rdmaring::SessionId, std::uint64_t> next;
      for (const rdmaring::Delivery& d : batch) {
        // Read in place: the reader walks the ring's words, and the memo goes from the ring to SQLite.
        capnp::FlatArrayMessageReader message(words_of(d));
        const auto e = message.getRoot<schema::Event>();
        const auto memo = e.getMemo();
        insert_event_.bind(1, to_sql(d.session))
            .bind(2, to_sql(d.sequence))
            .bind(3, e.getSource())
            .bind(4, to_sql(e.getIndex()))
            .bind(5, e.getAccount())
            .bind(6, e.getAmountCents())
            .bind(7, std::string_view(memo.begin(), memo.size()))
            .run();
        next[d.session] = d.sequence + 1;  // a session's records come in order
      }
      for (const auto& [session, sequence] : next)
        advance_session_.bind(1, to_sql(sequence)).bind(2, to_sql(session)).run();
      commit_.run();
    } catch (...) {
      rollback_.run();
      throw;
    }
    stored_ += batch.size();
  }

  std::uint64_t stored() const { return stored_; }  // the polling thread's own count

  bool every_session_ended() {
    std::lock_guard lock(m_);
    const bool open = open_sessions_.step();
    open_sessions_.reset();
    return !open;
  }

 private:
  std::uint64_t count_events() {
    Statement count = db_.prepare("SELECT count(*) FROM events");
    if (!count.step()) throw std::runtime_error("SQLite: count(*) returned no row");
    return from_sql(count.integer(0));
  }

  std::mutex m_;
  Database db_;
  Statement save_session_ = db_.prepare(
      "INSERT INTO sessions(id, secret, identity, min_epoch, next_sequence) VALUES(?, ?, ?, ?, 0) "
      "ON CONFLICT(id) DO UPDATE SET secret = excluded.secret, identity = excluded.identity, "
      "min_epoch = excluded.min_epoch");
  Statement find_session_ = db_.prepare(
      "SELECT secret, next_sequence, identity, min_epoch FROM sessions WHERE id = ? AND closed IS NULL");
  Statement close_session_ = db_.prepare("UPDATE sessions SET closed = ? WHERE id = ?");
  Statement open_sessions_ = db_.prepare("SELECT id FROM sessions WHERE closed IS NULL");
  Statement begin_ = db_.prepare("BEGIN");
  Statement insert_event_ = db_.prepare(
      "INSERT INTO events(session, sequence, source, idx, account, amount_cents, memo) VALUES(?, ?, ?, ?, ?, ?, ?)");
  Statement advance_session_ = db_.prepare("UPDATE sessions SET next_sequence = ? WHERE id = ?");
  Statement commit_ = db_.prepare("COMMIT");
  Statement rollback_ = db_.prepare("ROLLBACK");
  std::uint64_t stored_ = count_events();
};

}  // namespace

int run_consumer(const ConsumerOptions& o) {
  Store store(o.database);
  rdmaring::RingOwnerOptions options{.address = o.address, .control_port = o.control_port};
  options.security = o.security;
  options.on_session = [&store](const rdmaring::SessionRecord& r) { store.save_session(r); };
  options.restore = [&store](rdmaring::SessionId id) { return store.durable(id); };
  options.on_session_closed = [&store](rdmaring::SessionId id, rdmaring::CloseReason reason, const std::string&) {
    // This process stopping ends no session: its producers come back to the next one.
    if (reason != rdmaring::CloseReason::owner_stopped) store.close_session(id, reason);
  };
  const auto owner = rdmaring::RingOwner::start(options);
  std::cout << "consumer: listening on " << o.address << " port " << owner->control_port() << ", "
            << store.stored() << " events stored" << std::endl;

  constexpr std::uint64_t kReportEvery = 1000;
  // One transaction per poll, not per event (README.md next to this file).
  const auto handler = [&store, &o](const rdmaring::DeliveryBatch& batch) {
    const std::uint64_t before = store.stored();
    store.store(batch);
    if (store.stored() / kReportEvery != before / kReportEvery)
      std::cout << "consumer: " << store.stored() << " events stored" << std::endl;
    if (o.kill_self_at && before < *o.kill_self_at && store.stored() >= *o.kill_self_at)
      pipeline::kill_self("consumer: " + std::to_string(store.stored()) + " events stored, the last " +
                          std::to_string(batch.size()) + " not released");
    return batch.size();
  };
  while (!o.events || store.stored() < *o.events || !store.every_session_ended()) {
    auto polled = owner->poll_batch(handler, 256);
    if (!polled) {
      std::cerr << "pipeline consumer: poll: " << polled.error().message() << '\n';
      return 1;
    }
    if (polled.value() > 0) continue;
    // No longer than 100 ms: a session that ends wakes no wait(), and the loop must see it.
    if (auto woke = owner->wait(100ms); !woke) {
      std::cerr << "pipeline consumer: wait: " << woke.error().message() << '\n';
      return 1;
    }
  }
  const auto stats = owner->stats();
  std::cout << "consumer: " << store.stored() << " events stored, every session ended (this process: "
            << stats.sessions.restores << " session(s) restored, " << stats.rings.duplicates_dropped
            << " re-sent record(s) dropped as delivered before)" << std::endl;
  return 0;
}

}  // namespace pipeline
