// The verbs layer on a real device (Soft-RoCE in tests/softroce/guest-run, or a host RNIC):
// a connection made through rdma_cm, an RDMA WRITE WITH IMMEDIATE that lands, a write with a
// revoked rkey that must not, and the registration checks that only a kernel can confirm.
//
// The environment names the device: RDMARING_ADDR (an address rdma_cm can bind on the device),
// RDMARING_DEVICE, RDMARING_DEVINFO (ibv_devinfo output). An unset variable fails the test: a
// device test that skips itself would pass on a machine that tested nothing.
#include "rdmaring/verbs/cm_id.hpp"
#include "rdmaring/verbs/context.hpp"
#include "rdmaring/verbs/cq.hpp"
#include "rdmaring/verbs/event_channel.hpp"
#include "rdmaring/verbs/mr.hpp"
#include "rdmaring/verbs/pd.hpp"
#include "rdmaring/verbs/qp.hpp"

#include <catch2/catch.hpp>

#include "memlock_sandbox.hpp"

#include <arpa/inet.h>
#include <linux/capability.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <future>
#include <iostream>
#include <iterator>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

using namespace rdmaring;
using namespace rdmaring::verbs;
using namespace std::chrono_literals;

namespace {

// Generous: the guest emulates its CPU (TCG), where a CM round trip takes milliseconds.
constexpr std::chrono::milliseconds kSetupTimeout = 10s;
constexpr std::chrono::milliseconds kCompletionTimeout = 5s;
constexpr std::size_t kPayload = 4096;
constexpr std::uint32_t kImmediate = 0xC0FFEE42;
constexpr QueuePairCaps kCaps{.max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1,
                              .max_recv_sge = 1, .max_inline_data = 64};

std::string require_env(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') {
    FAIL(name << " is not set: run this test inside tests/softroce/guest-run, or set it for the "
                 "RDMA device of this host");
  }
  return value;
}

void require_ok(const Result<void>& r) {
  if (!r) FAIL(r.error().message());
}

// Busy-polls `cq` for one completion until `timeout` passes.
std::optional<ibv_wc> poll_one(CompletionQueue& cq, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  ibv_wc wc{};
  do {
    Result<std::size_t> n = cq.poll({&wc, 1});
    if (!n) FAIL(n.error().message());
    if (n.value() == 1) return wc;
    std::this_thread::yield();
  } while (std::chrono::steady_clock::now() < deadline);
  return std::nullopt;
}

ibv_wc wait_one(CompletionQueue& cq, const char* what) {
  std::optional<ibv_wc> wc = poll_one(cq, kCompletionTimeout);
  if (!wc) FAIL("no completion for " << what << " on " << cq.describe() << " within 5 s");
  return *wc;
}

// One side of the connection: everything hangs off the cm id, in destruction order (the QP
// before the MR, CQ and PD it uses; the MR before its buffer).
struct Endpoint {
  Endpoint(CmId cm_id, int access)
      : id(std::move(cm_id)),
        context(id.context()),
        pd(context),
        cq(context, 16),
        buffer(kPayload),
        mr(std::in_place, pd, buffer.data(), buffer.size(), access),
        qp(id, pd, cq, cq, kCaps) {}

  CmId id;
  Context context;
  ProtectionDomain pd;
  CompletionQueue cq;
  AlignedBuffer buffer;
  std::optional<MemoryRegion> mr;
  QueuePair qp;
};

// What the server tells the client in its accept's private data.
struct RemoteRegion {
  std::uint64_t addr;
  std::uint32_t rkey;
  std::uint32_t length;
};

ibv_qp_state qp_state(const QueuePair& qp) {
  ibv_qp_attr attr{};
  ibv_qp_init_attr init{};
  REQUIRE(ibv_query_qp(qp.get(), &attr, IBV_QP_STATE, &init) == 0);
  return attr.qp_state;
}

void fill(std::span<std::byte> bytes, unsigned seed) {
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = std::byte((i * 131 + seed) & 0xff);
}

// Whatever else arrived on a channel (e.g. TIMEWAIT_EXIT), for the log.
std::string drain(EventChannel& channel) {
  std::string names;
  while (Result<CmEvent> ev = channel.next(200ms)) names += std::string(" ") + ev.value().name();
  return names.empty() ? " (none)" : names;
}


}  // namespace

TEST_CASE("the device under test is shown", "[softroce]") {
  const std::string path = require_env("RDMARING_DEVINFO");
  std::ifstream in(path);
  REQUIRE(in);
  const std::string devinfo{std::istreambuf_iterator<char>(in), {}};
  std::cout << "--- " << path << " ---\n" << devinfo << "---\n";
  REQUIRE_FALSE(devinfo.empty());

  const Context device = Context::open(require_env("RDMARING_DEVICE"));
  std::cout << to_string(device.query_caps()) << "\n";
}

TEST_CASE("write with immediate lands over rdma_cm and a revoked rkey is refused", "[softroce]") {
  const std::string addr = require_env("RDMARING_ADDR");

  EventChannel server_channel;
  EventChannel client_channel;
  CmId listener(server_channel);
  listener.bind_and_listen(addr, 0, 1);
  const std::uint16_t port = listener.local_port();
  REQUIRE(port != 0);

  // The server half runs beside the client's connect, which blocks until the accept. It touches
  // no Catch2 macro (they are not thread-safe): failures come back through the future.
  std::size_t request_private_data_len = 0;
  auto accepted = std::async(std::launch::async, [&] {
    ConnectRequest request = listener.next_request(kSetupTimeout);
    request_private_data_len = request.private_data.size();
    auto server = std::make_unique<Endpoint>(std::move(request.id),
                                             IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    ibv_recv_wr recv{};  // no SGE: a WRITE WITH IMM consumes a receive but places no data in it
    recv.wr_id = 100;
    if (Result<void> r = server->qp.post_recv(recv); !r) throw SetupError(r.error());
    const RemoteRegion region{reinterpret_cast<std::uintptr_t>(server->buffer.data()),
                              server->mr->rkey(), static_cast<std::uint32_t>(kPayload)};
    rdma_conn_param param{};
    param.private_data = &region;
    param.private_data_len = sizeof region;
    server->id.accept(param, kSetupTimeout);
    return server;
  });

  CmId client_id(client_channel);
  client_id.resolve(addr, port, kSetupTimeout);
  Endpoint client(std::move(client_id), IBV_ACCESS_LOCAL_WRITE);
  std::cout << to_string(client.context.query_caps()) << "\n"
            << "max_inline_data asked " << kCaps.max_inline_data << ", granted "
            << client.qp.max_inline_data() << "\n";

  const char hello[] = "rdmaring smoke";
  rdma_conn_param param{};
  param.private_data = hello;
  param.private_data_len = sizeof hello;
  param.retry_count = 7;
  param.rnr_retry_count = 7;
  const std::vector<std::byte> accept_data = client.id.connect(param, kSetupTimeout);
  REQUIRE(accepted.wait_for(kSetupTimeout) == std::future_status::ready);
  const std::unique_ptr<Endpoint> server = accepted.get();
  std::cout << "private data: sent " << sizeof hello << " B, server got " << request_private_data_len
            << " B; server sent " << sizeof(RemoteRegion) << " B, client got " << accept_data.size()
            << " B\n"
            << "connected: " << client.id.describe() << " (" << client.qp.describe() << ") <-> "
            << server->id.describe() << " (" << server->qp.describe() << ")\n";
  REQUIRE(accept_data.size() >= sizeof(RemoteRegion));
  RemoteRegion region{};
  std::memcpy(&region, accept_data.data(), sizeof region);
  REQUIRE(region.rkey == server->mr->rkey());

  ibv_sge sge{reinterpret_cast<std::uintptr_t>(client.buffer.data()),
              static_cast<std::uint32_t>(kPayload), client.mr->lkey()};
  ibv_send_wr write{};
  write.sg_list = &sge;
  write.num_sge = 1;
  write.send_flags = IBV_SEND_SIGNALED;
  write.wr.rdma.remote_addr = region.addr;
  write.wr.rdma.rkey = region.rkey;

  SECTION("the written bytes and the immediate arrive") {
    fill(client.buffer.bytes(), 1);
    write.wr_id = 1;
    write.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
    write.imm_data = htonl(kImmediate);
    require_ok(client.qp.post_send(write));

    const ibv_wc sent = wait_one(client.cq, "the client's WRITE WITH IMM");
    INFO("client completion: " << ibv_wc_status_str(sent.status));
    CHECK(sent.status == IBV_WC_SUCCESS);
    CHECK(sent.wr_id == 1);

    const ibv_wc received = wait_one(server->cq, "the server's receive");
    INFO("server completion: " << ibv_wc_status_str(received.status));
    REQUIRE(received.status == IBV_WC_SUCCESS);
    CHECK(received.wr_id == 100);
    CHECK(received.opcode == IBV_WC_RECV_RDMA_WITH_IMM);
    CHECK((received.wc_flags & IBV_WC_WITH_IMM) != 0);
    CHECK(ntohl(received.imm_data) == kImmediate);
    CHECK(received.byte_len == kPayload);
    CHECK(std::ranges::equal(server->buffer.bytes(), client.buffer.bytes()));
  }

  SECTION("a write with a revoked rkey fails and changes nothing") {
    fill(server->buffer.bytes(), 7);
    const std::vector<std::byte> before(server->buffer.bytes().begin(), server->buffer.bytes().end());
    // Re-registering the same memory revokes the old rkey: the window the client was given is
    // closed while the memory stays registered.
    const std::uint32_t old_rkey = server->mr->rkey();
    server->mr.reset();
    server->mr.emplace(server->pd, server->buffer.data(), kPayload,
                       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    REQUIRE(server->mr->rkey() != old_rkey);
    // Shows, in the log, what a remote access error does to the responder's QP.
    ibv_recv_wr recv{};
    recv.wr_id = 101;
    require_ok(server->qp.post_recv(recv));

    fill(client.buffer.bytes(), 99);
    write.wr_id = 2;
    write.opcode = IBV_WR_RDMA_WRITE;
    write.wr.rdma.rkey = old_rkey;
    require_ok(client.qp.post_send(write));

    const ibv_wc refused = wait_one(client.cq, "the client's write with the revoked rkey");
    INFO("client completion: " << ibv_wc_status_str(refused.status));
    CHECK(refused.wr_id == 2);
    CHECK(refused.status == IBV_WC_REM_ACCESS_ERR);
    CHECK(qp_state(client.qp) == IBV_QPS_ERR);
    CHECK(std::ranges::equal(server->buffer.bytes(), before));

    const std::optional<ibv_wc> responder = poll_one(server->cq, 1s);
    std::cout << "after the refused write: client qp state " << qp_state(client.qp)
              << ", server qp state " << qp_state(server->qp) << ", server completion "
              << (responder ? ibv_wc_status_str(responder->status) : "none") << "\n";
  }

  // Either side may start the disconnect; the other answers, so both run at once.
  auto server_gone = std::async(std::launch::async, [&] { server->id.disconnect(kSetupTimeout); });
  const auto start = std::chrono::steady_clock::now();
  client.id.disconnect(kSetupTimeout);
  REQUIRE(server_gone.wait_for(kSetupTimeout) == std::future_status::ready);
  server_gone.get();
  std::cout << "disconnected in "
            << std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start).count()
            << " ms; later events: client" << drain(client_channel) << ", server"
            << drain(server_channel) << "\n";
}

TEST_CASE("registration respects RLIMIT_MEMLOCK as the kernel counts it", "[softroce]") {
  const Context device = Context::open(require_env("RDMARING_DEVICE"));
  const ProtectionDomain pd(device);
  AlignedBuffer fits(64 * 1024);
  AlignedBuffer extra(4096);
  const int access = IBV_ACCESS_LOCAL_WRITE;

  const MemlockSandbox sandbox(read_memlock_state().pinned + fits.size());
  REQUIRE_FALSE(read_memlock_state().cap_ipc_lock);

  const MemoryRegion first(pd, fits.data(), fits.size(), access);
  try {
    const MemoryRegion second(pd, extra.data(), extra.size(), access);
    FAIL("registered beyond RLIMIT_MEMLOCK");
  } catch (const SetupError& e) {
    INFO(e.what());
    CHECK(e.error() == errc::memlock_too_low);
    CHECK_THAT(std::string(e.what()), Catch::Matchers::Contains("RLIMIT_MEMLOCK"));
  }
  // The kernel agrees: the check above refused what ibv_reg_mr itself would refuse.
  ibv_mr* raw = ibv_reg_mr(pd.get(), extra.data(), extra.size(), access);
  const int reg_errno = raw == nullptr ? errno : 0;
  if (raw != nullptr) ibv_dereg_mr(raw);
  CHECK(raw == nullptr);
  CHECK(reg_errno == ENOMEM);
}

TEST_CASE("on-demand paging is refused clearly where the device has none", "[softroce]") {
  const Context device = Context::open(require_env("RDMARING_DEVICE"));
  const ProtectionDomain pd(device);
  AlignedBuffer buffer(kPayload);
  const bool supported = device.query_caps().odp_rc_write;
  INFO(device.name() << " ODP for RC WRITE: " << (supported ? "yes" : "no"));
  try {
    const MemoryRegion odp(pd, buffer.data(), buffer.size(),
                           IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE, true);
    CHECK(supported);
  } catch (const SetupError& e) {
    INFO(e.what());
    CHECK_FALSE(supported);
    CHECK(e.error() == errc::odp_unsupported);
    CHECK_THAT(std::string(e.what()), Catch::Matchers::Contains(std::string(device.name())));
  }
}

TEST_CASE("the device grants at least the inline size asked for", "[softroce]") {
  const std::string addr = require_env("RDMARING_ADDR");
  EventChannel channel;
  CmId id(channel);
  // Route resolution needs no listener: it only picks the device and the path.
  id.resolve(addr, 9, kSetupTimeout);
  const Context context = id.context();
  const ProtectionDomain pd(context);
  const CompletionQueue cq(context, 4);
  QueuePairCaps caps = kCaps;
  // One QP at a time on the id: each is destroyed before the next is created.
  for (std::uint32_t asked : {0U, 1U, 64U, 256U}) {
    caps.max_inline_data = asked;
    const QueuePair qp(id, pd, cq, cq, caps);
    std::cout << "max_inline_data asked " << asked << ", granted " << qp.max_inline_data() << "\n";
    CHECK(qp.max_inline_data() >= asked);
  }
  // No device inlines a megabyte: the refusal is a SetupError with the provider's errno.
  caps.max_inline_data = 1 << 20;
  try {
    const QueuePair qp(id, pd, cq, cq, caps);
    FAIL("a 1 MiB inline size was granted: " << qp.max_inline_data());
  } catch (const SetupError& e) {
    INFO(e.what());
    CHECK(e.error() == errc::verbs_failure);
    CHECK(e.error().sys_errno == EINVAL);
  }
}
