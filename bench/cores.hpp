// rdmaring-bench cores: what a record costs the CPU in the library's own code, with no device and
// no emulator (bench/README.md, "Native cost").
#pragma once

namespace rdmaring::bench {

// argv[0] is "cores". Exit status 0, or 2 for bad options (one line on stderr).
int run_cores(int argc, char** argv);

}  // namespace rdmaring::bench
