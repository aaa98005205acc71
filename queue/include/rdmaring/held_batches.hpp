// Batches of records held past the poll that took them (protocol-spec/owner.md §5.1): which one
// may finish now. Releasing is per session up to a position, and a give-back moves a session's
// read position back to it, so only the oldest batch may be released, and only the newest may
// give records back; anything else would release bytes of an older batch still being read, or
// deliver a newer one's records twice. Sans I/O: the adapter (OwnerDataPlane) keeps one beside
// its OwnerCore and finishes the batch remove() returns.
#pragma once

#include <cstddef>
#include <deque>
#include <memory>
#include <span>
#include <vector>

#include "rdmaring/error.hpp"
#include "rdmaring/owner_core.hpp"

namespace rdmaring {

// The ring a held record lies in (RingOwner::ring_of), for a consumer that registers each ring
// once with another device, as the GPU delivery does with CUDA: its bytes, and a share that
// keeps them allocated while it is kept, past the batch's finish and its session's end.
struct RingShare {
  std::span<std::byte> bytes;
  std::shared_ptr<const void> keep;
};

class HeldBatches {
 public:
  struct Batch {
    std::vector<TakenRecord> taken;
    // What keeps the batch's rings allocated until it finishes: the adapter's handles.
    std::vector<std::shared_ptr<void>> pins;
  };

  // Holds a batch as taken, after every batch held so far. An empty batch is not held.
  void hold(std::vector<TakenRecord> taken, std::vector<std::shared_ptr<void>> pins);
  // The held batch `batch` names (by its first record and its length: no record is in two held
  // batches), taken out, when finish(batch, handled) may end it now: the oldest wholly handled,
  // the newest given back whole (`handled` 0), or the only one with any `handled` up to its
  // size (an empty `batch` with 0: an empty Batch, nothing held changes). Errors:
  // invalid_argument, saying which rule, and nothing changes.
  Result<Batch> remove(std::span<const TakenRecord> batch, std::size_t handled);

  // The first pin of a held batch for which holds(pin.get()) is true, or null.
  template <class Holds>
  std::shared_ptr<void> find_pin(Holds&& holds) const {
    for (const Batch& b : held_)
      for (const auto& p : b.pins)
        if (holds(p.get())) return p;
    return nullptr;
  }

  bool empty() const noexcept { return held_.empty(); }
  std::size_t size() const noexcept { return held_.size(); }

 private:
  std::deque<Batch> held_;
};

}  // namespace rdmaring
