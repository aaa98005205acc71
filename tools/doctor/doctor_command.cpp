#include "doctor_command.hpp"

#include "facts.hpp"
#include "render.hpp"
#include "verdicts.hpp"

#include <cstdint>
#include <iostream>
#include <memory>
#include <string>

namespace rdmaring::tools {
namespace {

struct DoctorOptions {
  bool json = false;
  std::string device;
  std::uint64_t ring_bytes = 1 << 20;
};

int run_doctor(const DoctorOptions& o) {
  const doctor::Facts facts = doctor::gather_facts(o.device);
  const doctor::Verdicts verdicts = doctor::judge(facts, o.ring_bytes);
  std::cout << (o.json ? doctor::render_json(facts, verdicts) + "\n" : doctor::render_text(facts, verdicts));
  std::cout.flush();
  if (doctor::usable_count(facts) > 0) return 0;
  std::cerr << "rdmaring doctor: " << doctor::no_usable_device(facts) << "\n";
  return 1;
}

}  // namespace

Command add_doctor_command(CLI::App& parent) {
  // Shared with the run function: CLI11 writes the options while parsing, after this returns.
  auto options = std::make_shared<DoctorOptions>();
  CLI::App* app = parent.add_subcommand(
      "doctor",
      "Prints every verbs device (ports, GIDs, capabilities), the process's NUMA placement and memlock, the IOMMU, "
      "the GPU topology and ARP settings, and a verdict per path. Connects nothing.");
  app->add_flag("--json", options->json, "one JSON object instead of text");
  app->add_option("--device", options->device, "only this device (e.g. rxe0)")->type_name("NAME");
  app->add_option("--ring-bytes", options->ring_bytes, "the ring size the memlock verdict counts with")
      ->type_name("N")
      ->capture_default_str()
      ->transform(whole_number(1));
  app->footer("Exit status: 0 if a device is usable, 1 if none is, 2 on a usage error.");
  return {app, [options] { return run_doctor(*options); }};
}

}  // namespace rdmaring::tools
