// The address of the verbs device the tests run on (set by tests/softroce/on-device).
#pragma once

#include <catch2/catch.hpp>

#include <cstdlib>
#include <string>

inline std::string device_address() {
  const char* a = std::getenv("RDMARING_ADDR");
  // Never a silent skip: without a device address these tests cannot mean anything.
  if (a == nullptr || *a == '\0')
    FAIL("RDMARING_ADDR is not set: run under tests/softroce/on-device or set it to a local RDMA address");
  return a;
}
