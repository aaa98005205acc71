#include "rdmaring/gpu/gpu_delivery.hpp"

#include <string>

#include "rdmaring/wire.hpp"

namespace rdmaring::gpu {

GpuDelivery::GpuDelivery(std::span<const std::span<std::byte>> rings, GpuDeliveryOptions options) : options_(options) {
  if (options.slots == 0 || options.max_records == 0)
    throw SetupError(make_error(errc::bad_config, "GPU delivery: slots and max_records must be at least 1"));
  std::size_t total = 0;
  registrations_.reserve(rings.size());
  for (const auto& ring : rings) {
    registrations_.emplace_back(ring);
    total += ring.size();
  }
  for (std::size_t i = 0; i < options.slots; ++i) slots_.emplace_back(total, options.max_records);
}

GpuDelivery::~GpuDelivery() {
  // The copy engine may still read a ring and the consumer a slot: both outlive their work.
  cudaStreamSynchronize(stream_.get());
}

Result<bool> GpuDelivery::completed(const CudaEvent& e) {
  const cudaError_t q = cudaEventQuery(e.get());
  if (q == cudaErrorNotReady) return false;
  BOOST_OUTCOME_TRYV(cuda_result("cudaEventQuery", q));
  return true;
}

GpuDelivery::Slot* GpuDelivery::free_slot() {
  Slot& s = slots_[next_slot_];
  if (s.used) {
    auto done = completed(s.consumed);
    if (!done || !done.value()) return nullptr;
  }
  for (const InCopy& c : in_copy_)
    if (c.slot == &s) return nullptr;
  next_slot_ = (next_slot_ + 1) % slots_.size();
  return &s;
}

const HostRegistration* GpuDelivery::registration_of(const std::byte* p, std::size_t n) const noexcept {
  for (const HostRegistration& r : registrations_)
    if (r.holds(p, n)) return &r;
  return nullptr;
}

Result<GpuBatch> GpuDelivery::copy(Slot& slot, std::span<const TakenRecord> taken) {
  // Records that lie back to back in a ring are copied as one run: header and padding bytes go
  // along (the GPU reads payloads through the descriptors), a copy per record would cost a call each.
  auto* table = reinterpret_cast<GpuRecord*>(slot.table.data());
  std::uint64_t filled = 0;
  const std::byte* run = nullptr;
  std::uint64_t run_bytes = 0;
  std::uint64_t run_at = 0;
  const auto flush_run = [&]() -> Result<void> {
    if (run_bytes == 0) return success();
    if (!registration_of(run, run_bytes))
      // A copy from memory CUDA has not registered would be staged through a bounce buffer.
      return make_error(errc::invalid_argument, "GPU delivery: a record lies outside every ring registered with CUDA");
    BOOST_OUTCOME_TRYV(cuda_result("cudaMemcpyAsync(ring -> device slot)",
                                   cudaMemcpyAsync(slot.bytes.data() + run_at, run, run_bytes, cudaMemcpyHostToDevice, stream())));
    run_bytes = 0;
    return success();
  };
  for (std::size_t i = 0; i < taken.size(); ++i) {
    const Delivery& d = taken[i].delivery;
    const std::byte* header = d.payload.data() - wire::kRecordHeaderSize;
    const std::uint64_t span = wire::record_span(d.payload.size());
    if (run_bytes == 0 || header != run + run_bytes) {
      BOOST_OUTCOME_TRYV(flush_run());
      run = header;
      run_at = filled;
    }
    table[i] = GpuRecord{filled + wire::kRecordHeaderSize, d.sequence, d.session, static_cast<std::uint32_t>(d.payload.size()), 0};
    run_bytes += span;
    filled += span;
  }
  BOOST_OUTCOME_TRYV(flush_run());
  BOOST_OUTCOME_TRYV(cuda_result("cudaEventRecord(copied)", cudaEventRecord(slot.copied.get(), stream())));
  // In stream order after the records: what tells the GPU they are valid.
  BOOST_OUTCOME_TRYV(cuda_result("cudaMemcpyAsync(descriptors -> device)",
                                 cudaMemcpyAsync(slot.records.data(), table, taken.size() * sizeof(GpuRecord),
                                                 cudaMemcpyHostToDevice, stream())));
  slot.used = true;
  return GpuBatch{slot.bytes.data(), reinterpret_cast<const GpuRecord*>(slot.records.data()),
                  static_cast<std::uint32_t>(taken.size())};
}

Result<void> GpuDelivery::record_consumed(Slot& slot) {
  return cuda_result("cudaEventRecord(consumed)", cudaEventRecord(slot.consumed.get(), stream()));
}

}  // namespace rdmaring::gpu
