// The loopback owner under RingOwner's rules for held batches (protocol-spec/owner.md §5.1):
// take() and finish() return Results, and a finish out of that order is refused, as by
// RingOwner::finish, so a consumer's order is checked at every release. Its ring is shared as
// RingOwner shares a session's: ring_of() finds it through the held batches' pins, and `session`
// is the owner's own share, which ending the session drops. For the GPU delivery's tests.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "fabric/loopback.hpp"
#include "rdmaring/held_batches.hpp"

namespace rdmaring::test {

struct HeldOwner {
  LoopbackOwner& owner;
  std::span<std::byte> ring;
  HeldBatches held;
  std::shared_ptr<void> session = std::make_shared<int>(0);

  Result<std::vector<TakenRecord>> take(std::size_t max) {
    std::vector<TakenRecord> t = owner.take(max);
    held.hold(t, {session});
    return t;
  }
  Result<void> finish(std::span<const TakenRecord> batch, std::size_t handled) {
    BOOST_OUTCOME_TRYV(held.remove(batch, handled));
    owner.finish(batch, handled);
    return success();
  }
  Result<RingShare> ring_of(const TakenRecord&) const {
    const std::shared_ptr<void> pin = held.find_pin([](const void*) { return true; });
    if (!pin) return make_error(errc::invalid_argument, "ring_of(): no batch held");
    return RingShare{ring, std::shared_ptr<const void>(pin, ring.data())};
  }
};

}  // namespace rdmaring::test
