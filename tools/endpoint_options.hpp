// The options `listen` and `send` share: where the owner is, how records are framed, and how
// the report is written.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "command.hpp"
#include "framing.hpp"

namespace rdmaring::tools {

struct Endpoint {
  std::string address;
  std::uint16_t port = 7471;
  Framing framing = Framing::lines;
  bool json = false;   // the closing report as one JSON object, on stderr (stdout may carry records)
  bool quiet = false;  // no progress lines, no closing report
};

// The closing report, on stderr (stdout may carry records): `fields` as one JSON object with
// --json, else `text`; nothing with -q.
inline void report(const Endpoint& e, const nlohmann::json& fields, const std::string& text) {
  if (e.json) std::cerr << fields.dump() << std::endl;
  else if (!e.quiet) std::cerr << text << std::endl;
}

// `address_help` says what the address is to this side (the owner's own, or the owner's).
inline void add_endpoint_options(CLI::App& app, Endpoint& e, const std::string& address_help) {
  app.add_option("-a,--address", e.address, address_help)->envname("RDMARING_ADDR")->required();
  app.add_option("-p,--port", e.port, "the owner's control port (TCP)")->check(CLI::Range(1, 65535))->capture_default_str();
  app.add_option("-f,--framing", e.framing,
                 "lines: one record per line (the newline is not sent); length-prefixed: each record behind "
                 "its length, 4 bytes little-endian")
      ->transform(one_of(std::map<std::string, Framing>{{"lines", Framing::lines},
                                                                         {"length-prefixed", Framing::length_prefixed}}))
      ->default_str("lines");
  app.add_flag("--json", e.json, "the closing report as one JSON object on stderr");
  app.add_flag("-q,--quiet", e.quiet, "no progress lines and no closing report");
}

}  // namespace rdmaring::tools
