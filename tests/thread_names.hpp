// The names of this process's threads, as the kernel reports them to top -H, ps -L and perf: how
// tests prove that the library's threads are named.
#pragma once

#include <algorithm>
#include <cstddef>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace rdmaring::test {

inline std::vector<std::string> thread_names() {
  std::vector<std::string> names;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    // A thread that exited since the listing has no comm to read any more.
    std::ifstream comm(task.path() / "comm");
    std::string name;
    if (std::getline(comm, name)) names.push_back(name);
  }
  return names;
}

inline std::size_t threads_named(const std::string& name) {
  const auto names = thread_names();
  return static_cast<std::size_t>(std::count(names.begin(), names.end(), name));
}

}  // namespace rdmaring::test
