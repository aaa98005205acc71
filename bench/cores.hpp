// rdmaring-bench cores: what a record costs the CPU in the library's own code, with no device and
// no emulator (bench/README.md, "Native cost").
#pragma once

#include "tools/command.hpp"

namespace rdmaring::tools {

Command add_cores_command(CLI::App& parent);

}  // namespace rdmaring::tools
