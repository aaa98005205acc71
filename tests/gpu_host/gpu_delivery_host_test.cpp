// The GPU delivery's host side (gpu/) over the stand-in CUDA runtime (tests/cuda_standin/), so
// that CI, which has no GPU, runs its registrations, releases and give-backs: the real OwnerCore
// and ProducerCore over the loopback fabric, under RingOwner's rules for held batches. The
// stand-in checks every host-to-device copy against the ranges registered with it; the records
// are checked where the "device" slot holds them, in the launch callback. On a GPU the same
// cases run with a checking kernel (gpu/tests/).
#include <catch2/catch.hpp>

#include <cstring>
#include <vector>

#include "cuda_standin/standin.hpp"
#include "fabric/held_owner.hpp"
#include "fabric/loopback.hpp"
#include "rdmaring/gpu/gpu_delivery.hpp"
#include "send_records.hpp"

using namespace rdmaring;
namespace standin = rdmaring::test::cuda_standin;

namespace {

constexpr std::uint32_t kMaxPayload = 3000;  // as the GPU tests' (gpu/tests/check_kernels.hpp)
using gpu::test::record_byte;
using gpu::test::record_length;

std::uint64_t send_some(test::LoopbackFabric& f, std::uint64_t sequence, std::uint64_t until) {
  return gpu::test::send_some(f, sequence, until, kMaxPayload);
}

// What a checking kernel does on the GPU: each record's descriptor and bytes, where the slot
// holds them, in sequence order across batches.
struct Checker {
  std::uint64_t next = 0;
  std::uint64_t wrong = 0;
  void operator()(cudaStream_t, const gpu::GpuBatch& b) {
    for (std::uint32_t i = 0; i < b.count; ++i) {
      const gpu::GpuRecord& r = b.records[i];
      bool ok = r.sequence == next && r.length == record_length(next, kMaxPayload);
      for (std::uint32_t k = 0; ok && k < r.length; ++k) ok = b.bytes[r.offset + k] == std::byte{record_byte(next, k)};
      if (!ok) ++wrong;
      ++next;
    }
  }
};

}  // namespace

TEST_CASE("GPU delivery, host side: 100,000 mixed records, copied only from registered rings, exact and in order",
          "[gpu]") {
  test::LoopbackFabric f(wire::PublishMode::imm, 1 << 20, 4096);
  // A slot smaller than a turn's quantum (64 KiB): a batch of a full turn is given back and taken
  // again shorter, one of the ring's last records fits.
  gpu::GpuDelivery delivery({}, {.slots = 4, .max_records = 512, .slot_bytes = 48 << 10});
  test::HeldOwner owner{f.owner(), f.ring(), {}};
  const std::uint64_t copies_before = standin::unregistered_copies();
  constexpr std::uint64_t kRecords = 100'000;
  Checker check;
  std::uint64_t sent = 0, taken = 0;
  while (taken < kRecords) {
    sent = send_some(f, sent, kRecords);
    auto polled = delivery.poll(owner, 512, check);
    REQUIRE(polled.has_value());
    taken += polled.value();
    f.return_credit();
  }
  REQUIRE(delivery.drain(owner).has_value());
  f.return_credit();
  CHECK(check.next == kRecords);
  CHECK(check.wrong == 0);
  CHECK(standin::unregistered_copies() == copies_before);
  CHECK(owner.held.empty());
  CHECK(delivery.registered_rings() == 1);
  CHECK(f.owner().core().counters().handler_aborts > 0);
  const ConsumerLedger l = f.consumer().ledger();
  CHECK(l.released == l.delivered);
  CHECK(f.producer->ledger().released == l.credited);  // credit is lazy: what was written back reached it
}

TEST_CASE("GPU delivery, host side: nothing released while a copy is held, and a freed ring is unregistered", "[gpu]") {
  test::LoopbackFabric f(wire::PublishMode::imm, 1 << 20, 4096);
  const std::size_t ranges_before = standin::registered_ranges();
  {
    gpu::GpuDelivery delivery({}, {.slots = 2, .max_records = 512, .slot_bytes = 1 << 20});
    test::HeldOwner owner{f.owner(), f.ring(), {}};
    CHECK(delivery.registered_rings() == 0);
    REQUIRE(send_some(f, 0, 100) == 100);
    standin::hold(true);
    REQUIRE(delivery.poll(owner, 512, [](cudaStream_t, const gpu::GpuBatch&) {}).value() == 100);
    CHECK(delivery.registered_rings() == 1);
    CHECK(standin::registered_ranges() == ranges_before + 1);
    // The session ends while its batch is in copy: the batch's pin and the delivery's share keep
    // the ring registered, and nothing is released until the copy has run.
    owner.session.reset();
    for (int i = 0; i < 10; ++i) {
      REQUIRE(delivery.poll(owner, 512, [](cudaStream_t, const gpu::GpuBatch&) {}).has_value());
      f.return_credit();
      REQUIRE(f.consumer().ledger().released == 0);
      REQUIRE(delivery.in_copy() == 1);
      REQUIRE(delivery.registered_rings() == 1);
    }
    standin::hold(false);
    standin::run_held();
    // The copy has run: this poll releases the batch, and then, the delivery's share being the
    // last, lets go of the ring, unregistered first.
    REQUIRE(delivery.poll(owner, 512, [](cudaStream_t, const gpu::GpuBatch&) {}).has_value());
    CHECK(delivery.in_copy() == 0);
    CHECK(owner.held.empty());
    CHECK(f.consumer().ledger().released == f.consumer().ledger().delivered);
    CHECK(delivery.registered_rings() == 0);
    CHECK(standin::registered_ranges() == ranges_before);
  }
  CHECK(standin::registered_ranges() == ranges_before);
}

TEST_CASE("GPU delivery, host side: a record larger than a slot is refused as record_too_large, and stays first",
          "[gpu]") {
  test::LoopbackFabric f(wire::PublishMode::imm, 1 << 20, 4096);
  gpu::GpuDelivery delivery({}, {.slots = 2, .max_records = 512, .slot_bytes = 1024});
  test::HeldOwner owner{f.owner(), f.ring(), {}};
  std::uint64_t big = 0;
  while (wire::record_span(record_length(big, kMaxPayload)) <= 1024) ++big;
  REQUIRE(send_some(f, 0, big + 1) == big + 1);
  Checker check;
  for (int i = 0; i < 100 && check.next < big; ++i) {
    REQUIRE(delivery.poll(owner, 512, check).has_value());
    REQUIRE(delivery.drain(owner).has_value());
  }
  REQUIRE(check.next == big);
  CHECK(check.wrong == 0);
  for (int i = 0; i < 2; ++i) {
    const auto refused = delivery.poll(owner, 512, check);
    REQUIRE_FALSE(refused.has_value());
    CHECK(refused.error() == errc::record_too_large);
    CHECK_THAT(refused.error().message(), Catch::Contains("record " + std::to_string(big)) && Catch::Contains("slot_bytes"));
  }
  CHECK(owner.held.empty());
  const ConsumerLedger l = f.consumer().ledger();
  CHECK(l.delivered == l.released);
  CHECK(l.published > l.released);
}

TEST_CASE("GPU delivery, host side: no slot bytes and no ring to size them by is a configuration error", "[gpu]") {
  try {
    gpu::GpuDelivery delivery({}, {.slots = 1, .max_records = 1});
    FAIL("a delivery with no slot bytes was made");
  } catch (const SetupError& e) {
    CHECK(e.error() == errc::bad_config);
    CHECK_THAT(e.what(), Catch::Contains("slot_bytes"));
  }
}
