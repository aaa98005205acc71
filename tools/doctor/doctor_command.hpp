// `rdmaring doctor [--json] [--device NAME] [--ring-bytes N]`: the route a connection would take
// and the contract the device offers the queue, with one verdict per path.
//
// Exit status: 0 when at least one device is usable (opens, has an ACTIVE port, and can create a
// PD, a CQ and an RC QP), 1 when none is (one line on stderr naming rdma_rxe / Soft-RoCE, or the
// devices present when none is called --device), 2 on a usage error (refused while parsing).
#pragma once

#include "../command.hpp"

namespace rdmaring::tools {

Command add_doctor_command(CLI::App& parent);

}  // namespace rdmaring::tools
