// rdmaring-bench: the benchmark's roles as a program of their own, for bench/ scripts and tests
// (`rdmaring bench ROLE` is the same code).
#include "bench_command.hpp"

int main(int argc, char** argv) {
  CLI::App app{"rdmaring-bench: records over a real verbs device, measured", "rdmaring-bench"};
  const std::vector<rdmaring::tools::Command> roles = rdmaring::tools::add_bench_roles(app, {});
  return rdmaring::tools::run_command_line(app, roles, argc, argv);
}
