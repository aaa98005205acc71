// The benchmark's roles as subcommands: of `rdmaring-bench` itself (bench/rdmaring_bench_main.cpp)
// and of `rdmaring bench` (tools/rdmaring.cpp).
#pragma once

#include <string>
#include <vector>

#include "tools/command.hpp"

namespace rdmaring::tools {

// pair, consumer, producer, attach, phases, cores and verbs-pingpong, added to `app`. `self`: the arguments
// after the program's name that lead to `app` (pair starts its two roles as this program again).
std::vector<Command> add_bench_roles(CLI::App& app, const std::vector<std::string>& self);
// `bench`, with the roles under it.
Command add_bench_command(CLI::App& parent);

}  // namespace rdmaring::tools
