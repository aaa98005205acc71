// How a command protects its control channel (control_security.hpp): mutual TLS from --ca,
// --cert and --key (or RDMARING_CA, RDMARING_CERT, RDMARING_KEY), else plain TCP only when
// --insecure-plaintext says so. Shared by `listen`, `send` and the bench's roles. A wrong
// combination is refused before anything is opened: exit status 2, one line (command.hpp).
#pragma once

#include <CLI/CLI.hpp>

#include <charconv>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "command.hpp"
#include "rdmaring/control_security.hpp"
#include "rdmaring/owner_core.hpp"

namespace rdmaring::tools {

struct SecurityFlags {
  std::string ca, cert, key;
  std::string server_name;  // the producer's check of the owner's certificate
  bool insecure_plaintext = false;
};

enum class SecuritySide { owner, producer, both };

// --ca, --cert, --key and --insecure-plaintext; --server-name where a producer runs (`side`
// producer or both).
inline void add_security_options(CLI::App& app, SecurityFlags& s, SecuritySide side) {
  const std::string group = "Control channel security (mutual TLS unless --insecure-plaintext)";
  app.add_option("--ca", s.ca, "the CA certificate (PEM) both sides' certificates are signed by")
      ->envname("RDMARING_CA")
      ->check(CLI::ExistingFile)
      ->group(group);
  app.add_option("--cert", s.cert,
                 side == SecuritySide::owner      ? "this owner's certificate (PEM; chain: leaf first)"
                 : side == SecuritySide::producer ? "this producer's certificate (PEM; chain: leaf first); its subject "
                                                    "common name is the identity the owner's --allow rules match"
                                                  : "the certificate (PEM) each side presents")
      ->envname("RDMARING_CERT")
      ->check(CLI::ExistingFile)
      ->group(group);
  app.add_option("--key", s.key, "the certificate's private key (PEM, unencrypted)")
      ->envname("RDMARING_KEY")
      ->check(CLI::ExistingFile)
      ->group(group);
  if (side != SecuritySide::owner)
    app.add_option("--server-name", s.server_name,
                   "the name the owner's certificate must carry (default: the address connected to)")
        ->envname("RDMARING_SERVER_NAME")
        ->group(group);
  app.add_flag("--insecure-plaintext", s.insecure_plaintext,
               "plain TCP: no certificates, and whoever reads or reaches the channel can act as any producer")
      ->group(group);
}

// Empty when the flags name one way: complete TLS material, or --insecure-plaintext alone. Else
// what is wrong, as one line.
inline std::string security_problem(const SecurityFlags& s) {
  std::vector<std::string> given, missing;
  for (const auto& [flag, value] : {std::pair{"--ca", &s.ca}, {"--cert", &s.cert}, {"--key", &s.key}})
    (value->empty() ? missing : given).push_back(flag);
  const auto list = [](const std::vector<std::string>& flags) {
    std::string out;
    for (std::size_t i = 0; i < flags.size(); ++i)
      out += (i == 0 ? "" : i + 1 == flags.size() ? " and " : ", ") + flags[i];
    return out;
  };
  if (s.insecure_plaintext) {
    if (!given.empty())
      return "--insecure-plaintext with " + list(given) +
             " (from the command line or RDMARING_CA/RDMARING_CERT/RDMARING_KEY): the control channel is either "
             "mutual TLS or plain TCP, say one";
    if (!s.server_name.empty()) return "--insecure-plaintext with --server-name: plain TCP checks no certificate";
    return {};
  }
  if (given.empty())
    return "the control channel is mutual TLS: give --ca, --cert and --key (or RDMARING_CA, RDMARING_CERT, "
           "RDMARING_KEY), or --insecure-plaintext for plain TCP";
  if (!missing.empty())
    return "mutual TLS needs --ca, --cert and --key: " + list(missing) + (missing.size() == 1 ? " is" : " are") +
           " missing (or set RDMARING_CA, RDMARING_CERT, RDMARING_KEY)";
  return {};
}

// Throws CLI::ValidationError (exit status 2, one line: run_command_line) for security_problem.
inline void require_security(const SecurityFlags& s) {
  if (const std::string p = security_problem(s); !p.empty()) throw CLI::ValidationError(p);
}

inline ControlSecurity owner_security(const SecurityFlags& s) {
  if (s.insecure_plaintext) return ControlSecurity{.insecure_plaintext = true};
  return ControlSecurity{.ca = s.ca, .certificate = s.cert, .private_key = s.key};
}

inline ControlSecurity producer_security(const SecurityFlags& s) {
  if (s.insecure_plaintext) return ControlSecurity{.insecure_plaintext = true};
  return ControlSecurity{.ca = s.ca, .certificate = s.cert, .private_key = s.key, .server_name = s.server_name};
}

// What a start line says of the channel.
inline const char* security_words(const SecurityFlags& s) {
  return s.insecure_plaintext ? "PLAIN TCP (--insecure-plaintext: anyone who reaches the port can act as any producer)"
                              : "mutual TLS";
}

// --allow PATTERN[:SESSIONS[:RING_BYTES]]: an IdentityRule (owner_core.hpp). SESSIONS and
// RING_BYTES are whole numbers (decimal or 0x hex), empty or 0 for no limit. Errors: what is wrong.
inline std::optional<IdentityRule> parse_allow(std::string_view text, std::string& why) {
  std::vector<std::string_view> parts;
  for (std::size_t from = 0;;) {
    const std::size_t colon = text.find(':', from);
    parts.push_back(text.substr(from, colon == std::string_view::npos ? colon : colon - from));
    if (colon == std::string_view::npos) break;
    from = colon + 1;
  }
  const auto number = [&why, text](std::string_view s, const char* what, std::uint64_t& out) {
    if (s.empty()) return true;  // no limit
    const bool hex = s.size() > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X');
    const std::string_view digits = hex ? s.substr(2) : s;
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), out, hex ? 16 : 10);
    if (!digits.empty() && ec == std::errc{} && end == digits.data() + digits.size()) return true;
    why = std::string(text) + ": " + what + " must be a whole number (0: no limit), not '" +
          std::string(s) + "' (PATTERN[:SESSIONS[:RING_BYTES]])";
    return false;
  };
  if (parts.size() > 3) {
    why = std::string(text) + ": more than PATTERN[:SESSIONS[:RING_BYTES]] (a pattern holds no ':')";
    return std::nullopt;
  }
  if (parts[0].empty()) {
    why = std::string(text) + ": empty PATTERN (PATTERN[:SESSIONS[:RING_BYTES]]; '*' matches anyone)";
    return std::nullopt;
  }
  IdentityRule rule{.pattern = std::string(parts[0])};
  std::uint64_t sessions = 0;
  if (parts.size() > 1 && !number(parts[1], "SESSIONS", sessions)) return std::nullopt;
  if (sessions > UINT32_MAX) {
    why = std::string(text) + ": SESSIONS must be below 2^32";
    return std::nullopt;
  }
  rule.max_sessions = static_cast<std::uint32_t>(sessions);
  if (parts.size() > 2 && !number(parts[2], "RING_BYTES", rule.max_ring_bytes)) return std::nullopt;
  return rule;
}

// A repeatable --allow, each value checked as it is parsed (exit status 2, one line).
inline void add_allow_option(CLI::App& app, std::vector<std::string>& rules) {
  app.add_option("--allow", rules,
                 "PATTERN[:SESSIONS[:RING_BYTES]] (repeatable): producers whose identity (certificate common name) "
                 "matches the fnmatch PATTERN may attach, each identity holding at most SESSIONS sessions and "
                 "RING_BYTES ring bytes at once (0 or empty: no limit); the first rule that matches applies, none: "
                 "refused. Without --allow: any producer the CA vouches for")
      ->check(CLI::Validator(
          [](const std::string& v) -> std::string {
            std::string why;
            return parse_allow(v, why) ? std::string{} : why;
          },
          "PATTERN[:SESSIONS[:RING_BYTES]]"))
      ->allow_extra_args(false);
}

inline std::vector<IdentityRule> allow_rules(const std::vector<std::string>& rules) {
  std::vector<IdentityRule> out;
  for (const std::string& r : rules) {
    std::string why;
    if (auto rule = parse_allow(r, why)) out.push_back(std::move(*rule));
    else throw CLI::ValidationError("--allow", why);
  }
  return out;
}

}  // namespace rdmaring::tools
