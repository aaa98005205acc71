// How the records one poll took reach the application's handler, and how many of them it handled
// (protocol-spec/owner.md §5): per record, or as one batch. What the handler answers decides what
// the poll releases; everything after that is given back to the next poll. RingOwner::poll and
// poll_batch run this over verbs, the test fabric runs it over plain memory.
#pragma once

#include <cstddef>
#include <iterator>
#include <span>
#include <string>
#include <type_traits>

#include "rdmaring/error.hpp"
#include "rdmaring/owner_core.hpp"

namespace rdmaring {

// The records of one poll, in delivery order, as a batch handler sees them: a view, valid (like
// every payload in it) until the handler returns.
class DeliveryBatch {
 public:
  class iterator {
   public:
    using iterator_category = std::random_access_iterator_tag;
    using value_type = Delivery;
    using difference_type = std::ptrdiff_t;
    using pointer = const Delivery*;
    using reference = const Delivery&;

    iterator() = default;
    reference operator*() const noexcept { return at_->delivery; }
    pointer operator->() const noexcept { return &at_->delivery; }
    reference operator[](difference_type n) const noexcept { return at_[n].delivery; }
    iterator& operator++() noexcept { return ++at_, *this; }
    iterator operator++(int) noexcept { return iterator(at_++); }
    iterator& operator--() noexcept { return --at_, *this; }
    iterator operator--(int) noexcept { return iterator(at_--); }
    iterator& operator+=(difference_type n) noexcept { return at_ += n, *this; }
    iterator& operator-=(difference_type n) noexcept { return at_ -= n, *this; }
    friend iterator operator+(iterator i, difference_type n) noexcept { return i += n; }
    friend iterator operator+(difference_type n, iterator i) noexcept { return i += n; }
    friend iterator operator-(iterator i, difference_type n) noexcept { return i -= n; }
    friend difference_type operator-(iterator a, iterator b) noexcept { return a.at_ - b.at_; }
    friend auto operator<=>(iterator a, iterator b) noexcept = default;

   private:
    friend class DeliveryBatch;
    explicit iterator(const TakenRecord* at) noexcept : at_(at) {}
    const TakenRecord* at_ = nullptr;
  };

  explicit DeliveryBatch(std::span<const TakenRecord> taken) noexcept : taken_(taken) {}
  std::size_t size() const noexcept { return taken_.size(); }
  bool empty() const noexcept { return taken_.empty(); }
  const Delivery& operator[](std::size_t i) const noexcept { return taken_[i].delivery; }
  iterator begin() const noexcept { return iterator(taken_.data()); }
  iterator end() const noexcept { return iterator(taken_.data() + taken_.size()); }

 private:
  std::span<const TakenRecord> taken_;
};

// Per record: handler(const Delivery&) returns void (consume) or a HandlerAction. Returns how
// many records it handled; `handled` counts them as it goes, so that a caller that catches the
// handler's exception releases the records handled before it.
template <class Handler>
std::size_t hand_each(std::span<const TakenRecord> taken, Handler& handler, std::size_t& handled) {
  for (const TakenRecord& t : taken) {
    if constexpr (std::is_void_v<std::invoke_result_t<Handler&, const Delivery&>>) {
      handler(t.delivery);
    } else {
      const HandlerAction action = handler(t.delivery);
      if (action == HandlerAction::abort) break;
      if (action == HandlerAction::stop) return ++handled;
    }
    ++handled;
  }
  return handled;
}

// As one batch: handler(const DeliveryBatch&) returns how many records, from the first, it
// handled; the rest are given back. A count above the batch's size is the application's bug:
// nothing is released (a record it did handle comes again, none is lost) and the poll fails with
// invalid_argument. `handled` stays 0 until the handler returns, so a throw releases nothing.
template <class Handler>
Result<std::size_t> hand_batch(std::span<const TakenRecord> taken, Handler& handler, std::size_t& handled) {
  static_assert(std::is_convertible_v<std::invoke_result_t<Handler&, const DeliveryBatch&>, std::size_t>,
                "a batch handler returns how many records it handled");
  if (taken.empty()) return std::size_t{0};
  const std::size_t answered = handler(DeliveryBatch(taken));
  if (answered > taken.size())
    return make_error(errc::invalid_argument, "batch handler said it handled " + std::to_string(answered) +
                                                  " records of a batch of " + std::to_string(taken.size()) +
                                                  ": none released, all delivered again");
  return handled = answered;
}

}  // namespace rdmaring
