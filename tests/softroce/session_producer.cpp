// A producer process for the session tests: attaches (or, when its credentials file exists,
// rejoins the session in it after a restart), keeps the file current at every epoch, and sends
// records session_records.hpp defines up to --records, recovering from every connection failure.
// The tests kill it with SIGKILL at arbitrary points and start it again.
//
// rdmaring-session-producer --address A --port P --credentials FILE --records N
//                           [--fault-every K] [--source ADDR] [--mode-note TEXT]
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>

#include "rdmaring/producer.hpp"
#include "session_records.hpp"

using namespace rdmaring;

namespace {

void save(const std::string& path, const SessionCredentials& c) {
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

std::optional<SessionCredentials> load(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return std::nullopt;
  SessionCredentials c;
  f.read(reinterpret_cast<char*>(&c.session), sizeof c.session);
  f.read(reinterpret_cast<char*>(c.secret.data()), static_cast<std::streamsize>(c.secret.size()));
  f.read(reinterpret_cast<char*>(&c.epoch), sizeof c.epoch);
  if (!f) return std::nullopt;
  return c;
}

// Recovers until the owner answers (a cut control connection costs one failed call).
void recover(Producer& p, const std::string& credentials) {
  for (int attempt = 0;; ++attempt) {
    auto r = p.recover();
    if (r) break;
    if (attempt == 50 || (r.error() != errc::control_failure && r.error() != errc::timed_out &&
                          r.error() != errc::verbs_failure))
      throw SetupError(r.error());
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  save(credentials, p.credentials());
}

}  // namespace

int main(int argc, char** argv) {
  ProducerOptions o;
  std::string credentials;
  std::uint64_t records = 0, fault_every = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--address") o.address = v;
    else if (k == "--port") o.control_port = static_cast<std::uint16_t>(std::stoul(v));
    else if (k == "--credentials") credentials = v;
    else if (k == "--records") records = std::stoull(v);
    else if (k == "--fault-every") fault_every = std::stoull(v);
    else if (k == "--source") o.source_address = v;
    else {
      std::cerr << "session-producer: unknown option " << k << "\n";
      return 2;
    }
  }
  try {
    const auto saved = load(credentials);
    Producer p = saved ? Producer::rejoin(o, *saved) : Producer::attach(o);
    save(credentials, p.credentials());
    std::cerr << "session-producer " << getpid() << ": " << (saved ? "rejoined" : "attached") << " session "
              << p.credentials().session << " epoch " << p.credentials().epoch << " at sequence "
              << p.next_sequence() << std::endl;
    for (std::uint64_t seq = p.next_sequence(); seq < records;) {
      const auto payload = testing::record_bytes(seq);
      auto r = p.send(payload, std::chrono::seconds(30));
      if (r) {
        ++seq;
        if (fault_every && seq % fault_every == 0) (void)p.force_error();
        continue;
      }
      if (!needs_recover(r.error())) throw SetupError(r.error());
      recover(p, credentials);
    }
    for (;;) {
      auto r = p.detach(std::chrono::seconds(60));
      if (r) break;
      if (!needs_recover(r.error())) throw SetupError(r.error());
      recover(p, credentials);
    }
    std::filesystem::remove(credentials);
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "session-producer " << getpid() << ": " << e.what() << std::endl;
    return 1;
  }
}
