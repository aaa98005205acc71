// A test that cannot run where it is must show as skipped, never as passed: Catch2 v2 has no
// SKIP, and a test case that returns early passes. RDMARING_SKIP prints a marker line that
// ctest's SKIP_REGULAR_EXPRESSION (set for every discovered test in tests/CMakeLists.txt)
// recognises, then leaves the test case.
#pragma once

#include <iostream>
#include <string_view>

namespace rdmaring::test {

// Kept in step with SKIP_REGULAR_EXPRESSION in tests/CMakeLists.txt.
inline constexpr std::string_view kSkipMarker = "RDMARING-SKIP: ";

inline void announce_skip(std::string_view reason) {
  // std::endl: the line must be in ctest's capture even if the process dies right after.
  std::cout << kSkipMarker << reason << std::endl;
}

}  // namespace rdmaring::test

// In a TEST_CASE's own body, before its first assertion: ctest reports a run whose output has the
// marker as skipped whatever else failed in it, so nothing may be checked before the decision.
#define RDMARING_SKIP(reason)                     \
  do {                                            \
    ::rdmaring::test::announce_skip(reason);      \
    return;                                       \
  } while (false)
