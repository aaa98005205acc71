#include "rdmaring/producer_core.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "rdmaring/record_reader.hpp"

namespace rdmaring {

Result<void> ProducerConfig::validate() const {
  BOOST_OUTCOME_TRY(validate_send_queue(sq_depth, signal_interval, PostBatch{}.wrs.size()));
  if (coalesce.records == 0)
    return make_error(errc::bad_config, "coalesce.records must be at least 1");
  return success();
}

ProducerCore::ProducerCore(std::span<std::byte> staging, const PeerRing& peer, const ProducerConfig& config) noexcept
    : staging_(staging),
      peer_(peer),
      config_(config),
      epoch_(peer.start.epoch),
      sq_(config.sq_depth, config.signal_interval),
      released_(peer.start.released),
      published_(peer.start.position),
      committed_(peer.start.position),
      next_sequence_(peer.start.next_sequence),
      delivered_(peer.start.next_sequence),
      doorbell_(peer.mode == wire::PublishMode::tail) {}

std::span<std::byte, wire::kRecordHeaderSize> ProducerCore::header_at(std::uint64_t pos) noexcept {
  return staging_.subspan(peer_.geometry.offset(pos)).first<wire::kRecordHeaderSize>();
}

void ProducerCore::fail(Error e) {
  if (!failure_) failure_ = std::move(e);
}

void ProducerCore::mark_committed(std::uint64_t bytes, Clock::time_point now) {
  if (committed_ == published_) oldest_pending_ = now;
  committed_ += bytes;
  ++pending_records_;
  counters_.wire_bytes += bytes;
}

void ProducerCore::append_padding(std::uint64_t next_sequence) {
  const std::uint64_t pad = peer_.geometry.to_end(committed_);
  wire::encode(wire::RecordHeader{static_cast<std::uint32_t>(pad - wire::kRecordHeaderSize), wire::RecordKind::padding,
                                  next_sequence},
               {}, header_at(committed_));
  ++counters_.padding_records;
}

Error ProducerCore::starved() {
  ++counters_.would_block;
  request_credit();
  return make_error(errc::would_block);
}

Error ProducerCore::too_large(std::uint64_t len) const {
  return make_error(errc::record_too_large, "record of " + std::to_string(len) + " B, max_record " +
                                                std::to_string(peer_.geometry.max_record) + " B (ring " +
                                                std::to_string(peer_.geometry.bytes) + " B)");
}

Result<void> ProducerCore::reserve(std::uint64_t len, Clock::time_point now) {
  if (failure_) return *failure_;
  if (claim_) return make_error(errc::claim_open, "claim(" + std::to_string(len) + ")");
  if (len > peer_.geometry.max_record) return too_large(len);
  const std::uint64_t span = wire::record_span(len);
  const std::uint64_t to_end = peer_.geometry.to_end(committed_);
  if (span > to_end) {
    // Padding is a record of its own, committed even when the record after it must wait: a
    // record as large as the ring fits only once the padding has been consumed and released.
    if (free_bytes() < to_end) return starved();
    append_padding(next_sequence_);
    mark_committed(to_end, now);
  }
  if (free_bytes() < span) return starved();
  return success();
}

std::span<std::byte> ProducerCore::payload_at(std::uint64_t pos, std::uint32_t len) noexcept {
  return staging_.subspan(peer_.geometry.offset(pos) + wire::kRecordHeaderSize, len);
}

void ProducerCore::seal(std::uint32_t len, Clock::time_point when) {
  const auto payload = payload_at(committed_, len);
  wire::encode(wire::RecordHeader{len, wire::RecordKind::data, next_sequence_},
               peer_.payload_check == wire::PayloadCheck::crc32c ? payload : std::span<const std::byte>{},
               header_at(committed_));
  ++next_sequence_;
  ++counters_.records;
  counters_.payload_bytes += len;
  mark_committed(wire::record_span(len), when);
}

Result<std::span<std::byte>> ProducerCore::claim(std::uint32_t len, Clock::time_point now) {
  BOOST_OUTCOME_TRYV(reserve(len, now));
  claim_ = Claim{len, now};
  return payload_at(committed_, len);
}

Result<void> ProducerCore::commit(std::optional<std::uint32_t> len) {
  if (!claim_) return make_error(errc::no_claim, "commit()");
  const std::uint32_t n = len.value_or(claim_->len);
  if (n > claim_->len)
    return make_error(errc::record_too_large,
                      "commit(" + std::to_string(n) + ") exceeds the claim of " + std::to_string(claim_->len) + " B");
  seal(n, claim_->when);
  claim_.reset();
  return success();
}

void ProducerCore::abort() noexcept { claim_.reset(); }

Result<void> ProducerCore::send(std::span<const std::byte> payload, Clock::time_point now) {
  // claim + copy + commit, without a claim to open and close: the record is sealed at once.
  BOOST_OUTCOME_TRYV(reserve(payload.size(), now));
  const auto len = static_cast<std::uint32_t>(payload.size());  // reserve() held it to max_record
  if (len > 0) std::memcpy(payload_at(committed_, len).data(), payload.data(), len);
  seal(len, now);
  return success();
}

bool ProducerCore::flush_due(Clock::time_point now) const noexcept {
  if (!publish_pending()) return false;
  if (want_credit_ || ring_) return true;
  return committed_ - published_ >= config_.coalesce.bytes || pending_records_ >= config_.coalesce.records ||
         now - oldest_pending_ >= config_.coalesce.delay;
}

std::optional<PostBatch> ProducerCore::take_batch() {
  if (failure_ || (committed_ == published_ && !want_credit_ && !ring_)) return std::nullopt;
  PostBatch batch;
  const bool tail_mode = peer_.mode == wire::PublishMode::tail;
  const bool ring = tail_mode && (doorbell_ || ring_);
  const std::uint64_t waiting = committed_ - published_;
  const std::size_t segments = waiting == 0 ? 0 : waiting > peer_.geometry.to_end(published_) ? 2 : 1;
  const std::size_t needed = std::max<std::size_t>(segments + (tail_mode ? 1 : 0) + (ring ? 1 : 0), 1);
  if (sq_.free() < needed) {
    ++counters_.sq_full;
    return std::nullopt;
  }

  std::uint64_t end = published_;
  for (std::size_t i = 0; i < segments; ++i) {
    const std::uint64_t len = std::min(committed_ - end, peer_.geometry.to_end(end));
    WorkRequest& wr = batch.wrs[batch.count++];
    wr.kind = WorkRequest::Kind::write;
    wr.local_offset = wr.remote_offset = peer_.geometry.offset(end);
    wr.length = static_cast<std::uint32_t>(len);
    end += len;
  }
  const bool ask = want_credit_;
  if (tail_mode) {
    if (ask) ++credit_requests_;
    // The sequence of the first record not covered: every record below `end` is complete.
    WorkRequest& wr = batch.wrs[batch.count++];
    wr.kind = WorkRequest::Kind::write_tail;
    wire::encode(wire::TailRecord{epoch_, end, next_sequence_, credit_requests_}, wr.tail);
    if (ring) {
      // After the tail write on the same QP: by the time the consumer wakes, the tail is placed.
      WorkRequest& bell = batch.wrs[batch.count++];
      bell.kind = WorkRequest::Kind::write_with_imm;
      bell.imm = wire::encode(wire::Immediate{static_cast<std::uint32_t>(end / wire::kRecordAlign), false,
                                              static_cast<std::uint32_t>(epoch_)});
      ring_ = false;
      ++counters_.doorbells;
    }
  } else {
    if (batch.count == 0) batch.count = 1;  // a zero-length WRITE_WITH_IMM: publish the credit request alone
    WorkRequest& wr = batch.wrs[batch.count - 1];
    wr.kind = WorkRequest::Kind::write_with_imm;
    wr.imm = wire::encode(wire::Immediate{static_cast<std::uint32_t>(end / wire::kRecordAlign), ask,
                                          static_cast<std::uint32_t>(epoch_)});
  }
  if (ask) {
    want_credit_ = false;
    credit_asked_ = true;
    ++counters_.credit_requests;
  }
  // A starved producer needs the completion now, not one interval later, to free slots early.
  for (std::size_t i = 0; i < batch.count; ++i) {
    batch.wrs[i].slot = sq_.take(ask && i + 1 == batch.count);
    counters_.signaled += batch.wrs[i].slot.signaled;
  }
  counters_.wrs += batch.count;
  ++counters_.batches;
  published_ = end;
  pending_records_ = 0;
  return batch;
}

Result<void> ProducerCore::resume(const ResumePoint& at) {
  if (at.epoch <= epoch_)
    return make_error(errc::stale_epoch, "resume to epoch " + std::to_string(at.epoch) + " from epoch " + std::to_string(epoch_));
  const std::string where = "resume at position " + std::to_string(at.position) + " sequence " +
                            std::to_string(at.next_sequence);
  if (at.released > at.position || at.position < released_ || at.position > published_ || at.position % wire::kRecordAlign != 0)
    return make_error(errc::protocol_violation, where + ": outside what this producer published (" +
                                                    std::to_string(released_) + ", " + std::to_string(published_) + "]");
  if (at.position < committed_) {
    // Checked as the consumer would read it, so a position inside a record is refused.
    const RecordView r = read_record(staging_, peer_.geometry, at.position, committed_, peer_.payload_check);
    if ((r.status != RecordView::Status::data && r.status != RecordView::Status::padding) ||
        r.sequence != at.next_sequence)
      return make_error(errc::protocol_violation, where + ": no record of that sequence starts there in staging");
  } else if (next_sequence_ != at.next_sequence) {
    return make_error(errc::protocol_violation, where + ": this producer's next sequence is " + std::to_string(next_sequence_));
  }
  epoch_ = at.epoch;
  released_ = std::max(released_, at.released);
  delivered_ = at.next_sequence;
  published_ = at.position;
  // A new QP: no slot is in use, and nothing of the old connection's credit state carries over.
  sq_ = SendQueueBudget(config_.sq_depth, config_.signal_interval);
  want_credit_ = credit_asked_ = ring_ = false;
  doorbell_ = peer_.mode == wire::PublishMode::tail;  // nothing heard from the new epoch's consumer yet
  credit_requests_ = 0;  // counted per epoch, as the consumer does
  last_credit_ = {};
  failure_.reset();
  // Re-send at once: the records are old, their coalescing delay is long spent.
  oldest_pending_ = Clock::time_point{};
  return success();
}

ProducerCore::ResendPoint ProducerCore::resend_point() const noexcept {
  const ResumePoint& start = peer_.start;
  if (released_ <= start.position) return {start.position, start.next_sequence};
  if (released_ == committed_) return {released_, next_sequence_};
  // Sealed, by this producer: a data or padding header, each carrying a sequence (padding the
  // next record's), wire-formats.md §2.
  const auto h = wire::decode_record_header(staging_.subspan(peer_.geometry.offset(released_)).first<wire::kRecordHeaderSize>());
  return {released_, h ? h->sequence : next_sequence_};
}

void ProducerCore::on_completion(std::uint64_t wr_id, bool success, int wc_status) {
  if (!success) {
    fail(make_error(errc::completion_error, "send completion of wr " + std::to_string(wr_id) + " status " +
                                                std::to_string(wc_status)));
    return;
  }
  sq_.retire_through(wr_id);
}

void ProducerCore::on_credit(std::span<const std::byte, wire::kCreditRecordSize> bytes) {
  if (std::equal(bytes.begin(), bytes.end(), last_credit_.begin())) return;
  std::copy(bytes.begin(), bytes.end(), last_credit_.begin());
  const auto credit = wire::decode_credit_record(bytes);
  if (!credit) {
    ++counters_.torn_credit_reads;
    return;
  }
  if (credit->epoch != epoch_) {
    ++counters_.stale_credit;
    return;
  }
  if (peer_.mode == wire::PublishMode::tail) {
    doorbell_ = (credit->flags & wire::kCreditDoorbell) != 0;
    // Written before the consumer saw all we published, the flag may have landed after we
    // checked it for those publishes, and the consumer may have re-checked before they landed.
    if (doorbell_ && credit->released < published_) ring_ = true;
  }
  if (credit->released <= released_) return;
  if (credit->released > published_ || credit->released % wire::kRecordAlign != 0) {
    fail(make_error(errc::protocol_violation, "credit releases up to " + std::to_string(credit->released) +
                                                  " but only " + std::to_string(published_) + " was published"));
    return;
  }
  released_ = credit->released;
  delivered_ = credit->delivered;
  credit_asked_ = false;
  ++counters_.credit_updates;
}

ProducerLedger ProducerCore::ledger() const noexcept {
  return ProducerLedger{released_, published_, committed_,
                        claim_ ? committed_ + wire::record_span(claim_->len) : committed_, peer_.geometry.bytes};
}

}  // namespace rdmaring
