#include "rdmaring/metrics_text.hpp"

#include <array>
#include <charconv>

namespace rdmaring {
namespace {

// Label values escape backslash, double quote and newline (the format's only escapes).
std::string escape(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

}  // namespace

void MetricsText::sample(const std::string& name, const std::string& help, const char* type, const std::string& value,
                         const Labels& labels) {
  const std::string full = "rdmaring_" + name;
  auto [it, fresh] = families_.try_emplace(full, Family{help, type, {}});
  if (fresh) order_.push_back(full);
  std::string line = full;
  if (!labels.empty()) {
    line += '{';
    for (std::size_t i = 0; i < labels.size(); ++i) {
      if (i) line += ',';
      line += labels[i].first + "=\"" + escape(labels[i].second) + '"';
    }
    line += '}';
  }
  it->second.samples.push_back(line + ' ' + value);
}

void MetricsText::counter(const std::string& name, const std::string& help, std::uint64_t value, const Labels& labels) {
  sample(name, help, "counter", std::to_string(value), labels);
}

void MetricsText::gauge(const std::string& name, const std::string& help, double value, const Labels& labels) {
  // The shortest text that reads back as the same double: byte gauges stay exact integers
  // (an ostream's 6 digits would print a 1 MiB ring as 1.04858e+06).
  std::array<char, 32> buf;
  const auto end = std::to_chars(buf.data(), buf.data() + buf.size(), value).ptr;
  sample(name, help, "gauge", std::string(buf.data(), end), labels);
}

void MetricsText::counters(const std::string& name, const std::string& help,
                           const std::map<std::string, std::uint64_t>& counts, const std::string& label) {
  for (const auto& [key, n] : counts) counter(name, help, n, {{label, key}});
}

void MetricsText::registrations(const std::string& side, const std::string& device, std::uint64_t regions,
                                std::uint64_t bytes) {
  const Labels on{{"device", device}};
  gauge(side + "_registered_regions", "Memory regions registered now", static_cast<double>(regions), on);
  gauge(side + "_registered_bytes", "Bytes under registration now (pinned unless on-demand paged)",
        static_cast<double>(bytes), on);
}

std::string MetricsText::str() const {
  std::string out;
  for (const auto& name : order_) {
    const Family& f = families_.at(name);
    out += "# HELP " + name + ' ' + f.help + '\n';
    out += "# TYPE " + name + ' ' + f.type + '\n';
    for (const auto& s : f.samples) out += s + '\n';
  }
  return out;
}

}  // namespace rdmaring
