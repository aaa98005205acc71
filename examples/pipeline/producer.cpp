// The producer service: several threads make events and send them through one ThreadedProducer;
// its poster builds each one as a Cap'n Proto message in place in the span Producer::claim()
// lends, after writing down which event takes which sequence. A restart (kill -9 included)
// rejoins the session and sends exactly the events the owner has not delivered (README.md next
// to this file).
#include <capnp/message.h>
#include <capnp/serialize.h>
#include <fcntl.h>
#include <kj/vector.h>
#include <rdmaring/producer.hpp>
#include <rdmaring/threaded_producer.hpp>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iostream>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "event.capnp.h"
#include "pipeline.hpp"

namespace pipeline {
namespace {

using namespace std::chrono_literals;

// How long the producer waits for an owner that went away (a restart) before it gives up.
constexpr std::uint32_t kRecoverAttempts = 600;
constexpr auto kRecoverInterval = 100ms;

// The session's credentials, written whole and renamed into place at every epoch: a kill at any
// point leaves either the previous epoch's or this one's.
void save_credentials(const std::filesystem::path& path, const rdmaring::SessionCredentials& c) {
  const std::filesystem::path tmp = path.string() + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(&c), sizeof c);
    f.flush();
    if (!f) throw std::runtime_error("cannot write " + tmp.string());
  }
  std::filesystem::rename(tmp, path);
}

std::optional<rdmaring::SessionCredentials> load_credentials(const std::filesystem::path& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return std::nullopt;
  rdmaring::SessionCredentials c;
  if (!f.read(reinterpret_cast<char*>(&c), sizeof c)) throw std::runtime_error(path.string() + " is truncated");
  return c;
}

// Which event took which sequence: entry s (16 bytes at offset 16 s) is {source, index} of the
// record with sequence s. The poster writes it before it claims the record, so every record the
// owner can have delivered has its entry; a record refused and retried writes the same entry
// again. A write lands in the page cache at once: a kill -9 loses none.
class Journal {
 public:
  struct Entry {
    std::uint64_t source = 0;
    std::uint64_t index = 0;
  };

  Journal(const std::filesystem::path& path, bool fresh)
      : fd_(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | (fresh ? O_TRUNC : 0), 0644)) {
    if (fd_ < 0) throw std::system_error(errno, std::system_category(), "open " + path.string());
  }
  Journal(const Journal&) = delete;
  Journal& operator=(const Journal&) = delete;
  ~Journal() { ::close(fd_); }

  // Called by the poster: errors are values (a Sink must not throw).
  rdmaring::Result<void> write(std::uint64_t sequence, const Entry& e) {
    if (::pwrite(fd_, &e, sizeof e, offset(sequence)) != static_cast<ssize_t>(sizeof e)) {
      return rdmaring::make_error(rdmaring::errc::system_failure,
                                  "journal write of sequence " + std::to_string(sequence) + ": " + std::strerror(errno));
    }
    return rdmaring::success();
  }

  // Where each source goes on when the owner has delivered every sequence below `delivered`:
  // after the last of its events among them. A source's events take sequences in its own order
  // (ThreadedProducer keeps each thread's order), so those delivered are a prefix of them.
  std::vector<std::uint64_t> resume_points(std::uint64_t delivered, std::uint32_t sources) const {
    std::vector<Entry> entries(delivered);
    const auto bytes = static_cast<ssize_t>(delivered * sizeof(Entry));
    if (::pread(fd_, entries.data(), static_cast<std::size_t>(bytes), 0) != bytes)
      throw std::runtime_error("the journal holds fewer than the " + std::to_string(delivered) +
                               " sequences the owner delivered: not this session's journal");
    std::vector<std::uint64_t> next(sources, 0);
    for (const Entry& e : entries) {
      if (e.source >= sources)
        throw std::runtime_error("the journal names source " + std::to_string(e.source) + ", not one of " +
                                 std::to_string(sources) + ": a run with another --threads");
      next[e.source] = e.index + 1;
    }
    return next;
  }

 private:
  static off_t offset(std::uint64_t sequence) { return static_cast<off_t>(sequence * sizeof(Entry)); }
  int fd_;
};

// A message builder whose first segment is the claimed span. MallocMessageBuilder takes a caller
// buffer too, but its destructor zeroes the words it used, and here they are the record, which
// must stay as built until the owner releases it (a recover() sends it again from there).
// Segments past the first come from the heap, and make the record a copy (EventSink::send).
class ClaimBuilder final : public capnp::MessageBuilder {
 public:
  explicit ClaimBuilder(kj::ArrayPtr<capnp::word> claimed) : claimed_(claimed) {}
  kj::ArrayPtr<capnp::word> allocateSegment(unsigned minimum) override {
    if (!claimed_given_ && minimum <= claimed_.size()) {
      claimed_given_ = true;
      return claimed_;
    }
    kj::Array<capnp::word>& segment = more_.add(kj::heapArray<capnp::word>(minimum));
    std::memset(segment.begin(), 0, segment.size() * sizeof(capnp::word));  // the builder wants zeroes
    return segment;
  }

 private:
  kj::ArrayPtr<capnp::word> claimed_;
  bool claimed_given_ = false;
  kj::Vector<kj::Array<capnp::word>> more_;
};

// What a thread hands the poster through ThreadedProducer::send(): the event's fixed fields, then
// its memo's bytes.
struct Fields {
  std::uint32_t source;
  std::uint32_t account;
  std::uint64_t index;
  std::int64_t amount_cents;
};

void hand_off(const Event& e, std::vector<std::byte>& out) {
  const Fields f{.source = e.source, .account = e.account, .index = e.index, .amount_cents = e.amount_cents};
  out.resize(sizeof f + e.memo.size());
  std::memcpy(out.data(), &f, sizeof f);
  std::memcpy(out.data() + sizeof f, e.memo.data(), e.memo.size());
}

// The bytes of an event as a one-segment flat message: the segment table, the root pointer, the
// struct, and the memo with its NUL, in whole words.
std::uint32_t message_bytes(std::size_t memo) {
  constexpr std::size_t kWord = sizeof(capnp::word);
  constexpr std::size_t kStructWords = schema::Event::_capnpPrivate::dataWordSize + schema::Event::_capnpPrivate::pointerCount;
  return static_cast<std::uint32_t>(kWord + (1 + kStructWords) * kWord + (memo + kWord) / kWord * kWord);
}

// The Producer as ThreadedProducer's poster drives it (the only thread that calls it): each
// record handed over gets its journal entry, then is built in place in the claimed staging span.
class EventSink {
 public:
  EventSink(rdmaring::Producer& producer, Journal& journal, std::optional<std::uint64_t> kill_self_at)
      : producer_(producer), journal_(journal), kill_self_at_(kill_self_at) {}

  rdmaring::Result<void> send(std::span<const std::byte> handed) {
    auto sent = post(handed);
    if (sent && kill_self_at_ && producer_.next_sequence() == *kill_self_at_)
      kill_self("producer: sequences below " + std::to_string(*kill_self_at_) + " committed");
    return sent;
  }
  rdmaring::Result<void> progress() { return producer_.progress(); }
  rdmaring::Result<void> flush() { return producer_.flush(); }
  bool quiescent() { return producer_.quiescent(); }
  rdmaring::Result<rdmaring::ResumePoint> recover() { return producer_.recover(); }

  std::uint64_t copies() const { return copies_; }  // read after the poster stopped

 private:
  rdmaring::Result<void> post(std::span<const std::byte> handed) {
    Fields f{};
    std::memcpy(&f, handed.data(), sizeof f);
    const auto memo = handed.subspan(sizeof f);
    if (auto written = journal_.write(producer_.next_sequence(), {f.source, f.index}); !written) return written;
    auto claimed = producer_.claim(message_bytes(memo.size()));
    if (!claimed) return std::move(claimed).error();
    const std::span<std::byte> record = claimed.value();
    std::memset(record.data(), 0, record.size());  // staging holds older records; the builder wants zeroes
    // Staging is page-aligned, records and their 16-byte header 16-byte aligned: the span is whole
    // words (protocol-spec/wire-formats.md §2). Word 0 is kept for the segment table.
    kj::ArrayPtr<capnp::word> words(reinterpret_cast<capnp::word*>(record.data()), record.size() / sizeof(capnp::word));
    ClaimBuilder message(words.slice(1, words.size()));
    auto event = message.initRoot<schema::Event>();
    event.setSource(f.source);
    event.setAccount(f.account);
    event.setIndex(f.index);
    event.setAmountCents(f.amount_cents);
    event.setMemo(capnp::Text::Reader(reinterpret_cast<const char*>(memo.data()), memo.size()));
    const auto segments = message.getSegmentsForOutput();
    if (segments.size() == 1) {
      // The segment table of one segment: the segment count less one, then its size in words.
      const std::uint32_t table[2] = {0, static_cast<std::uint32_t>(segments[0].size())};
      std::memcpy(record.data(), table, sizeof table);
      return producer_.commit(static_cast<std::uint32_t>(sizeof table + segments[0].size() * sizeof(capnp::word)));
    }
    // The message outgrew the claim (message_bytes() no longer matches the schema): it goes as a
    // flattened copy, counted, under the same sequence and journal entry.
    const kj::Array<capnp::word> flat = capnp::messageToFlatArray(segments);
    producer_.abort();
    const auto bytes = flat.asBytes();
    auto sent = producer_.send(std::as_bytes(std::span(bytes.begin(), bytes.size())));
    if (sent) ++copies_;
    return sent;
  }

  rdmaring::Producer& producer_;
  Journal& journal_;
  std::optional<std::uint64_t> kill_self_at_;
  std::uint64_t copies_ = 0;
};

// recover() until the owner is back (a restart takes a while), for the calls the poster does not
// make itself.
rdmaring::Result<void> recover_until_back(rdmaring::Producer& producer) {
  for (std::uint32_t attempt = 1;; ++attempt) {
    auto resumed = producer.recover();
    if (resumed) return rdmaring::success();
    if (attempt == kRecoverAttempts) return std::move(resumed).error();
    std::this_thread::sleep_for(kRecoverInterval);
  }
}

// Attaches, or rejoins from the saved credentials, until the owner answers: a consumer that is
// restarting refuses or drops the control connection for a while, and a new consumer rejects
// the QP of a grant its predecessor made. The credentials are read again before each try: a
// rejoin that got its grant but not its QP moved the session on.
rdmaring::Producer open_until_back(const rdmaring::ProducerOptions& options, const std::filesystem::path& credentials) {
  for (std::uint32_t attempt = 1;; ++attempt) {
    try {
      const auto saved = load_credentials(credentials);
      return saved ? rdmaring::Producer::rejoin(options, *saved) : rdmaring::Producer::attach(options);
    } catch (const rdmaring::SetupError& e) {
      const bool owner_away = e.error() == rdmaring::errc::control_failure || e.error() == rdmaring::errc::timed_out ||
                              e.error() == rdmaring::errc::verbs_failure;
      if (!owner_away || attempt == kRecoverAttempts) throw;
      std::this_thread::sleep_for(kRecoverInterval);
    }
  }
}

int fail(std::string_view what, const rdmaring::Error& e) {
  std::cerr << "pipeline producer: " << what << ": " << e.message() << '\n';
  return 1;
}

}  // namespace

int run_producer(const ProducerOptions& o) {
  std::filesystem::create_directories(o.state);
  const auto credentials_file = o.state / "credentials";
  rdmaring::ProducerOptions options{.address = o.address, .control_port = o.control_port, .security = o.security};
  // Heartbeats every 200 ms: with its ring full a producer posts nothing, and only they tell it
  // soon that the owner died.
  options.heartbeat_interval = 200ms;
  // Before the epoch's QP connects: once it has, the owner admits no resume from the epoch before.
  options.on_credentials = [&credentials_file](const rdmaring::SessionCredentials& c) {
    save_credentials(credentials_file, c);
  };
  const auto saved = load_credentials(credentials_file);
  rdmaring::Producer producer = open_until_back(options, credentials_file);
  Journal journal(o.state / "journal", !saved);
  // Everything below the owner's next sequence was delivered; everything from it on is sent now,
  // whatever an earlier process had sent under those sequences.
  const std::uint64_t first = producer.next_sequence();
  const std::vector<std::uint64_t> resume = journal.resume_points(first, o.threads);
  std::cout << "producer: " << (saved ? "rejoined" : "attached") << " session " << producer.credentials().session
            << " at sequence " << first << ", sources resume at";
  for (const std::uint64_t r : resume) std::cout << ' ' << r;
  std::cout << std::endl;

  EventSink sink(producer, journal, o.kill_self_at);
  std::mutex errors_mutex;
  std::vector<std::string> errors;
  {
    rdmaring::ThreadedProducer<EventSink> front(
        sink, {.recover_attempts = kRecoverAttempts, .recover_interval = kRecoverInterval});
    std::vector<std::jthread> threads;
    for (std::uint32_t source = 0; source < o.threads; ++source) {
      threads.emplace_back([&, source] {
        std::vector<std::byte> bytes;
        for (std::uint64_t i = resume[source]; i < events_of(source, o.events, o.threads); ++i) {
          hand_off(make_event(source, i), bytes);
          // Back-pressure lasts while the owner restarts: the poster heals the connection meanwhile.
          if (auto sent = front.send(bytes, 120s); !sent) {
            std::lock_guard lock(errors_mutex);
            errors.push_back("source " + std::to_string(source) + " event " + std::to_string(i) + ": " +
                             sent.error().message());
            return;
          }
        }
      });
    }
    threads.clear();  // joins them
    // Every event to the Producer, however long an owner restart holds it up; stop() alone
    // would give up after its stop_timeout and drop what it holds.
    if (auto drained = front.drain(120s); !drained) return fail("drain", drained.error());
    if (auto stopped = front.stop(); !stopped) return fail("stop", stopped.error());
  }
  for (const std::string& e : errors) std::cerr << "pipeline producer: send: " << e << '\n';
  if (!errors.empty()) return 1;
  // Detaching drains: the owner has then released, so stored, every event.
  for (auto detached = producer.detach(60s); !detached; detached = producer.detach(60s)) {
    if (!rdmaring::needs_recover(detached.error())) return fail("detach", detached.error());
    if (auto resumed = recover_until_back(producer); !resumed) return fail("recover", resumed.error());
  }
  // The session has ended: a producer started now begins a new one (and sends every event again).
  std::filesystem::remove(credentials_file);
  std::cout << "producer: sent sequences [" << first << ", " << producer.next_sequence() << ") of session "
            << producer.credentials().session << ", " << sink.copies() << " of them copied" << std::endl;
  return 0;
}

}  // namespace pipeline
