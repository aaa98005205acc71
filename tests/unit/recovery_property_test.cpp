// Properties of the producer core and the ring owner's OwnerCore under adversarial schedules,
// driven through the loopback fabric: placements held back, done one WR or
// one 64-byte piece at a time (in any order where the ring MR has relaxed ordering, the
// immediate's completion still last), send completions and immediates delivered late, the QP
// dropped at any step, resumes through OwnerCore::resume / admit_connect (replies lost,
// connects late), producer restarts (over a control connection of their own), and old or
// duplicated control messages replayed, on the producer's control connection or on another.
// Whatever the schedule: every record is delivered exactly once, in order, checksum-valid, with
// the bytes it was sent with; no write lands on ring bytes the consumer has not released, and a
// record held by the application keeps its bytes until released; both ledgers are consistent
// after every step; the producer never has more WRs outstanding than its send queue's depth
// (the fabric refuses such a post: a doorbell, say, posted with no slot counted for it); the
// session table admits exactly what its rules admit, no replayed resume is admitted, and a
// refused control message changes nothing.
//
// A failing case prints the shrunk schedule ([send, flush, drop, resume, ...]) and a log of
// what each step did.
#include <rapidcheck/catch.h>

#include <sstream>

#include "../fabric/loopback.hpp"
#include "rdmaring/checksum.hpp"

using namespace rdmaring;
using rdmaring::test::LoopbackFabric;

namespace {

constexpr std::uint64_t kRing = 4096;
constexpr std::uint32_t kMaxRecord = 1000;  // a quarter of the ring: laps and wrapped batches are frequent

enum class Op : std::uint8_t {
  send,               // the application sends the next record (into staging)
  send_burst,         // ... the next 6 records, as far as the ring has room
  flush,              // take_batch and post it (placed at once unless placements are held)
  place_one,          // hold placements; place the oldest in-flight WR whole
  place_all,          // stop holding; place everything in flight, in order
  place_piece,        // hold placements; place one 64-byte piece (relaxed: any piece of any WR)
  publish,            // the consumer takes every queued immediate / reads the tail MR
  publish_one,        // the consumer takes one immediate (the rest arrive late)
  consume,            // the application takes up to 3 records and releases them at once
  consume_hold,       // the application takes up to 3 records and holds them
  release,            // the application releases every record it holds
  credit,             // credit write-back over the live link; the producer polls its credit MR
  complete,           // the producer takes its queued send completions
  drop,               // the producer's QP dies (or its connect attempt fails)
  resume,             // Producer::recover (QP gone or core failed): request, grant, resume(), connect
  resume_reply_lost,  // the resume request is admitted, its reply never arrives
  resume_no_connect,  // the grant is taken; the connect request is still on its way
  connect,            // the pending connect request reaches the owner
  established,        // the owner sees ESTABLISHED for its current link
  restart,            // the producer process dies and rejoins empty with its kept credentials
  replay_tail,        // the consumer reads an old epoch's tail record (mode tail)
  dup_resume,         // the last resume request is delivered again, on the producer's connection
  replay_resume,      // an earlier resume request is delivered again (argument: which, and bit 0
                      // where: the producer's control connection or another)
  replay_connect,     // an earlier connect request (argument picks which) is delivered again
  sleep,              // the owner arms and sleeps (RingOwner::wait) unless it finds work; argument
                      // bit 0: its flag writes' completions come after the re-check
  producer_poll,      // the producer reads its credit MR (its progress loop), nothing else
};

const char* name(Op op) {
  static const char* names[] = {"send",          "send_burst",  "flush",       "place_one",    "place_all",
                                "place_piece",   "publish",     "publish_one",  "consume",
                                "consume_hold",  "release",     "credit",       "complete",
                                "drop",          "resume",      "resume_reply_lost", "resume_no_connect",
                                "connect",       "established", "restart",      "replay_tail",
                                "dup_resume",    "replay_resume", "replay_connect", "sleep",
                                "producer_poll"};
  return names[static_cast<int>(op)];
}

bool takes_arg(Op op) {
  return op == Op::place_piece || op == Op::replay_resume || op == Op::replay_connect || op == Op::sleep;
}

struct Step {
  Op op = Op::send;
  std::uint8_t arg = 0;  // which piece / which earlier message; shown only where it is used
};

// Shrunk counterexamples print as a readable schedule.
void showValue(const Step& s, std::ostream& os) {
  os << name(s.op);
  if (takes_arg(s.op)) os << '(' << static_cast<int>(s.arg) << ')';
}

std::vector<std::byte> payload_for(std::uint64_t seq) {
  std::vector<std::byte> p((seq * 397) % (kMaxRecord + 1));
  for (std::size_t i = 0; i < p.size(); ++i) p[i] = static_cast<std::byte>(seq * 131 + i);
  return p;
}

// "; " between the parts of a step's log line.
std::ostream& sep(std::ostringstream& d) { return d.tellp() > 0 ? d << "; " : d; }

std::string show(const ResumePoint& at) {
  return "{epoch " + std::to_string(at.epoch) + ", position " + std::to_string(at.position) + ", released " +
         std::to_string(at.released) + ", next_sequence " + std::to_string(at.next_sequence) + "}";
}

// The session rules, written down independently of SessionTable: what it must admit.
struct SessionRef {
  enum class State { waiting_qp, connected, broken };
  std::uint64_t epoch = 1;
  std::optional<std::uint64_t> unconfirmed;  // the epoch a retried resume may still come from
  State state = State::connected;

  bool admits_resume(std::uint64_t e) const { return e == epoch || (unconfirmed && *unconfirmed <= e && e < epoch); }
  void resumed(std::uint64_t) {
    if (!unconfirmed) unconfirmed = epoch;  // the window's lower end stays
    ++epoch;
    state = State::waiting_qp;
  }
  enum class Connect { admit, stale, busy };
  Connect connect(std::uint64_t e) const {
    if (e != epoch) return Connect::stale;
    return state == State::waiting_qp ? Connect::admit : Connect::busy;
  }
  void connected() {
    state = State::connected;
    unconfirmed.reset();
  }
  void broken(std::uint64_t e) {
    if (e == epoch && state == State::connected) state = State::broken;
  }
};

// Everything a refused control message must leave as it was.
struct Snapshot {
  std::vector<std::byte> ring;
  ConsumerLedger c;
  ProducerLedger p;
  std::uint64_t c_epoch, c_next, p_epoch, t_epoch;
  SessionState t_state;
  std::optional<std::uint64_t> t_unconfirmed, link;
  bool dropped;
};

bool same(const ConsumerLedger& a, const ConsumerLedger& b) {
  return a.released == b.released && a.credited == b.credited && a.delivered == b.delivered && a.head == b.head &&
         a.published == b.published;
}
bool same(const ProducerLedger& a, const ProducerLedger& b) {
  return a.released == b.released && a.published == b.published && a.committed == b.committed &&
         a.claimed == b.claimed;
}
// The ring's state: its bytes, the consumer's ledger and epoch, the session's epoch and state.
bool same_ring_state(const Snapshot& a, const Snapshot& b) {
  return a.ring == b.ring && same(a.c, b.c) && a.c_epoch == b.c_epoch && a.c_next == b.c_next &&
         a.t_epoch == b.t_epoch && a.t_state == b.t_state && a.t_unconfirmed == b.t_unconfirmed;
}
bool same_everything(const Snapshot& a, const Snapshot& b) {
  return same_ring_state(a, b) && same(a.p, b.p) && a.p_epoch == b.p_epoch && a.link == b.link &&
         a.dropped == b.dropped;
}

struct Options {
  wire::PublishMode mode = wire::PublishMode::imm;
  bool relaxed = false;
  // A producer whose resume is refused as stale asks again from the other epochs it can sign
  // for (earlier ones first). Producer::recover does not: it asks from its core's epoch only.
  bool fallback = true;
  // The owner may sleep (Op::sleep, and after each round of the final drain): then it acts only
  // when an event is in its completion queue or the control thread woke it, as RingOwner::wait.
  bool sleeps = false;
  // Mode tail: the owner parks a session at its first quiet tail read (wakeup.md §3.2), so that
  // every step between a park and a publish is tried; 0: never.
  std::uint32_t park_reads = 0;
};

ProducerConfig small_send_queue() {
  ProducerConfig pc;
  pc.sq_depth = 8;  // send completions are delayed: a full send queue is reachable
  pc.signal_interval = 4;
  return pc;
}

class Harness {
 public:
  explicit Harness(const Options& o)
      : o_(o), f_(o.mode, kRing, kMaxRecord, small_send_queue(), ConsumerConfig{}, o.relaxed, o.park_reads) {
    f_.delay_completions(true);
    f_.on_place = [this](const WorkRequest& wr) {
      if (overlaps_unreleased(wr)) {
        overwrote_ = true;
        RC_LOG() << "    !! placed ring[" << wr.remote_offset << ", " << wr.remote_offset + wr.length
                 << ") over unreleased bytes: " << to_string(f_.consumer().ledger()) << '\n';
      }
    };
  }

  void step(const Step& s) {
    std::ostringstream d;
    const auto sq = f_.producer->send_queue_outstanding();
    if (owner_step(s.op) && !owner_awake()) {
      RC_LOG() << "  " << name(s.op) << ": the owner sleeps\n";
      return;
    }
    // The control thread's events (rdma_cm, a resume) wake a sleeping owner, as RingOwner's do.
    if (control_step(s.op)) asleep_ = false;
    switch (s.op) {
      case Op::send:
      case Op::send_burst: {
        const std::uint64_t first = next_send_;
        for (int i = 0; i < (s.op == Op::send ? 1 : 6); ++i) {
          if (!f_.producer->send(payload_for(next_send_), Clock::now())) break;
          ++next_send_;
        }
        if (next_send_ == first) d << "refused";
        else d << "seq " << first << (next_send_ - first > 1 ? ".." + std::to_string(next_send_ - 1) : "");
        break;
      }
      case Op::flush: d << (f_.flush() ? "posted" : "nothing to post") << (f_.dropped() ? " (no QP)" : ""); break;
      case Op::place_one:
        f_.hold(true);
        d << (f_.place_one() ? "placed" : "nothing in flight");
        break;
      case Op::place_all:
        f_.hold(false);
        f_.place_all();
        break;
      case Op::place_piece:
        f_.hold(true);
        d << f_.place_piece(s.arg);
        break;
      case Op::publish:
      case Op::publish_one: {
        const auto ok = f_.take_publishes(s.op == Op::publish ? SIZE_MAX : 1);
        if (!ok) RC_FAIL("publish refused: " + ok.error().message());
        d << "published " << f_.consumer().ledger().published;
        break;
      }
      case Op::consume: d << consume(3, false) << " delivered"; break;
      case Op::consume_hold: d << consume(3, true) << " delivered, held"; break;
      case Op::release: d << release_held() << " released"; break;
      case Op::credit:
        f_.return_credit();
        d << "producer released " << f_.producer->ledger().released;
        break;
      case Op::producer_poll:
        producer_reads_credit();
        d << "released " << f_.producer->ledger().released << (f_.producer->doorbell() ? ", doorbell flag" : "")
          << (f_.producer->doorbell_owed() ? ", a doorbell owed" : "");
        break;
      case Op::sleep: d << try_sleep((s.arg & 1) != 0); break;
      case Op::complete: d << f_.complete() << " completions"; break;
      case Op::drop:
        if (f_.connect_pending()) {
          f_.abandon_connect();
          d << "the connect attempt fails";
        } else if (!f_.dropped()) {
          const auto e = *f_.link_epoch();
          f_.drop();
          ref_.broken(e);
          d << "QP of epoch " << e << " dies";
        }
        break;
      case Op::resume:
      case Op::resume_reply_lost:
      case Op::resume_no_connect:
      case Op::restart:
        if (!needs_recover()) break;
        if (s.op == Op::restart) f_.reconnect();  // a new process: a control connection of its own
        if (const auto at = producer_request(d)) {
          if (!held_.empty()) resumed_holding_ = true;
          if (s.op == Op::resume_reply_lost) {
            sep(d) << "the reply is lost";
          } else if (s.op == Op::restart) {
            f_.producer_restart(*at);
            next_send_ = at->next_sequence;
            sep(d) << "a new producer starts at " << show(*at);
            connect(d);
          } else {
            const auto ok = f_.producer_resume(*at);
            if (!ok) RC_FAIL("the producer refused the grant " + show(*at) + ": " + ok.error().message());
            sep(d) << "producer resumed";
            if (s.op == Op::resume) connect(d);
          }
        }
        break;
      case Op::connect:
        if (f_.connect_pending()) connect(d);
        break;
      case Op::established:
        if (f_.established()) {
          ref_.connected();
          d << "epoch " << ref_.epoch << " confirmed";
        }
        break;
      case Op::replay_tail:
        if (const auto old = f_.old_tail(); o_.mode == wire::PublishMode::tail && old) {
          const Snapshot before = snapshot();
          f_.core().on_tail(f_.session(), *old);
          f_.owner().collect_closed();
          RC_ASSERT(f_.alive().has_value());
          RC_ASSERT(same_everything(before, snapshot()));  // a stale epoch changes nothing
          d << "ignored";
        }
        break;
      case Op::dup_resume:
        if (!f_.resumes_sent().empty()) replay_resume(f_.resumes_sent().back(), true, d);
        break;
      case Op::replay_resume:
        if (!f_.resumes_sent().empty())
          replay_resume(f_.resumes_sent()[(s.arg >> 1) % f_.resumes_sent().size()], (s.arg & 1) == 0, d);
        break;
      case Op::replay_connect:
        if (!f_.connects_sent().empty()) replay_connect(f_.connects_sent()[s.arg % f_.connects_sent().size()], d);
        break;
    }
    if (f_.producer->send_queue_outstanding() != sq) d << " [sq " << f_.producer->send_queue_outstanding() << "]";
    RC_LOG() << "  ";
    showValue(s, RC_LOG());
    RC_LOG() << (d.str().empty() ? "" : ": ") << d.str() << '\n';
    RC_ASSERT(!overwrote_);
    check_ledgers();
  }

  // Heal and drain: whatever the schedule, everything sent arrives, once, and the producer's
  // credit catches up with what the consumer released (a credit that lags, say one carrying an
  // old `released`, starves a producer however long it asks).
  void heal_and_drain() {
    RC_LOG() << "  -- heal and drain --\n";
    f_.hold(false);
    for (int round = 0; round < 200 && (expect_ < next_send_ || needs_recover() || credit_lags()); ++round) {
      std::ostringstream d;
      f_.complete();
      if (f_.connect_pending()) connect(d);
      if (needs_recover()) {
        const auto at = producer_request(d);
        if (!at) {
          RC_LOG() << "  heal: " << d.str() << '\n';
          RC_FAIL("the producer cannot resume: every resume it can send is refused");
        }
        RC_ASSERT(f_.producer_resume(*at).has_value());
        connect(d);
      }
      if (f_.established()) {
        ref_.connected();
        asleep_ = false;  // ESTABLISHED: RingOwner's control thread wakes the poller
      }
      if (!d.str().empty()) {
        asleep_ = false;  // a control event
        RC_LOG() << "  heal: " << d.str() << '\n';
      }
      f_.place_all();
      f_.complete();
      if (owner_awake()) {
        const auto ok = f_.take_publishes();
        if (!ok) RC_FAIL("publish refused: " + ok.error().message());
        consume(1000, false);
        release_held();
        f_.owner().post_credits();
        f_.owner().collect_closed();
      }
      producer_reads_credit();
      f_.producer->request_credit();
      f_.flush();
      if (o_.sleeps) RC_LOG() << "  heal: " << try_sleep(false) << '\n';
      RC_ASSERT(!overwrote_);
      check_ledgers();
    }
    const std::string ledgers =
        "; producer " + to_string(f_.producer->ledger()) + ", consumer " + to_string(f_.consumer().ledger());
    if (expect_ != next_send_)
      RC_FAIL("delivered up to sequence " + std::to_string(expect_) + " of " + std::to_string(next_send_) + ledgers);
    if (credit_lags())
      RC_FAIL("the producer asked for credit 200 times and never got what the consumer released" + ledgers);
  }

  bool wedged() const { return wedged_; }
  bool slept() const { return slept_; }
  std::uint64_t parks() const { return f_.owner().core().counters().parks; }
  std::uint64_t doorbells() const { return f_.producer->counters().doorbells; }
  bool resumed_holding() const { return resumed_holding_; }
  const LoopbackFabric::Stats& fabric_stats() const { return f_.stats(); }

  // Producer::recover is due: the producer has no QP, or its core failed (a WRITE posted while
  // it had none: the application calls recover() on completion_error), and no connect is on
  // its way.
  bool needs_recover() const { return !f_.connect_pending() && (f_.dropped() || f_.producer->failure()); }
  bool credit_lags() const { return f_.producer->ledger().released != f_.consumer().ledger().released; }
  bool retried() const { return retried_; }
  bool replayed_elsewhere() const { return replayed_elsewhere_; }

 private:
  struct Held {
    std::uint64_t sequence, start, end;
  };

  // ---- the owner's sleep (protocol-spec/wakeup.md) --------------------------------------------

  // Steps the owner's polling thread takes: none while it sleeps.
  static bool owner_step(Op op) {
    return op == Op::publish || op == Op::publish_one || op == Op::consume || op == Op::consume_hold ||
           op == Op::release || op == Op::credit || op == Op::replay_tail || op == Op::sleep;
  }
  static bool control_step(Op op) {
    return op == Op::drop || op == Op::resume || op == Op::resume_reply_lost || op == Op::resume_no_connect ||
           op == Op::restart || op == Op::connect || op == Op::established;
  }
  // A sleeping owner wakes when its completion queue holds an event: an immediate, a doorbell,
  // a completion of its own writes.
  bool owner_awake() {
    if (asleep_ && f_.owner().queued() > 0) asleep_ = false;
    return !asleep_;
  }
  bool unread() const {
    const auto l = f_.consumer().ledger();
    return l.head != l.published;
  }
  // RingOwner::arm on the fabric: take what is there; if nothing, ask for doorbells (the flag
  // writes), then look again (the CQ too, unless `late`: the writes' completions come after the
  // look, and wake it), and sleep when that finds nothing. Only with nothing held: a RingOwner
  // poll ends with every record released or given back.
  std::string try_sleep(bool late) {
    if (!o_.sleeps || asleep_ || !held_.empty() || f_.closed()) return "stays up";
    const auto ok = f_.take_publishes();
    if (!ok) RC_FAIL("publish refused: " + ok.error().message());
    if (unread()) return "work: stays up";
    f_.core().prepare_sleep();
    f_.owner().post_credits();
    f_.owner().collect_closed();
    if (late) f_.owner().read_tails();
    else if (const auto again = f_.take_publishes(); !again) RC_FAIL("publish refused: " + again.error().message());
    // As OwnerDataPlane's re-check: what it took is acted on, a doorbell's clear (O2) included.
    f_.owner().post_credits();
    if (unread()) return "work at the re-check: stays up";
    if (f_.core().doorbell_since_prepare()) return "a doorbell at the re-check: stays up";
    asleep_ = slept_ = true;
    return "asleep";
  }
  // The producer's progress loop reads its credit MR whatever the owner does.
  void producer_reads_credit() {
    f_.producer->on_credit(std::span<const std::byte, wire::kCreditRecordSize>(f_.credit_mr()));
  }

  // Ring bytes the consumer has not released and that are published in its current epoch.
  bool overlaps_unreleased(const WorkRequest& wr) const {
    if (wr.kind == WorkRequest::Kind::write_tail || wr.length == 0) return false;
    const auto l = f_.consumer().ledger();
    for (std::uint64_t pos = l.released; pos < l.published; pos += wire::kRecordAlign) {
      const std::uint64_t off = pos & (kRing - 1);
      if (off >= wr.remote_offset && off < wr.remote_offset + wr.length) return true;
    }
    return false;
  }

  // The record at `start` in the ring is sequence `seq` as sent: a valid data header whose check
  // covers the payload, and the payload bytes themselves.
  void check_record(std::uint64_t seq, std::uint64_t start, std::uint64_t end, const char* when) const {
    const auto ring = f_.ring();
    const std::uint64_t off = f_.geometry().offset(start);
    const auto header = ring.subspan(off).first<wire::kRecordHeaderSize>();
    const auto h = wire::decode_record_header(header);
    if (!h || h->kind != wire::RecordKind::data || h->sequence != seq ||
        wire::record_span(h->payload_len) != end - start)
      RC_FAIL(std::string(when) + ": no valid header of sequence " + std::to_string(seq) + " at " + std::to_string(start));
    const auto payload = ring.subspan(off + wire::kRecordHeaderSize, h->payload_len);
    RC_ASSERT(wire::record_check_matches(header, payload));
    const auto want = payload_for(seq);
    if (!std::equal(want.begin(), want.end(), payload.begin(), payload.end()))
      RC_FAIL(std::string(when) + ": the bytes of sequence " + std::to_string(seq) + " changed");
  }

  // The application polls: take_deliveries up to `max`, each record checked; held, or handled
  // at once (finish_deliveries) with everything held before it.
  std::size_t consume(std::size_t max, bool hold) {
    auto taken = f_.take(max);
    if (const auto ok = f_.alive(); !ok) RC_FAIL("take_deliveries: " + ok.error().message());
    for (const TakenRecord& t : taken) {
      const Delivery& rec = t.delivery;
      RC_ASSERT(rec.session == f_.session());
      if (rec.sequence != expect_)
        RC_FAIL("delivered sequence " + std::to_string(rec.sequence) + ", expected " + std::to_string(expect_));
      const std::uint64_t start = t.end - wire::record_span(rec.payload.size());
      check_record(expect_, start, t.end, "at delivery");
      held_.push_back(Held{expect_, start, t.end});
      ++expect_;
    }
    const std::size_t n = taken.size();
    if (n > 0) polls_.push_back(std::move(taken));
    if (!hold) release_held();
    return n;
  }

  // Releases every held record (finish_deliveries of each poll, all handled), after checking
  // that its bytes stayed as delivered.
  std::size_t release_held() {
    if (held_.empty()) return 0;
    for (const Held& h : held_) check_record(h.sequence, h.start, h.end, "while held");
    for (const auto& poll : polls_) f_.finish(poll, poll.size());
    if (const auto ok = f_.alive(); !ok) RC_FAIL("release: " + ok.error().message());
    const std::size_t n = held_.size();
    held_.clear();
    polls_.clear();
    return n;
  }

  void check_ledgers() const {
    const auto p = f_.producer->ledger();
    const auto c = f_.consumer().ledger();
    const bool producer_ok = p.released <= p.published && p.published <= p.committed && p.committed <= p.claimed &&
                             p.claimed <= p.released + kRing;
    const bool consumer_ok = c.credited <= c.released && c.released <= c.delivered && c.delivered <= c.head &&
                             c.head <= c.published && c.published <= c.credited + kRing;
    // Information flows one way along each of these (ledger.md §2.3).
    const bool between_ok = p.released <= c.credited && c.published <= p.published;
    const bool aligned = (p.released | p.published | p.committed | c.credited | c.released | c.delivered | c.head |
                          c.published) % wire::kRecordAlign == 0;
    if (!(producer_ok && consumer_ok && between_ok && aligned))
      RC_FAIL("ledgers inconsistent: producer " + to_string(p) + ", consumer " + to_string(c));
  }

  Snapshot snapshot() const {
    const SessionEntry* e = f_.table().find(f_.session());
    RC_ASSERT(e != nullptr);
    return Snapshot{std::vector<std::byte>(f_.ring().begin(), f_.ring().end()),
                    f_.consumer().ledger(),
                    f_.producer->ledger(),
                    f_.consumer().epoch(),
                    f_.consumer().next_sequence(),
                    f_.producer->epoch(),
                    e->epoch,
                    e->state,
                    e->unconfirmed,
                    f_.link_epoch(),
                    f_.dropped()};
  }

  // A resume request for epoch `e` reaches the owner. Checks the verdict against the rules;
  // a refused one must change nothing.
  std::optional<ResumePoint> send_resume(const LoopbackFabric::Request& r, std::ostringstream& d) {
    const bool admit = ref_.admits_resume(r.epoch);
    const Snapshot before = snapshot();
    const auto at = f_.owner_resume(r);
    if (!admit) {
      if (at) RC_FAIL("a resume of epoch " + std::to_string(r.epoch) + " was admitted; the session is in epoch " +
                      std::to_string(ref_.epoch));
      RC_ASSERT(at.error() == errc::stale_epoch);
      if (!same_everything(before, snapshot())) RC_FAIL("a refused resume of epoch " + std::to_string(r.epoch) + " changed state");
      d << "resume(" << r.epoch << ") refused: stale";
      return std::nullopt;
    }
    if (!at) RC_FAIL("a resume of epoch " + std::to_string(r.epoch) + " was refused: " + at.error().message());
    if (r.epoch < ref_.epoch) retried_ = true;
    ref_.resumed(r.epoch);
    RC_ASSERT(at.value().epoch == ref_.epoch);
    d << "resume(" << r.epoch << ") admitted: " << show(at.value());
    return at.value();
  }

  // Producer::recover's request, from the core's epoch; with `fallback`, refused, from each
  // earlier epoch, newest first (it holds the secret: it can sign for any). The unconfirmed
  // epoch is always one of them, so the fallback always gets in.
  std::optional<ResumePoint> producer_request(std::ostringstream& d) {
    const std::uint64_t mine = f_.producer->epoch();
    if (auto at = send_resume(f_.resume_request(mine), d)) return at;
    wedged_ = true;
    if (!o_.fallback) return std::nullopt;
    for (std::uint64_t e = mine - 1; e >= 1; --e) {
      sep(d);
      if (auto at = send_resume(f_.resume_request(e), d)) return at;
    }
    RC_FAIL("no epoch up to the producer's own (" + std::to_string(mine) + ") is admitted; the session is in epoch " +
            std::to_string(ref_.epoch));
    return std::nullopt;
  }

  // The producer's pending connect reaches the owner; checks the verdict.
  void connect(std::ostringstream& d) {
    const std::uint64_t e = f_.producer->epoch();
    const auto want = ref_.connect(e);
    const auto ok = f_.connect();
    switch (want) {
      case SessionRef::Connect::admit:
        if (!ok) RC_FAIL("connect of epoch " + std::to_string(e) + " refused: " + ok.error().message());
        sep(d) << "connect(" << e << ") admitted";
        break;
      case SessionRef::Connect::stale:
        RC_ASSERT(!ok.has_value());
        RC_ASSERT(ok.error() == errc::stale_epoch);
        sep(d) << "connect(" << e << ") refused: stale";
        break;
      case SessionRef::Connect::busy:
        RC_ASSERT(!ok.has_value());
        RC_ASSERT(ok.error() == errc::invalid_argument);
        sep(d) << "connect(" << e << ") refused: the epoch's QP is there";
        break;
    }
  }

  // A captured resume request, verbatim. On the connection it was sent on, while that is the
  // producer's, its counter was used; on another (the replayer's, authenticated as the
  // producer's identity: the worst case) its proof covers another nonce. Refused either way,
  // even in the retry window, and nothing changes. (`r` is a copy: sending it logs it, which may
  // move the log it came from.)
  void replay_resume(LoopbackFabric::Request r, bool own, std::ostringstream& d) {
    own = own && r.sent_on == f_.control().nonce();
    const Snapshot before = snapshot();
    ControlConnection other(std::string(LoopbackFabric::kIdentity), random_nonce());
    const auto at = own ? f_.owner_resume(r) : f_.owner_resume(r, other);
    d << "replayed resume(" << r.epoch << ") #" << r.counter << " on " << (own ? "the producer's" : "another")
      << " connection";
    if (at) RC_FAIL("a replayed resume of epoch " + std::to_string(r.epoch) + " was admitted");
    if (!(at.error() == errc::bad_proof)) RC_FAIL("a replayed resume refused with " + at.error().message());
    if (!same_everything(before, snapshot())) RC_FAIL("a refused replay of a resume changed state");
    d << ": refused";
    if (!own) replayed_elsewhere_ = true;
  }

  void replay_connect(wire::ConnectData c, std::ostringstream& d) {
    const auto want = ref_.connect(c.epoch);
    const Snapshot before = snapshot();
    const auto ok = f_.owner_connect(c, false);
    const Snapshot after = snapshot();
    // Admitted or not, a connect never touches the ring, its ledger or the session's epoch.
    if (!same_ring_state(before, after)) RC_FAIL("a replayed connect of epoch " + std::to_string(c.epoch) + " changed the ring");
    switch (want) {
      case SessionRef::Connect::admit:
        if (!ok) RC_FAIL("replayed connect of the current epoch refused: " + ok.error().message());
        d << "replayed connect(" << c.epoch << ") admitted: it replaces the producer's QP";
        break;
      case SessionRef::Connect::stale:
      case SessionRef::Connect::busy:
        if (ok) RC_FAIL("a replayed connect of epoch " + std::to_string(c.epoch) + " was admitted in epoch " +
                        std::to_string(ref_.epoch));
        RC_ASSERT(ok.error() == (want == SessionRef::Connect::stale ? errc::stale_epoch : errc::invalid_argument));
        RC_ASSERT(same_everything(before, after));
        d << "replayed connect(" << c.epoch << ") refused: " << (want == SessionRef::Connect::stale ? "stale" : "QP there");
        break;
    }
  }

  Options o_;
  LoopbackFabric f_;
  SessionRef ref_;
  std::vector<Held> held_;
  std::vector<std::vector<TakenRecord>> polls_;  // taken, not yet finished (held_'s records)
  std::uint64_t next_send_ = 0, expect_ = 0;
  bool overwrote_ = false;
  bool wedged_ = false;
  bool retried_ = false;             // a resume from below the session's epoch admitted (the retry window)
  bool replayed_elsewhere_ = false;  // a resume replayed on another connection
  bool resumed_holding_ = false;  // a resume was granted while the application held records
  bool asleep_ = false;           // the owner sleeps (Options::sleeps)
  bool slept_ = false;
};

// What a property reports about its cases (rapidcheck prints the share of each class).
enum class Report { data_path, reorder, replay, sleep, park, none };

void run_schedule(const Options& o, const std::vector<Step>& steps, Report report = Report::none) {
  Harness h(o);
  for (const Step& s : steps) h.step(s);
  h.heal_and_drain();
  switch (report) {
    case Report::data_path:
      RC_CLASSIFY(h.fabric_stats().wrapped_batches > 0, "a batch crossed the ring's end");
      RC_CLASSIFY(h.resumed_holding(), "resumed while records were held");
      break;
    case Report::reorder:
      RC_CLASSIFY(h.fabric_stats().wrapped_batches > 0, "a batch crossed the ring's end");
      RC_CLASSIFY(h.fabric_stats().out_of_order_pieces > 0, "a piece placed before an earlier one");
      break;
    case Report::replay:
      RC_CLASSIFY(h.retried(), "a retry in the window admitted");
      RC_CLASSIFY(h.replayed_elsewhere(), "a resume replayed on another connection");
      RC_CLASSIFY(h.wedged(), "the producer's own epoch was refused");
      break;
    case Report::sleep:
      RC_CLASSIFY(h.slept(), "the owner slept");
      RC_CLASSIFY(h.doorbells() > 0, "a doorbell rang");
      break;
    case Report::park:
      RC_CLASSIFY(h.parks() > 0, "a session parked");
      RC_CLASSIFY(h.doorbells() > 0, "a doorbell rang");
      break;
    case Report::none: break;
  }
}

using Weights = std::initializer_list<std::pair<std::size_t, Op>>;

// Up to 300 steps (3 × rapidcheck's size).
rc::Gen<std::vector<Step>> schedules(const Weights& w) {
  return rc::gen::scale(3.0, rc::gen::container<std::vector<Step>>(rc::gen::apply(
      [](Op op, std::uint8_t arg) { return Step{op, takes_arg(op) ? arg : std::uint8_t{0}}; },
      rc::gen::weightedElement<Op>(w), rc::gen::arbitrary<std::uint8_t>())));
}

// The data path, drops, resumes and restarts.
const Weights kBase = {{24, Op::send},        {4, Op::send_burst},   {8, Op::flush},        {8, Op::place_one},
                       {5, Op::place_all},    {4, Op::place_piece},  {6, Op::publish},      {3, Op::publish_one},
                       {6, Op::consume},      {3, Op::consume_hold}, {3, Op::release},      {6, Op::credit},
                       {5, Op::complete},     {2, Op::drop},         {2, Op::resume},       {1, Op::resume_reply_lost},
                       {1, Op::resume_no_connect}, {2, Op::connect}, {2, Op::established},  {1, Op::restart},
                       {1, Op::replay_tail}};

// Pieces placed in every order the ring MR allows.
const Weights kReorder = {{24, Op::send},        {5, Op::send_burst}, {10, Op::flush},   {20, Op::place_piece},
                          {2, Op::place_one},    {2, Op::place_all},  {6, Op::publish},  {4, Op::publish_one},
                          {6, Op::consume},      {3, Op::consume_hold}, {3, Op::release}, {6, Op::credit},
                          {5, Op::complete},     {2, Op::drop},       {2, Op::resume},   {1, Op::resume_no_connect},
                          {1, Op::connect},      {2, Op::established}};

// Old, duplicated and replayed control messages around resumes.
const Weights kReplay = {{16, Op::send},        {3, Op::send_burst},     {6, Op::flush},
                         {5, Op::place_one},    {3, Op::place_all},      {4, Op::place_piece},
                         {5, Op::publish},      {2, Op::publish_one},    {5, Op::consume},
                         {2, Op::consume_hold}, {2, Op::release},        {5, Op::credit},
                         {4, Op::complete},     {4, Op::drop},           {4, Op::resume},
                         {2, Op::resume_reply_lost}, {3, Op::resume_no_connect}, {3, Op::connect},
                         {3, Op::established},  {1, Op::restart},        {1, Op::replay_tail},
                         {3, Op::dup_resume},   {4, Op::replay_resume},  {4, Op::replay_connect}};

}  // namespace

TEST_CASE("exactly-once in-order delivery under adversarial schedules", "[property]") {
  rc::prop("mode imm", [] { run_schedule({wire::PublishMode::imm}, *schedules(kBase), Report::data_path); });
  rc::prop("mode tail", [] { run_schedule({wire::PublishMode::tail}, *schedules(kBase), Report::data_path); });
  rc::prop("mode tail, sessions parked", [] {
    run_schedule({wire::PublishMode::tail, false, true, false, 1}, *schedules(kBase), Report::park);
  });
}

TEST_CASE("placements reordered as far as the ring MR's ordering allows", "[property][reorder]") {
  // Relaxed ordering: pieces of one batch, and of later batches, land in any order; the
  // immediate completes only after all of them. The owner refuses it in mode tail.
  CHECK_THROWS_AS(LoopbackFabric(wire::PublishMode::tail, kRing, kMaxRecord, {}, {}, true), std::invalid_argument);
  rc::prop("mode imm, relaxed ring MR", [] {
    run_schedule({wire::PublishMode::imm, true}, *schedules(kReorder), Report::reorder);
  });
  // Strict ordering: pieces land in posting order only (torn in order, never out of order).
  rc::prop("mode tail, strict ring MR", [] {
    run_schedule({wire::PublishMode::tail}, *schedules(kReorder), Report::reorder);
  });
}

TEST_CASE("replayed and duplicated control messages are refused or harmless", "[property][replay]") {
  rc::prop("mode imm", [] { run_schedule({wire::PublishMode::imm}, *schedules(kReplay), Report::replay); });
  rc::prop("mode imm, relaxed ring MR", [] {
    run_schedule({wire::PublishMode::imm, true}, *schedules(kReplay), Report::replay);
  });
  rc::prop("mode tail", [] { run_schedule({wire::PublishMode::tail}, *schedules(kReplay), Report::replay); });
}

// Sleep and wake-up steps: the owner sleeps at any step (its flag writes' completions before or
// after its re-check), doorbells are placed late (held placements) or lost with their QP, and the
// producer reads its credit MR at any step. A sleeping owner acts only on an event, so a lost
// wake-up is a record the final drain never delivers.
const Weights kSleep = {{20, Op::send},        {4, Op::send_burst},   {8, Op::flush},        {6, Op::place_one},
                        {4, Op::place_all},    {3, Op::place_piece},  {5, Op::publish},      {2, Op::publish_one},
                        {5, Op::consume},      {2, Op::consume_hold}, {3, Op::release},      {4, Op::credit},
                        {4, Op::complete},     {1, Op::drop},         {2, Op::resume},       {1, Op::connect},
                        {1, Op::established},  {12, Op::sleep},       {6, Op::producer_poll}};

TEST_CASE("no record waits for a sleeping owner", "[property][wakeup]") {
  rc::prop("mode imm", [] { run_schedule({wire::PublishMode::imm, false, true, true}, *schedules(kSleep), Report::sleep); });
  rc::prop("mode tail", [] { run_schedule({wire::PublishMode::tail, false, true, true}, *schedules(kSleep), Report::sleep); });
  // Parked sessions and the owner's sleep together: a parked session keeps its flag through a
  // sleep, and the sleep asks only the sessions not parked.
  rc::prop("mode tail, sessions parked", [] {
    run_schedule({wire::PublishMode::tail, false, true, true, 1}, *schedules(kSleep), Report::park);
  });
}

// A resume whose reply was lost leaves the producer's epoch behind the session's, anywhere in the
// retry window once it took a later grant and lost its QP again. Producer::recover asks only from
// its core's epoch: the table admits the whole window from the unconfirmed epoch up, so it gets
// back in. (In protocol v3 a replayed copy, admitted in the window, could fence the epoch its
// producer had just been granted: with the window of the unconfirmed epoch alone, this property
// found the session wedged for good. Replays are refused since v4; the window still serves the
// producer's own retries.)
TEST_CASE("a producer that asks only from its own epoch can always resume", "[property][session-wedge]") {
  rc::prop("mode imm, Producer::recover's rule", [] {
    run_schedule({wire::PublishMode::imm, false, false}, *schedules(kReplay));
  });
}
