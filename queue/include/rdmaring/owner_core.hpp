// The ring owner's protocol, sans I/O: the session table, one consumer core per session, links
// (which epoch's QP is admitted, established, dead), fencing, leases, credit decisions and fair
// delivery (deficit round robin). Events go in (a control request, a connect request, an
// immediate, a tail record read, a completion, a clock tick); what the transport must do comes
// out (zero these ring bytes, post this credit, tear this session down). RingOwner executes it
// on verbs; the test fabric executes it on plain memory, so both run this code and nothing else.
//
// Isolation: everything that belongs to one session (its protocol violations, its link's
// failures) changes that session only. Nothing here calls back into the caller: a session ended
// while a batch of events is being fed is reported by take_closed(), after the batch, so an
// adapter never tears a QP down in the middle of dispatching its completion queue.
//
// Single-threaded: the adapter serialises calls (RingOwner holds its lock around each one and
// never while the application's handler runs).
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <deque>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "rdmaring/consumer_core.hpp"
#include "rdmaring/error.hpp"
#include "rdmaring/session_table.hpp"

namespace rdmaring {

// Who may attach, and how much each identity may hold (sessions.md §2.8). An identity is the
// producer's certificate's subject common name ("" on a plaintext channel).
struct IdentityRule {
  std::string pattern;              // fnmatch(3) glob, flags 0: '*', '?', '[...]'
  std::uint32_t max_sessions = 0;   // sessions one identity may hold at once; 0: no limit but the owner's
  std::uint64_t max_ring_bytes = 0; // ring bytes one identity may hold at once; 0: no limit
};

struct OwnerConfig {
  std::uint64_t ring_bytes = 1 << 20;  // per session
  std::uint32_t max_record = 64 * 1024;
  wire::PublishMode mode = wire::PublishMode::imm;
  std::uint32_t max_sessions = 64;
  // A session that neither publishes nor heartbeats for this long is closed. Zero: never.
  std::chrono::nanoseconds lease = std::chrono::seconds(30);
  // Deficit round robin: payload bytes a session may deliver per turn (at least one record).
  std::uint32_t quantum_bytes = 64 * 1024;
  // Mode tail: a session whose tail record was read this many times in a row without a move, with
  // nothing unread or unreleased, is parked (wakeup.md §3.2): its producer is asked to ring, and
  // once it has the flag the owner stops reading that tail until a doorbell. Zero: never parked.
  std::uint32_t tail_park_reads = 1024;
  ConsumerConfig core;
  // Empty: any identity, no per-identity quota. Else the FIRST rule that matches applies; none
  // matching: unauthorized.
  std::vector<IdentityRule> allow;

  Result<void> validate() const;
};

// What an application keeps, durably, so that exactly-once delivery survives a restart of the
// owner: per session, its last SessionRecord and the sequence after the last record it has
// durably processed.
struct DurableSession {
  SessionSecret secret{};
  std::uint64_t next_sequence = 0;  // records below this were delivered and must not be again
  std::string identity;          // whose session it is: a restore from another identity is refused
  std::uint64_t min_epoch = 1;   // the durable floor: no resume from an epoch below it is admitted
};

// What the application must store (upsert) whenever it changes: at attach, at a restore, and
// whenever a resumed epoch's QP is established (the floor rises to that epoch).
struct SessionRecord {
  SessionId session = 0;
  SessionSecret secret{};
  std::string identity;
  std::uint64_t min_epoch = 1;
};

enum class CloseReason {
  detached,            // the producer said goodbye
  lease_expired,       // no publish or heartbeat for a lease
  protocol_violation,  // the producer broke the protocol
  ring_failure,        // the ring could not be made or registered again
  owner_stopped,       // the owner was destroyed
};
const char* to_string(CloseReason r) noexcept;

struct ClosedSession {
  SessionId session = 0;
  CloseReason reason = CloseReason::detached;
  std::string message;
};

// Ring offsets [offset, offset + length).
struct ByteRange {
  std::uint64_t offset = 0;
  std::uint64_t length = 0;
};

// A resume admitted: the epoch is fenced. The adapter must, in this order: drop the session's QP
// and discard its completions (done by the time resume() returns: see there), zero `zero` and
// register the ring again (new rkeys), then call fence_done(). Until then no QP is admitted for
// the session, so nothing can write the bytes being zeroed.
struct Fence {
  ResumePoint at;                  // where the producer continues: the grant's resume point
  std::array<ByteRange, 2> zero{};  // the unread ring, from the read head to the producer's limit
};

struct CreditPost {
  SessionId session = 0;
  CreditWrite write;
};

// A record as the application's handler sees it.
struct Delivery {
  SessionId session = 0;
  std::span<const std::byte> payload;  // in the session's ring: valid until the handler returns
  std::uint64_t sequence = 0;          // per session, from 0, without gaps
};

// What a handler may answer (Aeron's controlled poll): back-pressure from the application.
enum class HandlerAction {
  consume,  // the record is handled; go on
  abort,    // the record is NOT handled: it and everything after it in this poll are delivered
            // again, in order, by the next poll
  stop,     // the record is handled; end this poll after it (Aeron's BREAK)
};

// A record being consumed, with where it ends (what finish_deliveries releases).
struct TakenRecord {
  Delivery delivery;
  std::uint64_t end = 0;
};

struct OwnerCounters {
  std::uint64_t sessions_failed = 0;    // closed because their producer broke the protocol
  std::uint64_t connect_refused = 0;    // connect requests refused (any reason in the table's counters)
  std::uint64_t restore_gaps = 0;       // restores where the producer no longer held every unprocessed record
  std::uint64_t error_completions = 0;  // each marks its session's link broken
  std::uint64_t credit_posts = 0;
  std::uint64_t handler_aborts = 0;     // give-backs: per session, a poll that left its records for the next
  std::uint64_t refused_unauthorized = 0;  // attaches and restores of an identity no allow rule matches
  std::uint64_t refused_quota = 0;         // attaches and restores beyond the identity's rule's quota
  // Sessions this core looked at for a delivery, a credit or a doorbell flag: grows with the
  // events and records of busy sessions, not with the sessions attached.
  std::uint64_t session_visits = 0;
  // Mode tail: tail records read (read_tails), and sessions parked (wakeup.md §3.2). A parked
  // session's tail is read again only after its doorbell, so an idle owner's poll reads none.
  std::uint64_t tail_reads = 0;
  std::uint64_t parks = 0;
  ConsumerCounters closed_rings;        // summed over the rings of closed sessions
  std::string last_session_failure;
};

class OwnerCore {
 public:
  using Clock = SessionTable::Clock;

  // Assumes `config` validated.
  explicit OwnerCore(const OwnerConfig& config);

  // ---- the control channel ----------------------------------------------------------------

  // Whether an attach from `identity` could be admitted now: checked before the adapter
  // allocates a ring, so a full owner allocates nothing. Counts its refusals. Errors:
  // unauthorized, quota_exceeded, no_capacity.
  Result<void> can_attach(std::string_view identity);
  // A new session of `identity` in epoch 1 over `ring` (ring_bytes of zeroes, kept by the
  // adapter until the session is closed). Errors: as can_attach.
  Result<SessionEntry> attach(std::string_view identity, std::span<const std::byte> ring, Clock::time_point now);
  // A resume of a known session: fences the caller's epoch and begins the next. The session's
  // link is gone when this returns: the adapter drops its QP and drains its completions before
  // it feeds any other event (RingOwner does both under the same lock). Errors: as the table's
  // resume.
  Result<Fence> resume(const Credentials& who, Clock::time_point now);
  // The fence's zeroing and re-registration are done: connect requests are admitted again.
  void fence_done(SessionId id) noexcept;
  // A resume of a session this owner does not know, which the application vouches for after an
  // owner restart (`durable`), over a new `ring`. `released`/`first` are what the producer still
  // holds (restarted: from durable.next_sequence, nothing released). A gap between the two is
  // counted and reported, not refused. Admitted as an attach of who.identity is, and only from
  // the identity and epochs the durable record allows. Errors: unauthorized, quota_exceeded, as
  // the table's restore.
  Result<ResumePoint> restore(const Credentials& who, const DurableSession& durable, bool restarted,
                              std::uint64_t released, std::uint64_t first, std::span<const std::byte> ring,
                              Clock::time_point now);
  Result<void> heartbeat(const Credentials& who, Clock::time_point now);
  // Ends the session (reported by take_closed). Errors: as the table's detach.
  Result<void> detach(const Credentials& who);
  // Records changed since the last call, oldest first (an upsert each): pushed by attach
  // (min_epoch 1), restore (min_epoch = who.epoch, the retry window's low end) and
  // on_established when it ends a retry window (min_epoch = the new epoch: the table forgets the
  // window, so no resume from below it can be admitted again). A session ended before the call
  // has none.
  std::vector<SessionRecord> take_records();
  // Leases that ran out end their sessions (reported by take_closed).
  void tick(Clock::time_point now);
  // The owner ends a session on its own account (its ring could not be registered again).
  void close(SessionId id, CloseReason reason, std::string message);

  // ---- links --------------------------------------------------------------------------------

  // A QP's connect request: admitted only for the current epoch of a session that has no QP and
  // is not being fenced. On success any earlier link of the session is replaced: the adapter
  // drops its QP. Errors: as the table's admit_connect.
  Result<void> admit_connect(const wire::ConnectData& request, Clock::time_point now);
  // The admitted QP could not be made: the session has no link again.
  void connect_failed(SessionId id) noexcept;
  void on_established(SessionId id) noexcept;
  // The link died (error completion, disconnect, QP fatal, a failed post): what is published
  // stays deliverable and the producer may resume.
  void on_link_broken(SessionId id) noexcept;

  // ---- the data path --------------------------------------------------------------------------

  void on_immediate(SessionId id, std::uint32_t imm);
  // Mode tail: the tail record of every session not parked, each copied by `read(id, into)` (into
  // a std::span<std::byte, wire::kTailRecordSize>; false: no such ring, skipped) and then taken as
  // on_tail(). A session a doorbell or a resume unparks is read from the next call on (or from
  // this one, if it came before).
  template <class Read>
  void read_tails(Read&& read);
  void on_tail(SessionId id, std::span<const std::byte, wire::kTailRecordSize> bytes);
  void on_credit_completion(SessionId id, std::uint64_t wr_id);
  void on_error_completion(SessionId id);
  // Whether take_deliveries needs the clock: some session has unread records or moved its
  // publish mark since the last call (an idle owner reads no clock). Not const: it forgets the
  // sessions an event touched that turned out to have nothing.
  bool wants_clock() noexcept;
  // Whether a poll at `now` has work: as wants_clock(), less the sessions whose next record
  // fails its checks and is not due for its re-read yet (wakeup.md O7). An owner about to sleep
  // asks this, and sleeps no later than next_recheck().
  bool work_due(Clock::time_point now) noexcept;
  std::optional<Clock::time_point> next_recheck() const noexcept;
  // Appends up to `max` records to `out`, sessions taken in turn (deficit round robin by ring
  // space), records in order within each. They are being consumed until finish_deliveries.
  void take_deliveries(std::size_t max, Clock::time_point now, std::vector<TakenRecord>& out);
  // The application handled the first `handled` records of `taken`; the rest go back and are
  // taken again, in the same order, by the next take_deliveries. Releases what was handled.
  void finish_deliveries(std::span<const TakenRecord> taken, std::size_t handled);
  // Credit write-backs due on live, established links.
  void take_credits(std::vector<CreditPost>& out);
  // The owner is about to sleep (mode tail): every established link's producer not parked
  // already is asked to follow its publishes with a doorbell, by the credit records the next
  // take_credits returns.
  // The owner may sleep at once: each write that sets a flag is signaled, and its completion
  // wakes the owner for the re-check that makes the sleep safe (protocol-spec/wakeup.md).
  void prepare_sleep() noexcept;
  // Whether a doorbell came since the last prepare_sleep(). It cleared its session's flag (O2),
  // and the clear goes out with the next credits: an owner that slept now would have told that
  // producer to stop ringing, and a publish it then makes would wake nobody. So the owner does
  // not sleep; the next try sets the flag again (wakeup.md §3.1 step 4).
  bool doorbell_since_prepare() const noexcept { return doorbells_ != doorbells_at_prepare_; }

  // Whether take_closed, take_broken or take_records has anything: the adapter asks at every
  // poll, and an empty answer costs no vector.
  bool has_actions() const noexcept { return !closed_.empty() || !broken_.empty() || !records_.empty(); }
  // Sessions ended since the last call: the adapter tears down their QPs and rings.
  std::vector<ClosedSession> take_closed();
  // Sessions whose link broke since the last call: the adapter disconnects their QPs, so that a
  // producer whose QP still looks alive (the owner's post was refused, say) learns of it and
  // resumes instead of waiting for credit that cannot come.
  std::vector<SessionId> take_broken();

  // ---- what is visible ------------------------------------------------------------------------

  const SessionTable& table() const noexcept { return table_; }
  const OwnerCounters& counters() const noexcept { return counters_; }
  const ConsumerCore* consumer(SessionId id) const noexcept;
  std::size_t ring_count() const noexcept { return sessions_.size(); }
  std::vector<SessionId> session_ids() const;  // ascending
  // Whether the session has an admitted QP that is neither dead nor replaced.
  bool link_live(SessionId id) const noexcept;
  // Mode tail: whether the session's tail record is read at every poll (false: parked, read
  // only after its doorbell).
  bool tail_watched(SessionId id) const noexcept;

 private:
  struct Link {
    std::uint64_t epoch = 0;
    bool established = false;
    bool dead = false;
  };
  // Where a session stands in deficit round robin: not backlogged, queued for a turn, or
  // backlogged with a next record that failed its checks (re-read at every take, wakeup.md O7).
  enum class Turn : std::uint8_t { idle, queued, stalled };
  // Mode tail (wakeup.md §3.2): its tail record read at every poll; asked to ring and waiting
  // for the flag write's completion (still read); or parked (read after a doorbell only).
  enum class Watch : std::uint8_t { watched, parking, parked };
  struct Session {
    ConsumerCore core;
    std::optional<Link> link;
    bool fencing = false;
    std::uint64_t publishes_seen = 0;
    std::int64_t deficit = 0;
    Turn turn = Turn::idle;
    // On the lists of sessions an event touched since take_deliveries and take_credits looked.
    bool publish_touched = false;
    bool credit_touched = false;
    Watch watch = Watch::watched;
    bool on_watch_list = false;      // in watched_ (a parked one stays there until it is compacted)
    std::uint32_t quiet_reads = 0;   // tail reads in a row that found no move
  };

  Session* find(SessionId id) noexcept;
  // Whether `identity` may hold one more session by the allow rules. Counts refusals.
  Result<void> admit(std::string_view identity);
  void record(const SessionEntry& s, std::uint64_t min_epoch);
  Session& add(SessionId id, std::span<const std::byte> ring, const ResumePoint& start, std::uint64_t deliver_from);
  void fail(SessionId id, const Error& e);
  void end(SessionId id, CloseReason reason, std::string message);
  void break_link(SessionId id, Session& s) noexcept;
  // Every event of a session that can make a record of it deliverable (publish) or a credit of
  // it due (credit) puts it on a list that the next take_deliveries or take_credits works
  // through: they look at the sessions events touched and at the sessions queued for a turn,
  // never at every session, so a poll costs the same with 1 session or 1,000 of which the same
  // few are busy (bench/README.md, "Cost as sessions grow").
  void touch_publish(SessionId id, Session& s);
  void touch_credit(SessionId id, Session& s);
  void touch(SessionId id, Session& s) {
    touch_publish(id, s);
    touch_credit(id, s);
  }
  // Queues a backlogged session for a turn (last, or first when its turn goes on).
  void enqueue(SessionId id, Session& s, bool first);
  // Mode tail: its tail is read at every poll again, and its quiet count starts over.
  void watch(SessionId id, Session& s);
  // Whether nothing of the session is unread, unreleased or owed over an established, live link:
  // only then may it park, so that the flag record's `released` is what the owner has seen.
  bool parkable(const Session& s) const noexcept;
  void take_quiet_tail(SessionId id, Session& s);

  OwnerConfig config_;
  RingGeometry geometry_;
  SessionTable table_;
  // Looked up at every event and turn: hashed, since a tree of 1,000 sessions is ten dependent
  // loads per lookup. Nothing walks it in order (session_ids() sorts).
  std::unordered_map<SessionId, Session> sessions_;
  // Deficit round robin's round: the sessions queued for a turn, in turn order (Turn::queued).
  std::deque<SessionId> round_;
  std::optional<SessionId> goes_on_;  // the front's turn was cut short: it goes on with no new quantum
  std::vector<SessionId> stalled_;    // Turn::stalled
  std::vector<SessionId> publish_touched_;
  std::vector<SessionId> credit_touched_;
  // Mode tail: the sessions read_tails reads (Watch::watched, parking, and parked ones not yet
  // compacted away). Entries of ended or parked sessions are dropped at the next read_tails, not
  // at once: an end or a park may come from inside read_tails' own loop.
  std::vector<SessionId> watched_;
  bool watched_stale_ = false;
  std::vector<ClosedSession> closed_;
  std::vector<SessionId> broken_;
  std::vector<SessionRecord> records_;
  std::vector<std::pair<SessionId, bool>> mark_scratch_;
  std::uint64_t doorbells_ = 0;  // mode tail: doorbells taken, all sessions
  std::uint64_t doorbells_at_prepare_ = 0;
  OwnerCounters counters_;
};

template <class Read>
void OwnerCore::read_tails(Read&& read) {
  if (config_.mode != wire::PublishMode::tail) return;
  if (std::exchange(watched_stale_, false)) {
    std::erase_if(watched_, [this](SessionId id) {
      Session* s = find(id);
      if (s && s->watch != Watch::parked) return false;
      if (s) s->on_watch_list = false;
      return true;
    });
  }
  // By index: an event inside the loop may append (never erase) an entry.
  for (std::size_t i = 0; i < watched_.size(); ++i) {
    const SessionId id = watched_[i];
    const Session* s = find(id);
    if (!s || s->watch == Watch::parked) continue;
    std::array<std::byte, wire::kTailRecordSize> tail;
    if (!read(id, std::span<std::byte, wire::kTailRecordSize>(tail))) continue;
    ++counters_.tail_reads;
    on_tail(id, tail);
  }
}

}  // namespace rdmaring
