// The doctor's two renderings of the same facts and verdicts: aligned text for a person, and one
// JSON object (compact, one line) for a script.
#pragma once

#include "facts.hpp"
#include "verdicts.hpp"

#include <string>

namespace rdmaring::doctor {

std::string render_text(const Facts& f, const Verdicts& v);

// Keys keep the order a reader of the text report expects. Absent facts are null. Bytes that
// are not UTF-8 (sysfs, nvidia-smi) become U+FFFD, so the output parses whatever was read.
std::string render_json(const Facts& f, const Verdicts& v);

}  // namespace rdmaring::doctor
