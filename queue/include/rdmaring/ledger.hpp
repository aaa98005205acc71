// The ownership ledger: who owns which bytes of a ring right now. Each boundary is a
// monotonic byte position; the byte ranges between them are the ledger's states, and the
// event that moves each boundary is named beside it. protocol-spec/ledger.md is the long form.
#pragma once

#include <cstdint>
#include <string>

namespace rdmaring {

// The producer's view (its staging buffer mirrors the ring byte for byte).
struct ProducerLedger {
  std::uint64_t released = 0;   // credit write-back seen: below this the producer may write
  std::uint64_t published = 0;  // publish WR posted (imm or tail write): consumer's from here down
  std::uint64_t committed = 0;  // commit(): written-not-published between published and here
  std::uint64_t claimed = 0;    // claim(): the open claim ends here (== committed if none)
  std::uint64_t ring_bytes = 0; // producer-writable: [claimed, released + ring_bytes)
};

// The consumer's view.
struct ConsumerLedger {
  std::uint64_t released = 0;   // application released: producer's again once credit is written
  std::uint64_t credited = 0;   // last credit write-back posted to the producer
  std::uint64_t delivered = 0;  // handed to the application: [released, delivered) being consumed
  std::uint64_t head = 0;       // next record to read: [delivered, head) skipped (padding, duplicates)
  std::uint64_t published = 0;  // publish event seen (immediate or tail record): [head, published) ready
  std::uint64_t ring_bytes = 0; // [published, credited + ring_bytes) owned by the producer
};

std::string to_string(const ProducerLedger& l);
std::string to_string(const ConsumerLedger& l);

}  // namespace rdmaring
