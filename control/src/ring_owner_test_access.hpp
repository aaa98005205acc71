// Tests reach the owner's fault injection points here; the header is not installed, so no
// application can arm them.
#pragma once

#include "rdmaring/owner_data_plane.hpp"
#include "rdmaring/ring_owner.hpp"

namespace rdmaring {

struct RingOwnerTestAccess {
  static void inject(RingOwner& owner, SessionId session, OwnerDataPlane::Fault fault);
};

}  // namespace rdmaring
