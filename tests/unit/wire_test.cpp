#include <catch2/catch.hpp>
#include <vector>

#include "rdmaring/checksum.hpp"
#include "rdmaring/ring_geometry.hpp"
#include "rdmaring/ring_owner.hpp"
#include "rdmaring/wire.hpp"

using namespace rdmaring;

TEST_CASE("CRC-32C matches the Castagnoli check value", "[wire]") {
  const char* s = "123456789";
  CHECK(crc32c(std::as_bytes(std::span{s, 9})) == 0xE3069283u);
}

TEST_CASE("record spans are 16-byte multiples holding header and payload", "[wire]") {
  CHECK(wire::record_span(0) == 16);
  CHECK(wire::record_span(1) == 32);
  CHECK(wire::record_span(16) == 32);
  CHECK(wire::record_span(64) == 80);
  CHECK(wire::record_span(65536) == 65536 + 16);
}

TEST_CASE("record header round-trips and its check sees any flipped bit, of the header or what it covers", "[wire]") {
  std::array<std::byte, wire::kRecordHeaderSize> b{};
  std::vector<std::byte> payload(37);
  for (std::size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<std::byte>(i * 13);
  for (const auto kind : {wire::RecordKind::data, wire::RecordKind::padding}) {
    const wire::RecordHeader h{1234, kind, 0x1122334455667788ull};
    wire::encode(h, payload, b);
    auto d = wire::decode_record_header(b);
    REQUIRE(d);
    CHECK(d->payload_len == 1234);
    CHECK(d->kind == kind);
    CHECK(d->sequence == 0x1122334455667788ull);
    CHECK(wire::record_check_matches(b, payload));
    CHECK_FALSE(wire::record_check_matches(b, {}));
    for (std::size_t bit = 0; bit < b.size() * 8; ++bit) {
      auto c = b;
      c[bit / 8] ^= std::byte{static_cast<unsigned char>(1u << (bit % 8))};
      CHECK_FALSE((wire::decode_record_header(c) && wire::record_check_matches(c, payload)));
    }
    for (std::size_t bit = 0; bit < payload.size() * 8; ++bit) {
      auto p = payload;
      p[bit / 8] ^= std::byte{static_cast<unsigned char>(1u << (bit % 8))};
      CHECK_FALSE(wire::record_check_matches(b, p));
    }
  }
}

TEST_CASE("immediate carries tail units, credit request and epoch bits", "[wire]") {
  const auto raw = wire::encode(wire::Immediate{0x0abcdef, true, 13});
  const auto imm = wire::decode_immediate(raw);
  CHECK(imm.tail_units == 0x0abcdef);
  CHECK(imm.credit_request);
  CHECK(imm.epoch_low == (13 & 7));
}

TEST_CASE("a 28-bit tail widens to the position at or after the last one seen", "[wire]") {
  const std::uint64_t ring = 1 << 20;
  constexpr std::uint64_t u = wire::kRecordAlign;
  CHECK(wire::widen_tail(2, 0, 0, ring) == 2 * u);
  // Across the 2^28-unit wrap of the immediate field: the period is 2^28 units, 2^32 B.
  const std::uint64_t known = (std::uint64_t{1} << 32) - 2 * u;
  CHECK(wire::widen_tail(1, known, known, ring) == (std::uint64_t{1} << 32) + u);
  // More than a ring ahead of the released position: refused.
  CHECK_FALSE(wire::widen_tail(static_cast<std::uint32_t>((ring + u) / u), 0, 0, ring));
}

TEST_CASE("tail and credit records round-trip and detect tearing", "[wire]") {
  std::array<std::byte, wire::kTailRecordSize> t{};
  wire::encode(wire::TailRecord{7, 4096, 99, 3}, t);
  auto d = wire::decode_tail_record(t);
  REQUIRE(d);
  CHECK(d->epoch == 7);
  CHECK(d->tail == 4096);
  CHECK(d->next_sequence == 99);
  CHECK(d->credit_requests == 3);
  // A torn read: the first half new, the second half old.
  std::array<std::byte, wire::kTailRecordSize> older{};
  wire::encode(wire::TailRecord{7, 2048, 98, 3}, older);
  std::copy(older.begin() + 16, older.end(), t.begin() + 16);
  CHECK_FALSE(wire::decode_tail_record(t));

  std::array<std::byte, wire::kCreditRecordSize> c{};
  wire::encode(wire::CreditRecord{2, 8192, 17, 1}, c);
  auto dc = wire::decode_credit_record(c);
  REQUIRE(dc);
  CHECK(dc->released == 8192);
  CHECK(dc->delivered == 17);
}

TEST_CASE("connect and accept private data round-trip and reject foreign bytes", "[wire]") {
  wire::ConnectData c{0x1122334455667788, 9, {}, 0x7f0000001000, 0x1234};
  c.proof[0] = std::byte{0xAB};
  c.proof[15] = std::byte{0xCD};
  auto cd = wire::encode(c);
  static_assert(wire::kConnectDataSize <= 56, "RC connect private data holds 56 bytes");
  auto d = wire::decode_connect_data(cd);
  REQUIRE(d);
  CHECK(d->session == 0x1122334455667788);
  CHECK(d->epoch == 9);
  CHECK(d->proof == c.proof);
  CHECK(d->credit_addr == 0x7f0000001000);
  CHECK(d->credit_rkey == 0x1234);
  CHECK_FALSE(wire::decode_connect_data(std::span{cd}.first(51)));
  std::vector<std::byte> padded(cd.begin(), cd.end());
  padded.resize(56);  // rdma_cm pads private data with zeros
  CHECK(wire::decode_connect_data(padded));
  cd[6] = std::byte{1};  // reserved bits set
  CHECK_FALSE(wire::decode_connect_data(cd));
  cd[6] = std::byte{0};
  cd[4] = std::byte{1};  // version 1
  CHECK_FALSE(wire::decode_connect_data(cd));

  auto ab = wire::encode(wire::AcceptData{7});
  auto da = wire::decode_accept_data(ab);
  REQUIRE(da);
  CHECK(da->epoch == 7);
  ab[0] = std::byte{0};  // not our magic
  CHECK_FALSE(wire::decode_accept_data(ab));
}

TEST_CASE("ring geometry refuses sizes that are not powers of two or too small", "[ring]") {
  CHECK(RingGeometry::make(1 << 16, 1024));
  auto r = RingGeometry::make(3 * 4096, 1024);
  REQUIRE_FALSE(r);
  CHECK(r.error() == errc::bad_config);
  CHECK_THAT(r.error().message(), Catch::Contains("power of two"));
  CHECK_FALSE(RingGeometry::make(2048, 16));
  auto big = RingGeometry::make(4096, 4096);
  REQUIRE_FALSE(big);
  CHECK_THAT(big.error().message(), Catch::Contains("more than the ring"));
  CHECK(RingGeometry::make(4096, 4096 - 64));
}

TEST_CASE("ring owner options: relaxed ordering is refused with tail mode, allowed with imm", "[config]") {
  RingOwnerOptions o;
  o.address = "169.254.0.1";
  o.security.insecure_plaintext = true;  // validate() reads no TLS material
  o.mode = wire::PublishMode::tail;
  o.relaxed_ordering = true;
  auto r = o.validate();
  REQUIRE_FALSE(r);
  CHECK(r.error() == errc::relaxed_ordering_refused);
  CHECK_THAT(r.error().message(), Catch::Contains("tail record's write may land before the payload"));
  o.mode = wire::PublishMode::imm;
  CHECK(o.validate());
  o.core.payload_check = wire::PayloadCheck::none;
  r = o.validate();
  REQUIRE_FALSE(r);
  CHECK(r.error() == errc::relaxed_ordering_refused);
  CHECK_THAT(r.error().message(), Catch::Contains("payload CRC is the only check"));
  o.relaxed_ordering = false;
  CHECK(o.validate());
  o.core.payload_check = wire::PayloadCheck::crc32c;
  o.ring_bytes = 5000;
  CHECK(o.validate().error() == errc::bad_config);
  o.ring_bytes = 1 << 20;
  o.max_sessions = 0;
  CHECK(o.validate().error() == errc::bad_config);
  o.max_sessions = 1;
  o.address.clear();
  CHECK_THAT(o.validate().error().message(), Catch::Contains("no address"));
}
