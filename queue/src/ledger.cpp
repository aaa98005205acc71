#include "rdmaring/ledger.hpp"

#include <sstream>

namespace rdmaring {

std::string to_string(const ProducerLedger& l) {
  std::ostringstream s;
  s << "producer ring " << l.ring_bytes << " B: consumer-owned (published, not released) "
    << l.published - l.released << " B [" << l.released << ", " << l.published << "); written-not-published "
    << l.committed - l.published << " B [" << l.published << ", " << l.committed << "); claimed "
    << l.claimed - l.committed << " B; producer-writable " << l.released + l.ring_bytes - l.claimed << " B";
  return s.str();
}

std::string to_string(const ConsumerLedger& l) {
  std::ostringstream s;
  s << "consumer ring " << l.ring_bytes << " B: released-not-credited " << l.released - l.credited << " B ["
    << l.credited << ", " << l.released << "); being consumed " << l.delivered - l.released << " B; skipped "
    << l.head - l.delivered << " B; published-unread " << l.published - l.head << " B [" << l.head << ", "
    << l.published << "); producer-owned " << l.credited + l.ring_bytes - l.published << " B";
  return s.str();
}

}  // namespace rdmaring
