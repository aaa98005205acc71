#include "rdmaring/held_batches.hpp"

#include <algorithm>
#include <string>
#include <utility>

namespace rdmaring {

void HeldBatches::hold(std::vector<TakenRecord> taken, std::vector<std::shared_ptr<void>> pins) {
  if (taken.empty()) return;
  held_.push_back(Batch{std::move(taken), std::move(pins)});
}

Result<HeldBatches::Batch> HeldBatches::remove(std::span<const TakenRecord> batch, std::size_t handled) {
  if (batch.empty() && handled == 0) return Batch{};  // take() held nothing for it
  if (handled > batch.size())
    return make_error(errc::invalid_argument,
                      "finish(): " + std::to_string(handled) + " handled of a batch of " + std::to_string(batch.size()));
  const auto is = [&batch](const Batch& h) {
    return h.taken.size() == batch.size() &&
           h.taken.front().delivery.session == batch.front().delivery.session &&
           h.taken.front().delivery.sequence == batch.front().delivery.sequence;
  };
  if (std::none_of(held_.begin(), held_.end(), is))
    return make_error(errc::invalid_argument, "finish(): not a batch take() holds");
  const bool oldest = is(held_.front()), newest = is(held_.back());
  // A give-back moves its sessions' read positions back to its first record given back: past
  // it, only records of no other held batch may lie.
  const bool allowed = (oldest && handled == batch.size()) || (newest && (handled == 0 || oldest));
  if (!allowed) {
    const std::string what = oldest ? "the oldest of " + std::to_string(held_.size()) + " held batches, partly handled"
                                    : "a batch taken after the oldest of the " + std::to_string(held_.size()) + " held";
    return make_error(errc::invalid_argument, "finish(): " + what +
                                                  ": finish them in the order taken (only the newest may give records "
                                                  "back, and only whole)");
  }
  Batch out = std::move(oldest ? held_.front() : held_.back());
  if (oldest) held_.pop_front();
  else held_.pop_back();
  return out;
}

}  // namespace rdmaring
