// A subcommand of `rdmaring` (tools/rdmaring.cpp) or of `rdmaring-bench`: parsing and running
// are apart, so that a bad option is refused (exit 2, one line) before anything is opened,
// connected or half-written.
#pragma once

#include <CLI/CLI.hpp>

#include <charconv>
#include <cstdint>
#include <exception>
#include <functional>
#include <iostream>
#include <map>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace rdmaring::tools {

// For an option whose values are names (imm|tail): parses them through `names`; --help lists them.
template <class T>
  requires std::is_enum_v<T>
CLI::Validator one_of(const std::map<std::string, T>& names) {
  std::string list;
  for (const auto& [name, value] : names) list += (list.empty() ? "" : "|") + name;
  return CLI::Validator(
      [names, list](std::string& value) -> std::string {
        const auto it = names.find(value);
        if (it == names.end()) return value + " is not one of " + list;
        // CLI11 reads an enum from its number.
        value = std::to_string(static_cast<std::underlying_type_t<T>>(it->second));
        return {};
      },
      list);
}

// A whole number as a person writes it, decimal or 0x hex, at least `min`, rewritten to decimal:
// CLI11's own conversion of an unsigned option (strtoull, base 0) would take "-1" as 2^64 - 1, an
// overflow as the largest value, and a leading 0 as octal.
inline CLI::Validator whole_number(std::uint64_t min = 0) {
  return CLI::Validator(
      [min](std::string& value) -> std::string {
        const std::string_view s = value;
        const bool hex = s.size() > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X');
        const std::string_view digits = hex ? s.substr(2) : s;
        std::uint64_t n = 0;
        const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), n, hex ? 16 : 10);
        if (digits.empty() || ec != std::errc{} || end != digits.data() + digits.size() || n < min)
          return "needs a whole number from " + std::to_string(min) + " below 2^64 (decimal or 0x hex), not '" + value + "'";
        value = std::to_string(n);
        return {};
      },
      min > 0 ? "positive" : "");
}

struct Command {
  CLI::App* app;             // the subcommand, its options added
  std::function<int()> run;  // runs it once parsed: the process's exit status
};

// Parses the command line and runs the one command it names. Exit status: --help 0; a wrong
// command line 2, one line on stderr (also a CLI::ParseError the command throws before it opens
// anything: options that are wrong together); a command that throws 1, one line naming it; else the
// command's own.
inline int run_command_line(CLI::App& app, const std::vector<Command>& commands, int argc, char** argv) {
  app.require_subcommand(1);
  // The subcommand the command line reached, and its name as typed.
  const auto reached = [&app] {
    std::pair<const CLI::App*, std::string> out{&app, app.get_name()};
    while (!out.first->get_subcommands().empty()) {
      out.first = out.first->get_subcommands().front();
      out.second += " " + out.first->get_name();
    }
    return out;
  };
  const auto path = [&reached] { return reached().second; };
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    const auto [sub, where] = reached();
    // CLI11 blames a mistyped subcommand on the one that is missing; the word is the news.
    const std::vector<std::string> left = sub->remaining();
    const std::string why = left.empty() ? e.what() : left.front() + " is not a subcommand or option of " + where;
    std::cerr << where << ": " << why << " (see " << where << " --help)" << std::endl;
    return 2;
  }
  for (const Command& c : commands) {
    if (!c.app->parsed()) continue;
    try {
      return c.run();
    } catch (const CLI::ParseError& e) {
      // Options that are wrong together (command.hpp's callers check them before anything is
      // opened): as a wrong command line.
      std::cerr << path() << ": " << e.what() << " (see " << path() << " --help)" << std::endl;
      return 2;
    } catch (const std::exception& e) {
      std::cerr << path() << ": " << e.what() << std::endl;
      return 1;
    }
  }
  return 2;  // require_subcommand(1): one of them was parsed
}

}  // namespace rdmaring::tools
