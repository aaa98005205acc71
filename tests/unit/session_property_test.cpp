// The ring owner's session table against a reference model written from its rules
// (protocol-spec/sessions.md §3, §5, §7): random sequences of attach (by two identities), resume
// (of the current epoch, of an old epoch replayed, of the unconfirmed epoch as a retry, of a
// future epoch, forged, bound to no channel, from another identity), connect requests of any
// epoch, ESTABLISHED, link failures, heartbeats, detaches, lease expiry with time advancing, new
// control connections, and replays of any captured control message on its own connection or on
// another. After every step the table must hold exactly the reference's sessions (identity, epoch,
// state, unconfirmed epoch, lease), have answered exactly what the reference admits or refuses,
// with the same error and counters, and keep the replay-fencing invariants: once an epoch's QP is
// established no message naming an earlier epoch is admitted, epochs only grow by one per
// admitted resume, an unconfirmed epoch exists exactly while the session is resuming, and no
// captured control message is admitted again, whatever its epoch and wherever it is replayed.
//
// A second property drives OwnerCore's admission: random attaches, detaches, closes and expiries
// from several identities under random allow rules never let an identity hold more than its rule
// allows, and admit exactly what the rules admit.
//
// A failing case prints the shrunk schedule ([attach(a), resume(s0, current), ...]) and a log of
// what each step was answered.
#include <rapidcheck/catch.h>

#include <algorithm>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <sstream>

#include "rdmaring/control_connection.hpp"
#include "rdmaring/owner_core.hpp"
#include "rdmaring/session_table.hpp"

using namespace rdmaring;
using namespace std::chrono_literals;

namespace {

using TablePoint = SessionTable::Clock::time_point;
constexpr std::size_t kMaxSessions = 3;
constexpr auto kLease = 100ms;
const std::string kIdentities[] = {"a", "b"};

enum class Op : std::uint8_t {
  attach, resume, connect, connected, broken, heartbeat, detach, touch, expire, reconnect, replay
};
// Which epoch a message names, relative to the session's state when it is sent, and who sends it.
enum class Which : std::uint8_t {
  current,        // the session's epoch E
  unconfirmed,    // U while resuming (a retry after a lost reply); E - 1 when there is none
  old,            // an earlier epoch, replayed (which one: the step's argument)
  future,         // E + 1, not granted yet
  forged,         // epoch E, proof with a flipped bit
  wrong_purpose,  // epoch E, a valid proof made for another message
  unbound,        // epoch E, a proof that binds no channel, sent without a binding (a v3 producer)
  intruder,       // epoch E, a valid proof over a connection of another identity
};

struct Step {
  Op op = Op::attach;
  std::uint8_t session = 0;  // index into the sessions attached so far (removed ones included)
  Which which = Which::current;
  std::uint8_t arg = 0;      // old: which earlier epoch; expire: how far time advances; attach: which
                             // identity; replay: which captured message, and where (bit 0)
};

const char* name(Op op) {
  static const char* names[] = {"attach", "resume",  "connect", "connected", "broken",   "heartbeat",
                                "detach", "touch",   "expire",  "reconnect", "replay"};
  return names[static_cast<int>(op)];
}
const char* name(ProofPurpose p) {
  static const char* names[] = {"?", "connect", "resume", "heartbeat", "detach"};
  return names[static_cast<int>(p)];
}
const char* name(Which w) {
  static const char* names[] = {"current", "unconfirmed", "old", "future", "forged", "wrong_purpose", "unbound",
                                "intruder"};
  return names[static_cast<int>(w)];
}
bool names_epoch(Op op) {
  return op == Op::resume || op == Op::connect || op == Op::heartbeat || op == Op::detach;
}
std::chrono::milliseconds advance(std::uint8_t arg) { return 25ms * (arg % 8 + 1); }  // 25 .. 200 ms
// A replay arrives on the captured message's own connection (while it is open) or on another.
bool replay_on_own(std::uint8_t arg) { return (arg & 1) == 0; }

// Shrunk counterexamples print as a readable schedule.
void showValue(const Step& s, std::ostream& os) {
  os << name(s.op);
  switch (s.op) {
    case Op::attach: os << '(' << kIdentities[s.arg % 2] << ')'; return;
    case Op::expire: os << "(+" << advance(s.arg).count() << "ms)"; return;
    case Op::replay:
      os << '(' << (s.which == Which::current ? "current epoch" : "any") << " #" << (s.arg >> 1) << ", "
         << (replay_on_own(s.arg) ? "own connection" : "another connection") << ')';
      return;
    default: break;
  }
  os << "(s" << static_cast<int>(s.session);
  if (names_epoch(s.op) || s.op == Op::broken) {
    os << ", " << (s.op == Op::broken ? (s.which == Which::old ? "old" : "current") : name(s.which));
    if (s.which == Which::old) os << '#' << static_cast<int>(s.arg);
  }
  os << ')';
}

// ---- the reference model --------------------------------------------------------------------

enum class Verdict { admitted, unknown, bad_proof, stale, busy, no_capacity, unauthenticated, unauthorized };

const char* name(Verdict v) {
  static const char* names[] = {"admitted",    "unknown_session", "bad_proof",       "stale_epoch",
                                "refused_state", "no_capacity",   "unauthenticated", "unauthorized"};
  return names[static_cast<int>(v)];
}

Verdict verdict_of(const Error& e) {
  if (e == errc::unknown_session) return Verdict::unknown;
  if (e == errc::bad_proof) return Verdict::bad_proof;
  if (e == errc::stale_epoch) return Verdict::stale;
  if (e == errc::invalid_argument) return Verdict::busy;
  if (e == errc::no_capacity) return Verdict::no_capacity;
  if (e == errc::unauthenticated) return Verdict::unauthenticated;
  if (e == errc::unauthorized) return Verdict::unauthorized;
  RC_FAIL("unexpected error: " + e.message());
  return Verdict::busy;
}
template <class T>
Verdict verdict_of(const Result<T>& r) {
  return r ? Verdict::admitted : verdict_of(r.error());
}

// One control connection as the owner keeps it. The producer's closes when it opens another.
struct Connection {
  ControlConnection guard;
  bool open = true;
};

struct RefSession {
  SessionId id = 0;
  SessionSecret secret{};
  std::string identity;
  bool alive = true;
  std::uint64_t epoch = 1;
  SessionState state = SessionState::attached;
  std::optional<std::uint64_t> unconfirmed;
  TablePoint last_seen{};
  enum class Link { none, pending, established, dead } link = Link::none;
  std::uint64_t confirmed = 0;  // the last epoch whose QP reached ESTABLISHED
  std::size_t connection = 0;   // the producer's control connection now
  std::uint64_t counter = 0;    // the last counter it used there
};

// A control message the producer sent: what a replayer captured.
struct Captured {
  std::size_t session = 0;
  ProofPurpose purpose = ProofPurpose::resume;
  std::uint64_t epoch = 0;
  std::uint64_t counter = 0;
  Proof proof{};
  std::size_t connection = 0;
};

struct RefCounters {
  std::uint64_t attaches = 0, resumes = 0, connects = 0, detaches = 0, expired = 0, refused_unknown = 0,
                refused_proof = 0, refused_stale = 0, refused_state = 0, refused_capacity = 0, refused_identity = 0;
};

class Harness {
 public:
  Harness() : table_(kMaxSessions, kLease) {}

  void step(const Step& s) {
    std::ostringstream d;
    switch (s.op) {
      case Op::attach: attach(kIdentities[s.arg % 2], d); break;
      case Op::expire: expire(advance(s.arg), d); break;
      case Op::replay: replay(s, d); break;
      default:
        if (sessions_.empty()) break;
        RefSession& r = sessions_[s.session % sessions_.size()];
        d << "s" << s.session % sessions_.size() << ' ' << describe(r) << ": ";
        switch (s.op) {
          case Op::resume: resume(r, s, d); break;
          case Op::connect: connect(r, s, d); break;
          case Op::connected: connected(r, d); break;
          case Op::broken: broken(r, s, d); break;
          case Op::heartbeat: heartbeat(r, s, d); break;
          case Op::detach: detach(r, s, d); break;
          case Op::touch:
            table_.touch(r.id, now_);
            if (r.alive) r.last_seen = now_;
            d << "lease restarts";
            break;
          case Op::reconnect:
            connections_[r.connection]->open = false;
            r.connection = open_connection(r.identity);
            r.counter = 0;
            d << "a new control connection";
            break;
          default: break;
        }
    }
    RC_LOG() << "  ";
    showValue(s, RC_LOG());
    RC_LOG() << " -> " << d.str() << '\n';
    check();
  }

 private:
  static std::string describe(const RefSession& r) {
    if (!r.alive) return "(gone)";
    std::string out = "(" + r.identity + ", epoch " + std::to_string(r.epoch) + ", " + to_string(r.state);
    if (r.unconfirmed) out += ", U " + std::to_string(*r.unconfirmed);
    return out + ")";
  }

  std::size_t alive() const {
    return static_cast<std::size_t>(std::count_if(sessions_.begin(), sessions_.end(), [](const RefSession& r) { return r.alive; }));
  }

  std::size_t open_connection(const std::string& identity) {
    connections_.push_back(std::make_unique<Connection>(Connection{ControlConnection(identity, random_nonce())}));
    return connections_.size() - 1;
  }

  // The epoch a message names.
  std::uint64_t epoch_for(const RefSession& r, const Step& s) const {
    switch (s.which) {
      case Which::unconfirmed: return r.unconfirmed ? *r.unconfirmed : r.epoch - 1;
      case Which::old: return r.epoch > 1 ? r.epoch - 1 - s.arg % (r.epoch - 1) : 0;
      case Which::future: return r.epoch + 1;
      default: return r.epoch;
    }
  }
  // The purpose a step's proof is made for, and whether it is spoilt.
  static ProofPurpose proof_purpose(const Step& s, ProofPurpose purpose) {
    if (s.which != Which::wrong_purpose) return purpose;
    return purpose == ProofPurpose::connect ? ProofPurpose::resume : ProofPurpose::connect;
  }
  static void spoil(const Step& s, Proof& p) {
    if (s.which == Which::forged) p[s.arg % p.size()] ^= std::byte{1};
  }
  static std::string other_identity(const std::string& identity) { return identity == "a" ? "b" : "a"; }

  // A control message of session `r` for `purpose`, as the step sends it, reaching the table
  // through `ask`: the producer's own (on its connection, with its next counter; captured, for
  // replays), a v3 producer's with no binding, or an intruder's, signed over a connection of
  // another identity.
  template <class Ask>
  auto send(RefSession& r, const Step& s, ProofPurpose purpose, std::uint64_t epoch, Ask ask) {
    const ProofPurpose made_for = proof_purpose(s, purpose);
    if (s.which == Which::unbound) {
      const Proof p = make_proof(r.secret, made_for, r.id, epoch);
      return ask(Credentials{r.id, epoch, p, r.identity, std::nullopt});
    }
    Connection& c = s.which == Which::intruder ? *connections_[open_connection(other_identity(r.identity))]
                                               : *connections_[r.connection];
    const std::uint64_t counter = s.which == Which::intruder ? 1 : ++r.counter;
    const ChannelBinding binding = c.guard.bind(counter).value();  // a fresh counter: never refused
    Proof p = make_control_proof(r.secret, made_for, r.id, epoch, binding);
    spoil(s, p);
    if (s.which != Which::intruder)
      captured_.push_back(Captured{static_cast<std::size_t>(&r - sessions_.data()), purpose, epoch, counter, p,
                                   r.connection});
    return ask(Credentials{r.id, epoch, p, c.guard.identity(), binding});
  }

  // Bound to a channel, known session, proof, identity, then epoch: what every control message
  // checks first (sessions.md §5.2); a connect request has no channel and names no identity.
  Verdict screen(const RefSession& r, const Step& s, bool epoch_ok, bool control) {
    if (control && s.which == Which::unbound) return ++c_.refused_proof, Verdict::unauthenticated;
    if (!r.alive) return ++c_.refused_unknown, Verdict::unknown;
    if (s.which == Which::forged || s.which == Which::wrong_purpose)
      return ++c_.refused_proof, Verdict::bad_proof;
    if (control && s.which == Which::intruder) return ++c_.refused_identity, Verdict::unauthorized;
    if (!epoch_ok) return ++c_.refused_stale, Verdict::stale;
    return Verdict::admitted;
  }

  void expect(Verdict want, Verdict got, const std::string& what, std::ostream& d) {
    d << what << ' ' << name(got);
    if (want != got) RC_FAIL(what + ": the table answered " + name(got) + ", the rules say " + name(want));
  }

  // Once an epoch's QP is established, nothing naming an earlier epoch is admitted.
  static void fenced(const RefSession& r, std::uint64_t epoch, const char* what) {
    if (epoch < r.confirmed)
      RC_FAIL(std::string(what) + " of epoch " + std::to_string(epoch) + " admitted after epoch " +
              std::to_string(r.confirmed) + " was confirmed");
  }

  void attach(const std::string& identity, std::ostream& d) {
    const auto got = table_.attach(identity, now_);
    const Verdict want = alive() < kMaxSessions ? Verdict::admitted : Verdict::no_capacity;
    expect(want, verdict_of(got), "attach", d);
    if (!got) {
      ++c_.refused_capacity;
      return;
    }
    const SessionEntry& e = got.value();
    RC_ASSERT(e.epoch == 1u);
    RC_ASSERT(e.state == SessionState::attached);
    RC_ASSERT(!e.unconfirmed);
    for (const RefSession& r : sessions_) RC_ASSERT(!(r.alive && r.id == e.id));
    RefSession r;
    r.id = e.id;
    r.secret = e.secret;
    r.identity = identity;
    r.last_seen = now_;
    r.connection = open_connection(identity);
    sessions_.push_back(r);
    ++c_.attaches;
    d << ": s" << sessions_.size() - 1;
  }

  void resume(RefSession& r, const Step& s, std::ostream& d) {
    const std::uint64_t e = epoch_for(r, s);
    const bool current = e == r.epoch, retry = r.unconfirmed && *r.unconfirmed <= e && e < r.epoch;
    const Verdict want = screen(r, s, current || retry, true);
    const auto got =
        send(r, s, ProofPurpose::resume, e, [&](const Credentials& who) { return table_.resume(who, now_); });
    expect(want, verdict_of(got), "resume(" + std::to_string(e) + ")", d);
    if (!got) {
      if (want == Verdict::stale && e < r.epoch) stale_refused_ = true;
      return;
    }
    fenced(r, e, "resume");
    if (!r.unconfirmed) r.unconfirmed = r.epoch;  // the window's lower end stays
    ++r.epoch;
    r.state = SessionState::resuming;
    r.link = RefSession::Link::none;  // the owner fences: the epoch's QP is dropped
    r.last_seen = now_;
    ++c_.resumes;
    RC_ASSERT(got.value() == r.epoch);
    d << ", epoch " << r.epoch << (retry && !current ? " (retry)" : "");
    if (retry && !current) retried_ = true;
  }

  void connect(RefSession& r, const Step& s, std::ostream& d) {
    const std::uint64_t e = epoch_for(r, s);
    Proof p = make_proof(r.secret, proof_purpose(s, ProofPurpose::connect), r.id, e);
    spoil(s, p);
    Verdict want = screen(r, s, e == r.epoch, false);
    if (want == Verdict::admitted && r.state != SessionState::attached && r.state != SessionState::resuming) {
      want = Verdict::busy;
      ++c_.refused_state;
    }
    const auto got = table_.admit_connect(wire::ConnectData{r.id, e, p, 0x1000, 7}, now_);
    expect(want, verdict_of(got), "connect(" + std::to_string(e) + ")", d);
    if (!got) return;
    fenced(r, e, "connect");
    r.link = RefSession::Link::pending;  // a new QP replaces any earlier one of this epoch
    r.last_seen = now_;
  }

  // ESTABLISHED of the session's admitted link (the owner reports nothing else).
  void connected(RefSession& r, std::ostream& d) {
    if (!r.alive || r.link != RefSession::Link::pending) {
      d << "no link waiting";
      return;
    }
    table_.on_connected(r.id);
    r.link = RefSession::Link::established;
    r.state = SessionState::connected;
    r.unconfirmed.reset();
    r.confirmed = r.epoch;
    ++c_.connects;
    d << "epoch " << r.epoch << " confirmed";
  }

  // The link dies (reported for its epoch), or a late report names an older epoch: ignored.
  void broken(RefSession& r, const Step& s, std::ostream& d) {
    if (!r.alive) return;
    const std::uint64_t e = s.which == Which::old ? epoch_for(r, s) : r.epoch;
    if (s.which != Which::old) {
      if (r.link == RefSession::Link::none || r.link == RefSession::Link::dead) {
        d << "no link";
        return;
      }
      r.link = RefSession::Link::dead;
    }
    table_.on_broken(r.id, e);
    if (e == r.epoch && r.state == SessionState::connected) r.state = SessionState::broken;
    d << "on_broken(" << e << ")";
  }

  void heartbeat(RefSession& r, const Step& s, std::ostream& d) {
    const std::uint64_t e = epoch_for(r, s);
    const Verdict want = screen(r, s, e == r.epoch || (r.unconfirmed && *r.unconfirmed <= e && e < r.epoch), true);
    const auto got =
        send(r, s, ProofPurpose::heartbeat, e, [&](const Credentials& who) { return table_.heartbeat(who, now_); });
    expect(want, verdict_of(got), "heartbeat(" + std::to_string(e) + ")", d);
    if (!got) return;
    fenced(r, e, "heartbeat");
    r.last_seen = now_;
  }

  void detach(RefSession& r, const Step& s, std::ostream& d) {
    const std::uint64_t e = epoch_for(r, s);
    const Verdict want = screen(r, s, e == r.epoch, true);
    const auto got = send(r, s, ProofPurpose::detach, e, [&](const Credentials& who) { return table_.detach(who); });
    expect(want, verdict_of(got), "detach(" + std::to_string(e) + ")", d);
    if (!got) return;
    r.alive = false;
    ++c_.detaches;
  }

  // A captured message again, verbatim: on its own connection (while open) its counter is used;
  // on a connection of the replayer's (authenticated as the session's identity: the worst case)
  // its proof covers another nonce. Refused either way, and it changes nothing (check() after the
  // step compares the whole table with the reference, which this leaves as it was).
  void replay(const Step& s, std::ostream& d) {
    std::vector<const Captured*> pool;
    for (const Captured& m : captured_) {
      const RefSession& r = sessions_[m.session];
      if (s.which != Which::current || (r.alive && m.epoch == r.epoch)) pool.push_back(&m);
    }
    if (pool.empty()) {
      d << "nothing captured";
      return;
    }
    const Captured& m = *pool[(s.arg >> 1) % pool.size()];
    const RefSession& r = sessions_[m.session];
    const bool own = replay_on_own(s.arg) && connections_[m.connection]->open;
    Connection& on = own ? *connections_[m.connection] : *connections_[open_connection(r.identity)];
    d << "s" << m.session << ' ' << describe(r) << ": " << name(m.purpose) << '(' << m.epoch << ") #" << m.counter
      << (own ? " on its own connection" : " on another connection") << ": ";
    Verdict want = Verdict::bad_proof;
    if (own) {  // refused by the connection: the table never sees it
      const auto bound = on.guard.bind(m.counter);
      expect(want, verdict_of(bound), "replay", d);
    } else {
      want = r.alive ? (++c_.refused_proof, Verdict::bad_proof) : (++c_.refused_unknown, Verdict::unknown);
      const ChannelBinding binding = on.guard.bind(m.counter).value();
      const Credentials who{r.id, m.epoch, m.proof, on.guard.identity(), binding};
      const Verdict got = m.purpose == ProofPurpose::resume      ? verdict_of(table_.resume(who, now_))
                          : m.purpose == ProofPurpose::heartbeat ? verdict_of(table_.heartbeat(who, now_))
                                                                 : verdict_of(table_.detach(who));
      expect(want, got, "replay", d);
    }
    if (r.alive && m.epoch == r.epoch) current_replayed_ = true;
  }

  void expire(std::chrono::milliseconds dt, std::ostream& d) {
    now_ += dt;
    const auto gone = table_.expire(now_);
    std::set<SessionId> want, got(gone.begin(), gone.end());
    for (RefSession& r : sessions_) {
      if (r.alive && now_ - r.last_seen > kLease) {
        want.insert(r.id);
        r.alive = false;
        ++c_.expired;
        expired_ = true;
      }
    }
    d << "t = " << std::chrono::duration_cast<std::chrono::milliseconds>(now_ - TablePoint{}).count() << "ms, "
      << got.size() << " expired";
    if (got != want || got.size() != gone.size())
      RC_FAIL("expire: " + std::to_string(gone.size()) + " sessions expired, the rules say " + std::to_string(want.size()));
  }

  // The table holds exactly the reference's sessions and counters.
  void check() const {
    RC_ASSERT(table_.size() == alive());
    for (std::size_t i = 0; i < sessions_.size(); ++i) {
      const RefSession& r = sessions_[i];
      const SessionEntry* e = table_.find(r.id);
      if (!r.alive) {
        if (e) RC_FAIL("s" + std::to_string(i) + " should be gone");
        continue;
      }
      if (!e) RC_FAIL("s" + std::to_string(i) + " is gone");
      const bool same = e->identity == r.identity && e->epoch == r.epoch && e->state == r.state &&
                        e->unconfirmed == r.unconfirmed && e->last_seen == r.last_seen;
      if (!same)
        RC_FAIL("s" + std::to_string(i) + ": the table has " + e->identity + ", epoch " + std::to_string(e->epoch) +
                " " + to_string(e->state) + (e->unconfirmed ? " U " + std::to_string(*e->unconfirmed) : "") +
                ", the rules say " + describe(r));
      // sessions.md §5.1: U is set exactly while the state is resuming.
      RC_ASSERT(e->unconfirmed.has_value() == (e->state == SessionState::resuming));
      RC_ASSERT(e->epoch >= r.confirmed);
    }
    for (const std::string& identity : kIdentities) {
      const auto held = std::count_if(sessions_.begin(), sessions_.end(),
                                      [&](const RefSession& r) { return r.alive && r.identity == identity; });
      RC_ASSERT(table_.held(identity) == static_cast<std::size_t>(held));
    }
    const SessionCounters& t = table_.counters();
    const bool same = t.attaches == c_.attaches && t.resumes == c_.resumes && t.connects == c_.connects &&
                      t.detaches == c_.detaches && t.expired == c_.expired && t.refused_unknown == c_.refused_unknown &&
                      t.refused_proof == c_.refused_proof && t.refused_stale == c_.refused_stale &&
                      t.refused_state == c_.refused_state && t.refused_capacity == c_.refused_capacity &&
                      t.refused_identity == c_.refused_identity;
    if (!same) RC_FAIL("the table's counters differ from the rules'");
  }

 public:
  bool retried() const { return retried_; }
  bool stale_refused() const { return stale_refused_; }
  bool expired() const { return expired_; }
  bool current_replayed() const { return current_replayed_; }

 private:
  bool retried_ = false, stale_refused_ = false, expired_ = false, current_replayed_ = false;
  SessionTable table_;
  TablePoint now_ = TablePoint{} + 1h;
  std::vector<RefSession> sessions_;
  std::vector<std::unique_ptr<Connection>> connections_;
  std::vector<Captured> captured_;
  RefCounters c_;
};

rc::Gen<std::vector<Step>> schedules() {
  const auto op = rc::gen::weightedElement<Op>({{4, Op::attach},
                                                {8, Op::resume},
                                                {7, Op::connect},
                                                {5, Op::connected},
                                                {3, Op::broken},
                                                {4, Op::heartbeat},
                                                {1, Op::detach},
                                                {2, Op::touch},
                                                {3, Op::expire},
                                                {1, Op::reconnect},
                                                {8, Op::replay}});
  const auto which = rc::gen::weightedElement<Which>({{6, Which::current},
                                                      {4, Which::unconfirmed},
                                                      {4, Which::old},
                                                      {1, Which::future},
                                                      {1, Which::forged},
                                                      {1, Which::wrong_purpose},
                                                      {1, Which::unbound},
                                                      {1, Which::intruder}});
  return rc::gen::container<std::vector<Step>>(rc::gen::apply(
      [](Op o, std::uint8_t session, Which w, std::uint8_t arg) {
        // Fields a step does not use stay 0, so the shrunk schedule shows only what matters.
        Step s{o, 0, Which::current, 0};
        switch (o) {
          case Op::attach: s.arg = arg % 2; return s;
          case Op::expire: s.arg = arg; return s;
          case Op::replay:
            s.which = w == Which::current ? Which::current : Which::old;
            s.arg = arg;
            return s;
          default: break;
        }
        s.session = session % 4;
        // A connect request has no channel to leave unbound, and names no identity.
        const bool channel_only = w == Which::unbound || w == Which::intruder;
        if (names_epoch(o)) s.which = o == Op::connect && channel_only ? Which::current : w;
        if (o == Op::broken) s.which = w == Which::old ? Which::old : Which::current;
        if (s.which == Which::old || s.which == Which::forged) s.arg = arg;
        return s;
      },
      op, rc::gen::arbitrary<std::uint8_t>(), which, rc::gen::arbitrary<std::uint8_t>()));
}

}  // namespace

TEST_CASE("the session table admits exactly what its rules admit", "[property][sessions]") {
  rc::prop("attach, resume, retry, replay, connect, break, heartbeat, detach, expire", [] {
    Harness h;
    for (const Step& s : *schedules()) h.step(s);
    RC_CLASSIFY(h.retried(), "a retry from the unconfirmed epoch admitted");
    RC_CLASSIFY(h.stale_refused(), "a resume of an older epoch refused");
    RC_CLASSIFY(h.expired(), "a lease ran out");
    RC_CLASSIFY(h.current_replayed(), "a message of the current epoch replayed");
  });
}

// ---- admission by identity ------------------------------------------------------------------------

namespace {

const std::string kAdmitted[] = {"p-0", "p-1", "p-2", "q", "r"};  // no rule names "r"
constexpr std::uint64_t kRing = 4096;

enum class AdmitOp : std::uint8_t { attach, detach, close, expire };
struct AdmitStep {
  AdmitOp op = AdmitOp::attach;
  std::uint8_t arg = 0;  // attach: which identity; detach, close: which live session
};

void showValue(const AdmitStep& s, std::ostream& os) {
  static const char* names[] = {"attach", "detach", "close", "expire"};
  os << names[static_cast<int>(s.op)] << '(';
  if (s.op == AdmitOp::attach) os << kAdmitted[s.arg % 5];
  else os << static_cast<int>(s.arg);
  os << ')';
}

// The rule that applies to `identity`: the first that matches. The patterns below are literals or
// end in '*', so the reference needs no glob of its own.
const IdentityRule* rule_for(const std::vector<IdentityRule>& rules, const std::string& identity) {
  const auto rule = std::find_if(rules.begin(), rules.end(), [&](const IdentityRule& r) {
    const bool prefix = r.pattern.back() == '*';
    return prefix ? identity.rfind(r.pattern.substr(0, r.pattern.size() - 1), 0) == 0 : r.pattern == identity;
  });
  return rule == rules.end() ? nullptr : &*rule;
}

// What the rules say of one more session of `identity`, given what it and all hold.
errc admission(const std::vector<IdentityRule>& rules, const std::string& identity, std::uint64_t held,
               std::size_t total, std::size_t max_sessions) {
  if (!rules.empty()) {
    const IdentityRule* rule = rule_for(rules, identity);
    if (!rule) return errc::unauthorized;
    if (rule->max_sessions != 0 && held >= rule->max_sessions) return errc::quota_exceeded;
    if (rule->max_ring_bytes != 0 && (held + 1) * kRing > rule->max_ring_bytes) return errc::quota_exceeded;
  }
  return total >= max_sessions ? errc::no_capacity : errc{};
}

}  // namespace

TEST_CASE("no identity ever holds more than its allow rule admits", "[property][sessions][admission]") {
  rc::prop("random rules; attach, detach, close and expire from several identities", [] {
    // Up to three rules over "p-*", "p-0", "q" in any order (the first that matches applies; a
    // later rule of the same pattern would never apply).
    std::vector<IdentityRule> rules;
    const auto patterns =
        *rc::gen::container<std::vector<std::string>>(rc::gen::element<std::string>("p-*", "p-0", "q"));
    for (const std::string& p : patterns) {
      if (rule_for(rules, p) && rule_for(rules, p)->pattern == p) continue;
      rules.push_back({p, *rc::gen::inRange<std::uint32_t>(0, 4),
                       *rc::gen::element<std::uint64_t>(0, kRing, 2 * kRing, 3 * kRing - 1, 5 * kRing)});
    }
    OwnerConfig cfg;
    cfg.ring_bytes = kRing;
    cfg.max_record = 1000;
    cfg.max_sessions = *rc::gen::inRange<std::uint32_t>(1, 8);
    cfg.lease = 100ms;
    cfg.allow = rules;
    RC_ASSERT(cfg.validate().has_value());
    OwnerCore core(cfg);
    std::deque<std::vector<std::byte>> rings;
    std::map<std::string, std::uint64_t> held;
    std::vector<SessionEntry> live;
    TablePoint now = TablePoint{} + 1h;
    std::uint64_t refused_quota = 0, refused_unauthorized = 0;
    const auto steps = *rc::gen::container<std::vector<AdmitStep>>(rc::gen::apply(
        [](AdmitOp op, std::uint8_t arg) { return AdmitStep{op, arg}; },
        rc::gen::weightedElement<AdmitOp>(
            {{6, AdmitOp::attach}, {2, AdmitOp::detach}, {1, AdmitOp::close}, {1, AdmitOp::expire}}),
        rc::gen::arbitrary<std::uint8_t>()));
    const auto forget = [&](SessionId id) {
      const auto it = std::find_if(live.begin(), live.end(), [id](const SessionEntry& e) { return e.id == id; });
      RC_ASSERT(it != live.end());
      --held[it->identity];
      live.erase(it);
    };
    for (const AdmitStep& s : steps) {
      switch (s.op) {
        case AdmitOp::attach: {
          const std::string& identity = kAdmitted[s.arg % 5];
          const errc want = admission(rules, identity, held[identity], live.size(), cfg.max_sessions);
          const auto asked = core.can_attach(identity);
          const auto got = core.attach(identity, rings.emplace_back(kRing), now);
          RC_ASSERT(asked.has_value() == got.has_value());
          if (want == errc{}) {
            if (!got) RC_FAIL(identity + " refused: " + got.error().message());
            live.push_back(got.value());
            ++held[identity];
          } else {
            if (got) RC_FAIL(identity + " admitted; the rules say " + make_error_code(want).message());
            RC_ASSERT(got.error() == want);
            RC_ASSERT(asked.error() == want);
            refused_quota += 2 * (want == errc::quota_exceeded);
            refused_unauthorized += 2 * (want == errc::unauthorized);
          }
          break;
        }
        case AdmitOp::detach: {
          if (live.empty()) break;
          const SessionEntry e = live[s.arg % live.size()];
          const ChannelBinding b{random_nonce(), 1};
          const Proof p = make_control_proof(e.secret, ProofPurpose::detach, e.id, 1, b);
          RC_ASSERT(core.detach(Credentials{e.id, 1, p, e.identity, b}).has_value());
          forget(e.id);
          break;
        }
        case AdmitOp::close: {
          if (live.empty()) break;
          const SessionId id = live[s.arg % live.size()].id;
          core.close(id, CloseReason::protocol_violation, "test");
          forget(id);
          break;
        }
        case AdmitOp::expire:
          now += 60ms;
          core.tick(now);
          for (const ClosedSession& c : core.take_closed())
            if (c.reason == CloseReason::lease_expired) forget(c.session);
          break;
      }
      core.take_closed();
      // Never beyond a rule: sessions, and ring bytes.
      for (const auto& [identity, n] : held) {
        RC_ASSERT(core.table().held(identity) == n);
        if (rules.empty()) continue;
        const IdentityRule* rule = rule_for(rules, identity);
        if (!rule) {
          RC_ASSERT(n == 0u);
          continue;
        }
        if (rule->max_sessions != 0) RC_ASSERT(n <= rule->max_sessions);
        if (rule->max_ring_bytes != 0) RC_ASSERT(n * kRing <= rule->max_ring_bytes);
      }
      RC_ASSERT(core.counters().refused_quota == refused_quota);
      RC_ASSERT(core.counters().refused_unauthorized == refused_unauthorized);
    }
    RC_CLASSIFY(rules.empty(), "no rules: any identity");
    RC_CLASSIFY(refused_quota > 0, "a quota refused an attach");
    RC_CLASSIFY(refused_unauthorized > 0, "an identity no rule matches refused");
  });
}
