# One event of the pipeline (README.md next to this file). The producer builds it in place in the
# span Producer::claim() lends in its registered staging buffer; the consumer reads it in place in
# the ring. One segment, framed as a flat array: the segment table (8 bytes), then the segment.
@0xa833e83195e4530a;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("pipeline::schema");

struct Event {
  source @0 :UInt32;       # the producer thread (input partition) that made it
  account @1 :UInt32;
  index @2 :UInt64;        # its place in its source, from 0
  amountCents @3 :Int64;
  memo @4 :Text;
}
