#include "rdmaring/consumer_core.hpp"

#include <algorithm>
#include <string>

#include "rdmaring/record_reader.hpp"

namespace rdmaring {

Result<void> ConsumerConfig::validate() const {
  BOOST_OUTCOME_TRY(validate_send_queue(sq_depth, signal_interval, 1));
  if (credit_fraction < 1 || credit_fraction > 64)
    return make_error(errc::bad_config, "credit_fraction " + std::to_string(credit_fraction) + " outside 1..64");
  return success();
}

ConsumerCore::ConsumerCore(std::span<const std::byte> ring, const RingGeometry& geometry, wire::PublishMode mode,
                           const ResumePoint& start, std::uint64_t deliver_from, const ConsumerConfig& config) noexcept
    : ring_(ring),
      geometry_(geometry),
      mode_(mode),
      epoch_(start.epoch),
      config_(config),
      sq_(config.sq_depth, config.signal_interval),
      credited_(start.position),
      released_(start.position),
      delivered_(start.position),
      head_(start.position),
      published_(start.position),
      next_sequence_(start.next_sequence),
      deliver_from_(deliver_from),
      doorbell_wanted_(mode == wire::PublishMode::tail),
      doorbell_written_(doorbell_wanted_) {}

Error ConsumerCore::violation(std::string what) {
  if (!failure_) failure_ = make_error(errc::protocol_violation, std::move(what));
  return *failure_;
}

Result<void> ConsumerCore::on_immediate(std::uint32_t raw) {
  if (failure_) return *failure_;
  const auto imm = wire::decode_immediate(raw);
  if (imm.epoch_low != (epoch_ & 7))
    return violation("immediate with epoch bits " + std::to_string(imm.epoch_low) + ", epoch is " + std::to_string(epoch_));
  const auto tail = wire::widen_tail(imm.tail_units, published_, credited_, geometry_.bytes);
  if (!tail) return violation("immediate tail runs more than a ring ahead of the credit given");
  if (*tail != published_) ++counters_.publishes;
  published_ = *tail;
  if (imm.credit_request) {
    credit_asked_ = true;
    ++counters_.credit_requests;
  }
  return success();
}

Result<void> ConsumerCore::on_tail(std::span<const std::byte, wire::kTailRecordSize> bytes) {
  if (failure_) return *failure_;
  if (std::equal(bytes.begin(), bytes.end(), last_tail_.begin())) return success();
  std::copy(bytes.begin(), bytes.end(), last_tail_.begin());
  const auto tail = wire::decode_tail_record(bytes);
  if (!tail) {
    ++counters_.torn_tail_reads;
    return success();
  }
  if (tail->epoch != epoch_) {
    ++counters_.stale_epoch;
    return success();
  }
  if (tail->tail % wire::kRecordAlign != 0)
    return violation("tail record at " + std::to_string(tail->tail) + " not a multiple of " +
                     std::to_string(wire::kRecordAlign));
  if (tail->tail - credited_ > geometry_.bytes)
    return violation("tail record at " + std::to_string(tail->tail) + " outside the credit given (" +
                     std::to_string(credited_) + " + ring)");
  if (tail->tail > published_) {
    published_ = tail->tail;
    ++counters_.publishes;
  }
  if (tail->credit_requests != credit_requests_seen_) {
    credit_requests_seen_ = tail->credit_requests;
    credit_asked_ = true;
    ++counters_.credit_requests;
  }
  return success();
}

Result<void> ConsumerCore::on_doorbell(std::uint32_t raw) {
  if (failure_) return *failure_;
  const auto imm = wire::decode_immediate(raw);
  if (imm.epoch_low != (epoch_ & 7))
    return violation("doorbell with epoch bits " + std::to_string(imm.epoch_low) + ", epoch is " + std::to_string(epoch_));
  ++counters_.doorbells;
  doorbell_wanted_ = false;
  return success();
}

void ConsumerCore::want_doorbell(bool on) noexcept {
  if (mode_ == wire::PublishMode::tail) doorbell_wanted_ = on;
}

bool ConsumerCore::doorbell_confirmed() const noexcept {
  return !doorbell_wanted_ || (doorbell_written_ && !doorbell_wr_);
}

void ConsumerCore::skip(std::uint64_t span) {
  head_ += span;
  // Nothing being consumed before it: skipped bytes are released at once, or a producer waiting
  // for the space behind a padding record would wait for ever.
  if (released_ == delivered_) released_ = delivered_ = head_;
}

Result<std::optional<DeliveredRecord>> ConsumerCore::next(Clock::time_point now) {
  if (failure_) return *failure_;
  if (recheck_at() > now) return std::optional<DeliveredRecord>{};
  // Padding and records below deliver_from are consumed in place; the loop goes on to the next.
  while (head_ != published_) {
    const RecordView r = read_record(ring_, geometry_, head_, published_, config_.payload_check);
    const bool valid = (r.status == RecordView::Status::data || r.status == RecordView::Status::padding) &&
                       r.sequence == next_sequence_;
    if (!valid) {
      const std::string what = "record at " + std::to_string(head_) + " (" + to_string(r.status) + ", sequence " +
                               std::to_string(r.sequence) +
                               ", expected " + std::to_string(next_sequence_) + ") below the publish mark " +
                               std::to_string(published_);
      if (mode_ == wire::PublishMode::imm) return violation(what);
      // Tail mode: the tail write may have overtaken the payload (or a check saw it half placed).
      ++counters_.not_ready;
      if (!invalid_since_) invalid_since_ = now;
      const auto failing = now - *invalid_since_;
      if (failing >= config_.ordering_grace) return violation(what + ", placement order violated");
      // Backing off as the failure ages: an honest placement race ends within microseconds, a
      // hostile tail lasts the whole grace, which must not keep the owner awake (wakeup.md O7).
      const auto wait = std::clamp<Clock::duration>(failing, kRecheckMin, kRecheckMax);
      recheck_at_ = std::min(now + wait, *invalid_since_ + config_.ordering_grace);
      invalid_published_ = published_;
      return std::optional<DeliveredRecord>{};
    }
    invalid_since_.reset();
    if (r.status == RecordView::Status::padding) {
      ++counters_.padding_records;
      skip(r.span);
      continue;
    }
    if (r.sequence < deliver_from_) {
      ++counters_.duplicates_dropped;
      ++next_sequence_;
      skip(r.span);
      continue;
    }
    head_ += r.span;
    delivered_ = head_;
    ++next_sequence_;
    ++counters_.records;
    counters_.payload_bytes += r.payload.size();
    return DeliveredRecord{r.payload, r.sequence, head_};
  }
  return std::optional<DeliveredRecord>{};
}

std::optional<Clock::time_point> ConsumerCore::recheck_at() const noexcept {
  if (!invalid_since_ || published_ != invalid_published_ || failure_) return std::nullopt;
  return recheck_at_;
}

Result<void> ConsumerCore::release(std::uint64_t end) {
  // A partial release must end where a delivered record ends: a record header starts there.
  // Anything else would hand the producer bytes the application may still be reading.
  const bool boundary = [&] {
    if (end == delivered_) return true;
    if (end % wire::kRecordAlign != 0 || end > delivered_) return false;
    const auto r = read_record(ring_, geometry_, end, delivered_, config_.payload_check);
    return r.status == RecordView::Status::data || r.status == RecordView::Status::padding;
  }();
  if (end <= released_ || end > delivered_ || !boundary)
    return make_error(errc::invalid_argument, "release(" + std::to_string(end) + ") is not the end of a record delivered in (" +
                                                  std::to_string(released_) + ", " + std::to_string(delivered_) + "]");
  released_ = end;
  if (released_ == delivered_) released_ = delivered_ = head_;
  return success();
}

void ConsumerCore::unread(std::uint64_t start, std::uint64_t sequence) noexcept {
  // Counted again when delivered again: `records` counts what the application took. Padding
  // from `start` to the read head (the head may lie past the last delivered record: padding
  // skipped after it) is read again too: it is uncounted as well.
  for (std::uint64_t pos = start; pos < head_;) {
    const auto header = wire::decode_record_header(ring_.subspan(geometry_.offset(pos)).first<wire::kRecordHeaderSize>());
    if (!header) break;
    if (header->kind == wire::RecordKind::data && header->sequence >= deliver_from_) {
      --counters_.records;
      counters_.payload_bytes -= header->payload_len;
    } else if (header->kind == wire::RecordKind::padding) {
      --counters_.padding_records;
    }
    pos += wire::record_span(header->payload_len);
  }
  head_ = delivered_ = start;
  next_sequence_ = sequence;
  invalid_since_.reset();
}

Result<ResumePoint> ConsumerCore::begin_epoch(std::uint64_t epoch) {
  if (epoch <= epoch_)
    return make_error(errc::stale_epoch, "epoch " + std::to_string(epoch) + " is not newer than " + std::to_string(epoch_));
  epoch_ = epoch;
  published_ = head_;
  // The producer learns `released` from the resume answer itself: that is the new credit.
  credited_ = released_;
  credit_asked_ = false;
  unnotified_ = false;  // the resume answer carries `released`
  // Both sides count credit requests from 0 in a new epoch (a restarted producer can do no else).
  credit_requests_seen_ = 0;
  doorbell_wanted_ = doorbell_written_ = mode_ == wire::PublishMode::tail;
  doorbell_wr_.reset();
  last_tail_ = {};
  invalid_since_.reset();
  failure_.reset();
  sq_ = SendQueueBudget(config_.sq_depth, config_.signal_interval);
  return ResumePoint{epoch_, head_, released_, next_sequence_};
}

std::optional<CreditWrite> ConsumerCore::take_credit() {
  const bool flag_changes = doorbell_wanted_ != doorbell_written_;
  // A request that crossed a plain record carrying the room it asks for: the producer may have
  // armed and slept before that record landed, so it is written again, with an immediate,
  // whether or not anything more was released (protocol-spec/wakeup.md O6).
  const bool repeat = credit_asked_ && unnotified_;
  if (failure_ || sq_.free() == 0 || (released_ == credited_ && !flag_changes && !repeat)) return std::nullopt;
  if (!credit_asked_ && !flag_changes && released_ - credited_ < geometry_.bytes / config_.credit_fraction)
    return std::nullopt;
  CreditWrite w;
  wire::encode(wire::CreditRecord{epoch_, released_, next_sequence_, doorbell_wanted_ ? wire::kCreditDoorbell : 0u},
               w.bytes);
  // Only new space answers a request: a record that changes the flag alone leaves it pending.
  const bool answers = credit_asked_ && released_ != credited_;
  // An answer is signaled (the producer is stalled: keep our slots turning over) and notifies
  // (the producer may sleep until it comes). Setting the flag is too: a producer asleep with
  // publishes in flight must look at it (protocol-spec/wakeup.md).
  const bool sets_flag = flag_changes && doorbell_wanted_;
  w.notify = answers || sets_flag || repeat;
  if (w.notify) unnotified_ = false;
  else if (released_ != credited_) unnotified_ = true;
  w.slot = sq_.take(w.notify);
  if (flag_changes) {
    ++counters_.doorbell_flag_writes;
    doorbell_written_ = doorbell_wanted_;
    doorbell_wr_ = sets_flag ? std::optional(w.slot.wr_id) : std::nullopt;
  }
  credited_ = released_;
  if (answers) credit_asked_ = false;
  ++counters_.credit_writes;
  return w;
}

void ConsumerCore::on_completion(std::uint64_t wr_id, bool success, int wc_status) {
  if (!success) {
    if (!failure_)
      failure_ = make_error(errc::completion_error, "credit write completion of wr " + std::to_string(wr_id) +
                                                        " status " + std::to_string(wc_status));
    return;
  }
  sq_.retire_through(wr_id);
  if (doorbell_wr_ && wr_id >= *doorbell_wr_) doorbell_wr_.reset();
}


ConsumerCounters& ConsumerCounters::operator+=(const ConsumerCounters& o) noexcept {
  records += o.records;
  payload_bytes += o.payload_bytes;
  padding_records += o.padding_records;
  publishes += o.publishes;
  credit_writes += o.credit_writes;
  credit_requests += o.credit_requests;
  torn_tail_reads += o.torn_tail_reads;
  stale_epoch += o.stale_epoch;
  not_ready += o.not_ready;
  duplicates_dropped += o.duplicates_dropped;
  doorbells += o.doorbells;
  doorbell_flag_writes += o.doorbell_flag_writes;
  return *this;
}

ConsumerLedger ConsumerCore::ledger() const noexcept {
  return ConsumerLedger{released_, credited_, delivered_, head_, published_, geometry_.bytes};
}

}  // namespace rdmaring
