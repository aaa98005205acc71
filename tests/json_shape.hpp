// A structural JSON check for tests: brackets balance outside strings, every string is closed,
// no raw control character inside one. Enough to catch a broken writer, no JSON library needed.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace rdmaring::test {

inline bool structurally_json(const std::string& s) {
  const std::size_t start = s.find_first_not_of(" \n");
  if (start == std::string::npos || (s[start] != '{' && s[start] != '[')) return false;
  std::vector<char> stack;
  bool in_string = false;
  for (std::size_t i = start; i < s.size(); ++i) {
    const char c = s[i];
    if (in_string) {
      if (static_cast<unsigned char>(c) < 0x20) return false;
      if (c == '\\') {
        if (++i >= s.size() || std::string_view("\"\\/bfnrtu").find(s[i]) == std::string_view::npos) return false;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      stack.push_back(c);
    } else if (c == '}' || c == ']') {
      if (stack.empty() || stack.back() != (c == '}' ? '{' : '[')) return false;
      stack.pop_back();
      if (stack.empty()) return s.find_first_not_of(" \n", i + 1) == std::string::npos;
    }
  }
  return false;
}

}  // namespace rdmaring::test
