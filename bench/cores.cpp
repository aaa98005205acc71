// rdmaring-bench cores: what a record costs the CPU in the library's own code, with no device and
// no emulator. ProducerCore and OwnerCore are joined through plain memory: a memcpy stands for the
// NIC's placement of each WRITE, a lock-free queue for the owner's completion queue (mode imm's
// immediates, the doorbells), and the tail and credit records are 32-byte mailboxes written and
// read a word at a time, so a reader may see one torn, as with DMA. Everything else is the
// library's: coalescing, the signaling budget, CRCs, credit, release, round robin.
//
// Per configuration (record size x payload check x publish mode), median of --runs:
//   split      one thread takes turns: the producer (up to 256 claim+copy+commit and the posts
//              that come due, as Producer::send does them), the NIC (placing what was posted),
//              the owner (RingOwner::poll's work until nothing is left); each turn timed apart
//   pipelined  a producer thread and an owner thread, as deployed: wall time per record
// and, side by side, the floors for the same records: a Boost.Lockfree spsc_queue handing
// (length, bytes) between the same threads (split and pipelined, like the above), and a memcpy
// of the bytes (with a crc32c pass when the ring checks payloads).
// Then the cost as sessions grow: 1, 16, 64, 256 sessions of 64 B records on one OwnerCore (all
// of them publishing, or --active percent), split: owner ns per record and per empty poll.
//
// Instructions per record: the turns are functions of their own (producer_turn, nic_turn,
// owner_turn, spsc_push_turn, spsc_pop_turn, memcpy_turn) so that callgrind's inclusive counts
// split them (bench/cores-instructions), where no PMU is exposed to perf.
#include "cores.hpp"

#include "tools/wire_names.hpp"

#include <algorithm>
#include <atomic>
#include <boost/lockfree/spsc_queue.hpp>
#include <charconv>
#include <chrono>
#include <cstring>
#include <fstream>
#include <functional>
#include <iomanip>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "bench_records.hpp"
#include "rdmaring/checksum.hpp"
#include "rdmaring/owner_core.hpp"
#include "rdmaring/producer_core.hpp"
#include "rdmaring/session_proof.hpp"

namespace rdmaring::bench {
namespace {

using Ns = std::chrono::duration<double, std::nano>;

constexpr std::size_t kTurnRecords = 256;  // a producer turn; also the owner's poll limit
// As sessions grow, each publishes this many records a turn, so that the figures compare the
// same batching at every session count.
constexpr std::uint64_t kSessionTurnRecords = 16;

// What the floors read of the records, so that no read is optimised away.
volatile std::uint64_t g_sink = 0;

struct Config {
  std::uint32_t size = 64;
  wire::PayloadCheck check = wire::PayloadCheck::none;
  wire::PublishMode mode = wire::PublishMode::imm;
  std::uint64_t ring_bytes = 1 << 20;
  std::uint64_t records = 0;
};

const char* name(wire::PayloadCheck c) { return c == wire::PayloadCheck::none ? "none" : "crc32c"; }
const char* name(wire::PublishMode m) { return m == wire::PublishMode::imm ? "imm" : "tail"; }

// A 32-byte record that one side writes and the other reads (the tail MR, the credit MR).
// Release stores and acquire loads order the ring's bytes around it the way the RC QP's
// ordering does; a read between the words of a write sees it torn, which the cores must reject.
class Mailbox {
 public:
  using Bytes = std::array<std::byte, 32>;
  void store(const Bytes& b) noexcept {
    for (std::size_t i = 0; i < words_.size(); ++i) {
      std::uint64_t w;
      std::memcpy(&w, b.data() + 8 * i, 8);
      words_[i].store(w, std::memory_order_release);
    }
  }
  Bytes load() const noexcept {
    Bytes b;
    for (std::size_t i = 0; i < words_.size(); ++i) {
      const std::uint64_t w = words_[i].load(std::memory_order_acquire);
      std::memcpy(b.data() + 8 * i, &w, 8);
    }
    return b;
  }

 private:
  std::array<std::atomic<std::uint64_t>, 4> words_{};
};
static_assert(sizeof(Mailbox::Bytes) == wire::kTailRecordSize && sizeof(Mailbox::Bytes) == wire::kCreditRecordSize);

struct Receive {
  SessionId session = 0;
  std::uint32_t imm = 0;
};
using CompletionQueue = boost::lockfree::spsc_queue<Receive>;

std::runtime_error broken(const std::string& what) { return std::runtime_error("bench cores: " + what); }

class Stream;

// The owner's side: OwnerCore, its completion queue, and a poll that does what
// OwnerDataPlane::begin_poll/end_poll do around the application's handler.
class Owner {
 public:
  Owner(const Config& c, std::size_t sessions)
      : config_(owner_config(c, sessions)),
        core_(config_),
        cq_(sessions * (config_.ring_bytes / wire::kRecordAlign) + 1024) {}

  OwnerCore& core() { return core_; }
  CompletionQueue& cq() { return cq_; }
  const OwnerConfig& config() const { return config_; }
  void add(SessionId id, Stream& s) { streams_[id] = &s; }

  std::size_t poll();
  // Records the handler has seen; what it read of them, so that nothing is optimised away.
  std::uint64_t delivered() const { return delivered_; }
  std::uint64_t sink() const { return sink_; }

 private:
  static OwnerConfig owner_config(const Config& c, std::size_t sessions) {
    OwnerConfig o;
    o.ring_bytes = c.ring_bytes;
    o.mode = c.mode;
    o.max_sessions = static_cast<std::uint32_t>(sessions);
    o.lease = std::chrono::nanoseconds::zero();
    o.core.payload_check = c.check;
    if (auto ok = o.validate(); !ok) throw broken("owner config: " + ok.error().message());
    return o;
  }

  OwnerConfig config_;
  OwnerCore core_;
  CompletionQueue cq_;
  std::unordered_map<SessionId, Stream*> streams_;
  std::vector<TakenRecord> taken_;
  std::vector<CreditPost> credits_;
  std::uint64_t delivered_ = 0;
  std::uint64_t sink_ = 0;
};

// One session: the producer's core and staging, the owner's ring, the two mailboxes, and the
// NIC between them. `deferred`: posted batches wait for place_posted() (the split measurement's
// NIC turn); otherwise they are placed as they are posted, on the producer's thread.
class Stream {
 public:
  Stream(Owner& owner, const Config& c, bool deferred) : owner_(owner), deferred_(deferred) {
    const auto made = RingGeometry::make(c.ring_bytes, owner.config().max_record);
    if (!made) throw broken("ring geometry: " + made.error().message());
    const RingGeometry geometry = made.value();
    staging_.assign(geometry.bytes, std::byte{0});
    ring_.assign(geometry.bytes, std::byte{0});
    const auto now = Clock::now();
    auto attached = owner.core().attach("bench", ring_, now);  // one identity; no allow rules
    if (!attached) throw broken("attach: " + attached.error().message());
    const SessionEntry& entry = attached.value();
    id_ = entry.id;
    owner.add(id_, *this);
    const wire::ConnectData hello{id_, 1, make_proof(entry.secret, ProofPurpose::connect, id_, 1), 0x1000, 1};
    if (auto ok = owner.core().admit_connect(hello, now); !ok) throw broken("connect: " + ok.error().message());
    owner.core().on_established(id_);
    core_.emplace(staging_, PeerRing{c.mode, geometry, {}, c.check}, ProducerConfig{});
  }

  // Producer::send, retried once after Producer::progress when the ring is full. False: still
  // full (a publish asking for credit went out).
  bool send(std::span<const std::byte> payload) {
    for (int attempt = 0; attempt < 2; ++attempt) {
      const auto now = time_for_send(*core_);
      auto r = core_->send(payload, now);
      if (r) {
        post_due(false, now);
        return true;
      }
      if (r.error() != errc::would_block) throw broken("send: " + r.error().message());
      progress();
    }
    return false;
  }
  // Producer::flush: whatever is committed is published now.
  void flush() { post_due(true, Clock::now()); }
  // Producer::progress: completions, the credit record, and a publish that came due.
  void progress() {
    take_completions();
    read_credit();
    if (core_->publish_pending()) post_due(false, Clock::now());
  }

  // The NIC's turn: what was posted lands in the ring, in order.
  void place_posted() {
    for (const PostBatch& b : posted_) place(b);
    posted_.clear();
  }

  Mailbox& credit() { return credit_; }
  const Mailbox& tail() const { return tail_; }
  SessionId id() const { return id_; }

 private:
  // ProducerDataPlane::post_due.
  void post_due(bool force, Clock::time_point now) {
    if (!force && !core_->flush_due(now)) return;
    if (core_->peer().mode == wire::PublishMode::tail) read_credit();
    for (bool polled = false;; polled = true) {
      while (auto batch = core_->take_batch()) {
        if (deferred_) posted_.push_back(*batch);
        else place(*batch);
      }
      if (polled || !core_->publish_pending()) return;
      take_completions();
    }
  }
  void read_credit() { core_->on_credit(credit_.load()); }
  void take_completions() {
    for (const std::uint64_t wr_id : completed_) core_->on_completion(wr_id, true);
    completed_.clear();
  }
  void place(const PostBatch& b) {
    for (const WorkRequest& wr : b.requests()) {
      switch (wr.kind) {
        case WorkRequest::Kind::write:
          std::memcpy(ring_.data() + wr.remote_offset, staging_.data() + wr.local_offset, wr.length);
          break;
        case WorkRequest::Kind::write_with_imm:
          std::memcpy(ring_.data() + wr.remote_offset, staging_.data() + wr.local_offset, wr.length);
          if (!owner_.cq().push(Receive{id_, wr.imm})) throw broken("the completion queue overflowed");
          break;
        case WorkRequest::Kind::write_tail: {
          Mailbox::Bytes t;
          std::copy(wr.tail.begin(), wr.tail.end(), t.begin());
          tail_.store(t);
          break;
        }
      }
      if (wr.slot.signaled) completed_.push_back(wr.slot.wr_id);
    }
  }

  Owner& owner_;
  bool deferred_;
  SessionId id_ = 0;
  std::vector<std::byte> staging_;
  std::vector<std::byte> ring_;  // the owner's memory
  std::optional<ProducerCore> core_;
  std::vector<PostBatch> posted_;
  std::vector<std::uint64_t> completed_;
  Mailbox tail_;    // the owner's tail MR
  Mailbox credit_;  // the producer's credit MR
};

std::size_t Owner::poll() {
  cq_.consume_all([this](const Receive& r) { core_.on_immediate(r.session, r.imm); });
  // As OwnerDataPlane: the tails of the sessions not parked (wakeup.md §3.2).
  core_.read_tails([this](SessionId id, std::span<std::byte, wire::kTailRecordSize> into) {
    const auto it = streams_.find(id);
    if (it == streams_.end()) return false;
    const Mailbox::Bytes t = it->second->tail().load();
    std::copy(t.begin(), t.end(), into.begin());
    return true;
  });
  taken_.clear();
  if (core_.wants_clock()) core_.take_deliveries(kTurnRecords, Clock::now(), taken_);
  for (const TakenRecord& t : taken_) {
    const auto p = t.delivery.payload;
    if (!p.empty()) sink_ += static_cast<std::uint8_t>(p.front()) ^ static_cast<std::uint8_t>(p.back());
  }
  core_.finish_deliveries(taken_, taken_.size());
  credits_.clear();
  core_.take_credits(credits_);
  for (const CreditPost& c : credits_) {
    Mailbox::Bytes b;
    std::copy(c.write.bytes.begin(), c.write.bytes.end(), b.begin());
    streams_.at(c.session)->credit().store(b);
    if (c.write.slot.signaled) core_.on_credit_completion(c.session, c.write.slot.wr_id);
  }
  if (const auto closed = core_.take_closed(); !closed.empty())
    throw broken("session " + std::to_string(closed.front().session) + " closed: " + closed.front().message);
  delivered_ += taken_.size();
  return taken_.size();
}

// ---- the turns (functions of their own, for callgrind) -------------------------------------------

[[gnu::noinline]] std::uint64_t producer_turn(std::span<const std::unique_ptr<Stream>> streams,
                                              std::span<const std::byte> payload, std::uint64_t per_stream,
                                              std::uint64_t left) {
  std::uint64_t sent = 0;
  for (auto& s : streams) {
    for (std::uint64_t k = 0; k < per_stream && sent < left; ++k, ++sent)
      if (!s->send(payload)) break;
    s->flush();
  }
  return sent;
}

[[gnu::noinline]] void nic_turn(std::vector<std::unique_ptr<Stream>>& streams) {
  for (auto& s : streams) s->place_posted();
}

[[gnu::noinline]] std::uint64_t owner_turn(Owner& owner) {
  std::uint64_t n = 0;
  while (const std::size_t got = owner.poll()) n += got;
  return n;
}

[[gnu::noinline]] std::uint64_t empty_polls(Owner& owner, std::uint64_t polls) {
  std::uint64_t n = 0;
  for (std::uint64_t i = 0; i < polls; ++i) n += owner.poll();
  return n;
}

struct Split {
  double producer = 0, nic = 0, owner = 0;  // ns per record
  double empty_poll = 0;                    // ns per poll that finds nothing
  double sum() const { return producer + owner; }
};

std::vector<std::byte> payload_of(std::uint32_t size) {
  std::vector<std::byte> p(size);
  bench::fill(1, 0, p);
  return p;
}

// `per_stream`: records each of the first `active` sessions sends per producer turn (one publish
// each, at least); the others stay attached and idle.
Split run_split(const Config& c, std::size_t sessions, std::uint64_t per_stream, std::size_t active) {
  Owner owner(c, sessions);
  std::vector<std::unique_ptr<Stream>> streams;
  for (std::size_t i = 0; i < sessions; ++i) streams.push_back(std::make_unique<Stream>(owner, c, true));
  const auto payload = payload_of(c.size);
  // An owner's sessions have been attached a while, idle ones idle: in mode tail parked
  // (wakeup.md §3.2, after OwnerConfig::tail_park_reads quiet reads and the flag's completion),
  // as they are in a service. The timed run and the empty polls start from there.
  constexpr std::uint64_t kSettlePolls = 4096;
  empty_polls(owner, kSettlePolls);
  Ns producer{}, nic{}, own{};
  std::uint64_t sent = 0, idle_rounds = 0;
  while (owner.delivered() < c.records) {
    const auto t0 = Clock::now();
    const std::uint64_t s = producer_turn(std::span(streams).first(active), payload, per_stream, c.records - sent);
    const auto t1 = Clock::now();
    nic_turn(streams);
    const auto t2 = Clock::now();
    const std::uint64_t d = owner_turn(owner);
    const auto t3 = Clock::now();
    producer += t1 - t0;
    nic += t2 - t1;
    own += t3 - t2;
    sent += s;
    // A round that moves nothing is normal once (credit read late); many in a row are a stall.
    idle_rounds = (s == 0 && d == 0) ? idle_rounds + 1 : 0;
    if (idle_rounds > 1000) throw broken("no progress: " + std::to_string(owner.delivered()) + " delivered");
  }
  constexpr std::uint64_t kEmptyPolls = 20000;
  empty_polls(owner, kSettlePolls);
  const auto e0 = Clock::now();
  if (empty_polls(owner, kEmptyPolls) != 0) throw broken("an empty poll delivered a record");
  const Ns empty = Clock::now() - e0;
  const double n = static_cast<double>(c.records);
  return Split{producer.count() / n, nic.count() / n, own.count() / n, empty.count() / kEmptyPolls};
}

double run_pipelined(const Config& c) {
  Owner owner(c, 1);
  Stream stream(owner, c, false);
  const auto payload = payload_of(c.size);
  std::atomic<bool> go{false}, done{false};
  std::thread consumer([&] {
    while (!go.load(std::memory_order_acquire)) {
    }
    while (owner.delivered() < c.records) owner.poll();
    done.store(true, std::memory_order_release);
  });
  const auto t0 = Clock::now();
  go.store(true, std::memory_order_release);
  for (std::uint64_t i = 0; i < c.records; ++i)
    while (!stream.send(payload)) {
    }
  stream.flush();
  while (!done.load(std::memory_order_acquire)) stream.progress();
  const Ns wall = Clock::now() - t0;
  consumer.join();
  return wall.count() / static_cast<double>(c.records);
}

// ---- the floors -------------------------------------------------------------------------------

using ByteQueue = boost::lockfree::spsc_queue<std::byte>;

bool spsc_push(ByteQueue& q, std::span<const std::byte> payload) {
  if (q.write_available() < 4 + payload.size()) return false;
  const auto len = static_cast<std::uint32_t>(payload.size());
  std::array<std::byte, 4> h;
  std::memcpy(h.data(), &len, 4);
  q.push(h.data(), h.size());
  q.push(payload.data(), payload.size());
  return true;
}

// Pops one record into `out`; false when none is there. (The pusher pushes a header only with
// its bytes, so a reader that sees the header waits only for a push in progress.)
bool spsc_pop(ByteQueue& q, std::vector<std::byte>& out, std::uint64_t& sink) {
  if (q.read_available() < 4) return false;
  std::array<std::byte, 4> h;
  q.pop(h.data(), h.size());
  std::uint32_t len;
  std::memcpy(&len, h.data(), 4);
  while (q.read_available() < len) {
  }
  q.pop(out.data(), len);
  if (len > 0) sink += static_cast<std::uint8_t>(out[0]) ^ static_cast<std::uint8_t>(out[len - 1]);
  return true;
}

[[gnu::noinline]] std::uint64_t spsc_push_turn(ByteQueue& q, std::span<const std::byte> payload, std::uint64_t max) {
  std::uint64_t n = 0;
  while (n < max && spsc_push(q, payload)) ++n;
  return n;
}

[[gnu::noinline]] std::uint64_t spsc_pop_turn(ByteQueue& q, std::vector<std::byte>& out, std::uint64_t& sink) {
  std::uint64_t n = 0;
  while (spsc_pop(q, out, sink)) ++n;
  return n;
}

struct Floor {
  double push = 0, pop = 0;  // split, ns per record
  double pipelined = 0;
  double memcpy = 0;         // memcpy of the bytes (and a crc32c pass when the ring checks)
  double sum() const { return push + pop; }
};

// One thread: pushes up to a turn's records, then pops them.
Floor floor_spsc_split(const Config& c) {
  const auto payload = payload_of(c.size);
  std::vector<std::byte> out(c.size);
  std::uint64_t sink = 0;
  ByteQueue q(c.ring_bytes);
  Ns push{}, pop{};
  for (std::uint64_t done = 0; done < c.records;) {
    const auto t0 = Clock::now();
    const std::uint64_t n = spsc_push_turn(q, payload, std::min<std::uint64_t>(kTurnRecords, c.records - done));
    const auto t1 = Clock::now();
    done += spsc_pop_turn(q, out, sink);
    const auto t2 = Clock::now();
    push += t1 - t0;
    pop += t2 - t1;
    if (n == 0) throw broken("spsc floor: a record larger than the queue");
  }
  g_sink = sink;
  const double n = static_cast<double>(c.records);
  return Floor{push.count() / n, pop.count() / n};
}

double floor_spsc_pipelined(const Config& c) {
  const auto payload = payload_of(c.size);
  std::vector<std::byte> out(c.size);
  std::uint64_t sink = 0;
  ByteQueue q(c.ring_bytes);
  std::atomic<bool> go{false};
  std::thread consumer([&] {
    while (!go.load(std::memory_order_acquire)) {
    }
    for (std::uint64_t n = 0; n < c.records;) n += spsc_pop(q, out, sink);
  });
  const auto t0 = Clock::now();
  go.store(true, std::memory_order_release);
  for (std::uint64_t i = 0; i < c.records; ++i)
    while (!spsc_push(q, payload)) {
    }
  consumer.join();
  g_sink = sink;
  return Ns(Clock::now() - t0).count() / static_cast<double>(c.records);
}

[[gnu::noinline]] std::uint64_t memcpy_turn(std::span<std::byte> ring, std::span<const std::byte> payload,
                                            std::uint64_t records, bool crc) {
  std::uint64_t at = 0, sink = 0;
  for (std::uint64_t i = 0; i < records; ++i) {
    if (at + payload.size() > ring.size()) at = 0;
    std::memcpy(ring.data() + at, payload.data(), payload.size());
    if (crc) sink += crc32c(std::span<const std::byte>(ring.data() + at, payload.size()));
    at += payload.size();
  }
  return sink + static_cast<std::uint8_t>(ring[0]);
}

double floor_memcpy(const Config& c) {
  std::vector<std::byte> ring(c.ring_bytes);
  const auto payload = payload_of(c.size);
  const auto t0 = Clock::now();
  const std::uint64_t sink = memcpy_turn(ring, payload, c.records, c.check == wire::PayloadCheck::crc32c);
  const Ns t = Clock::now() - t0;
  g_sink = sink;
  return t.count() / static_cast<double>(c.records);
}

// ---- options, runs, report -----------------------------------------------------------------

struct Options {
  std::vector<std::uint32_t> sizes{64, 1024, 4096, 65536};
  std::vector<wire::PayloadCheck> checks{wire::PayloadCheck::none, wire::PayloadCheck::crc32c};
  std::vector<wire::PublishMode> modes{wire::PublishMode::imm, wire::PublishMode::tail};
  std::vector<std::uint32_t> sessions{1, 16, 64, 256};
  unsigned active_percent = 100;  // of the sweep's sessions, those that publish
  unsigned runs = 5;
  std::optional<std::uint64_t> records;
  bool split_only = false;
  bool sessions_only = false;
  std::string json;
};

// Enough records that a run moves 256 MiB, within [20,000, 500,000].
std::uint64_t records_for(const Options& o, std::uint32_t size) {
  if (o.records) return *o.records;
  return std::clamp<std::uint64_t>((std::uint64_t{256} << 20) / size, 20000, 500000);
}

// Each figure's median over the runs (not all figures of one run).
template <class T>
T median_each(unsigned runs, std::initializer_list<double T::*> figures, const std::function<T()>& run) {
  std::vector<T> v;
  for (unsigned i = 0; i < runs; ++i) v.push_back(run());
  T out = v.front();
  for (double T::*m : figures) {
    std::vector<double> x;
    for (const T& r : v) x.push_back(r.*m);
    std::sort(x.begin(), x.end());
    out.*m = x[x.size() / 2];
  }
  return out;
}

struct Figure {
  double value = 0;
};
double median_of(unsigned runs, const std::function<double()>& run) {
  return median_each<Figure>(runs, {&Figure::value}, [&] { return Figure{run()}; }).value;
}

Split median_split(unsigned runs, const Config& c, std::size_t sessions, std::uint64_t per_stream,
                   std::size_t active) {
  return median_each<Split>(runs, {&Split::producer, &Split::nic, &Split::owner, &Split::empty_poll},
                            [&] { return run_split(c, sessions, per_stream, active); });
}

double ratio(double a, double b) { return b > 0 ? a / b : 0; }

int run_cores(const Options& o) {
  nlohmann::json report{{"runs", o.runs}, {"cost", nlohmann::json::array()}, {"sessions", nlohmann::json::array()}};
  std::cout << std::fixed << std::setprecision(1)
            << "native cost per record, ns (median of " << o.runs
            << "); split: one thread, each side timed apart; pipelined: two threads, wall time\n";
  for (const std::uint32_t size : o.sessions_only ? std::vector<std::uint32_t>{} : o.sizes) {
    for (const auto check : o.checks) {
      Config base;
      base.size = size;
      base.check = check;
      base.records = records_for(o, size);
      Floor floor = median_each<Floor>(o.runs, {&Floor::push, &Floor::pop}, [&] { return floor_spsc_split(base); });
      floor.memcpy = median_of(o.runs, [&] { return floor_memcpy(base); });
      if (!o.split_only) floor.pipelined = median_of(o.runs, [&] { return floor_spsc_pipelined(base); });
      for (const auto mode : o.modes) {
        Config c = base;
        c.mode = mode;
        const Split s = median_split(o.runs, c, 1, kTurnRecords, 1);
        const double pipelined = o.split_only ? 0 : median_of(o.runs, [&] { return run_pipelined(c); });
        std::cout << "cores size=" << size << " check=" << name(check) << " mode=" << name(mode)
                  << " producer=" << s.producer << " nic=" << s.nic << " owner=" << s.owner
                  << " producer+owner=" << s.sum() << " pipelined=" << pipelined << " | spsc push=" << floor.push
                  << " pop=" << floor.pop << " push+pop=" << floor.sum() << " pipelined=" << floor.pipelined
                  << " | memcpy" << (check == wire::PayloadCheck::crc32c ? "+crc32c=" : "=") << floor.memcpy
                  << std::setprecision(2) << " | ratio split/spsc=" << ratio(s.sum(), floor.sum())
                  << " pipelined/spsc=" << ratio(pipelined, floor.pipelined)
                  << " split/memcpy=" << ratio(s.sum(), floor.memcpy) << std::setprecision(1) << "\n";
        report["cost"].push_back({{"size", size},
                                  {"check", name(check)},
                                  {"mode", name(mode)},
                                  {"records", c.records},
                                  {"producer_ns", s.producer},
                                  {"nic_ns", s.nic},
                                  {"owner_ns", s.owner},
                                  {"pipelined_ns", pipelined},
                                  {"spsc_push_ns", floor.push},
                                  {"spsc_pop_ns", floor.pop},
                                  {"spsc_pipelined_ns", floor.pipelined},
                                  {"memcpy_ns", floor.memcpy},
                                  {"ratio_split_spsc", ratio(s.sum(), floor.sum())},
                                  {"ratio_pipelined_spsc", ratio(pipelined, floor.pipelined)},
                                  {"ratio_split_memcpy", ratio(s.sum(), floor.memcpy)}});
      }
    }
  }
  if (!o.sessions.empty())
    std::cout << "cost as sessions grow: 64 B records, payload check none, 256 KiB rings, split, "
              << kSessionTurnRecords << " records per session per publish, " << o.active_percent
              << " % of the sessions publishing\n";
  for (const std::uint32_t n : o.sessions) {
    const std::size_t active = std::max<std::size_t>(1, (std::size_t{n} * o.active_percent + 99) / 100);
    for (const auto mode : o.modes) {
      Config c;
      c.mode = mode;
      c.ring_bytes = 256 * 1024;
      c.records = o.records.value_or(200000);
      const Split s = median_split(o.runs, c, n, kSessionTurnRecords, active);
      std::cout << "sessions n=" << n << " active=" << active << " mode=" << name(mode) << " producer=" << s.producer
                << " owner=" << s.owner << " empty_poll=" << s.empty_poll << "\n";
      report["sessions"].push_back({{"sessions", n},
                                    {"active", active},
                                    {"mode", name(mode)},
                                    {"producer_ns", s.producer},
                                    {"owner_ns", s.owner},
                                    {"empty_poll_ns", s.empty_poll}});
    }
  }
  if (!o.json.empty()) {
    std::ofstream out(o.json);
    out << report.dump(2) << "\n";
    if (!out) {
      std::cerr << "rdmaring-bench cores: cannot write " << o.json << "\n";
      return 1;
    }
  }
  return 0;
}

}  // namespace

}  // namespace rdmaring::bench

namespace rdmaring::tools {

Command add_cores_command(CLI::App& parent) {
  auto o = std::make_shared<bench::Options>();
  CLI::App* app = parent.add_subcommand("cores", "no device: the library's CPU cost per record, beside an spsc_queue and a memcpy");
  app->add_option("--record-sizes", o->sizes, "record sizes, bytes")->delimiter(',')->check(CLI::Range(1, 64 * 1024))->capture_default_str();
  app->add_option("--checks", o->checks, "payload checks: none, crc32c")
      ->delimiter(',')
      ->transform(one_of(kPayloadCheckNames))
      ->default_str("none,crc32c");
  app->add_option("--modes", o->modes, "publish modes: imm, tail")
      ->delimiter(',')
      ->transform(one_of(kPublishModeNames))
      ->default_str("imm,tail");
  app->add_option("--sessions", o->sessions, "session counts of the sweep, 1 to 4096")
      ->delimiter(',')
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  app->add_flag_callback("--no-sessions", [o] { o->sessions.clear(); }, "no sweep over session counts");
  app->add_option("--active", o->active_percent, "percent of the sweep's sessions that publish (at least one); the rest stay attached and idle")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  app->add_option("--runs", o->runs, "runs per figure (the median is reported)")->check(CLI::Range(1, 101))->capture_default_str();
  app->add_option("--records", o->records, "records per run (default: 256 MiB worth, 20,000 to 500,000)")
      ->check(CLI::Range(std::uint64_t{1}, std::uint64_t{1} << 40));
  app->add_flag("--split-only", o->split_only, "no pipelined runs");
  app->add_flag("--sessions-only", o->sessions_only, "only the sweep over session counts");
  app->add_option("--json", o->json, "write the figures to this file as one JSON object");
  return {app, [o] { return bench::run_cores(*o); }};
}

}  // namespace rdmaring::tools

