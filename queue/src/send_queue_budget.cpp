#include "rdmaring/send_queue_budget.hpp"

#include <string>

namespace rdmaring {

Result<void> validate_send_queue(std::uint32_t depth, std::uint32_t signal_interval, std::uint32_t min_depth) {
  if (signal_interval == 0 || depth < 2 * signal_interval || depth < min_depth)
    return make_error(errc::bad_config, "send queue depth " + std::to_string(depth) +
                                            " must be at least twice the signal interval " +
                                            std::to_string(signal_interval) + " (>= 1) and at least " +
                                            std::to_string(min_depth));
  return success();
}

}  // namespace rdmaring
