// Errors of the data plane and of set-up.
//
// The data path returns Result<T> (Boost.Outcome) so a full ring or a dead QP is a value the
// caller branches on, not an exception. Set-up (registration, connect) throws SetupError,
// because nothing useful can run on a half-built connection. Both carry an Error: a code the
// caller can compare against `errc` or an errno, and the context a human needs (which verbs call,
// on which object) to act on it.
#pragma once

#include <boost/outcome/bad_access.hpp>
#include <boost/outcome/policy/base.hpp>
#include <boost/outcome/result.hpp>
#include <boost/outcome/try.hpp>

#include <stdexcept>
#include <string>
#include <system_error>
#include <utility>

namespace rdmaring {

enum class errc {
  would_block = 1,          // no ring space (or SQ slots) now; retry after progress
  timed_out,                // a blocking call's deadline passed
  record_too_large,         // record span exceeds the configured maximum or the ring
  bad_config,               // a configuration value is out of range
  relaxed_ordering_refused, // relaxed ordering asked for where the publish mode forbids it
  odp_unsupported,          // on-demand paging asked for, device has none
  memlock_too_low,          // RLIMIT_MEMLOCK below what registration needs
  verbs_failure,            // a verbs/rdma_cm call failed (errno in Error::sys_errno)
  completion_error,         // a work completion with a status other than IBV_WC_SUCCESS
  protocol_violation,       // the peer broke the wire protocol (bad check, bad sequence, ...)
  stale_epoch,              // a message from an older epoch
  no_claim,                 // commit()/abort() without an open claim
  claim_open,               // a second claim(), or send() while a claim is open
  no_device,                // no verbs device to open
  invalid_argument,         // a call's argument is outside what the call accepts
  unknown_session,          // a session the ring owner does not know (never attached, closed, expired)
  bad_proof,                // a session proof that does not match the session secret
  no_capacity,              // the ring owner's session limit is reached
  ring_changed,             // the ring owner restarted with another ring geometry or mode
  control_failure,          // the control channel failed (connection refused or cut, malformed message)
  owner_lost,               // the ring owner stopped answering heartbeats: recover() when it is back
  closed,                   // the object was stopped; it takes no more work
  system_failure,           // a system call failed (epoll, eventfd: errno in Error::sys_errno)
  unauthenticated,          // a control message bound to no channel (no hello on its connection)
  unauthorized,             // the identity matches no allow rule, or the session is another identity's
  quota_exceeded,           // the identity's allow rule admits no more sessions or ring bytes
};

const std::error_category& rdmaring_category() noexcept;
std::error_code make_error_code(errc e) noexcept;

// What failed: the code, the errno of the failing call (0 if none), and a one-line context
// naming the call and object ("ibv_post_send(qp 0x11 on rxe0)"). The code is the enum itself,
// not a std::error_code (make_error_code(code) makes one): every Result carries an Error beside
// its value (Boost.Outcome 2.1), and a default std::error_code is a call into the C++ runtime
// (system_category()) in each, which showed in the guest's profile of the data path.
struct Error {
  errc code{};
  int sys_errno = 0;
  std::string context;

  std::string message() const;
  bool operator==(errc e) const noexcept { return code == e; }
};

Error make_error(errc e, std::string context = {}, int sys_errno = 0);

// Thrown by set-up code; what() is Error::message().
class SetupError : public std::runtime_error {
 public:
  explicit SetupError(Error e);
  const Error& error() const noexcept { return error_; }

 private:
  Error error_;
};

// Thrown by Result<T>::value() on a Result that holds an Error: an application that unwraps
// with value() (rather than branching) gets the Error it ignored, as an exception it can catch,
// instead of a terminated process. A SetupError, so set-up code that unwraps fails as set-up does.
class BadResultAccess : public SetupError {
 public:
  explicit BadResultAccess(Error e) : SetupError(std::move(e)) {}
};

// Result's checks of the wide observers (value(), error()): one branch each, on the state the
// caller has usually tested already, so the data path pays nothing more than it did.
struct ResultPolicy : boost::outcome_v2::policy::base {
  template <class Impl>
  static constexpr void wide_value_check(Impl&& self) {
    if (!base::_has_value(self)) [[unlikely]] throw BadResultAccess(base::_error(self));
  }
  // error() on a success is a bug in the caller, not a runtime failure: a std::logic_error.
  template <class Impl>
  static constexpr void wide_error_check(Impl&& self) {
    if (!base::_has_error(self)) [[unlikely]] throw boost::outcome_v2::bad_result_access("Result::error() on a success");
  }
};

using boost::outcome_v2::success;

template <class T>
using Result = boost::outcome_v2::result<T, Error, ResultPolicy>;

// Whether `e` (from a producer's send, progress, flush or drain) calls for recover(): the
// connection died (completion_error, verbs_failure of a post), the owner stopped answering
// (owner_lost), or it no longer knows the session (unknown_session: it restarted, and recover()
// restores the session if its application keeps durable records; otherwise recover() fails with
// unknown_session again and the session is gone).
inline bool needs_recover(const Error& e) {
  return e == errc::completion_error || e == errc::owner_lost || e == errc::unknown_session ||
         e == errc::verbs_failure;
}

}  // namespace rdmaring

template <>
struct std::is_error_code_enum<rdmaring::errc> : std::true_type {};
