// The control channel's messages from a hostile peer: the input is the bytes a TCP peer sends,
// read exactly as the ring owner (and the producer, for replies) would read them, with the
// owner's limits (control::kTraversalLimitWords, control::kNestingLimit).
//
// Three ways in, each over the same bytes:
//   1. stream framing, asynchronous (capnp::tryReadMessage, what TwoPartyVatNetwork runs on the
//      socket), frame after frame until the bytes end: the segment table is parsed here, so this
//      is where truncated frames, huge segment counts and oversized messages are turned away.
//      Every frame is then read as the rpc::Message it claims to be: a Call to RingService has
//      its params read as that method's params, a Return's results as each method's results.
//   2. stream framing, synchronous (capnp::InputStreamMessageReader over kj::ArrayInputStream),
//      frame after frame, read the same way.
//   3. one frame over a word-aligned copy (capnp::FlatArrayMessageReader), its root read as each
//      struct a peer can send (every params and results struct, Credentials, RingGrant, Refusal,
//      GrantOrRefusal, Channel, ChannelOrRefusal), each from a fresh reader so one view's traversal
//      does not starve the next.
// Every view goes through the library's checked readers (control/src/messages.hpp) and touches
// every field. kj::Exception is the expected outcome for malformed input and is caught per view;
// anything else (a sanitizer report, a crash, an invariant below) is a finding:
//   - a grant read() accepts has a power-of-two ring within the wire limits that fits max_record,
//     epoch != 0, released <= position, position - released <= ring_bytes, both kRecordAlign-aligned,
//     data_port != 0, a tail MR in tail mode, no relaxed ordering in tail mode, the secret (when
//     asked for) equal to the 32 bytes sent, every other field as sent; and it survives
//     write() + read() unchanged;
//   - a Credentials read succeeds if and only if the proof is 16 bytes, and names those bytes;
//     written back with a binding, it carries the counter sent;
//   - a hello reply read() accepts has a 16-byte nonce and names it and the identity sent, and
//     survives write() + read() unchanged;
//   - a refusal never reads as a grant or a channel, and reads as the same error as the Refusal
//     on its own.
#include <capnp/message.h>
#include <capnp/rpc.capnp.h>
#include <capnp/serialize-async.h>
#include <capnp/serialize.h>
#include <kj/async.h>
#include <kj/exception.h>
#include <kj/io.h>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "messages.hpp"

using namespace rdmaring;
namespace schema = rdmaring::control::schema;

namespace {

constexpr capnp::ReaderOptions kOptions{control::kTraversalLimitWords, control::kNestingLimit};
// Frames read from one input, per path: enough for a pipelined call or two, bounded per input.
constexpr int kMaxFrames = 4;
// The copies the checks build are a few dozen words: a small first segment keeps every run from
// zeroing (and, under ASan, faulting in) the default 8 KiB.
constexpr unsigned kBuilderWords = 64;

// Keeps the touched fields alive without the optimiser dropping the reads.
volatile std::uint64_t sink;

#define CHECK(cond)                         \
  do {                                      \
    if (!(cond)) __builtin_trap();          \
  } while (0)

void touch(capnp::Data::Reader d) {
  std::uint64_t h = d.size();
  for (auto b : d) h = h * 31 + b;
  sink = sink + h;
}
void touch(capnp::Text::Reader t) {
  std::uint64_t h = t.size();
  for (char c : t) h = h * 31 + static_cast<unsigned char>(c);
  sink = sink + h;
}

void touch(schema::RingGrant::Reader g) {
  sink = sink + g.getSession() + g.getEpoch() + static_cast<std::uint16_t>(g.getMode()) + g.getRelaxedOrdering() +
         g.getRingAddr() + g.getRingRkey() + g.getRingBytes() + g.getMaxRecord() + g.getTailAddr() +
         g.getTailRkey() + g.getPosition() + g.getReleased() + g.getNextSequence() + g.getDataPort() +
         g.getLeaseMillis();
  touch(g.getSecret());
}

// Read(Credentials): succeeds exactly when the proof is 16 bytes, and then names those bytes.
void check_credentials(schema::Credentials::Reader in) {
  const auto got = control::read(in);
  const auto proof = in.getProof();
  touch(proof);
  CHECK(static_cast<bool>(got) == (proof.size() == wire::kProofSize));
  if (!got) {
    CHECK(got.error() == errc::invalid_argument);
    return;
  }
  Credentials c = got.value();
  CHECK(c.session == in.getSession() && c.epoch == in.getEpoch());
  CHECK(c.proof.size() == wire::kProofSize && std::memcmp(c.proof.data(), proof.begin(), proof.size()) == 0);
  // No binding: the nonce is the reading connection's, never the sender's word.
  CHECK(!c.binding);
  // And back: write() then read() names the same session, epoch and proof; the counter travels
  // with the binding.
  c.binding = ChannelBinding{{}, in.getCounter()};
  capnp::MallocMessageBuilder b(kBuilderWords);
  auto root = b.initRoot<schema::Credentials>();
  control::write(root, c);
  CHECK(root.getCounter() == in.getCounter());
  const auto again = control::read(root.asReader());
  CHECK(again && again.value().session == c.session && again.value().epoch == c.epoch &&
        std::equal(again.value().proof.begin(), again.value().proof.end(), c.proof.begin(), c.proof.end()));
}

bool known_refusal_errc(const Error& e) {
  return e == errc::invalid_argument || e == errc::protocol_violation || e == errc::unknown_session ||
         e == errc::bad_proof || e == errc::stale_epoch || e == errc::no_capacity || e == errc::ring_changed ||
         e == errc::memlock_too_low || e == errc::odp_unsupported || e == errc::unauthenticated ||
         e == errc::unauthorized || e == errc::quota_exceeded;
}

Error check_refusal(schema::Refusal::Reader in) {
  Error e = control::read(in);
  touch(in.getMessage());
  CHECK(known_refusal_errc(e));
  CHECK(e.context.rfind("ring owner refused: ", 0) == 0);
  return e;
}

bool same(const control::RingGrant& a, const control::RingGrant& b) {
  return a.session == b.session && a.secret == b.secret && a.mode == b.mode && a.relaxed_ordering == b.relaxed_ordering &&
         a.ring_addr == b.ring_addr && a.ring_rkey == b.ring_rkey && a.ring_bytes == b.ring_bytes &&
         a.max_record == b.max_record && a.tail_addr == b.tail_addr && a.tail_rkey == b.tail_rkey &&
         a.at.epoch == b.at.epoch && a.at.position == b.at.position && a.at.released == b.at.released &&
         a.at.next_sequence == b.at.next_sequence && a.data_port == b.data_port && a.lease == b.lease &&
         a.recv_budget == b.recv_budget;
}

// The grant's rules, whatever the bytes were.
void check_grant(const control::RingGrant& g, schema::RingGrant::Reader in, bool with_secret) {
  CHECK(std::has_single_bit(g.ring_bytes) && g.ring_bytes >= wire::kMinRingBytes && g.ring_bytes <= wire::kMaxRingBytes);
  CHECK(wire::record_span(g.max_record) <= g.ring_bytes);
  CHECK(g.at.epoch != 0);
  CHECK(g.at.released <= g.at.position && g.at.position - g.at.released <= g.ring_bytes);
  CHECK(g.at.position % wire::kRecordAlign == 0 && g.at.released % wire::kRecordAlign == 0);
  CHECK(g.data_port != 0);
  CHECK(g.mode == wire::PublishMode::imm || g.mode == wire::PublishMode::tail);
  CHECK(g.mode != wire::PublishMode::tail || (g.tail_addr != 0 && !g.relaxed_ordering));
  // Every field as sent.
  CHECK(g.session == in.getSession() && g.at.epoch == in.getEpoch() && g.relaxed_ordering == in.getRelaxedOrdering() &&
        g.ring_addr == in.getRingAddr() && g.ring_rkey == in.getRingRkey() && g.ring_bytes == in.getRingBytes() &&
        g.max_record == in.getMaxRecord() && g.tail_addr == in.getTailAddr() && g.tail_rkey == in.getTailRkey() &&
        g.at.position == in.getPosition() && g.at.released == in.getReleased() &&
        g.at.next_sequence == in.getNextSequence() && g.data_port == in.getDataPort() &&
        static_cast<std::uint64_t>(g.lease.count()) == in.getLeaseMillis() && g.recv_budget == in.getRecvBudget());
  CHECK((g.mode == wire::PublishMode::imm) == (in.getMode() == schema::PublishMode::IMM));
  if (with_secret) {
    const auto secret = in.getSecret();
    CHECK(secret.size() == g.secret.size() && std::memcmp(secret.begin(), g.secret.data(), secret.size()) == 0);
  } else {
    CHECK(std::all_of(g.secret.begin(), g.secret.end(), [](std::byte b) { return b == std::byte{0}; }));
  }
  // And back: write() then read() gives the same grant.
  capnp::MallocMessageBuilder b(kBuilderWords);
  auto root = b.initRoot<schema::GrantOrRefusal>();
  control::write(root.initGrant(), g, with_secret);
  const auto again = control::read(root.asReader(), with_secret);
  CHECK(again && same(again.value(), g));
}

void check_reply(schema::GrantOrRefusal::Reader in) {
  for (bool with_secret : {true, false}) {
    try {
      const auto got = control::read(in, with_secret);
      if (in.isRefused()) {
        CHECK(!got);
        CHECK(got.error().code == check_refusal(in.getRefused()).code);
      } else if (got) {
        CHECK(in.isGrant());
        const auto g = in.getGrant();
        touch(g);
        check_grant(got.value(), g, with_secret);
      }
    } catch (const kj::Exception&) {
    }
  }
}

// A RingGrant as the root: read() takes it inside a GrantOrRefusal, so copy it into one (the copy
// walks the hostile pointers too).
void check_bare_grant(schema::RingGrant::Reader g) {
  touch(g);
  capnp::MallocMessageBuilder b(kBuilderWords);
  b.initRoot<schema::GrantOrRefusal>().setGrant(g);
  check_reply(b.getRoot<schema::GrantOrRefusal>().asReader());
}

// hello's reply: a channel (its nonce exactly 16 bytes, as sent, and the identity sent) or the
// refusal it carries.
void check_channel(schema::ChannelOrRefusal::Reader in) {
  const auto got = control::read(in);
  if (in.isRefused()) {
    CHECK(!got);
    CHECK(got.error().code == check_refusal(in.getRefused()).code);
    return;
  }
  if (!got) {
    CHECK(got.error() == errc::protocol_violation);
    return;
  }
  CHECK(in.isChannel());
  const auto channel = in.getChannel();
  const auto nonce = channel.getNonce();
  touch(nonce);
  touch(channel.getIdentity());
  const control::Channel& c = got.value();
  CHECK(nonce.size() == kNonceSize && std::memcmp(c.nonce.data(), nonce.begin(), nonce.size()) == 0);
  CHECK(c.identity == channel.getIdentity().cStr());
  // And back: write() then read() gives the same channel.
  capnp::MallocMessageBuilder b(kBuilderWords);
  auto root = b.initRoot<schema::ChannelOrRefusal>();
  control::write(root.initChannel(), c);
  const auto again = control::read(root.asReader());
  CHECK(again && again.value().nonce == c.nonce && again.value().identity == c.identity);
}

// A Channel as the root: read() takes it inside a ChannelOrRefusal.
void check_bare_channel(schema::Channel::Reader c) {
  capnp::MallocMessageBuilder b(kBuilderWords);
  b.initRoot<schema::ChannelOrRefusal>().setChannel(c);
  check_channel(b.getRoot<schema::ChannelOrRefusal>().asReader());
}

// Each guarded on its own: an exception in one view leaves the others to run.
template <class F>
void guarded(F&& f) {
  try {
    f();
  } catch (const kj::Exception&) {
  }
}

void attach_params(schema::RingService::AttachParams::Reader p) { sink = sink + p.getVersion(); }
void hello_params(schema::RingService::HelloParams::Reader p) { sink = sink + p.getVersion(); }
void resume_params(schema::RingService::ResumeParams::Reader p) {
  sink = sink + p.getRestarted() + p.getReleased() + p.getReleasedSequence() + p.hasWho();
  check_credentials(p.getWho());
}
template <class Params>
void who_params(Params p) {
  check_credentials(p.getWho());
}
template <class Results>
void refusal_results(Results r) {
  sink = sink + r.getOk() + r.hasRefused();
  check_refusal(r.getRefused());
}

// The RPC layer's view of a frame: a Call to RingService carries that method's params, a Return
// carries some method's results (which one is known only to the caller, so all of them).
void rpc_frame(capnp::MessageReader& reader) {
  const auto m = reader.getRoot<capnp::rpc::Message>();
  auto cap_table = [](capnp::rpc::Payload::Reader payload) {
    for (auto d : payload.getCapTable()) sink = sink + static_cast<std::uint16_t>(d.which());
  };
  switch (m.which()) {
    case capnp::rpc::Message::CALL: {
      const auto call = m.getCall();
      sink = sink + call.getQuestionId() + call.getAllowThirdPartyTailCall();
      guarded([&] { sink = sink + static_cast<std::uint16_t>(call.getTarget().which()); });
      const auto params = call.getParams();
      guarded([&] { cap_table(params); });
      if (call.getInterfaceId() != capnp::typeId<schema::RingService>()) return;
      const auto content = params.getContent();
      switch (call.getMethodId()) {
        case 0: attach_params(content.getAs<schema::RingService::AttachParams>()); break;
        case 1: resume_params(content.getAs<schema::RingService::ResumeParams>()); break;
        case 2: who_params(content.getAs<schema::RingService::HeartbeatParams>()); break;
        case 3: who_params(content.getAs<schema::RingService::DetachParams>()); break;
        case 4: hello_params(content.getAs<schema::RingService::HelloParams>()); break;
        default: break;
      }
      break;
    }
    case capnp::rpc::Message::RETURN: {
      const auto ret = m.getReturn();
      sink = sink + ret.getAnswerId() + ret.getReleaseParamCaps();
      if (!ret.isResults()) return;
      const auto results = ret.getResults();
      guarded([&] { cap_table(results); });
      const auto content = results.getContent();
      guarded([&] { check_reply(content.getAs<schema::RingService::AttachResults>().getReply()); });
      guarded([&] { check_reply(content.getAs<schema::RingService::ResumeResults>().getReply()); });
      guarded([&] { refusal_results(content.getAs<schema::RingService::HeartbeatResults>()); });
      guarded([&] { refusal_results(content.getAs<schema::RingService::DetachResults>()); });
      guarded([&] { check_channel(content.getAs<schema::RingService::HelloResults>().getReply()); });
      break;
    }
    default:
      sink = sink + static_cast<std::uint16_t>(m.which());
      break;
  }
}

// An AsyncInputStream over the input, handing it out in the pieces asked for.
class ArrayAsyncInputStream final : public kj::AsyncInputStream {
 public:
  explicit ArrayAsyncInputStream(kj::ArrayPtr<const kj::byte> bytes) : rest_(bytes) {}
  kj::Promise<size_t> tryRead(void* buffer, size_t /*minBytes*/, size_t maxBytes) override {
    const size_t n = std::min(maxBytes, rest_.size());
    if (n > 0) std::memcpy(buffer, rest_.begin(), n);
    rest_ = rest_.slice(n, rest_.size());
    return n;
  }
  bool done() const { return rest_.size() == 0; }

 private:
  kj::ArrayPtr<const kj::byte> rest_;
};

void async_frames(kj::ArrayPtr<const kj::byte> bytes) {
  static kj::EventLoop loop;
  static kj::WaitScope wait(loop);
  ArrayAsyncInputStream in(bytes);
  for (int i = 0; i < kMaxFrames && !in.done(); ++i) {
    kj::Maybe<kj::Own<capnp::MessageReader>> frame;
    try {
      frame = capnp::tryReadMessage(in, kOptions).wait(wait);
    } catch (const kj::Exception&) {
      return;  // a bad frame ends the connection
    }
    KJ_IF_MAYBE(reader, frame) { guarded([&] { rpc_frame(**reader); }); }
    else return;
  }
}

void sync_frames(kj::ArrayPtr<const kj::byte> bytes) {
  kj::ArrayInputStream in(bytes);
  for (int i = 0; i < kMaxFrames && in.tryGetReadBuffer().size() > 0; ++i) {
    try {
      capnp::InputStreamMessageReader reader(in, kOptions);
      guarded([&] { rpc_frame(reader); });
      // The destructor skips what the views left unread, so the next frame starts in place.
    } catch (const kj::Exception&) {
      return;
    }
  }
}

template <class F>
void flat_view(kj::ArrayPtr<const capnp::word> words, F&& f) {
  try {
    capnp::FlatArrayMessageReader reader(words, kOptions);
    f(reader);
  } catch (const kj::Exception&) {
  }
}

void flat_views(kj::ArrayPtr<const capnp::word> words) {
  using RS = schema::RingService;
  flat_view(words, [](capnp::MessageReader& r) { attach_params(r.getRoot<RS::AttachParams>()); });
  flat_view(words, [](capnp::MessageReader& r) { resume_params(r.getRoot<RS::ResumeParams>()); });
  flat_view(words, [](capnp::MessageReader& r) { who_params(r.getRoot<RS::HeartbeatParams>()); });
  flat_view(words, [](capnp::MessageReader& r) { who_params(r.getRoot<RS::DetachParams>()); });
  flat_view(words, [](capnp::MessageReader& r) { hello_params(r.getRoot<RS::HelloParams>()); });
  flat_view(words, [](capnp::MessageReader& r) { check_reply(r.getRoot<RS::AttachResults>().getReply()); });
  flat_view(words, [](capnp::MessageReader& r) { check_reply(r.getRoot<RS::ResumeResults>().getReply()); });
  flat_view(words, [](capnp::MessageReader& r) { refusal_results(r.getRoot<RS::HeartbeatResults>()); });
  flat_view(words, [](capnp::MessageReader& r) { refusal_results(r.getRoot<RS::DetachResults>()); });
  flat_view(words, [](capnp::MessageReader& r) { check_channel(r.getRoot<RS::HelloResults>().getReply()); });
  flat_view(words, [](capnp::MessageReader& r) { check_reply(r.getRoot<schema::GrantOrRefusal>()); });
  flat_view(words, [](capnp::MessageReader& r) { check_credentials(r.getRoot<schema::Credentials>()); });
  flat_view(words, [](capnp::MessageReader& r) { check_bare_grant(r.getRoot<schema::RingGrant>()); });
  flat_view(words, [](capnp::MessageReader& r) { check_refusal(r.getRoot<schema::Refusal>()); });
  flat_view(words, [](capnp::MessageReader& r) { check_channel(r.getRoot<schema::ChannelOrRefusal>()); });
  flat_view(words, [](capnp::MessageReader& r) { check_bare_channel(r.getRoot<schema::Channel>()); });
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const kj::ArrayPtr<const kj::byte> bytes(data, size);
  async_frames(bytes);
  sync_frames(bytes);
  // The input is not word-aligned: copy the whole words into an aligned buffer (a frame is
  // whole words; a trailing partial word cannot belong to one).
  auto words = kj::heapArray<capnp::word>(size / sizeof(capnp::word));
  if (words.size() > 0) std::memcpy(words.begin(), data, words.size() * sizeof(capnp::word));
  flat_views(words);
  return 0;
}
