// rdmaring: the library's command-line tool, one command with subcommands (--help on each).
// Exit status: 0 done; 1 it ran and failed (no device, owner unreachable, a record refused),
// one line on stderr saying what; 2 the command line is wrong, one line, and nothing was opened.
#include "bench/bench_command.hpp"
#include "commands.hpp"
#include "doctor/doctor_command.hpp"

int main(int argc, char** argv) {
  using namespace rdmaring::tools;
  CLI::App app{"rdmaring: a one-sided RDMA ring queue with an explicit publish protocol", "rdmaring"};
  const std::vector<Command> commands{add_listen_command(app), add_send_command(app), add_doctor_command(app),
                                      add_bench_command(app)};
  return run_command_line(app, commands, argc, argv);
}
