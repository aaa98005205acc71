// The GPU delivery over the loopback fabric: the real OwnerCore and ProducerCore, the ring in
// host memory registered with CUDA, records copied into HBM and checked there by a kernel.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>

#include <infiniband/verbs.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "fabric/held_owner.hpp"
#include "fabric/loopback.hpp"
#include "check_kernels.hpp"
#include "fill.hpp"
#include "send_records.hpp"
#include "rdmaring/gpu/dmabuf_route.hpp"
#include "rdmaring/gpu/gpu_delivery.hpp"

using namespace rdmaring;
using rdmaring::gpu::test::record_byte;
using rdmaring::gpu::test::record_length;
using rdmaring::gpu::test::kMaxPayload;
using rdmaring::gpu::test::Tally;
using rdmaring::gpu::test::launch_check_records;
using rdmaring::gpu::test::launch_gate;

namespace {

std::uint64_t send_some(test::LoopbackFabric& f, std::uint64_t sequence, std::uint64_t until) {
  return gpu::test::send_some(f, sequence, until, kMaxPayload);
}

// Polls `polls` times, handing each batch to no consumer.
template <class Owner>
void poll_times(gpu::GpuDelivery& delivery, Owner& owner, std::size_t polls) {
  for (std::size_t i = 0; i < polls; ++i)
    REQUIRE(delivery.poll(owner, 512, [](cudaStream_t, const gpu::GpuBatch&) {}).has_value());
}

}  // namespace

TEST_CASE("1,000,000 records of mixed sizes reach HBM exact and in order, checked by a kernel, in RingOwner's order") {
  test::LoopbackFabric f(wire::PublishMode::imm, 1 << 20, 4096);
  // No ring given: it is registered at its first record, through ring_of(). A slot is smaller
  // than a turn's quantum (64 KiB), so a batch of a full turn is given back whole and taken
  // again, shorter.
  gpu::GpuDelivery delivery({}, {.slots = 4, .max_records = 512, .slot_bytes = 48 << 10});
  test::HeldOwner owner{f.owner(), f.ring(), {}};
  Tally* tally = nullptr;
  REQUIRE(cudaMalloc(reinterpret_cast<void**>(&tally), sizeof(Tally)) == cudaSuccess);
  REQUIRE(cudaMemset(tally, 0, sizeof(Tally)) == cudaSuccess);
  constexpr std::uint64_t kRecords = 1'000'000;
  std::uint64_t sent = 0;
  std::uint64_t taken = 0;
  std::uint64_t expected_bytes = 0;
  for (std::uint64_t s = 0; s < kRecords; ++s) expected_bytes += record_length(s, kMaxPayload);
  while (taken < kRecords) {
    sent = send_some(f, sent, kRecords);
    auto polled = delivery.poll(owner, 512, [&](cudaStream_t stream, const gpu::GpuBatch& b) {
      launch_check_records(stream, b, taken, tally);
    });
    REQUIRE(polled.has_value());
    taken += polled.value();
    f.return_credit();
  }
  REQUIRE(delivery.drain(owner).has_value());
  CHECK(owner.held.empty());
  CHECK(delivery.registered_rings() == 1);
  CHECK(f.owner().core().counters().handler_aborts > 0);
  f.return_credit();
  Tally seen{};
  REQUIRE(cudaMemcpy(&seen, tally, sizeof(Tally), cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(seen.wrong == 0);
  CHECK(seen.records == kRecords);
  CHECK(seen.bytes == expected_bytes);
  const ConsumerLedger l = f.consumer().ledger();
  CHECK(l.released == l.delivered);
  CHECK(f.producer->ledger().released == l.credited);  // credit is lazy: what was written back reached it
  cudaFree(tally);
}

TEST_CASE("no record is released, and no credit written, before its copy's event completed") {
  test::LoopbackFabric f(wire::PublishMode::imm, 1 << 20, 4096);
  const std::span<std::byte> rings[] = {f.ring()};
  gpu::GpuDelivery delivery(rings, {.slots = 2, .max_records = 512});
  int* open = nullptr;
  REQUIRE(cudaHostAlloc(reinterpret_cast<void**>(&open), sizeof(int), cudaHostAllocMapped) == cudaSuccess);
  *open = 0;
  int* open_on_gpu = nullptr;
  REQUIRE(cudaHostGetDevicePointer(reinterpret_cast<void**>(&open_on_gpu), open, 0) == cudaSuccess);
  launch_gate(delivery.stream(), open_on_gpu);

  const std::uint64_t sent = send_some(f, 0, 100);
  REQUIRE(sent == 100);
  auto polled = delivery.poll(f.owner(), 512, [](cudaStream_t, const gpu::GpuBatch&) {});
  REQUIRE(polled.value() == 100);
  const std::uint64_t delivered = f.consumer().ledger().delivered;
  REQUIRE(delivered > 0);
  const auto credit_before = f.credit_mr();
  for (int i = 0; i < 200; ++i) {  // 200 ms with the copy held back
    REQUIRE(delivery.poll(f.owner(), 512, [](cudaStream_t, const gpu::GpuBatch&) {}).has_value());
    f.return_credit();
    REQUIRE(f.consumer().ledger().released == 0);
    REQUIRE(f.producer->ledger().released == 0);
    REQUIRE(delivery.in_copy() == 1);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  CHECK(f.credit_mr() == credit_before);
  *open = 1;
  REQUIRE(delivery.drain(f.owner()).has_value());
  f.producer->on_credit(f.credit_mr());
  const ConsumerLedger l = f.consumer().ledger();
  CHECK(l.released == delivered);
  CHECK(delivery.in_copy() == 0);
  cudaFreeHost(open);
}

TEST_CASE("a ring is registered with CUDA at its first record, and let go once the owner side has freed it") {
  test::LoopbackFabric f(wire::PublishMode::imm, 1 << 20, 4096);
  gpu::GpuDelivery delivery({}, {.slots = 2, .max_records = 512, .slot_bytes = 1 << 20});
  test::HeldOwner owner{f.owner(), f.ring(), {}};
  CHECK(delivery.registered_rings() == 0);
  REQUIRE(send_some(f, 0, 100) == 100);
  REQUIRE(delivery.poll(owner, 512, [](cudaStream_t, const gpu::GpuBatch&) {}).value() == 100);
  CHECK(delivery.registered_rings() == 1);
  // The session ends while its batch is in copy: the batch's pin and the delivery's share keep
  // the ring, and the registration stays until the batch is released.
  owner.session.reset();
  poll_times(delivery, owner, 4);
  REQUIRE(delivery.drain(owner).has_value());
  CHECK(owner.held.empty());
  poll_times(delivery, owner, 2);
  CHECK(delivery.registered_rings() == 0);
}

TEST_CASE("a GPU-resident ring is refused on a host without an RDMA device, naming what is missing") {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (list) ibv_free_device_list(list);
  if (n > 0) {
    WARN("RDMARING-SKIP: this host has " << n << " RDMA device(s)");
    return;
  }
  const gpu::DmabufRoute route = gpu::probe_dmabuf_route(0);
  INFO("CUDA: " << route.cuda_note);
  CHECK_FALSE(route.possible());
  CHECK(route.missing().find("no RDMA device") != std::string::npos);
  try {
    gpu::require_gpu_resident_ring(route);
    FAIL("require_gpu_resident_ring accepted a host without an RDMA device");
  } catch (const SetupError& e) {
    CHECK(e.error() == errc::no_device);
    CHECK(std::string(e.what()).find("no host fallback") != std::string::npos);
    WARN("refusal: " << e.what());
  }
}
