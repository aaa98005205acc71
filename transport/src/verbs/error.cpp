#include "rdmaring/verbs/error.hpp"

#include <cstdio>

namespace rdmaring::verbs {
namespace {

std::string hex(std::uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace

void throw_verbs(const char* call, const std::string& object, int err) {
  throw SetupError(verbs_error(call, object, err));
}

Error verbs_error(const char* call, const std::string& object, int err) {
  return make_error(errc::verbs_failure, std::string(call) + "(" + object + ")", err);
}

std::string describe_bytes(std::uint64_t n) { return std::to_string(n) + " B"; }

std::string describe_object(std::string_view object, std::string_view device) {
  std::string s(object);
  s += " on ";
  s += device;
  return s;
}

std::string describe_qp(std::uint32_t qp_num, std::string_view device) {
  return describe_object("qp " + hex(qp_num), device);
}

std::string describe_mr(const void* addr, std::size_t length, std::string_view device) {
  char at[32];
  std::snprintf(at, sizeof at, "%p", addr);
  return describe_object("mr " + describe_bytes(length) + " at " + at, device);
}

namespace detail {

std::string describe_bad_wr(std::size_t index, std::uint64_t wr_id) {
  return " at WR #" + std::to_string(index) + " (wr_id " + hex(wr_id) + ")";
}

std::string describe_unknown_bad_wr() { return " at a WR not on the posted list"; }

}  // namespace detail
}  // namespace rdmaring::verbs
