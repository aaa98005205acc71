// The ring owner's session table against a reference model written from its rules
// (protocol-spec/sessions.md §5, §7): random sequences of attach, resume (of the current epoch,
// of an old epoch replayed, of the unconfirmed epoch as a retry, of a future epoch, forged),
// connect requests of any epoch, ESTABLISHED, link failures, heartbeats, detaches and lease
// expiry with time advancing. After every step the table must hold exactly the reference's
// sessions (epoch, state, unconfirmed epoch, lease), have answered exactly what the reference
// admits or refuses, with the same error and counters, and keep the replay-fencing invariants:
// once an epoch's QP is established no message naming an earlier epoch is admitted, epochs
// only grow by one per admitted resume, and an unconfirmed epoch exists exactly while the
// session is resuming.
//
// A failing case prints the shrunk schedule ([attach, resume(s0, current), ...]) and a log of
// what each step was answered.
#include <rapidcheck/catch.h>

#include <algorithm>
#include <set>
#include <sstream>

#include "rdmaring/session_table.hpp"

using namespace rdmaring;
using namespace std::chrono_literals;

namespace {

using TablePoint = SessionTable::Clock::time_point;
constexpr std::size_t kMaxSessions = 3;
constexpr auto kLease = 100ms;

enum class Op : std::uint8_t { attach, resume, connect, connected, broken, heartbeat, detach, touch, expire };
// Which epoch a message names, relative to the session's state when it is sent.
enum class Which : std::uint8_t {
  current,        // the session's epoch E
  unconfirmed,    // U while resuming (a retry after a lost reply); E - 1 when there is none
  old,            // an earlier epoch, replayed (which one: the step's argument)
  future,         // E + 1, not granted yet
  forged,         // epoch E, proof with a flipped bit
  wrong_purpose,  // epoch E, a valid proof made for another message
};

struct Step {
  Op op = Op::attach;
  std::uint8_t session = 0;  // index into the sessions attached so far (removed ones included)
  Which which = Which::current;
  std::uint8_t arg = 0;      // old: which earlier epoch; expire: how far time advances
};

const char* name(Op op) {
  static const char* names[] = {"attach", "resume", "connect", "connected", "broken",
                                "heartbeat", "detach", "touch", "expire"};
  return names[static_cast<int>(op)];
}
const char* name(Which w) {
  static const char* names[] = {"current", "unconfirmed", "old", "future", "forged", "wrong_purpose"};
  return names[static_cast<int>(w)];
}
bool names_epoch(Op op) {
  return op == Op::resume || op == Op::connect || op == Op::heartbeat || op == Op::detach;
}
std::chrono::milliseconds advance(std::uint8_t arg) { return 25ms * (arg % 8 + 1); }  // 25 .. 200 ms

// Shrunk counterexamples print as a readable schedule.
void showValue(const Step& s, std::ostream& os) {
  os << name(s.op);
  if (s.op == Op::attach) return;
  if (s.op == Op::expire) {
    os << "(+" << advance(s.arg).count() << "ms)";
    return;
  }
  os << "(s" << static_cast<int>(s.session);
  if (names_epoch(s.op) || s.op == Op::broken) {
    os << ", " << (s.op == Op::broken ? (s.which == Which::old ? "old" : "current") : name(s.which));
    if (s.which == Which::old) os << '#' << static_cast<int>(s.arg);
  }
  os << ')';
}

// ---- the reference model --------------------------------------------------------------------

enum class Verdict { admitted, unknown, bad_proof, stale, busy, no_capacity };

const char* name(Verdict v) {
  static const char* names[] = {"admitted", "unknown_session", "bad_proof", "stale_epoch", "refused_state",
                                "no_capacity"};
  return names[static_cast<int>(v)];
}

Verdict verdict_of(const Error& e) {
  if (e == errc::unknown_session) return Verdict::unknown;
  if (e == errc::bad_proof) return Verdict::bad_proof;
  if (e == errc::stale_epoch) return Verdict::stale;
  if (e == errc::invalid_argument) return Verdict::busy;
  if (e == errc::no_capacity) return Verdict::no_capacity;
  RC_FAIL("unexpected error: " + e.message());
  return Verdict::busy;
}

struct RefSession {
  SessionId id = 0;
  SessionSecret secret{};
  bool alive = true;
  std::uint64_t epoch = 1;
  SessionState state = SessionState::attached;
  std::optional<std::uint64_t> unconfirmed;
  TablePoint last_seen{};
  enum class Link { none, pending, established, dead } link = Link::none;
  std::uint64_t confirmed = 0;  // the last epoch whose QP reached ESTABLISHED
};

struct RefCounters {
  std::uint64_t attaches = 0, resumes = 0, connects = 0, detaches = 0, expired = 0, refused_unknown = 0,
                refused_proof = 0, refused_stale = 0, refused_state = 0, refused_capacity = 0;
};

class Harness {
 public:
  Harness() : table_(kMaxSessions, kLease) {}

  void step(const Step& s) {
    std::ostringstream d;
    switch (s.op) {
      case Op::attach: attach(d); break;
      case Op::expire: expire(advance(s.arg), d); break;
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
    std::string out = "(epoch " + std::to_string(r.epoch) + ", " + to_string(r.state);
    if (r.unconfirmed) out += ", U " + std::to_string(*r.unconfirmed);
    return out + ")";
  }

  std::size_t alive() const {
    return static_cast<std::size_t>(std::count_if(sessions_.begin(), sessions_.end(), [](const RefSession& r) { return r.alive; }));
  }

  // The epoch a message names, and the proof it carries.
  std::uint64_t epoch_for(const RefSession& r, const Step& s) const {
    switch (s.which) {
      case Which::current:
      case Which::forged:
      case Which::wrong_purpose: return r.epoch;
      case Which::unconfirmed: return r.unconfirmed ? *r.unconfirmed : r.epoch - 1;
      case Which::old: return r.epoch > 1 ? r.epoch - 1 - s.arg % (r.epoch - 1) : 0;
      case Which::future: return r.epoch + 1;
    }
    return r.epoch;
  }
  static Proof proof_for(const RefSession& r, const Step& s, ProofPurpose purpose, std::uint64_t epoch) {
    if (s.which == Which::wrong_purpose)
      purpose = purpose == ProofPurpose::connect ? ProofPurpose::resume : ProofPurpose::connect;
    Proof p = make_proof(r.secret, purpose, r.id, epoch);
    if (s.which == Which::forged) p[s.arg % p.size()] ^= std::byte{1};
    return p;
  }

  // Known session, then proof, then epoch: what every message checks first (sessions.md §5.2).
  Verdict screen(const RefSession& r, const Step& s, bool epoch_ok) {
    if (!r.alive) return ++c_.refused_unknown, Verdict::unknown;
    if (s.which == Which::forged || s.which == Which::wrong_purpose) return ++c_.refused_proof, Verdict::bad_proof;
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

  void attach(std::ostream& d) {
    const auto got = table_.attach(now_);
    const Verdict want = alive() < kMaxSessions ? Verdict::admitted : Verdict::no_capacity;
    expect(want, got ? Verdict::admitted : verdict_of(got.error()), "attach", d);
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
    r.last_seen = now_;
    sessions_.push_back(r);
    ++c_.attaches;
    d << ": s" << sessions_.size() - 1;
  }

  void resume(RefSession& r, const Step& s, std::ostream& d) {
    const std::uint64_t e = epoch_for(r, s);
    const Proof p = proof_for(r, s, ProofPurpose::resume, e);
    const bool current = e == r.epoch, retry = r.unconfirmed && *r.unconfirmed <= e && e < r.epoch;
    const Verdict want = screen(r, s, current || retry);
    const auto got = table_.resume(Credentials{r.id, e, p}, now_);
    expect(want, got ? Verdict::admitted : verdict_of(got.error()), "resume(" + std::to_string(e) + ")", d);
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
    const Proof p = proof_for(r, s, ProofPurpose::connect, e);
    Verdict want = screen(r, s, e == r.epoch);
    if (want == Verdict::admitted && r.state != SessionState::attached && r.state != SessionState::resuming) {
      want = Verdict::busy;
      ++c_.refused_state;
    }
    const auto got = table_.admit_connect(wire::ConnectData{r.id, e, p, 0x1000, 7}, now_);
    expect(want, got ? Verdict::admitted : verdict_of(got.error()), "connect(" + std::to_string(e) + ")", d);
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
    const Proof p = proof_for(r, s, ProofPurpose::heartbeat, e);
    const Verdict want = screen(r, s, e == r.epoch || (r.unconfirmed && *r.unconfirmed <= e && e < r.epoch));
    const auto got = table_.heartbeat(Credentials{r.id, e, p}, now_);
    expect(want, got ? Verdict::admitted : verdict_of(got.error()), "heartbeat(" + std::to_string(e) + ")", d);
    if (!got) return;
    fenced(r, e, "heartbeat");
    r.last_seen = now_;
  }

  void detach(RefSession& r, const Step& s, std::ostream& d) {
    const std::uint64_t e = epoch_for(r, s);
    const Proof p = proof_for(r, s, ProofPurpose::detach, e);
    const Verdict want = screen(r, s, e == r.epoch);
    const auto got = table_.detach(Credentials{r.id, e, p});
    expect(want, got ? Verdict::admitted : verdict_of(got.error()), "detach(" + std::to_string(e) + ")", d);
    if (!got) return;
    r.alive = false;
    ++c_.detaches;
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
      const bool same = e->epoch == r.epoch && e->state == r.state && e->unconfirmed == r.unconfirmed &&
                        e->last_seen == r.last_seen;
      if (!same)
        RC_FAIL("s" + std::to_string(i) + ": the table has epoch " + std::to_string(e->epoch) + " " +
                to_string(e->state) + (e->unconfirmed ? " U " + std::to_string(*e->unconfirmed) : "") +
                ", the rules say " + describe(r));
      // sessions.md §5.1: U is set exactly while the state is resuming.
      RC_ASSERT(e->unconfirmed.has_value() == (e->state == SessionState::resuming));
      RC_ASSERT(e->epoch >= r.confirmed);
    }
    const SessionCounters& t = table_.counters();
    const bool same = t.attaches == c_.attaches && t.resumes == c_.resumes && t.connects == c_.connects &&
                      t.detaches == c_.detaches && t.expired == c_.expired && t.refused_unknown == c_.refused_unknown &&
                      t.refused_proof == c_.refused_proof && t.refused_stale == c_.refused_stale &&
                      t.refused_state == c_.refused_state && t.refused_capacity == c_.refused_capacity;
    if (!same) RC_FAIL("the table's counters differ from the rules'");
  }

 public:
  bool retried() const { return retried_; }
  bool stale_refused() const { return stale_refused_; }
  bool expired() const { return expired_; }

 private:
  bool retried_ = false, stale_refused_ = false, expired_ = false;
  SessionTable table_;
  TablePoint now_ = TablePoint{} + 1h;
  std::vector<RefSession> sessions_;
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
                                                {3, Op::expire}});
  const auto which = rc::gen::weightedElement<Which>({{6, Which::current},
                                                      {4, Which::unconfirmed},
                                                      {4, Which::old},
                                                      {1, Which::future},
                                                      {1, Which::forged},
                                                      {1, Which::wrong_purpose}});
  return rc::gen::container<std::vector<Step>>(rc::gen::apply(
      [](Op o, std::uint8_t session, Which w, std::uint8_t arg) {
        // Fields a step does not use stay 0, so the shrunk schedule shows only what matters.
        Step s{o, 0, Which::current, 0};
        if (o == Op::attach) return s;
        if (o == Op::expire) return s.arg = arg, s;
        s.session = session % 4;
        if (names_epoch(o)) s.which = w;
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
  });
}
