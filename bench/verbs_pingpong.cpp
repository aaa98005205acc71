// rdmaring-bench verbs-pingpong: an event-driven ping-pong over raw verbs, with an optional lull
// before every ping: what a wake-up costs this device and host when no rdmaring protocol is in
// the way.
//
//   rdmaring-bench verbs-pingpong --server ADDR --port P [--iterations N] [--warmup W] [--size B]
//   rdmaring-bench verbs-pingpong --client ADDR --port P [--gap-ms G] [--iterations N] [--warmup W] [--size B]
//
// ib_send_lat -e (perftest's event-driven mode) sleeps on a completion channel for every
// message, but its ping-pong never pauses, so the host never idles between two messages.
// rdmaring's wake-up figure is a first record after a 100 ms lull, and a lull lets a CPU (a
// vCPU, in the TCG guest) go idle; this reference pays the same lull with nothing else changed.
//
// Both sides connect over rdma_cm (one RC QP) and exchange --size-byte SENDs, as ib_send_lat
// does: inline where the QP allows, the client's ping answered by the server's pong. Each side
// waits for a message as perftest -e does: arm the receive CQ (ibv_req_notify_cq), sleep until
// its completion channel reports, take the event (ibv_get_cq_event, acked), poll. The client
// sleeps --gap-ms before each ping; it times ping posted -> pong polled with steady_clock and
// reports RTT/2 over --iterations after --warmup (min, p50, p99, max, mean; nearest rank), so
// its figures compare with ib_send_lat's t_typical and rdmaring-bench's latency_*_us.
// One key=value line per side on stdout; the server prints `listening=` first, once it listens.
// `sleeps` counts the waits that did sleep (a message already there costs no sleep): with every
// wait asleep it equals the messages received.
#include "verbs_pingpong.hpp"

#include <poll.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <memory>
#include <span>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "rdmaring/error.hpp"
#include "rdmaring/verbs/cm_id.hpp"
#include "rdmaring/verbs/comp_channel.hpp"
#include "rdmaring/verbs/context.hpp"
#include "rdmaring/verbs/cq.hpp"
#include "rdmaring/verbs/error.hpp"
#include "rdmaring/verbs/event_channel.hpp"
#include "rdmaring/verbs/mr.hpp"
#include "rdmaring/verbs/pd.hpp"
#include "rdmaring/verbs/qp.hpp"

namespace rdmaring::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct PingPongOptions {
  std::string server;
  std::string client;
  std::uint16_t port = 0;
  std::uint64_t gap_ms = 0;
  std::uint64_t iterations = 1000;
  std::uint64_t warmup = 16;
  std::uint32_t size = 64;
  double timeout_s = 30;
};

// Only one message is ever in flight each way; a few receives let a slow repost never be the
// thing that is measured.
constexpr std::uint32_t kRecvDepth = 4;
// Sends are unsignaled but every kSignalEvery-th (and the last), whose completion frees the
// slots before it; the send CQ is polled, never slept on, so only the peer's message wakes a side.
constexpr std::uint32_t kSignalEvery = 16;
constexpr std::uint32_t kSendDepth = 2 * kSignalEvery;

void check(Result<void> r) {
  if (!r) throw SetupError(r.error());
}

// One side's connection and everything it posts from: the send slot, then kRecvDepth receive
// slots, in one registration. Members in the order they are built, so that the QP goes first and
// each CQ before its channel; the cm id, the caller's, outlives the link.
class Link {
 public:
  Link(verbs::CmId& id, std::uint32_t size)
      : ctx_(id.context()),
        channel_(ctx_),
        pd_(ctx_),
        send_cq_(ctx_, kSendDepth),
        recv_cq_(ctx_, kRecvDepth, &channel_),
        buffer_(std::size_t{size} * (1 + kRecvDepth)),
        mr_(pd_, buffer_.data(), buffer_.size(), IBV_ACCESS_LOCAL_WRITE),
        qp_(id, pd_, send_cq_, recv_cq_, caps(size)),
        size_(size) {
    // Before connect/accept: the peer may send as soon as the connection is up.
    for (std::uint32_t slot = 0; slot < kRecvDepth; ++slot) check(post_recv(slot));
  }

  std::string_view device() const noexcept { return ctx_.name(); }
  bool inline_send() const noexcept { return size_ <= qp_.max_inline_data(); }
  std::uint64_t sleeps() const noexcept { return sleeps_; }

  // `last`: signaled, so that flush() can wait for it.
  Result<void> send(bool last) {
    ibv_sge sge{reinterpret_cast<std::uintptr_t>(buffer_.data()), size_, mr_.lkey()};
    ibv_send_wr wr{};
    wr.wr_id = sent_;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = inline_send() ? IBV_SEND_INLINE : 0;
    if (++sent_ % kSignalEvery == 0 || last) {
      wr.send_flags |= IBV_SEND_SIGNALED;
      ++signaled_;
    }
    BOOST_OUTCOME_TRYV(qp_.post_send(wr));
    return reap_sends();
  }

  // Waits up to `timeout` for the peer's next message, asleep on the completion channel.
  Result<void> receive(std::chrono::milliseconds timeout) {
    const auto deadline = Clock::now() + timeout;
    for (bool armed = false;;) {
      ibv_wc wc{};
      BOOST_OUTCOME_TRY(n, recv_cq_.poll(std::span{&wc, 1}));
      if (n == 1) {
        if (wc.status != IBV_WC_SUCCESS)
          return make_error(errc::completion_error, qp_.describe() + ": receive completed with " +
                                                        ibv_wc_status_str(wc.status));
        if (wc.byte_len != size_)
          return make_error(errc::protocol_violation, qp_.describe() + ": received " + std::to_string(wc.byte_len) +
                                                          " B, expected " + std::to_string(size_));
        return post_recv(static_cast<std::uint32_t>(wc.wr_id));
      }
      // A message that lands before the arming raises no event: poll once more after it.
      if (!armed) {
        BOOST_OUTCOME_TRYV(recv_cq_.arm());
        armed = true;
        continue;
      }
      // The channel's descriptor is non-blocking (CompletionChannel): poll(2) is the sleep, with
      // a deadline, where perftest blocks in ibv_get_cq_event's read; the same wait queue wakes both.
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) return make_error(errc::timed_out, qp_.describe() + ": no message from the peer");
      pollfd p{channel_.fd(), POLLIN, 0};
      const int ready = ::poll(&p, 1, static_cast<int>(left.count()));
      if (ready < 0 && errno != EINTR)
        return make_error(errc::system_failure, "poll(" + std::string(device()) + "'s completion channel)", errno);
      if (ready <= 0) continue;
      ++sleeps_;
      BOOST_OUTCOME_TRYV(channel_.take_events());
      armed = false;
    }
  }

  // Waits for every signaled send (the last one is), so that the QP is not torn down under a
  // send the peer has not had yet. Spins: it is past the measurement.
  Result<void> flush(std::chrono::milliseconds timeout) {
    const auto deadline = Clock::now() + timeout;
    while (reaped_ < signaled_) {
      if (Clock::now() > deadline) return make_error(errc::timed_out, qp_.describe() + ": sends not completed");
      BOOST_OUTCOME_TRYV(reap_sends());
    }
    return success();
  }

 private:
  static verbs::QueuePairCaps caps(std::uint32_t size) {
    verbs::QueuePairCaps c;
    c.max_send_wr = kSendDepth;
    c.max_recv_wr = kRecvDepth;
    // ib_send_lat's default inline size, 236 B, covers its 64 B messages; so does this.
    c.max_inline_data = std::min<std::uint32_t>(size, 236);
    return c;
  }

  Result<void> post_recv(std::uint32_t slot) {
    ibv_sge sge{reinterpret_cast<std::uintptr_t>(buffer_.data() + std::size_t{size_} * (1 + slot)), size_, mr_.lkey()};
    ibv_recv_wr wr{};
    wr.wr_id = slot;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    return qp_.post_recv(wr);
  }

  Result<void> reap_sends() {
    std::array<ibv_wc, 4> wcs;
    BOOST_OUTCOME_TRY(n, send_cq_.poll(wcs));
    for (std::size_t i = 0; i < n; ++i)
      if (wcs[i].status != IBV_WC_SUCCESS)
        return make_error(errc::completion_error, qp_.describe() + ": SEND " + std::to_string(wcs[i].wr_id) +
                                                      " completed with " + ibv_wc_status_str(wcs[i].status));
    reaped_ += n;
    return success();
  }

  verbs::Context ctx_;
  verbs::CompletionChannel channel_;
  verbs::ProtectionDomain pd_;
  verbs::CompletionQueue send_cq_;
  verbs::CompletionQueue recv_cq_;
  verbs::AlignedBuffer buffer_;
  verbs::MemoryRegion mr_;
  verbs::QueuePair qp_;
  std::uint32_t size_;
  std::uint64_t sent_ = 0;
  std::uint64_t signaled_ = 0;
  std::uint64_t reaped_ = 0;
  std::uint64_t sleeps_ = 0;
};

rdma_conn_param conn_param() {
  rdma_conn_param p{};
  p.retry_count = 7;
  p.rnr_retry_count = 7;
  return p;
}

double percentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0;
  const auto rank = static_cast<std::size_t>(std::ceil(p * static_cast<double>(sorted.size())));
  return sorted[std::clamp<std::size_t>(rank, 1, sorted.size()) - 1];
}

std::string common_fields(const PingPongOptions& o, const Link& link) {
  std::ostringstream out;
  out << " device=" << link.device() << " op=send size=" << o.size << " inline=" << (link.inline_send() ? 1 : 0)
      << " warmup=" << o.warmup << " iterations=" << o.iterations;
  return out.str();
}

int run_server(const PingPongOptions& o, std::chrono::milliseconds timeout) {
  verbs::EventChannel events;
  verbs::CmId listener(events);
  listener.bind_and_listen(o.server, o.port, 1);
  std::cout << "verbs-pingpong role=server listening=" << o.server << ":" << listener.local_port() << std::endl;
  verbs::ConnectRequest request = listener.next_request(timeout);
  Link link(request.id, o.size);
  request.id.accept(conn_param(), timeout);
  const std::uint64_t messages = o.warmup + o.iterations;
  for (std::uint64_t i = 0; i < messages; ++i) {
    check(link.receive(timeout));
    check(link.send(i + 1 == messages));
  }
  check(link.flush(timeout));
  request.id.disconnect(timeout);
  std::cout << "verbs-pingpong role=server" << common_fields(o, link) << " messages=" << messages
            << " sleeps=" << link.sleeps() << std::endl;
  return 0;
}

int run_client(const PingPongOptions& o, std::chrono::milliseconds timeout) {
  verbs::EventChannel events;
  verbs::CmId id(events);
  id.resolve(o.client, o.port, timeout);
  Link link(id, o.size);
  (void)id.connect(conn_param(), timeout);
  std::vector<double> half_rtt_us;
  half_rtt_us.reserve(o.iterations);
  const std::uint64_t messages = o.warmup + o.iterations;
  for (std::uint64_t i = 0; i < messages; ++i) {
    if (o.gap_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(o.gap_ms));
    const auto t0 = Clock::now();
    check(link.send(i + 1 == messages));
    check(link.receive(timeout));
    const auto t1 = Clock::now();
    if (i >= o.warmup) half_rtt_us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / 2);
  }
  check(link.flush(timeout));
  id.disconnect(timeout);
  std::sort(half_rtt_us.begin(), half_rtt_us.end());
  double sum = 0;
  for (const double v : half_rtt_us) sum += v;
  std::cout << "verbs-pingpong role=client" << common_fields(o, link) << " gap_ms=" << o.gap_ms << " samples=" << half_rtt_us.size()
            << " latency_min_us=" << percentile(half_rtt_us, 0) << " latency_p50_us=" << percentile(half_rtt_us, 0.5)
            << " latency_p99_us=" << percentile(half_rtt_us, 0.99) << " latency_max_us=" << half_rtt_us.back()
            << " latency_mean_us=" << sum / static_cast<double>(half_rtt_us.size())
            << " messages=" << messages << " sleeps=" << link.sleeps() << std::endl;
  return 0;
}

}  // namespace
}  // namespace rdmaring::bench

namespace rdmaring::tools {

Command add_verbs_pingpong_command(CLI::App& parent) {
  auto o = std::make_shared<bench::PingPongOptions>();
  CLI::App* app = parent.add_subcommand(
      "verbs-pingpong", "raw verbs SEND ping-pong, both sides asleep on a completion channel, optional lull before each ping");
  CLI::Option* server = app->add_option("--server", o->server, "listen on this address (an RDMA device's) and answer");
  CLI::Option* client = app->add_option("--client", o->client, "connect to the server at this address and time the pings");
  server->excludes(client);
  app->add_option("-p,--port", o->port, "rdma_cm port")->required()->check(CLI::Range(1, 65535));
  app->add_option("--gap-ms", o->gap_ms, "client: sleep this long before each ping")
      ->transform(whole_number())
      ->capture_default_str();
  app->add_option("--iterations", o->iterations, "timed round trips")->transform(whole_number(1))->capture_default_str();
  app->add_option("--warmup", o->warmup, "round trips before them, not counted")->transform(whole_number())->capture_default_str();
  app->add_option("--size", o->size, "message bytes")->check(CLI::Range(1, 65536))->capture_default_str();
  app->add_option("--timeout", o->timeout_s, "seconds any one step (connect, a message) may take: more than the gap")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  return {app, [o] {
            if (o->server.empty() == o->client.empty())
              throw CLI::ValidationError("one of --server ADDR or --client ADDR");
            const auto timeout = std::chrono::ceil<std::chrono::milliseconds>(std::chrono::duration<double>(o->timeout_s));
            return o->server.empty() ? bench::run_client(*o, timeout) : bench::run_server(*o, timeout);
          }};
}

}  // namespace rdmaring::tools
