// Hostile input that passes every checksum: bytes changed in place and sealed again (the
// record's check over its header and the payload it now claims), so that only the semantic checks of
// the reader, the consumer, the producer and the session proofs stand between the lie and the
// application. A bit flip is caught by a CRC whatever the code behind it does; these are the
// lies a CRC cannot catch. Every case is enumerated: the tests are deterministic.
#include <catch2/catch.hpp>

#include <cstring>
#include <functional>

#include "../fabric/loopback.hpp"
#include "rdmaring/checksum.hpp"
#include "rdmaring/record_reader.hpp"

using namespace rdmaring;
using rdmaring::test::LoopbackFabric;

namespace {

using HeaderBytes = std::span<std::byte, wire::kRecordHeaderSize>;

template <class T>
T field(HeaderBytes h, std::size_t at) {
  T v;
  std::memcpy(&v, h.data() + at, sizeof v);
  return v;
}
template <class T>
void set_field(HeaderBytes h, std::size_t at, T v) {
  std::memcpy(h.data() + at, &v, sizeof v);
}

// Applies `lie` to the raw header at `offset` of `ring`, then seals it again: the check over the
// header and, for a data record, the payload length it now claims (as far as `ring` goes: it may
// extend past the ring proper).
void reseal(std::span<std::byte> ring, std::uint64_t offset, const std::function<void(HeaderBytes)>& lie) {
  const HeaderBytes h = ring.subspan(offset).first<wire::kRecordHeaderSize>();
  lie(h);
  const auto word = field<std::uint32_t>(h, 0);
  const std::uint64_t after = offset + wire::kRecordHeaderSize;
  const bool data = word >> wire::kRecordKindShift == static_cast<std::uint32_t>(wire::RecordKind::data);
  const auto covered = data ? ring.subspan(after, std::min<std::uint64_t>(word & wire::kRecordLenMask, ring.size() - after))
                            : std::span<std::byte>{};
  set_field(h, 12, crc32c(covered, crc32c(std::span<const std::byte>(h).first(12))));
}

std::function<void(HeaderBytes)> set_kind(std::uint32_t kind) {
  return [kind](HeaderBytes h) {
    set_field(h, 0, (field<std::uint32_t>(h, 0) & wire::kRecordLenMask) | kind << wire::kRecordKindShift);
  };
}

struct Lie {
  const char* what;
  std::function<void(HeaderBytes)> apply;
  bool last_only;  // a lie about the length can only be seen where nothing follows the record
};

std::function<void(HeaderBytes)> shift_sequence(std::uint64_t by) {
  return [by](HeaderBytes h) { set_field(h, 4, field<std::uint64_t>(h, 4) + by); };
}

const std::vector<Lie>& lies() {
  static const std::vector<Lie> all = {
      {"sequence + 1: the record before it was lost", shift_sequence(1), false},
      {"sequence - 1: an old record replayed", shift_sequence(~std::uint64_t{0}), false},
      {"kind 0", set_kind(0), false},
      {"kind 3", set_kind(3), false},
      {"data turned padding", set_kind(static_cast<std::uint32_t>(wire::RecordKind::padding)), false},
      {"span one unit past the publish mark",
       [](HeaderBytes h) { set_field<std::uint32_t>(h, 0, field<std::uint32_t>(h, 0) + wire::kRecordAlign); }, true},
  };
  return all;
}

std::vector<std::byte> payload_of(std::uint64_t seq) {
  std::vector<std::byte> p((seq * 211 + 30) % 700);
  for (std::size_t i = 0; i < p.size(); ++i) p[i] = static_cast<std::byte>(seq * 7 + i);
  return p;
}

// `records` records, from sequence `seq` on, sent, delivered and their credit returned: the
// records after them start that far round the ring.
void go_round(LoopbackFabric& f, std::uint64_t& seq, std::uint64_t records) {
  for (const std::uint64_t end = seq + records; seq < end; ++seq) {
    REQUIRE(f.producer->send(payload_of(seq), Clock::now()));
    f.flush();
    f.deliver_publishes();
    REQUIRE(f.deliver(SIZE_MAX, [](const Delivery&) {}) == 1);
    f.return_credit();
  }
}

// Where the record the producer sends next will start: after padding when it does not fit
// before the ring's end.
std::uint64_t next_record_at(LoopbackFabric& f, std::uint64_t payload_len) {
  const std::uint64_t at = f.producer->ledger().committed;
  const std::uint64_t to_end = f.geometry().to_end(at);
  return to_end < wire::record_span(payload_len) ? at + to_end : at;
}

// Takes every record the owner delivers at `now`, CHECKing that each is the one expected (then
// `expect` moves past it) and within max_record; the session's verdict once none is left.
Result<void> take_all(LoopbackFabric& f, std::uint64_t& expect, Clock::time_point now) {
  for (;;) {
    BOOST_OUTCOME_TRY(r, f.next(now));
    if (!r) return success();
    CHECK(r->delivery.sequence == expect);
    CHECK(r->delivery.payload.size() <= f.geometry().max_record);
    f.finish(std::span(&*r, 1), 1);
    ++expect;
  }
}

}  // namespace

TEST_CASE("a record re-sealed with a lie is never delivered and fails its session", "[hostile][core]") {
  // `lap` records go round first, so that victims sit at every kind of offset, some behind
  // padding at the wrap; then `count` more, and record `victim` of them lies.
  for (const Lie& lie : lies()) {
    for (std::uint64_t lap = 0; lap < 12; lap += 3) {
      for (std::uint64_t count = 1; count <= 4; ++count) {
        for (std::uint64_t victim = lie.last_only ? count - 1 : 0; victim < count; ++victim) {
          INFO(lie.what << ", after " << lap << " records, record " << victim << " of " << count);
          LoopbackFabric f(wire::PublishMode::imm, 4096, 1000);
          std::uint64_t seq = 0;
          go_round(f, seq, lap);
          std::uint64_t victim_at = 0;
          for (std::uint64_t i = 0; i < count; ++i, ++seq) {
            if (i == victim) victim_at = next_record_at(f, payload_of(seq).size());
            REQUIRE(f.producer->send(payload_of(seq), Clock::now()));
          }
          f.flush();
          reseal(f.ring(), f.geometry().offset(victim_at), lie.apply);
          f.deliver_publishes();
          std::uint64_t expect = lap;
          const Result<void> verdict = take_all(f, expect, f.owner().now());
          CHECK(expect == lap + victim);
          REQUIRE_FALSE(verdict);
          CHECK(verdict.error() == errc::protocol_violation);
        }
      }
    }
  }
}

TEST_CASE("a sealed data record longer than max_record is never delivered, though it lies below the publish mark",
          "[hostile][core]") {
  // wire-formats.md check 4'. The lie swallows the records sent after it, so that every byte it
  // claims is published, placed and sealed under its CRC: only max_record refuses it. Victims
  // stand at many offsets (after `lap` records), with lengths just over max_record, a unit
  // over, and up to most of the ring.
  constexpr std::uint32_t kMax = 700;  // payload_of's records stay within it
  std::size_t cases = 0;
  for (const auto mode : {wire::PublishMode::imm, wire::PublishMode::tail}) {
    for (std::uint64_t lap = 0; lap < 16; ++lap) {
      for (const std::uint32_t over : {1u, 2u, 23u, 63u, 64u, 65u, 300u, 1000u, 2500u, 3300u}) {
        const std::uint32_t len = kMax + over;
        INFO((mode == wire::PublishMode::imm ? "imm" : "tail") << ", after " << lap << " records, length " << len);
        LoopbackFabric f(mode, 4096, kMax);
        std::uint64_t seq = 0;
        go_round(f, seq, lap);
        const std::uint64_t victim = seq;
        const std::uint64_t victim_at = next_record_at(f, payload_of(seq).size());
        if (f.geometry().to_end(victim_at) < wire::record_span(len)) continue;  // the lie ends past the ring
        // The records the lie swallows must fit the credit one lap gives, padding included.
        bool fits = true;
        while (fits && f.producer->ledger().committed < victim_at + wire::record_span(len)) {
          const auto sent = f.producer->send(payload_of(seq++), Clock::now());
          if (!sent) REQUIRE(sent.error() == errc::would_block);
          fits = sent.has_value();
        }
        if (!fits) continue;
        f.flush();
        reseal(f.ring(), f.geometry().offset(victim_at), [len](HeaderBytes h) {
          set_field(h, 0, len | static_cast<std::uint32_t>(wire::RecordKind::data) << wire::kRecordKindShift);
        });
        f.deliver_publishes();
        std::uint64_t expect = lap;
        const Clock::time_point now = f.owner().now();
        Result<void> verdict = take_all(f, expect, now);
        // Mode tail waits out the ordering grace before it calls a record that fails a violation.
        if (mode == wire::PublishMode::tail && verdict)
          verdict = take_all(f, expect, now + f.owner().config().core.ordering_grace);
        CHECK(expect == victim);
        REQUIRE_FALSE(verdict);
        CHECK(verdict.error() == errc::protocol_violation);
        ++cases;
      }
    }
  }
  CHECK(cases > 150);
}

TEST_CASE("the record reader refuses a sealed record running one unit past the mark or the ring's end",
          "[hostile][ring]") {
  const auto g = RingGeometry::make(4096, 4096 - wire::kRecordHeaderSize).value();
  // Twice the ring: what a reader that overran the ring's end would read is there, sealed in.
  std::vector<std::byte> backing(2 * g.bytes);
  const std::span<std::byte> ring = std::span(backing).first(g.bytes);
  for (std::uint64_t head = g.bytes; head < 2 * g.bytes; head += wire::kRecordAlign) {
    const std::uint64_t offset = g.offset(head);
    const std::uint64_t longest = g.to_end(head) + wire::kRecordAlign;
    for (std::uint64_t span = wire::kRecordAlign; span <= longest; span += wire::kRecordAlign) {
      INFO("record at offset " << offset << " spanning " << span << " B");
      std::fill(backing.begin(), backing.end(), std::byte{0x5a});
      const auto len = static_cast<std::uint32_t>(span - wire::kRecordHeaderSize);
      reseal(backing, offset, [&](HeaderBytes h) {
        wire::encode(wire::RecordHeader{len, wire::RecordKind::data, 9}, {}, h);
      });
      const bool fits = span <= g.to_end(head);
      CHECK(read_record(ring, g, head, head + span).status ==
            (fits ? RecordView::Status::data : RecordView::Status::bad_length));
      CHECK(read_record(ring, g, head, head + span - wire::kRecordAlign).status == RecordView::Status::bad_length);
      if (!fits) CHECK(read_record(ring, g, head, head + 2 * g.bytes).status == RecordView::Status::bad_length);
    }
  }
}

TEST_CASE("the record reader refuses a sealed data record above max_record at every offset, below any mark",
          "[hostile][ring]") {
  // wire-formats.md check 4': the span check alone lets these through (they fit before the
  // ring's end and the mark); lengths go byte by byte around max_record, then a unit at a time.
  const auto g = RingGeometry::make(4096, 1000).value();
  std::vector<std::byte> ring(g.bytes);
  std::size_t refused = 0;
  for (std::uint64_t head = g.bytes; head < 2 * g.bytes; head += wire::kRecordAlign) {
    const std::uint64_t published = head + g.to_end(head);
    for (std::uint32_t len = g.max_record - 3; wire::record_span(len) <= g.to_end(head);
         len += len < g.max_record + 3 ? 1 : static_cast<std::uint32_t>(wire::kRecordAlign) - 1) {
      INFO("record at offset " << g.offset(head) << " of " << len << " B");
      std::fill(ring.begin(), ring.end(), std::byte{0x5a});
      reseal(ring, g.offset(head), [&](HeaderBytes h) {
        wire::encode(wire::RecordHeader{len, wire::RecordKind::data, 9}, {}, h);
      });
      const bool over = len > g.max_record;
      CHECK(read_record(ring, g, head, published).status ==
            (over ? RecordView::Status::bad_length : RecordView::Status::data));
      refused += over;
    }
  }
  CHECK(refused > 500);
}

TEST_CASE("a header of neither kind is refused even when sealed again", "[hostile][wire]") {
  const auto g = RingGeometry::make(4096, 1000).value();
  for (const std::uint32_t kind : {0u, 3u}) {
    std::vector<std::byte> ring(g.bytes);
    wire::encode(wire::RecordHeader{100, wire::RecordKind::data, 3}, {}, std::span(ring).first<wire::kRecordHeaderSize>());
    reseal(ring, 0, set_kind(kind));
    CHECK_FALSE(wire::decode_record_header(std::span(ring).first<wire::kRecordHeaderSize>()));
    CHECK(read_record(ring, g, 0, g.bytes).status == RecordView::Status::bad_header);
  }
}

TEST_CASE("a sealed credit releasing more than the producer published fails the producer", "[hostile][core]") {
  for (std::uint64_t beyond : {std::uint64_t{64}, std::uint64_t{4096}}) {
    LoopbackFabric f(wire::PublishMode::imm, 4096, 1000);
    for (std::uint64_t seq = 0; seq < 3; ++seq) REQUIRE(f.producer->send(payload_of(seq), Clock::now()));
    f.flush();
    const ProducerLedger before = f.producer->ledger();
    std::array<std::byte, wire::kCreditRecordSize> c{};
    wire::encode(wire::CreditRecord{f.producer->epoch(), before.published + beyond, 3, 0}, c);
    f.producer->on_credit(c);
    REQUIRE(f.producer->failure());
    CHECK(*f.producer->failure() == errc::protocol_violation);
    CHECK(f.producer->ledger().released == before.released);
  }
}

TEST_CASE("a proof shorter or longer than a proof never matches", "[hostile][sessions]") {
  const SessionSecret secret = random_secret();
  const ChannelBinding binding{random_nonce(), 3};
  const bool control = GENERATE(false, true);
  INFO((control ? "a control proof" : "a connect proof"));
  const Proof good = control ? make_control_proof(secret, ProofPurpose::resume, 5, 2, binding)
                             : make_proof(secret, ProofPurpose::connect, 5, 2);
  const auto matches = [&](std::span<const std::byte> proof) {
    return control ? proof_matches(secret, ProofPurpose::resume, 5, 2, binding, proof)
                   : proof_matches(secret, ProofPurpose::connect, 5, 2, proof);
  };
  const std::span<const std::byte> all(good);
  CHECK(matches(all));
  for (std::size_t n = 0; n < all.size(); ++n) CHECK_FALSE(matches(all.first(n)));
  std::vector<std::byte> longer(all.begin(), all.end());
  longer.push_back(std::byte{0});
  CHECK_FALSE(matches(longer));
}

TEST_CASE("a control proof is bound to every byte of its nonce and counter", "[hostile][sessions]") {
  const SessionSecret secret = random_secret();
  const ChannelBinding binding{random_nonce(), 7};
  const Proof good = make_control_proof(secret, ProofPurpose::heartbeat, 5, 2, binding);
  CHECK(proof_matches(secret, ProofPurpose::heartbeat, 5, 2, binding, good));
  for (std::size_t i = 0; i < kNonceSize; ++i) {
    ChannelBinding other = binding;
    other.nonce[i] ^= std::byte{0x01};
    CHECK_FALSE(proof_matches(secret, ProofPurpose::heartbeat, 5, 2, other, good));
  }
  for (int bit = 0; bit < 64; ++bit) {
    const ChannelBinding other{binding.nonce, binding.counter ^ (std::uint64_t{1} << bit)};
    CHECK_FALSE(proof_matches(secret, ProofPurpose::heartbeat, 5, 2, other, good));
  }
  CHECK_FALSE(proof_matches(secret, ProofPurpose::heartbeat, 5, 2, good));  // a proof that binds no channel
  CHECK_FALSE(proof_matches(secret, ProofPurpose::detach, 5, 2, binding, good));
}

TEST_CASE("an immediate with another epoch's bits fails its session, whatever tail it carries", "[hostile][core]") {
  // The copy repeats the tail of the honest immediate before it: only its epoch bits are wrong.
  for (std::uint32_t off = 1; off < 8; ++off) {
    LoopbackFabric f(wire::PublishMode::imm, 4096, 1000);
    REQUIRE(f.producer->send(payload_of(0), Clock::now()));
    f.flush();
    const auto units = static_cast<std::uint32_t>(f.producer->ledger().published / wire::kRecordAlign);
    const auto other_epoch = static_cast<std::uint32_t>(f.producer->epoch() + off);
    f.inject_immediate(wire::encode(wire::Immediate{units, false, other_epoch}));
    const auto ok = f.take_publishes();
    REQUIRE_FALSE(ok);
    CHECK(ok.error() == errc::protocol_violation);
  }
}
