// Ring -> HBM beside cudaMemcpyAsync from pinned and from pageable memory of the same sizes, and
// the time from publish to "valid on the GPU" through the owner core (bench/README.md, gpu/README.md).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include <stdexcept>
#include <string>

// The loopback fabric reports a closed session to Catch in deliver_publishes(); this program has
// no Catch, and calls take_publishes() instead.
#define FAIL(message) throw std::runtime_error(message)
#include "fabric/loopback.hpp"
#include "rdmaring/gpu/gpu_delivery.hpp"

using namespace rdmaring;
using Clock = std::chrono::steady_clock;

namespace {

constexpr std::size_t kHostBytes = 64 << 20;

void must(const char* call, cudaError_t e) {
  if (e != cudaSuccess) throw SetupError(gpu::cuda_error(call, e));
}

// GB/s of `copies` back-to-back copies of `batch` bytes from `host` (cycling through it) on one stream.
double copy_rate(const std::byte* host, std::size_t batch, gpu::DeviceBuffer& device, cudaStream_t stream) {
  const std::size_t copies = std::max<std::size_t>(64, (std::size_t{4} << 30) / batch / 4);
  gpu::CudaEvent start(true), stop(true);
  const std::size_t lanes = kHostBytes / batch;
  for (std::size_t i = 0; i < 8; ++i)  // warm-up
    must("cudaMemcpyAsync", cudaMemcpyAsync(device.data(), host, batch, cudaMemcpyHostToDevice, stream));
  must("cudaEventRecord", cudaEventRecord(start.get(), stream));
  for (std::size_t i = 0; i < copies; ++i) {
    const std::size_t at = (i % lanes) * batch;
    must("cudaMemcpyAsync", cudaMemcpyAsync(device.data() + at, host + at, batch, cudaMemcpyHostToDevice, stream));
  }
  must("cudaEventRecord", cudaEventRecord(stop.get(), stream));
  must("cudaEventSynchronize", cudaEventSynchronize(stop.get()));
  float ms = 0;
  must("cudaEventElapsedTime", cudaEventElapsedTime(&ms, start.get(), stop.get()));
  return static_cast<double>(copies * batch) / (ms * 1e6);
}

// Through the owner core and GpuDelivery: batches of `per_batch` records of `payload` bytes.
// Pipelined GB/s of ring bytes, then publish -> valid latency one batch at a time.
void pipeline(std::uint32_t payload, std::uint32_t per_batch) {
  ConsumerConfig cc;
  cc.payload_check = wire::PayloadCheck::none;
  test::LoopbackFabric f(wire::PublishMode::imm, 16 << 20, payload + 64, {}, cc);
  const std::span<std::byte> rings[] = {f.ring()};
  gpu::GpuDelivery delivery(rings, {.slots = 4, .max_records = per_batch});
  std::vector<std::byte> bytes(payload, std::byte{1});
  const auto nothing = [](cudaStream_t, const gpu::GpuBatch&) {};
  const auto send_batch = [&] {
    for (std::uint32_t i = 0; i < per_batch; ++i)
      if (!f.producer->send(bytes, Clock::now())) return false;
    f.flush();
    if (auto ok = f.take_publishes(); !ok) throw SetupError(ok.error());
    return true;
  };
  const std::size_t batches = 20000;
  std::size_t taken = 0;
  const auto t0 = Clock::now();
  for (std::size_t b = 0; b < batches;) {
    if (send_batch()) ++b;
    auto got = delivery.poll(f.owner(), per_batch, nothing);
    if (!got) throw SetupError(got.error());
    taken += got.value();
    f.return_credit();
  }
  while (taken < batches * per_batch) {
    auto got = delivery.poll(f.owner(), per_batch, nothing);
    if (!got) throw SetupError(got.error());
    taken += got.value();
    if (got.value() == 0) (void)delivery.drain(f.owner());
    f.return_credit();
  }
  (void)delivery.drain(f.owner());
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  const double ring_bytes = static_cast<double>(batches) * per_batch * static_cast<double>(wire::record_span(payload));
  std::vector<double> us;
  for (int i = 0; i < 5000; ++i) {
    for (std::uint32_t r = 0; r < per_batch; ++r)
      if (!f.producer->send(bytes, Clock::now())) throw std::runtime_error("ring full in latency run");
    f.flush();  // the publish: the immediate is in the owner's CQ now
    const auto published = Clock::now();
    if (auto ok = f.take_publishes(); !ok) throw SetupError(ok.error());
    auto got = delivery.poll(f.owner(), per_batch, nothing);
    if (!got || got.value() != per_batch) throw std::runtime_error("latency run took a partial batch");
    // Valid on the GPU: the descriptor table's copy, after the records', has completed.
    must("cudaStreamSynchronize", cudaStreamSynchronize(delivery.stream()));
    us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - published).count());
    (void)delivery.drain(f.owner());
    f.return_credit();
  }
  std::sort(us.begin(), us.end());
  std::printf("pipeline  batch %7.1f KiB (%u x %u B)  %6.2f GB/s ring bytes through owner core + loopback  publish->valid p50 %.1f us p99 %.1f us\n",
              static_cast<double>(per_batch * wire::record_span(payload)) / 1024.0, per_batch, payload, ring_bytes / s / 1e9,
              us[us.size() / 2], us[us.size() * 99 / 100]);
}

}  // namespace

int main() {
  cudaDeviceProp prop{};
  must("cudaGetDeviceProperties", cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, PCI %04x:%02x:%02x\n", prop.name, prop.pciDomainID, prop.pciBusID, prop.pciDeviceID);
  gpu::CudaStream stream;
  gpu::DeviceBuffer device(kHostBytes);
  std::vector<std::byte> ring(kHostBytes + 4096);
  // A ring as RingOwner allocates it: page-aligned, then registered with CUDA as GpuDelivery does.
  const auto aligned = std::span(ring).subspan((4096 - reinterpret_cast<std::uintptr_t>(ring.data()) % 4096) % 4096, kHostBytes);
  gpu::HostRegistration registered(aligned);
  gpu::PinnedBuffer pinned(kHostBytes);
  std::vector<std::byte> pageable(kHostBytes, std::byte{2});
  std::fill(aligned.begin(), aligned.end(), std::byte{3});
  std::fill(pinned.data(), pinned.data() + kHostBytes, std::byte{4});
  std::printf("%10s %14s %14s %14s %8s\n", "batch", "ring GB/s", "pinned GB/s", "pageable GB/s", "ring/pin");
  for (std::size_t batch : {std::size_t{4} << 10, std::size_t{16} << 10, std::size_t{64} << 10, std::size_t{256} << 10,
                            std::size_t{1} << 20, std::size_t{4} << 20}) {
    const double r = copy_rate(aligned.data(), batch, device, stream.get());
    const double p = copy_rate(pinned.data(), batch, device, stream.get());
    const double g = copy_rate(pageable.data(), batch, device, stream.get());
    std::printf("%7zu KiB %14.2f %14.2f %14.2f %8.3f\n", batch >> 10, r, p, g, r / p);
  }
  pipeline(16368, 4);   // 4 records of 16 KiB span: 64 KiB batches
  pipeline(4080, 16);   // 16 x 4 KiB: 64 KiB batches
  pipeline(65520, 4);   // 256 KiB batches
  return 0;
}
