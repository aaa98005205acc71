// Counters in the Prometheus text exposition format (version 0.0.4), for RingOwner::metrics()
// and Producer::metrics(): each metric family's HELP and TYPE once, then its samples.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace rdmaring {

class MetricsText {
 public:
  using Labels = std::vector<std::pair<std::string, std::string>>;
  // `name` without the rdmaring_ prefix; a family's help and type are taken from its first sample.
  void counter(const std::string& name, const std::string& help, std::uint64_t value, const Labels& labels = {});
  void gauge(const std::string& name, const std::string& help, double value, const Labels& labels = {});
  // One counter sample per entry of `counts`, labelled label="key".
  void counters(const std::string& name, const std::string& help, const std::map<std::string, std::uint64_t>& counts,
                const std::string& label);
  // What either side's registrations pin now, and on which device: <side>_registered_{regions,bytes}.
  void registrations(const std::string& side, const std::string& device, std::uint64_t regions, std::uint64_t bytes);
  std::string str() const;

 private:
  void sample(const std::string& name, const std::string& help, const char* type, const std::string& value,
              const Labels& labels);
  struct Family {
    std::string help;
    const char* type;
    std::vector<std::string> samples;
  };
  std::vector<std::string> order_;
  std::map<std::string, Family> families_;
};

}  // namespace rdmaring
