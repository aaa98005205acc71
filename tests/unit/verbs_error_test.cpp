// The verbs layer's error reporting and object descriptions, checked without a device.
#include "rdmaring/verbs/context.hpp"
#include "rdmaring/verbs/error.hpp"
#include "rdmaring/verbs/event_channel.hpp"
#include "rdmaring/verbs/mr.hpp"

#include <catch2/catch.hpp>

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

using namespace rdmaring;
using namespace rdmaring::verbs;
using Catch::Matchers::Contains;

namespace {

// A stand-in for an ibv_get_device_list() entry: select_device only reads the name.
ibv_device fake_device(const char* name) {
  ibv_device dev{};
  std::strncpy(dev.name, name, sizeof dev.name - 1);
  return dev;
}

}  // namespace

TEST_CASE("verbs_error carries the call, the object and the errno", "[verbs][error]") {
  const Error e = verbs_error("ibv_post_send", describe_qp(0x1a, "rxe0"), EINVAL);
  CHECK(e == errc::verbs_failure);
  CHECK(e.sys_errno == EINVAL);
  CHECK(e.context == "ibv_post_send(qp 0x1a on rxe0)");
  CHECK_THAT(e.message(), Contains("ibv_post_send(qp 0x1a on rxe0)") && Contains("errno 22"));
}

TEST_CASE("throw_verbs throws the same error as a SetupError", "[verbs][error]") {
  try {
    throw_verbs("ibv_alloc_pd", "rxe0", ENOMEM);
    FAIL("throw_verbs returned");
  } catch (const SetupError& e) {
    CHECK(e.error() == errc::verbs_failure);
    CHECK(e.error().sys_errno == ENOMEM);
    CHECK(e.error().context == "ibv_alloc_pd(rxe0)");
    CHECK_THAT(std::string(e.what()), Contains("ibv_alloc_pd(rxe0)"));
  }
}

TEST_CASE("objects are described in one shape", "[verbs][error]") {
  CHECK(describe_bytes(4194304) == "4194304 B");
  CHECK(describe_object("pd", "rxe0") == "pd on rxe0");
  CHECK(describe_qp(0x11, "mlx5_0") == "qp 0x11 on mlx5_0");
  const auto* addr = reinterpret_cast<const void*>(std::uintptr_t{0x7f0000001000});
  CHECK(describe_mr(addr, 4096, "rxe0") == "mr 4096 B at 0x7f0000001000 on rxe0");
}

TEST_CASE("a failed post names the first WR not posted", "[verbs][error]") {
  std::array<ibv_send_wr, 3> wrs{};
  wrs[0].wr_id = 0x10;
  wrs[0].next = &wrs[1];
  wrs[1].wr_id = 0x11;
  wrs[1].next = &wrs[2];
  wrs[2].wr_id = 0x12;

  const Error e = post_error("ibv_post_send", "qp 0x1a on rxe0", ENOMEM, &wrs[0],
                             static_cast<const ibv_send_wr*>(&wrs[2]));
  CHECK(e == errc::verbs_failure);
  CHECK(e.sys_errno == ENOMEM);
  CHECK(e.context == "ibv_post_send(qp 0x1a on rxe0) at WR #2 (wr_id 0x12)");

  ibv_send_wr stray{};
  const Error off_list = post_error("ibv_post_send", "qp 0x1a on rxe0", EINVAL, &wrs[0],
                                    static_cast<const ibv_send_wr*>(&stray));
  CHECK_THAT(off_list.context, Contains("not on the posted list"));
}

TEST_CASE("memlock shortfall names RLIMIT_MEMLOCK, the limit and the size", "[verbs][memlock]") {
  const std::string mr = describe_mr(nullptr, 4194304, "rxe0");

  SECTION("a zero limit refuses any registration") {
    const auto e = memlock_shortfall({.cap_ipc_lock = false, .soft_limit = 0, .pinned = 0},
                                     4194304, mr);
    REQUIRE(e);
    CHECK(*e == errc::memlock_too_low);
    CHECK_THAT(e->context, Contains("ibv_reg_mr(" + mr + ")") &&
                               Contains("RLIMIT_MEMLOCK is 0 B") &&
                               Contains("registration of 4194304 B needs 4194304 B more") &&
                               Contains("ulimit -l"));
  }
  SECTION("pages already pinned count against the limit") {
    const auto e = memlock_shortfall(
        {.cap_ipc_lock = false, .soft_limit = 8 << 20, .pinned = 6 << 20}, 4 << 20, mr);
    REQUIRE(e);
    CHECK_THAT(e->context, Contains("RLIMIT_MEMLOCK is 8388608 B with 6291456 B already pinned") &&
                               Contains("needs 2097152 B more"));
  }
  SECTION("exactly at the limit fits") {
    CHECK_FALSE(memlock_shortfall({.cap_ipc_lock = false, .soft_limit = 8 << 20, .pinned = 4 << 20},
                                  4 << 20, mr));
  }
  SECTION("CAP_IPC_LOCK or an unlimited limit always fits") {
    CHECK_FALSE(memlock_shortfall({.cap_ipc_lock = true, .soft_limit = 0, .pinned = 0}, 1 << 30, mr));
    CHECK_FALSE(memlock_shortfall({.cap_ipc_lock = false, .soft_limit = std::nullopt, .pinned = 0},
                                  1 << 30, mr));
  }
}

TEST_CASE("read_memlock_state reports this process's soft limit", "[verbs][memlock]") {
  rlimit lim{};
  REQUIRE(getrlimit(RLIMIT_MEMLOCK, &lim) == 0);
  const MemlockState state = read_memlock_state();
  if (lim.rlim_cur == RLIM_INFINITY) {
    CHECK_FALSE(state.soft_limit);
  } else {
    CHECK(state.soft_limit == lim.rlim_cur);
  }
}

TEST_CASE("select_device without devices says none was found and how to get one",
          "[verbs][device]") {
  try {
    select_device({}, "", ENOSYS);
    FAIL("select_device returned");
  } catch (const SetupError& e) {
    CHECK(e.error() == errc::no_device);
    CHECK(e.error().sys_errno == ENOSYS);
    CHECK_THAT(std::string(e.what()),
               Contains("no RDMA device found") && Contains("rdma_rxe") && Contains("Soft-RoCE"));
  }
}

TEST_CASE("select_device picks by name, or the first device", "[verbs][device]") {
  ibv_device mlx = fake_device("mlx5_0");
  ibv_device rxe = fake_device("rxe0");
  const std::array<ibv_device*, 2> devices{&mlx, &rxe};

  CHECK(&select_device(devices, "") == &mlx);
  CHECK(&select_device(devices, "rxe0") == &rxe);
  try {
    select_device(devices, "siw0");
    FAIL("select_device returned");
  } catch (const SetupError& e) {
    CHECK(e.error() == errc::no_device);
    CHECK_THAT(std::string(e.what()), Contains("'siw0'") && Contains("mlx5_0, rxe0"));
  }
}

TEST_CASE("an unexpected CM event is named with the expected one", "[verbs][cm]") {
  const Error e = unexpected_event_error("rdma_resolve_addr", "cm id -> 169.254.0.1:7471",
                                         RDMA_CM_EVENT_ADDR_RESOLVED, RDMA_CM_EVENT_ADDR_ERROR,
                                         -ETIMEDOUT, true);
  CHECK(e == errc::verbs_failure);
  CHECK(e.sys_errno == ETIMEDOUT);
  CHECK(e.context ==
        "rdma_resolve_addr(cm id -> 169.254.0.1:7471): expected RDMA_CM_EVENT_ADDR_RESOLVED, got "
        "RDMA_CM_EVENT_ADDR_ERROR (status -110)");

  const Error rejected = unexpected_event_error("rdma_connect", "cm id", RDMA_CM_EVENT_ESTABLISHED,
                                                RDMA_CM_EVENT_REJECTED, 28, false);
  CHECK(rejected.sys_errno == 0);  // a reject reason, not an errno
  CHECK_THAT(rejected.context, Contains("RDMA_CM_EVENT_REJECTED (status 28) for another cm id"));
}

TEST_CASE("AlignedBuffer is page-aligned and zeroed", "[verbs][buffer]") {
  const auto page = static_cast<std::uintptr_t>(sysconf(_SC_PAGESIZE));
  AlignedBuffer buf(5000);
  CHECK(buf.size() == 5000);
  CHECK(reinterpret_cast<std::uintptr_t>(buf.data()) % page == 0);
  CHECK(std::all_of(buf.bytes().begin(), buf.bytes().end(), [](std::byte b) { return b == std::byte{0}; }));

  AlignedBuffer moved = std::move(buf);
  CHECK(moved.size() == 5000);
}
