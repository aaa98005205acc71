// The file a session producer keeps its credentials in (session_producer.cpp writes it at every
// epoch; tests/chaos/chaos_probe.cpp reads a live producer's to replay its old messages): the
// session id, the secret and the epoch, raw, in the host's byte order.
#pragma once

#include <filesystem>
#include <fstream>
#include <optional>
#include <stdexcept>
#include <string>

#include "rdmaring/producer.hpp"

namespace rdmaring::testing {

inline void save_credentials(const std::string& path, const SessionCredentials& c) {
  // Written whole and renamed: a kill in the middle leaves the previous credentials intact.
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(&c.session), sizeof c.session);
    f.write(reinterpret_cast<const char*>(c.secret.data()), static_cast<std::streamsize>(c.secret.size()));
    f.write(reinterpret_cast<const char*>(&c.epoch), sizeof c.epoch);
    f.flush();
    if (!f) throw std::runtime_error("cannot write " + tmp);
  }
  std::filesystem::rename(tmp, path);
}

inline std::optional<SessionCredentials> load_credentials(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return std::nullopt;
  SessionCredentials c;
  f.read(reinterpret_cast<char*>(&c.session), sizeof c.session);
  f.read(reinterpret_cast<char*>(c.secret.data()), static_cast<std::streamsize>(c.secret.size()));
  f.read(reinterpret_cast<char*>(&c.epoch), sizeof c.epoch);
  if (!f) return std::nullopt;
  return c;
}

}  // namespace rdmaring::testing
