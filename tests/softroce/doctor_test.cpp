// `rdmaring doctor` on a real device: the text report names the device, its link layer, the
// memlock limit, its dma-buf registration and the absent GPU; --json is one object with a devices
// array; an unknown --device exits 1.
//
// The command is the RDMARING_TOOL_BINARY environment variable when set (a build elsewhere),
// else the RDMARING_TOOL_BINARY compile definition (tests/CMakeLists.txt: $<TARGET_FILE:rdmaring>).
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>

namespace {

std::string require_env(const char* name) {
  const char* value = std::getenv(name);
  // Never a silent skip: without the device's name this test cannot mean anything.
  if (value == nullptr || *value == '\0') {
    FAIL(name << " is not set: run this test inside tests/softroce/guest-run, or set it for the RDMA device of this host");
  }
  return value;
}

std::string tool_binary() {
  const char* p = std::getenv("RDMARING_TOOL_BINARY");
  return p != nullptr && *p != '\0' ? p : RDMARING_TOOL_BINARY;
}

struct Run {
  int status = -1;
  std::string out;
};

// Runs `rdmaring doctor` with `args`; stderr joins stdout only when `with_stderr`.
Run doctor(const std::string& args, bool with_stderr = false) {
  const std::string cmd = tool_binary() + " doctor " + args + (with_stderr ? " 2>&1" : "");
  Run run;
  FILE* p = popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  char buf[4096];
  while (std::fgets(buf, sizeof buf, p) != nullptr) run.out += buf;
  const int status = pclose(p);
  run.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return run;
}

}  // namespace

TEST_CASE("rdmaring doctor reports the device, its link layer and memlock", "[softroce][doctor]") {
  const std::string device = require_env("RDMARING_DEVICE");
  const Run run = doctor("");
  INFO(run.out);
  std::cout << run.out;
  CHECK(run.status == 0);
  CHECK_THAT(run.out, Catch::Matchers::Contains("\ndevice " + device + "\n"));
  CHECK_THAT(run.out, Catch::Matchers::Contains("ACTIVE"));
  CHECK_THAT(run.out, Catch::Matchers::Contains("Ethernet"));
  // The GIDs come from ibv_query_gid_ex: an rxe port on an addressed netdev has a RoCE v2 one.
  CHECK_THAT(run.out, Catch::Matchers::Contains("RoCE v2"));
  CHECK_THAT(run.out, Catch::Matchers::Contains("\n  RLIMIT_MEMLOCK    soft "));
  CHECK_THAT(run.out, Catch::Matchers::Contains("memlock: "));
  CHECK_THAT(run.out, Catch::Matchers::Contains("payload MR relaxed, publish by imm: ok"));
  CHECK_THAT(run.out, Catch::Matchers::Contains("tail mode: relies on in-order placement (no relaxed ordering): ok"));
  // Whatever the device grants, the queue's 32 B records must fit inline.
  CHECK_THAT(run.out, Catch::Matchers::Contains("B granted >= 32 B"));
  CHECK_THAT(run.out, Catch::Matchers::Contains("\n  dma-buf MR        "));
  CHECK_THAT(run.out, Catch::Matchers::Contains("GPUDirect RDMA: no GPU on the PCI bus"));
  CHECK(run.out.find("\n  FAIL") == std::string::npos);
}

TEST_CASE("rdmaring doctor --json is one object with a devices array", "[softroce][doctor]") {
  const std::string device = require_env("RDMARING_DEVICE");
  const Run run = doctor("--json --device " + device);
  INFO(run.out);
  CHECK(run.status == 0);
  const auto j = nlohmann::json::parse(run.out);
  REQUIRE(j.is_object());
  CHECK(j["usable_devices"] == 1);
  CHECK(j["device_filter"] == device);
  REQUIRE(j["devices"].size() == 1);
  const auto& d = j["devices"][0];
  CHECK(d["name"] == device);
  CHECK(d["usable"] == true);
  REQUIRE_FALSE(d["ports"].empty());
  CHECK(d["ports"][0]["link_layer"] == "Ethernet");
  CHECK(d["ports"][0]["gid_error"].is_null());
  CHECK_FALSE(d["ports"][0]["gids"].empty());
  CHECK(j["memlock"].contains("soft"));
  // The dma-buf probe ran on the device (rxe: the call refused or the descriptor refused), and
  // the guest has no GPU, so no GPUDirect pair.
  CHECK(d["dmabuf_registration"]["result"] != "not probed");
  CHECK(d["software"] == true);
  CHECK(j["gpus"].empty());
  CHECK(j["gpudirect"].empty());
  REQUIRE_FALSE(j["verdicts"].empty());
  CHECK(j["verdicts"][0].contains("level"));
}

TEST_CASE("rdmaring doctor --device with an unknown name exits 1 naming what is present", "[softroce][doctor]") {
  const std::string device = require_env("RDMARING_DEVICE");
  const Run run = doctor("--device no-such-device", true);
  INFO(run.out);
  CHECK(run.status == 1);
  CHECK_THAT(run.out, Catch::Matchers::Contains("no RDMA device named 'no-such-device'") &&
                          Catch::Matchers::Contains(device));
}
