// A deterministic in-process fabric for tests: one producer core and one consumer core joined
// by plain memory. It executes the cores' work requests the way an RC QP does (in order), and
// lets a test hold back or reorder placements to break the rules on purpose. A test
// instrument: the library never links it.
#pragma once

#include <cstring>
#include <deque>
#include <functional>
#include <optional>
#include <vector>

#include "rdmaring/consumer_core.hpp"
#include "rdmaring/producer_core.hpp"

namespace rdmaring::test {

class LoopbackFabric {
 public:
  LoopbackFabric(wire::PublishMode mode, std::uint64_t ring_bytes, std::uint32_t max_record,
                 ProducerConfig pc = {}, ConsumerConfig cc = {})
      : mode_(mode),
        geometry_(RingGeometry::make(ring_bytes, max_record).value()),
        staging_(ring_bytes),
        ring_(ring_bytes),
        producer_config_(pc),
        producer(std::in_place, staging_, PeerRing{mode, geometry_, {}}, pc),
        consumer(ring_, geometry_, mode, ResumePoint{}, 0, cc) {}

  // Posts what the producer has waiting (if anything) and places it at once unless held. On a
  // dropped connection the batch fails the way a QP in the error state fails it.
  bool flush() {
    auto batch = producer->take_batch();
    if (!batch) return false;
    if (dropped_) {
      producer->on_completion(batch->wrs[0].slot.wr_id, false, 5 /* IBV_WC_WR_FLUSH_ERR */);
      return true;
    }
    for (const auto& wr : batch->requests()) in_flight_.push_back(wr);
    if (!hold_) place_all();
    return true;
  }

  // Places the oldest in-flight work request only (the rest stays on the wire).
  bool place_one() {
    if (in_flight_.empty()) return false;
    place(take_front());
    return true;
  }

  // The connection dies: whatever is on the wire or not yet received is lost.
  void drop() {
    in_flight_.clear();
    immediates_.clear();
    dropped_ = true;
  }
  bool dropped() const { return dropped_; }

  // A new connection in the next epoch; the producer keeps its staging and resumes.
  Result<ResumePoint> resume() {
    BOOST_OUTCOME_TRY(at, consumer.begin_epoch(consumer.epoch() + 1));
    BOOST_OUTCOME_TRYV(producer->resume(at));
    dropped_ = false;
    old_tails_.push_back(tail_mr_);
    return at;
  }

  // As resume(), but the producer process died: it starts again, empty, from the resume point.
  ResumePoint restart_producer() {
    const ResumePoint at = consumer.begin_epoch(consumer.epoch() + 1).value();
    std::fill(staging_.begin(), staging_.end(), std::byte{0});
    producer.emplace(staging_, PeerRing{consumer_mode(), geometry_, at}, producer_config_);
    in_flight_.clear();
    immediates_.clear();
    dropped_ = false;
    return at;
  }

  // A tail record of an earlier epoch, as the consumer would read it if one were replayed. (Its
  // write cannot land in the MR: re-keying at resume revoked the rkey it was sent with.)
  std::optional<std::array<std::byte, wire::kTailRecordSize>> old_tail() const {
    if (old_tails_.empty()) return std::nullopt;
    return old_tails_.front();
  }

  // Places in-flight work requests in posting order (what RC guarantees).
  void place_all() {
    while (!in_flight_.empty()) place(take_front());
  }

  // Places the publish of the oldest batch before its payload: the trap of tail mode with
  // relaxed ordering. Returns the payload WRs still unplaced.
  std::vector<WorkRequest> place_publish_first() {
    std::vector<WorkRequest> held;
    while (!in_flight_.empty()) {
      auto wr = take_front();
      if (wr.kind == WorkRequest::Kind::write) {
        held.push_back(wr);
        continue;
      }
      place(wr);
      break;
    }
    return held;
  }

  void place(const WorkRequest& wr) {
    if (on_place) on_place(wr);
    switch (wr.kind) {
      case WorkRequest::Kind::write:
      case WorkRequest::Kind::write_with_imm:
        std::memcpy(ring_.data() + wr.remote_offset, staging_.data() + wr.local_offset, wr.length);
        if (wr.kind == WorkRequest::Kind::write_with_imm) immediates_.push_back(wr.imm);
        break;
      case WorkRequest::Kind::write_tail:
        std::memcpy(tail_mr_.data(), wr.tail.data(), wr.tail.size());
        break;
    }
    if (wr.slot.signaled) producer->on_completion(wr.slot.wr_id, true);
  }

  // Feeds publish events to the consumer and credit back to the producer, as the adapters do.
  void deliver_publishes() {
    while (!immediates_.empty()) {
      REQUIRE(consumer.on_immediate(immediates_.front()));
      immediates_.pop_front();
    }
    if (consumer_mode() == wire::PublishMode::tail)
      REQUIRE(consumer.on_tail(std::span<const std::byte, wire::kTailRecordSize>(tail_mr_)));
  }
  void return_credit() {
    while (auto credit = consumer.take_credit()) {
      credit_mr_ = credit->bytes;
      if (credit->slot.signaled) consumer.on_completion(credit->slot.wr_id, true);
    }
    producer->on_credit(credit_mr_);
  }

  wire::PublishMode consumer_mode() const { return mode_; }
  const RingGeometry& geometry() const { return geometry_; }
  // Called with each work request as it is placed, before its bytes land (for invariant checks).
  std::function<void(const WorkRequest&)> on_place;

  void hold(bool on) { hold_ = on; }
  std::span<std::byte> ring() { return ring_; }

 private:
  WorkRequest take_front() {
    auto wr = in_flight_.front();
    in_flight_.pop_front();
    return wr;
  }

  wire::PublishMode mode_;
  RingGeometry geometry_;
  std::vector<std::byte> staging_;
  std::vector<std::byte> ring_;
  std::array<std::byte, wire::kTailRecordSize> tail_mr_{};
  std::array<std::byte, wire::kCreditRecordSize> credit_mr_{};
  std::deque<WorkRequest> in_flight_;
  std::deque<std::uint32_t> immediates_;
  std::vector<std::array<std::byte, wire::kTailRecordSize>> old_tails_;
  bool hold_ = false;
  bool dropped_ = false;
  ProducerConfig producer_config_;

 public:
  std::optional<ProducerCore> producer;
  ConsumerCore consumer;
};

}  // namespace rdmaring::test
