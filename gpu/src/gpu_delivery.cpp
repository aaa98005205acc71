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
    registrations_.push_back(Registration{HostRegistration(ring), nullptr});
    total += ring.size();
  }
  if (options_.slot_bytes == 0) options_.slot_bytes = total;
  if (options_.slot_bytes == 0)
    throw SetupError(make_error(errc::bad_config, "GPU delivery: slot_bytes 0 and no ring given to size the slots by"));
  for (std::size_t i = 0; i < options.slots; ++i) slots_.emplace_back(options_.slot_bytes, options.max_records);
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

std::size_t GpuDelivery::fitting(std::span<const TakenRecord> taken) const noexcept {
  std::uint64_t bytes = 0;
  for (std::size_t i = 0; i < taken.size(); ++i) {
    bytes += wire::record_span(taken[i].delivery.payload.size());
    if (bytes > options_.slot_bytes) return i;
  }
  return taken.size();
}

Error GpuDelivery::too_large(const TakenRecord& t) const {
  return make_error(errc::record_too_large,
                    "GPU delivery: record " + std::to_string(t.delivery.sequence) + " of session " +
                        std::to_string(t.delivery.session) + " spans " +
                        std::to_string(wire::record_span(t.delivery.payload.size())) + " B, more than a slot's " +
                        std::to_string(options_.slot_bytes) + " B (GpuDeliveryOptions::slot_bytes)");
}

Result<void> GpuDelivery::add_registration(RingShare share) {
  try {
    registrations_.push_back(Registration{HostRegistration(share.bytes), std::move(share.keep)});
  } catch (const SetupError& e) {
    return e.error();
  }
  last_registration_ = registrations_.size() - 1;
  return success();
}

// One shared ring per poll, so that the cost stays the same however many are registered: once
// the delivery holds the last share, the owner side has freed the ring (its session ended, no
// batch holds it), and the registration goes before the memory does. No copy can be reading it:
// a batch in copy is held by the owner side, which then holds a share too.
void GpuDelivery::let_go_of_one_freed_ring() noexcept {
  if (registrations_.empty()) return;
  next_to_check_ = (next_to_check_ + 1) % registrations_.size();
  Registration& r = registrations_[next_to_check_];
  if (!r.share || r.share.use_count() != 1) return;
  std::swap(r, registrations_.back());
  registrations_.pop_back();
  last_registration_ = 0;
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

const HostRegistration* GpuDelivery::registration_of(const std::byte* p, std::size_t n) noexcept {
  // A batch's records mostly lie in the ring of the record before.
  if (last_registration_ < registrations_.size() && registrations_[last_registration_].cuda.holds(p, n))
    return &registrations_[last_registration_].cuda;
  for (std::size_t i = 0; i < registrations_.size(); ++i)
    if (registrations_[i].cuda.holds(p, n)) {
      last_registration_ = i;
      return &registrations_[i].cuda;
    }
  return nullptr;
}

Result<GpuBatch> GpuDelivery::copy(Slot& slot, std::span<const TakenRecord> taken) {
  // Records that lie back to back in a ring are copied as one run: header and padding bytes go
  // along (the GPU reads payloads through the descriptors), a copy per record would cost a call each.
  auto* table = reinterpret_cast<GpuRecord*>(slot.table.data());
  std::uint64_t filled = 0;
  const std::byte* run = nullptr;
  const HostRegistration* run_ring = nullptr;
  std::uint64_t run_bytes = 0;
  std::uint64_t run_at = 0;
  const auto flush_run = [&]() -> Result<void> {
    if (run_bytes == 0) return success();
    BOOST_OUTCOME_TRYV(cuda_result("cudaMemcpyAsync(ring -> device slot)",
                                   cudaMemcpyAsync(slot.bytes.data() + run_at, run, run_bytes, cudaMemcpyHostToDevice, stream())));
    run_bytes = 0;
    return success();
  };
  for (std::size_t i = 0; i < taken.size(); ++i) {
    const Delivery& d = taken[i].delivery;
    const std::byte* header = header_of(taken[i]);
    const std::uint64_t span = wire::record_span(d.payload.size());
    // Two rings may lie back to back in memory: a run stays within one registration.
    if (run_bytes == 0 || header != run + run_bytes || !run_ring->holds(header, span)) {
      BOOST_OUTCOME_TRYV(flush_run());
      run_ring = registration_of(header, span);
      if (!run_ring)
        // A copy from memory CUDA has not registered would be staged through a bounce buffer.
        return make_error(errc::invalid_argument, "GPU delivery: a record lies outside every ring registered with CUDA");
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
