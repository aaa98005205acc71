// The Prometheus text exposition (format 0.0.4) that RingOwner::metrics() and
// Producer::metrics() are made of.
#include "rdmaring/metrics_text.hpp"

#include <catch2/catch.hpp>

#include <sstream>
#include <string>
#include <vector>

using namespace rdmaring;

namespace {

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

}  // namespace

TEST_CASE("metrics text: one HELP and TYPE per family, before its samples, prefixed", "[metrics]") {
  MetricsText m;
  m.counter("owner_records_total", "Records delivered", 7);
  m.gauge("owner_sessions", "Sessions attached now", 2);
  m.counters("owner_refusals_total", "Refused", {{"bad_proof", 1}, {"stale_epoch", 3}}, "reason");
  m.registrations("owner", "rxe0", 2, 1052672);
  CHECK(lines_of(m.str()) == std::vector<std::string>{
                                 "# HELP rdmaring_owner_records_total Records delivered",
                                 "# TYPE rdmaring_owner_records_total counter",
                                 "rdmaring_owner_records_total 7",
                                 "# HELP rdmaring_owner_sessions Sessions attached now",
                                 "# TYPE rdmaring_owner_sessions gauge",
                                 "rdmaring_owner_sessions 2",
                                 "# HELP rdmaring_owner_refusals_total Refused",
                                 "# TYPE rdmaring_owner_refusals_total counter",
                                 "rdmaring_owner_refusals_total{reason=\"bad_proof\"} 1",
                                 "rdmaring_owner_refusals_total{reason=\"stale_epoch\"} 3",
                                 "# HELP rdmaring_owner_registered_regions Memory regions registered now",
                                 "# TYPE rdmaring_owner_registered_regions gauge",
                                 "rdmaring_owner_registered_regions{device=\"rxe0\"} 2",
                                 "# HELP rdmaring_owner_registered_bytes Bytes under registration now (pinned unless on-demand paged)",
                                 "# TYPE rdmaring_owner_registered_bytes gauge",
                                 "rdmaring_owner_registered_bytes{device=\"rxe0\"} 1052672",
                             });
}

TEST_CASE("metrics text: label values escape backslash, quote and newline", "[metrics]") {
  MetricsText m;
  m.counter("x_total", "x", 1, {{"status", "a\"b\\c\nd"}, {"qp", "17"}});
  CHECK_THAT(m.str(), Catch::Contains("rdmaring_x_total{status=\"a\\\"b\\\\c\\nd\",qp=\"17\"} 1\n"));
}
