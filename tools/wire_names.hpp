// The wire's choices as command-line options name them (protocol-spec/wire-formats.md).
#pragma once

#include <map>
#include <string>

#include "rdmaring/wire.hpp"

namespace rdmaring::tools {

inline const std::map<std::string, wire::PayloadCheck> kPayloadCheckNames{{"crc32c", wire::PayloadCheck::crc32c},
                                                                           {"none", wire::PayloadCheck::none}};
inline const std::map<std::string, wire::PublishMode> kPublishModeNames{{"imm", wire::PublishMode::imm},
                                                                        {"tail", wire::PublishMode::tail}};

}  // namespace rdmaring::tools
