// How the verbs layer reports failures, and how it names the objects involved.
//
// A verbs or rdma_cm failure is always errc::verbs_failure with the provider's errno kept in
// Error::sys_errno, so callers branch on one code and still see what the kernel said. The
// context is "CALL(OBJECT)", where OBJECT comes from the describe_* helpers below: one spelling
// for each kind of object, so logs of set-up and of the data path can be grepped together.
#pragma once

#include "rdmaring/error.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace rdmaring::verbs {

// Throws SetupError{errc::verbs_failure, sys_errno = err, context "CALL(OBJECT)"}.
// Assumes: err is the errno the call reported (positive); 0 is kept as is.
[[noreturn]] void throw_verbs(const char* call, const std::string& object, int err);

// The same Error as a value, for the data path (Result<T>). Never fails.
Error verbs_error(const char* call, const std::string& object, int err);

// Error for a post that failed part-way: names the failing work request by its position in
// the list and its wr_id, because every WR before it was posted and will complete.
// Assumes: `bad` is the bad_wr the post call returned and lies on the list starting at `first`
// (when it does not, the position is reported as unknown).
template <class WorkRequest>
Error post_error(const char* call, const std::string& object, int err, const WorkRequest* first,
                 const WorkRequest* bad);

// "4194304 B": sizes are printed exact, since limits are compared byte for byte.
std::string describe_bytes(std::uint64_t n);

// "<object> on <device>", e.g. "pd on rxe0". Every describe_* result has this shape.
std::string describe_object(std::string_view object, std::string_view device);

// "qp 0x1a on rxe0": QP numbers in hex, as ibv_devinfo and the kernel print them.
std::string describe_qp(std::uint32_t qp_num, std::string_view device);

// "mr 4194304 B at 0x7f0000000000 on rxe0".
std::string describe_mr(const void* addr, std::size_t length, std::string_view device);

namespace detail {
std::string describe_bad_wr(std::size_t index, std::uint64_t wr_id);
std::string describe_unknown_bad_wr();
}  // namespace detail

template <class WorkRequest>
Error post_error(const char* call, const std::string& object, int err, const WorkRequest* first,
                 const WorkRequest* bad) {
  Error e = verbs_error(call, object, err);
  std::size_t index = 0;
  for (const WorkRequest* wr = first; wr != nullptr; wr = wr->next, ++index) {
    if (wr == bad) {
      e.context += detail::describe_bad_wr(index, wr->wr_id);
      return e;
    }
  }
  e.context += detail::describe_unknown_bad_wr();
  return e;
}

}  // namespace rdmaring::verbs
