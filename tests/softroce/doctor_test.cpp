// rdmaring-doctor on a real device: the text report names the device, its link layer and the
// memlock limit; --json is one object with a devices array; an unknown --device exits 1.
//
// The binary is the RDMARING_DOCTOR_BINARY environment variable when set, else the
// RDMARING_DOCTOR_BINARY compile definition when the build passes one, else the file next to
// rdmaring-bench (both are built in the build's bench/ directory).
#include <catch2/catch.hpp>

#include "../json_shape.hpp"

#include <sys/stat.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <string_view>
#include <vector>

namespace {

std::string require_env(const char* name) {
  const char* value = std::getenv(name);
  // Never a silent skip: without the device's name this test cannot mean anything.
  if (value == nullptr || *value == '\0') {
    FAIL(name << " is not set: run this test inside tests/softroce/guest-run, or set it for the RDMA device of this host");
  }
  return value;
}

std::string doctor_binary() {
  if (const char* p = std::getenv("RDMARING_DOCTOR_BINARY"); p != nullptr && *p != '\0') return p;
#ifdef RDMARING_DOCTOR_BINARY
  return RDMARING_DOCTOR_BINARY;  // when tests/CMakeLists.txt passes $<TARGET_FILE:rdmaring-doctor>
#endif
  std::string bench = RDMARING_BENCH_BINARY;
  const auto slash = bench.rfind('/');
  const std::string path = (slash == std::string::npos ? std::string(".") : bench.substr(0, slash)) + "/rdmaring-doctor";
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) FAIL(path << " does not exist: build the rdmaring-doctor target");
  return path;
}

struct Run {
  int status = -1;
  std::string out;
};

// Runs the doctor with `args`; stderr joins stdout only when `with_stderr`.
Run doctor(const std::string& args, bool with_stderr = false) {
  const std::string cmd = doctor_binary() + " " + args + (with_stderr ? " 2>&1" : "");
  Run run;
  FILE* p = popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  char buf[4096];
  while (std::fgets(buf, sizeof buf, p) != nullptr) run.out += buf;
  const int status = pclose(p);
  run.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return run;
}

bool structurally_json_object(const std::string& s) {
  const std::size_t start = s.find_first_not_of(" \n");
  return start != std::string::npos && s[start] == '{' && rdmaring::test::structurally_json(s);
}

}  // namespace

TEST_CASE("rdmaring-doctor reports the device, its link layer and memlock", "[softroce][doctor]") {
  const std::string device = require_env("RDMARING_DEVICE");
  const Run run = doctor("");
  INFO(run.out);
  std::cout << run.out;
  CHECK(run.status == 0);
  CHECK_THAT(run.out, Catch::Matchers::Contains("\ndevice " + device + "\n"));
  CHECK_THAT(run.out, Catch::Matchers::Contains("ACTIVE"));
  CHECK_THAT(run.out, Catch::Matchers::Contains("Ethernet"));
  CHECK_THAT(run.out, Catch::Matchers::Contains("\n  RLIMIT_MEMLOCK    soft "));
  CHECK_THAT(run.out, Catch::Matchers::Contains("memlock: "));
  CHECK_THAT(run.out, Catch::Matchers::Contains("payload MR relaxed, publish by imm: ok"));
  CHECK_THAT(run.out, Catch::Matchers::Contains("tail mode: relies on in-order placement (no relaxed ordering): ok"));
  // Whatever the device grants, the queue's 32 B records must fit inline.
  CHECK_THAT(run.out, Catch::Matchers::Contains("B granted >= 32 B"));
  CHECK(run.out.find("\n  FAIL") == std::string::npos);
}

TEST_CASE("rdmaring-doctor --json is one object with a devices array", "[softroce][doctor]") {
  const std::string device = require_env("RDMARING_DEVICE");
  const Run run = doctor("--json --device " + device);
  INFO(run.out);
  CHECK(run.status == 0);
  CHECK(structurally_json_object(run.out));
  CHECK_THAT(run.out, Catch::Matchers::Contains("\"devices\":[{\"name\":\"" + device + "\",\"usable\":true"));
  CHECK_THAT(run.out, Catch::Matchers::Contains("\"usable_devices\":1"));
  CHECK_THAT(run.out, Catch::Matchers::Contains("\"link_layer\":\"Ethernet\""));
  CHECK_THAT(run.out, Catch::Matchers::Contains("\"memlock\":{\"soft\":"));
  CHECK_THAT(run.out, Catch::Matchers::Contains("\"verdicts\":[{\"level\":"));
}

TEST_CASE("rdmaring-doctor --device with an unknown name exits 1 naming what is present", "[softroce][doctor]") {
  const std::string device = require_env("RDMARING_DEVICE");
  const Run run = doctor("--device no-such-device", true);
  INFO(run.out);
  CHECK(run.status == 1);
  CHECK_THAT(run.out, Catch::Matchers::Contains("no RDMA device named 'no-such-device'") &&
                          Catch::Matchers::Contains(device));
}
