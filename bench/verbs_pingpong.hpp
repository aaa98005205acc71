// rdmaring-bench verbs-pingpong: raw verbs, no rdmaring protocol, each side asleep on its
// completion channel between messages: the like-for-like reference for a wake-up after a lull
// (bench/README.md, side-by-side's wake-up rows).
#pragma once

#include "tools/command.hpp"

namespace rdmaring::tools {

Command add_verbs_pingpong_command(CLI::App& parent);

}  // namespace rdmaring::tools
