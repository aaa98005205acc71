#include "rdmaring/owner_core.hpp"

#include <fnmatch.h>

#include <algorithm>
#include <utility>

namespace rdmaring {

Result<void> OwnerConfig::validate() const {
  BOOST_OUTCOME_TRYV(RingGeometry::make(ring_bytes, max_record));
  BOOST_OUTCOME_TRYV(core.validate());
  if (max_sessions == 0) return make_error(errc::bad_config, "max_sessions 0");
  if (quantum_bytes == 0) return make_error(errc::bad_config, "quantum_bytes 0");
  if (lease.count() < 0) return make_error(errc::bad_config, "negative lease");
  for (std::size_t i = 0; i < allow.size(); ++i) {
    const IdentityRule& r = allow[i];
    const std::string rule = "rule " + std::to_string(i + 1) + " ('" + r.pattern + "')";
    if (r.pattern.empty()) return make_error(errc::bad_config, rule + ": empty pattern");
    // Below one ring the rule would admit nothing while it seems to admit its identities: to keep
    // them out, leave them out of the rules.
    if (r.max_ring_bytes != 0 && r.max_ring_bytes < ring_bytes)
      return make_error(errc::bad_config, rule + ": max_ring_bytes " + std::to_string(r.max_ring_bytes) +
                                              " below one ring of " + std::to_string(ring_bytes));
  }
  return success();
}

const char* to_string(CloseReason r) noexcept {
  switch (r) {
    case CloseReason::detached: return "detached";
    case CloseReason::lease_expired: return "lease_expired";
    case CloseReason::protocol_violation: return "protocol_violation";
    case CloseReason::ring_failure: return "ring_failure";
    case CloseReason::owner_stopped: return "owner_stopped";
  }
  return "unknown";
}

OwnerCore::OwnerCore(const OwnerConfig& config)
    : config_(config),
      geometry_(RingGeometry::make(config.ring_bytes, config.max_record).value()),
      table_(config.max_sessions, config.lease) {}

OwnerCore::Session* OwnerCore::find(SessionId id) noexcept {
  const auto it = sessions_.find(id);
  return it == sessions_.end() ? nullptr : &it->second;
}

const ConsumerCore* OwnerCore::consumer(SessionId id) const noexcept {
  const auto it = sessions_.find(id);
  return it == sessions_.end() ? nullptr : &it->second.core;
}

std::vector<SessionId> OwnerCore::session_ids() const {
  std::vector<SessionId> ids;
  ids.reserve(sessions_.size());
  for (const auto& [id, s] : sessions_) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  return ids;
}

bool OwnerCore::link_live(SessionId id) const noexcept {
  const auto it = sessions_.find(id);
  return it != sessions_.end() && it->second.link && !it->second.link->dead;
}

bool OwnerCore::tail_watched(SessionId id) const noexcept {
  const auto it = sessions_.find(id);
  return it != sessions_.end() && config_.mode == wire::PublishMode::tail && it->second.watch != Watch::parked;
}

OwnerCore::Session& OwnerCore::add(SessionId id, std::span<const std::byte> ring, const ResumePoint& start,
                                   std::uint64_t deliver_from) {
  Session& s = sessions_
      .try_emplace(id, Session{ConsumerCore(ring, geometry_, config_.mode, start, deliver_from, config_.core)})
      .first->second;
  touch(id, s);
  if (config_.mode == wire::PublishMode::tail) {
    std::erase(watched_, id);  // an entry of an earlier session of this id, not compacted yet
    watched_.push_back(id);
    s.on_watch_list = true;
  }
  return s;
}

void OwnerCore::watch(SessionId id, Session& s) {
  s.quiet_reads = 0;
  s.watch = Watch::watched;
  if (config_.mode == wire::PublishMode::tail && !std::exchange(s.on_watch_list, true)) watched_.push_back(id);
}

bool OwnerCore::parkable(const Session& s) const noexcept {
  if (!s.link || !s.link->established || s.link->dead || s.fencing) return false;
  const ConsumerLedger l = s.core.ledger();
  return l.released == l.published && l.head == l.published && s.turn == Turn::idle && !s.publish_touched;
}

// A tail read that found no move (wakeup.md §3.2). Parking is the sleep of §3.1 for one session:
// the flag first, then a read of the tail after the flag write's completion, then no read until
// the doorbell that the producer, having the flag, sends after each publish.
void OwnerCore::take_quiet_tail(SessionId id, Session& s) {
  if (config_.tail_park_reads == 0) return;
  if (s.watch == Watch::parking) {
    // This read came after the flag write's completion (the CQ is polled before the tails): a
    // publish placed before the flag landed is seen here, one after it rings.
    if (s.core.doorbell_confirmed() && parkable(s)) {
      s.watch = Watch::parked;
      watched_stale_ = true;
      ++counters_.parks;
    }
    return;
  }
  if (++s.quiet_reads < config_.tail_park_reads || !parkable(s)) return;
  s.watch = Watch::parking;
  s.core.want_doorbell(true);
  touch_credit(id, s);
}

void OwnerCore::touch_publish(SessionId id, Session& s) {
  if (!std::exchange(s.publish_touched, true)) publish_touched_.push_back(id);
}

void OwnerCore::touch_credit(SessionId id, Session& s) {
  if (!std::exchange(s.credit_touched, true)) credit_touched_.push_back(id);
}

void OwnerCore::enqueue(SessionId id, Session& s, bool first) {
  if (s.turn == Turn::queued) {
    if (!first) return;
    round_.erase(std::find(round_.begin(), round_.end(), id));  // a give-back moves it: rare
  }
  s.turn = Turn::queued;
  if (first) round_.push_front(id);
  else round_.push_back(id);
}

void OwnerCore::end(SessionId id, CloseReason reason, std::string message) {
  const auto it = sessions_.find(id);
  if (it == sessions_.end()) return;
  counters_.closed_rings += it->second.core.counters();
  sessions_.erase(it);
  // Off every list now: the same id may come back by a restore, and must not find a turn queued.
  std::erase(round_, id);
  std::erase(stalled_, id);
  std::erase(publish_touched_, id);
  std::erase(credit_touched_, id);
  watched_stale_ = true;  // read_tails may be walking watched_ now
  if (goes_on_ == id) goes_on_.reset();
  // The adapter reports the end after the records it took: one still pending here would bring
  // the ended session's record back after the application dropped it.
  std::erase_if(records_, [id](const SessionRecord& r) { return r.session == id; });
  closed_.push_back(ClosedSession{id, reason, std::move(message)});
}

// The producer broke the protocol: its session ends (the adapter revokes the rkey with the MR);
// the others go on.
void OwnerCore::fail(SessionId id, const Error& e) {
  ++counters_.sessions_failed;
  counters_.last_session_failure = "session " + std::to_string(id) + ": " + e.message();
  table_.remove(id);
  end(id, CloseReason::protocol_violation, e.message());
}

void OwnerCore::close(SessionId id, CloseReason reason, std::string message) {
  table_.remove(id);
  end(id, reason, std::move(message));
}

std::vector<ClosedSession> OwnerCore::take_closed() { return std::exchange(closed_, {}); }
std::vector<SessionId> OwnerCore::take_broken() { return std::exchange(broken_, {}); }

// ---- the control channel ------------------------------------------------------------------------

Result<void> OwnerCore::admit(std::string_view identity) {
  const auto& rules = config_.allow;
  if (rules.empty()) return success();
  const std::string name(identity);
  const auto rule = std::find_if(rules.begin(), rules.end(), [&name](const IdentityRule& r) {
    return fnmatch(r.pattern.c_str(), name.c_str(), 0) == 0;
  });
  const std::string who = "identity '" + name + "'";
  if (rule == rules.end()) {
    ++counters_.refused_unauthorized;
    return make_error(errc::unauthorized,
                      who + " matches none of the " + std::to_string(rules.size()) + " allow rules");
  }
  const std::string by = "rule " + std::to_string(rule - rules.begin() + 1) + " ('" + rule->pattern + "') allows ";
  // Every session holds one ring of ring_bytes: its sessions are its ring bytes.
  const std::uint64_t held = table_.held(identity);
  if (rule->max_sessions != 0 && held >= rule->max_sessions) {
    ++counters_.refused_quota;
    return make_error(errc::quota_exceeded,
                      who + " holds " + std::to_string(held) + " sessions; " + by + std::to_string(rule->max_sessions));
  }
  if (rule->max_ring_bytes != 0 && (held + 1) * config_.ring_bytes > rule->max_ring_bytes) {
    ++counters_.refused_quota;
    return make_error(errc::quota_exceeded, who + " holds " + std::to_string(held * config_.ring_bytes) +
                                                " ring bytes; " + by + std::to_string(rule->max_ring_bytes) +
                                                ", not one more ring of " + std::to_string(config_.ring_bytes));
  }
  return success();
}

void OwnerCore::record(const SessionEntry& s, std::uint64_t min_epoch) {
  records_.push_back(SessionRecord{s.id, s.secret, s.identity, min_epoch});
}

std::vector<SessionRecord> OwnerCore::take_records() { return std::exchange(records_, {}); }

Result<void> OwnerCore::can_attach(std::string_view identity) {
  BOOST_OUTCOME_TRYV(admit(identity));
  if (table_.size() >= config_.max_sessions)
    return make_error(errc::no_capacity, "the owner serves " + std::to_string(table_.size()) + " sessions, its maximum");
  return success();
}

Result<SessionEntry> OwnerCore::attach(std::string_view identity, std::span<const std::byte> ring,
                                       Clock::time_point now) {
  BOOST_OUTCOME_TRYV(admit(identity));
  BOOST_OUTCOME_TRY(entry, table_.attach(identity, now));
  add(entry.id, ring, ResumePoint{}, 0);
  record(entry, 1);
  return entry;
}

Result<Fence> OwnerCore::resume(const Credentials& who, Clock::time_point now) {
  BOOST_OUTCOME_TRY(epoch, table_.resume(who, now));
  Session* s = find(who.session);
  if (!s) return make_error(errc::unknown_session, "session " + std::to_string(who.session) + " has no ring");
  BOOST_OUTCOME_TRY(at, s->core.begin_epoch(epoch));
  touch(who.session, *s);
  watch(who.session, *s);
  s->link.reset();
  s->fencing = true;
  // What the next epoch's producer may write again, from the read head to its limit: zeroed, so
  // that an old copy left there can never pass the checks in place of the new one
  // (protocol-spec/model, run 8). Records being consumed lie below the head and are kept.
  const ConsumerLedger l = s->core.ledger();
  Fence f{at, {}};
  const std::uint64_t length = l.released + geometry_.bytes - l.head;
  const std::uint64_t offset = geometry_.offset(l.head);
  const std::uint64_t first = std::min(length, geometry_.bytes - offset);
  f.zero[0] = ByteRange{offset, first};
  f.zero[1] = ByteRange{0, length - first};
  return f;
}

void OwnerCore::fence_done(SessionId id) noexcept {
  if (Session* s = find(id)) s->fencing = false;
}

Result<ResumePoint> OwnerCore::restore(const Credentials& who, const DurableSession& durable, bool restarted,
                                       std::uint64_t released, std::uint64_t first, std::span<const std::byte> ring,
                                       Clock::time_point now) {
  // A restarted producer holds nothing released and starts from the application's durable point.
  if (restarted) {
    released = 0;
    first = durable.next_sequence;
  }
  if (released % wire::kRecordAlign != 0)
    return make_error(errc::invalid_argument,
                      "resume: released " + std::to_string(released) + " is not a record boundary");
  BOOST_OUTCOME_TRYV(admit(who.identity));
  BOOST_OUTCOME_TRY(epoch, table_.restore(who, durable.secret, durable.identity, durable.min_epoch, now));
  if (first > durable.next_sequence) {
    // The producer no longer holds records the application's durable record says it has not
    // processed: the old owner released them. Delivery goes on; the gap is reported.
    ++counters_.restore_gaps;
    counters_.last_session_failure = "session " + std::to_string(who.session) + ": restored at sequence " +
                                     std::to_string(durable.next_sequence) + " but the producer holds from " +
                                     std::to_string(first) + "; records in between are lost";
  }
  const ResumePoint at{epoch, released, released, first};
  add(who.session, ring, at, durable.next_sequence);
  record(*table_.find(who.session), who.epoch);
  return at;
}

Result<void> OwnerCore::heartbeat(const Credentials& who, Clock::time_point now) { return table_.heartbeat(who, now); }

Result<void> OwnerCore::detach(const Credentials& who) {
  BOOST_OUTCOME_TRYV(table_.detach(who));
  end(who.session, CloseReason::detached, {});
  return success();
}

void OwnerCore::tick(Clock::time_point now) {
  for (SessionId id : table_.expire(now)) end(id, CloseReason::lease_expired, "no publish or heartbeat for a lease");
}

// ---- links --------------------------------------------------------------------------------------

Result<void> OwnerCore::admit_connect(const wire::ConnectData& request, Clock::time_point now) {
  Session* s = find(request.session);
  if (s && s->fencing) {
    ++counters_.connect_refused;
    return make_error(errc::invalid_argument, "session " + std::to_string(request.session) + " is being fenced");
  }
  if (auto ok = table_.admit_connect(request, now); !ok) {
    ++counters_.connect_refused;
    return ok.error();
  }
  if (!s) {
    ++counters_.connect_refused;
    return make_error(errc::unknown_session, "session " + std::to_string(request.session) + " has no ring");
  }
  // The table admits a QP only for the current epoch, so a link this replaces was of an epoch
  // already fenced, or a QP that never got established.
  s->link = Link{request.epoch, false, false};
  touch_credit(request.session, *s);
  return success();
}

void OwnerCore::connect_failed(SessionId id) noexcept {
  ++counters_.connect_refused;
  if (Session* s = find(id)) s->link.reset();
}

void OwnerCore::on_established(SessionId id) noexcept {
  Session* s = find(id);
  if (!s || !s->link || s->link->dead) return;
  s->link->established = true;
  const bool ends_window = table_.find(id)->unconfirmed.has_value();
  table_.on_connected(id);
  if (ends_window) {
    const SessionEntry& e = *table_.find(id);
    record(e, e.epoch);
  }
  touch_credit(id, *s);
}

void OwnerCore::break_link(SessionId id, Session& s) noexcept {
  if (!s.link || s.link->dead) return;
  s.link->dead = true;
  // A publish whose doorbell the break lost is still in the tail MR: what is published stays
  // deliverable (failures.md §1).
  watch(id, s);
  table_.on_broken(id, s.link->epoch);
  broken_.push_back(id);
}

void OwnerCore::on_link_broken(SessionId id) noexcept {
  if (Session* s = find(id)) break_link(id, *s);
}

// ---- the data path ------------------------------------------------------------------------------

void OwnerCore::on_immediate(SessionId id, std::uint32_t imm) {
  Session* s = find(id);
  if (!s) return;
  touch(id, *s);
  const auto ok = config_.mode == wire::PublishMode::imm ? s->core.on_immediate(imm) : s->core.on_doorbell(imm);
  if (!ok) {
    fail(id, ok.error());
  } else if (config_.mode == wire::PublishMode::tail) {
    ++doorbells_;
    watch(id, *s);  // its publish is in the tail MR, which read_tails now reads
  }
}

void OwnerCore::on_tail(SessionId id, std::span<const std::byte, wire::kTailRecordSize> bytes) {
  Session* s = find(id);
  if (!s) return;
  // Read every poll for every session not parked, and mostly unchanged: only a move is a change.
  const std::uint64_t published = s->core.ledger().published;
  const std::uint64_t asked = s->core.counters().credit_requests;
  if (auto ok = s->core.on_tail(bytes); !ok) {
    fail(id, ok.error());
  } else if (s->core.ledger().published != published || s->core.counters().credit_requests != asked) {
    touch(id, *s);
    watch(id, *s);
  } else {
    take_quiet_tail(id, *s);
  }
}

void OwnerCore::on_credit_completion(SessionId id, std::uint64_t wr_id) {
  Session* s = find(id);
  if (!s) return;
  s->core.on_completion(wr_id, true);
  touch_credit(id, *s);  // a credit held back for send-queue room may go now
}

void OwnerCore::on_error_completion(SessionId id) {
  ++counters_.error_completions;
  on_link_broken(id);
}

bool OwnerCore::wants_clock() noexcept {
  if (!round_.empty() || !stalled_.empty()) return true;
  if (publish_touched_.empty()) return false;  // an idle owner's poll ends here
  // What an event touched and left with nothing to deliver is forgotten here, so that an idle
  // owner's next poll does not look at it again.
  std::erase_if(publish_touched_, [this](SessionId id) {
    ++counters_.session_visits;
    Session& s = *find(id);
    const ConsumerLedger l = s.core.ledger();
    if (l.head != l.published || s.core.counters().publishes != s.publishes_seen) return false;
    s.publish_touched = false;
    return true;
  });
  return !publish_touched_.empty();
}

bool OwnerCore::work_due(Clock::time_point now) noexcept {
  if (!wants_clock()) return false;
  if (!round_.empty()) return true;
  const auto due = [this, now](SessionId id) {
    const Session& s = *find(id);
    if (s.core.counters().publishes != s.publishes_seen) return true;
    const ConsumerLedger l = s.core.ledger();
    if (l.head == l.published) return false;
    const auto at = s.core.recheck_at();
    return !at || *at <= now;
  };
  return std::any_of(publish_touched_.begin(), publish_touched_.end(), due) ||
         std::any_of(stalled_.begin(), stalled_.end(), due);
}

std::optional<OwnerCore::Clock::time_point> OwnerCore::next_recheck() const noexcept {
  std::optional<Clock::time_point> first;
  for (SessionId id : stalled_)
    if (const auto at = sessions_.at(id).core.recheck_at(); at && (!first || *at < *first)) first = at;
  return first;
}

void OwnerCore::take_deliveries(std::size_t max, Clock::time_point now, std::vector<TakenRecord>& out) {
  counters_.session_visits += publish_touched_.size() + stalled_.size();
  for (SessionId id : publish_touched_) {
    Session& s = *find(id);
    s.publish_touched = false;
    if (s.core.counters().publishes != s.publishes_seen) {
      s.publishes_seen = s.core.counters().publishes;
      table_.touch(id, now);
    }
    const ConsumerLedger l = s.core.ledger();
    if (l.head != l.published && s.turn != Turn::queued) enqueue(id, s, false);
  }
  publish_touched_.clear();
  // A record that failed its checks is read again at every take (it waits out its recheck time
  // inside next()); its session keeps its place after the ones queued before.
  for (SessionId id : stalled_) {
    Session& s = *find(id);
    if (s.turn == Turn::stalled) enqueue(id, s, false);
  }
  stalled_.clear();

  // Deficit round robin (Shreedhar and Varghese's active list): each turn adds a quantum of
  // payload bytes to a session's allowance; a record goes out while the allowance lasts (and one
  // always does), so a session of large records gets no more bytes per round than one of small
  // records, and none waits more than one round. A session still backlogged after its turn goes
  // to the back; one found empty leaves the round, banking nothing (an idle session gets no
  // allowance for a later flood). A turn that `max` cut short goes on first at the next call,
  // with no new quantum: else a session whose turns the poll limit keeps cutting would get a
  // record per poll while banking the rest of each quantum.
  std::size_t n = 0;
  while (n < max && !round_.empty()) {
    const SessionId id = round_.front();
    round_.pop_front();
    ++counters_.session_visits;
    Session* s = find(id);
    s->turn = Turn::idle;
    if (goes_on_ != id) s->deficit += config_.quantum_bytes;
    goes_on_.reset();
    std::size_t served = 0;
    bool empty = false;
    while (n < max && (served == 0 || s->deficit > 0)) {
      auto record = s->core.next(now);
      if (!record) {
        fail(id, record.error());
        break;
      }
      if (!record.value()) {
        empty = true;
        break;
      }
      const DeliveredRecord& d = *record.value();
      out.push_back(TakenRecord{Delivery{id, d.payload, d.sequence}, d.end});
      // Charged by the ring space a record takes, so empty records are not free.
      s->deficit -= static_cast<std::int64_t>(wire::record_span(d.payload.size()));
      ++served;
      ++n;
    }
    if (!(s = find(id))) continue;  // failed
    const ConsumerLedger l = s->core.ledger();
    if (empty || l.head == l.published) {
      s->deficit = 0;  // an idle session banks no allowance, even after a record
      if (l.head != l.published) {
        s->turn = Turn::stalled;
        stalled_.push_back(id);
      }
    } else if (n >= max && s->deficit > 0) {
      enqueue(id, *s, true);
      goes_on_ = id;
    } else {
      enqueue(id, *s, false);
    }
  }
}

void OwnerCore::finish_deliveries(std::span<const TakenRecord> taken, std::size_t handled) {
  // Per session, its handled records are a prefix of its records in the batch: release through
  // the last handled one, give back from the first one not handled. A batch spans few sessions,
  // so they are looked up in a flat list.
  if (taken.empty()) return;  // every poll ends here, most of an idle owner's with nothing
  auto& marks = mark_scratch_;  // (session, seen)
  const auto first_sight = [&marks](SessionId id) {
    for (auto& [marked, seen] : marks)
      if (marked == id) return !std::exchange(seen, true);
    marks.emplace_back(id, true);
    return true;
  };
  handled = std::min(handled, taken.size());
  marks.clear();
  for (std::size_t i = handled; i-- > 0;) {
    const TakenRecord& r = taken[i];
    // A session's records come in runs, one per turn: a record followed by its own session's is
    // not that session's last, and the common batch of one session needs no bookkeeping.
    if (i + 1 < handled && taken[i + 1].delivery.session == r.delivery.session) continue;
    if (!first_sight(r.delivery.session)) continue;  // not its session's last: looked up once per session, not per record
    Session* s = find(r.delivery.session);
    if (!s) continue;  // closed while the application held it
    touch_credit(r.delivery.session, *s);
    if (auto ok = s->core.release(r.end); !ok) fail(r.delivery.session, ok.error());
  }
  marks.clear();
  for (std::size_t i = handled; i < taken.size(); ++i) {
    const TakenRecord& r = taken[i];
    Session* s = find(r.delivery.session);
    if (!s) continue;
    const std::uint64_t span = wire::record_span(r.delivery.payload.size());
    // The allowance spent on records given back is refunded: an abort costs the session no turn.
    s->deficit += static_cast<std::int64_t>(span);
    if (!first_sight(r.delivery.session)) continue;
    ++counters_.handler_aborts;
    s->core.unread(r.end - span, r.delivery.sequence);
    touch_credit(r.delivery.session, *s);
    if (s->turn != Turn::queued) enqueue(r.delivery.session, *s, false);
  }
  // The turn the application interrupted goes on first: what it gave back comes again in the
  // same order.
  if (handled < taken.size()) {
    const SessionId id = taken[handled].delivery.session;
    if (Session* s = find(id)) {
      enqueue(id, *s, true);
      goes_on_ = id;
    }
  }
}

void OwnerCore::prepare_sleep() noexcept {
  doorbells_at_prepare_ = doorbells_;
  if (config_.mode != wire::PublishMode::tail) return;  // an immediate wakes the owner anyway
  // A parked session has the flag already (wakeup.md §3.2): only the watched are asked.
  counters_.session_visits += watched_.size();
  for (SessionId id : watched_) {
    Session* s = find(id);
    if (s && s->watch != Watch::parked && s->link && s->link->established && !s->link->dead) {
      s->core.want_doorbell(true);
      touch_credit(id, *s);
    }
  }
}

void OwnerCore::take_credits(std::vector<CreditPost>& out) {
  // What this takes leaves nothing due until the session's next event (a credit held back for
  // send-queue room waits for a completion, which touches it).
  if (credit_touched_.empty()) return;
  counters_.session_visits += credit_touched_.size();
  for (SessionId id : credit_touched_) {
    Session& s = *find(id);
    s.credit_touched = false;
    if (!s.link || !s.link->established || s.link->dead) continue;
    while (auto w = s.core.take_credit()) {
      ++counters_.credit_posts;
      out.push_back(CreditPost{id, *w});
    }
  }
  credit_touched_.clear();
}

}  // namespace rdmaring
