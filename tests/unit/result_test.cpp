// Result's policy: unwrapping an error throws what the application can catch and act on, rather
// than terminating the process.
#include "rdmaring/error.hpp"

#include <catch2/catch.hpp>

#include <cerrno>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

using namespace rdmaring;

namespace {

Result<std::uint64_t> refused() { return make_error(errc::memlock_too_low, "ibv_reg_mr(mr 4096 B on rxe0)", ENOMEM); }

// What the application sees when it unwraps `r` with value().
template <class T>
std::optional<BadResultAccess> thrown_by_value(T&& r) {
  try {
    (void)std::forward<T>(r).value();
  } catch (const BadResultAccess& e) {
    return e;
  }
  return std::nullopt;
}

void require_carries(const std::optional<BadResultAccess>& thrown, const Error& original) {
  REQUIRE(thrown);
  const BadResultAccess& e = *thrown;
  CHECK(e.error().code == original.code);
  CHECK(e.error().sys_errno == original.sys_errno);
  CHECK(e.error().context == original.context);
  CHECK(e.error() == errc::memlock_too_low);
  CHECK(std::string(e.what()) == original.message());
}

}  // namespace

TEST_CASE("value() on an error throws BadResultAccess carrying that error", "[result]") {
  const auto r = refused();
  require_carries(thrown_by_value(r), r.error());
}

TEST_CASE("value() on a moved error result throws it too, and a void result does alike", "[result]") {
  const Error original = refused().error();
  require_carries(thrown_by_value(refused()), original);
  Result<void> v = original;
  require_carries(thrown_by_value(v), original);
}

TEST_CASE("BadResultAccess is a SetupError and a std::runtime_error", "[result]") {
  const auto r = refused();
  REQUIRE_THROWS_AS(r.value(), SetupError);
  REQUIRE_THROWS_AS(r.value(), std::runtime_error);
}

TEST_CASE("value() on a success returns the value and error() on it throws a logic_error", "[result]") {
  Result<std::uint64_t> r = std::uint64_t{42};
  REQUIRE(r.value() == 42);
  REQUIRE_THROWS_AS(r.error(), boost::outcome_v2::bad_result_access);
  REQUIRE_THROWS_AS(r.error(), std::logic_error);
  Result<void> v = success();
  REQUIRE_NOTHROW(v.value());
  REQUIRE_THROWS_AS(v.error(), std::logic_error);
}
