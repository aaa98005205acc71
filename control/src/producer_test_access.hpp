// The Producer's fault injection, for tests only: it lives here, beside the sources and out of
// the installed headers, so that no application can reach it. Tests include it through their
// private include path (control/src).
#pragma once

#include "rdmaring/error.hpp"

namespace rdmaring {

class Producer;

struct ProducerTestAccess {
  // Moves the current QP to the error state, as a dead link would.
  static Result<void> force_error(Producer& p);
};

}  // namespace rdmaring
