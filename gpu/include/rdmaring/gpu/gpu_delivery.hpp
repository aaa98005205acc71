// Records into GPU memory (protocol-spec/gpu.md). A poll's records are copied by the GPU's copy
// engine straight out of the ring (registered with CUDA by cudaHostRegister, beside its verbs
// registration) into a device slot; they stay "in copy to GPU" until the copy's CUDA event has
// completed, and only then are they released to the producer. The GPU learns which records are
// valid only from the descriptor table, copied in stream order after the records, and from the
// consumer's kernel, launched after that: a CPU-initiated CUDA operation, never the NIC's
// completion. Several batches may be in copy at once (one per slot); they are released in the
// order they were taken. The rings are registered with CUDA as records of them first arrive,
// when the owner side says which ring a record lies in (RingOwner::ring_of), or given at
// construction.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "rdmaring/gpu/cuda_objects.hpp"
#include "rdmaring/gpu/gpu_batch.hpp"
#include "rdmaring/held_batches.hpp"
#include "rdmaring/owner_core.hpp"
#include "rdmaring/wire.hpp"

namespace rdmaring::gpu {

// An owner side's finish(): LoopbackOwner's returns nothing, RingOwner's a Result (it refuses a
// batch out of the order of protocol-spec/owner.md §5.1, which this delivery keeps).
template <class Owner>
Result<void> finish_on(Owner& owner, std::span<const TakenRecord> taken, std::size_t handled) {
  if constexpr (std::is_void_v<decltype(owner.finish(taken, handled))>) {
    owner.finish(taken, handled);
    return success();
  } else {
    return owner.finish(taken, handled);
  }
}

struct GpuDeliveryOptions {
  std::size_t slots = 4;           // batches in copy or being consumed at once
  std::size_t max_records = 4096;  // per batch
  // Device bytes per slot: a batch's record spans (header and padding included) must fit. 0:
  // the total size of the rings given at construction, which any batch fits.
  std::size_t slot_bytes = 0;
};

class GpuDelivery {
 public:
  // `rings`: rings a batch may come from, registered with CUDA here; may be empty for an owner
  // side with ring_of(), whose rings are registered as their records arrive, and let go once
  // the owner side has freed its share. Throws SetupError: bad_config for no slot, no record
  // per batch, or no slot bytes; a CUDA failure of a registration or allocation.
  explicit GpuDelivery(std::span<const std::span<std::byte>> rings, GpuDeliveryOptions options = {});
  GpuDelivery(const GpuDelivery&) = delete;
  GpuDelivery& operator=(const GpuDelivery&) = delete;
  ~GpuDelivery();

  // The stream the copies run on: a consumer launches on it so that it runs after them.
  cudaStream_t stream() const noexcept { return stream_.get(); }
  std::size_t in_copy() const noexcept { return in_copy_.size(); }
  // Rings registered with CUDA now: those given at construction, and those the owner side
  // shared and still holds.
  std::size_t registered_rings() const noexcept { return registrations_.size(); }

  // One step, over an owner side with take(max) -> vector<TakenRecord> (or a Result of one),
  // finish(span, handled) and optionally ring_of(record) -> Result<RingShare> (LoopbackOwner;
  // RingOwner's held batches): first releases the batches whose copy completed, oldest first;
  // then, if a slot is free, takes up to `max` records whose spans fit a slot, registers any
  // ring not yet registered, copies them and calls launch(stream, GpuBatch) to enqueue their
  // consumer. Returns how many records it took. Errors: the owner side's; CUDA's; for a record
  // that fits no slot, record_too_large (it is given back, and stays first).
  template <class Owner, class Launch>
  Result<std::size_t> poll(Owner& owner, std::size_t max, Launch&& launch) {
    BOOST_OUTCOME_TRYV(release_copied(owner));
    let_go_of_one_freed_ring();
    Slot* slot = free_slot();
    if (!slot) return std::size_t{0};
    BOOST_OUTCOME_TRY(taken, take_fitting(owner, std::min(max, options_.max_records)));
    if (taken.empty()) return std::size_t{0};
    Result<void> enqueued = register_rings(owner, taken);
    if (enqueued) {
      auto copied = copy(*slot, taken);
      if (copied) {
        launch(stream(), copied.value());
        enqueued = record_consumed(*slot);
      } else {
        enqueued = std::move(copied).error();
      }
    }
    if (!enqueued) {
      // Nothing was made valid on the GPU: the records go back, unreleased (the newest batch,
      // given back whole).
      (void)finish_on(owner, taken, 0);
      return std::move(enqueued).error();
    }
    const std::size_t n = taken.size();
    in_copy_.push_back(InCopy{slot, std::move(taken)});
    return n;
  }

  // Releases the batches whose copy completed, oldest first (take order).
  template <class Owner>
  Result<void> release_copied(Owner& owner) {
    while (!in_copy_.empty()) {
      BOOST_OUTCOME_TRY(done, completed(in_copy_.front().slot->copied));
      if (!done) break;
      BOOST_OUTCOME_TRYV(finish_on(owner, in_copy_.front().taken, in_copy_.front().taken.size()));
      in_copy_.pop_front();
    }
    return success();
  }

  // Waits for every copy and consumer enqueued, then releases what is in copy.
  template <class Owner>
  Result<void> drain(Owner& owner) {
    BOOST_OUTCOME_TRYV(cuda_result("cudaStreamSynchronize", cudaStreamSynchronize(stream())));
    return release_copied(owner);
  }

 private:
  // A batch whose spans overflow a slot is given back whole (it is the newest held) and taken
  // again, as many records as fitted.
  template <class Owner>
  Result<std::vector<TakenRecord>> take_fitting(Owner& owner, std::size_t max) {
    for (;;) {
      Result<std::vector<TakenRecord>> took = owner.take(max);
      if (!took) return took;
      const std::size_t fit = fitting(took.value());
      if (fit == took.value().size()) return took;
      BOOST_OUTCOME_TRYV(finish_on(owner, took.value(), 0));
      if (fit == 0) return too_large(took.value().front());
      max = fit;
    }
  }

  template <class Owner>
  Result<void> register_rings(Owner& owner, std::span<const TakenRecord> taken) {
    if constexpr (requires { owner.ring_of(taken.front()); }) {
      for (const TakenRecord& t : taken) {
        if (registration_of(header_of(t), wire::record_span(t.delivery.payload.size()))) continue;
        BOOST_OUTCOME_TRY(share, owner.ring_of(t));
        BOOST_OUTCOME_TRYV(add_registration(std::move(share)));
      }
    }
    return success();
  }

  struct Registration {
    HostRegistration cuda;
    std::shared_ptr<const void> share;  // the owner side's; null for a ring given at construction
  };
  struct Slot {
    Slot(std::size_t capacity, std::size_t max_records)
        : bytes(capacity), records(max_records * sizeof(GpuRecord)), table(max_records * sizeof(GpuRecord)) {}
    DeviceBuffer bytes;
    DeviceBuffer records;
    PinnedBuffer table;  // the descriptors, host side: rewritten only once `consumed` completed
    CudaEvent copied;    // the records' bytes are on the GPU: the ring may be released
    CudaEvent consumed;  // the consumer launched after the batch finished: the slot may be reused
    bool used = false;
  };
  struct InCopy {
    Slot* slot;
    std::vector<TakenRecord> taken;
  };

  static Result<bool> completed(const CudaEvent& e);
  static const std::byte* header_of(const TakenRecord& t) noexcept {
    return t.delivery.payload.data() - wire::kRecordHeaderSize;
  }
  std::size_t fitting(std::span<const TakenRecord> taken) const noexcept;
  Error too_large(const TakenRecord& t) const;
  Result<void> add_registration(RingShare share);
  void let_go_of_one_freed_ring() noexcept;
  Slot* free_slot();
  Result<GpuBatch> copy(Slot& slot, std::span<const TakenRecord> taken);
  Result<void> record_consumed(Slot& slot);
  const HostRegistration* registration_of(const std::byte* p, std::size_t n) noexcept;

  GpuDeliveryOptions options_;
  std::vector<Registration> registrations_;
  std::size_t last_registration_ = 0;  // where the previous lookup found its ring
  std::size_t next_to_check_ = 0;      // the shared ring let_go_of_one_freed_ring() looks at next
  std::deque<Slot> slots_;
  std::size_t next_slot_ = 0;
  std::deque<InCopy> in_copy_;
  CudaStream stream_;
};

}  // namespace rdmaring::gpu
