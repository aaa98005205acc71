#include "rdmaring/send_queue_budget.hpp"

#include <string>

namespace rdmaring {

Result<void> validate_send_queue(std::uint32_t depth, std::uint32_t signal_interval, std::uint32_t max_batch) {
  if (signal_interval == 0 || depth < 2 * signal_interval || depth < signal_interval + max_batch - 1)
    return make_error(errc::bad_config, "send queue depth " + std::to_string(depth) +
                                            " must be at least twice the signal interval " +
                                            std::to_string(signal_interval) + " (>= 1) and at least the interval + " +
                                            std::to_string(max_batch - 1) + " (a post of " + std::to_string(max_batch) +
                                            " WRs beside unsignaled ones)");
  return success();
}

}  // namespace rdmaring
