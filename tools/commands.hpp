// The subcommands of `rdmaring` that live in tools/ (the doctor's in doctor/, the bench's in
// bench/).
#pragma once

#include "command.hpp"

namespace rdmaring::tools {

Command add_listen_command(CLI::App& parent);
Command add_send_command(CLI::App& parent);

}  // namespace rdmaring::tools
