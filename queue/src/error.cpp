#include "rdmaring/error.hpp"

#include <cstring>

namespace rdmaring {
namespace {

class Category final : public std::error_category {
 public:
  const char* name() const noexcept override { return "rdmaring"; }
  std::string message(int v) const override {
    switch (static_cast<errc>(v)) {
      case errc::would_block: return "no ring space now (would block)";
      case errc::timed_out: return "timed out";
      case errc::record_too_large: return "record larger than the maximum record size";
      case errc::bad_config: return "bad configuration";
      case errc::relaxed_ordering_refused: return "relaxed ordering refused";
      case errc::odp_unsupported: return "on-demand paging not supported by the device";
      case errc::memlock_too_low: return "RLIMIT_MEMLOCK too low for the registration";
      case errc::verbs_failure: return "verbs call failed";
      case errc::completion_error: return "work completion with error status";
      case errc::protocol_violation: return "protocol violation by the peer";
      case errc::stale_epoch: return "stale epoch";
      case errc::no_claim: return "no open claim";
      case errc::claim_open: return "a claim is already open";
      case errc::no_device: return "no RDMA device";
      case errc::invalid_argument: return "invalid argument";
      case errc::unknown_session: return "unknown session";
      case errc::bad_proof: return "session proof does not match";
      case errc::no_capacity: return "ring owner has no capacity for another session";
      case errc::ring_changed: return "ring geometry or mode changed";
      case errc::control_failure: return "control channel failure";
      case errc::owner_lost: return "ring owner lost";
      case errc::closed: return "closed";
      case errc::system_failure: return "system call failed";
      case errc::unauthenticated: return "not authenticated";
      case errc::unauthorized: return "identity not authorized";
      case errc::quota_exceeded: return "identity's quota exceeded";
    }
    return "unknown rdmaring error";
  }
};

}  // namespace

const std::error_category& rdmaring_category() noexcept {
  static const Category c;
  return c;
}

std::error_code make_error_code(errc e) noexcept { return {static_cast<int>(e), rdmaring_category()}; }

std::string Error::message() const {
  std::string m = make_error_code(code).message();
  if (!context.empty()) m = context + ": " + m;
  if (sys_errno != 0) m += " (errno " + std::to_string(sys_errno) + ": " + std::strerror(sys_errno) + ")";
  return m;
}

Error make_error(errc e, std::string context, int sys_errno) {
  return Error{e, sys_errno, std::move(context)};
}

SetupError::SetupError(Error e) : std::runtime_error(e.message()), error_(std::move(e)) {}

}  // namespace rdmaring
