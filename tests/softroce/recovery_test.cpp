// Recovery on a real verbs device: the producer's QP is forced into the error state in the middle
// of batches, the producer reconnects and resumes in the consumer's next epoch (ring re-registered,
// old rkey revoked), and every record still arrives exactly once, in order, with its bytes.
#include <catch2/catch.hpp>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <future>
#include <string>

#include "rdmaring/consumer.hpp"
#include "device_address.hpp"
#include "rdmaring/producer.hpp"

using namespace rdmaring;

namespace {


std::uint32_t size_of(std::uint64_t seq) { return static_cast<std::uint32_t>((seq * 2654435761u) % 700); }

void fill(std::uint64_t seq, std::span<std::byte> out) {
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<std::byte>(seq * 31 + i * 7);
}

struct Delivery {
  std::uint64_t records = 0;
  std::uint64_t wrong = 0;
  std::string error;
  ConsumerStats stats{};
};

void run(wire::PublishMode mode) {
  constexpr std::uint64_t kRecords = 100000;
  constexpr std::uint64_t kFaultEvery = 10000;
  ConsumerOptions co;
  co.address = device_address();
  co.mode = mode;
  co.ring_bytes = 1 << 16;
  co.max_record = 1024;
  Consumer consumer = Consumer::listen(co);
  std::atomic<bool> producer_done{false};

  // Catch2 assertions are not thread-safe: the consumer thread reports, the test asserts.
  auto delivered = std::async(std::launch::async, [&]() -> Delivery {
    Delivery d;
    try {
      consumer.accept();
      std::vector<std::byte> want(1024);
      const auto deadline = Clock::now() + std::chrono::seconds(300);
      while ((d.records < kRecords || !producer_done) && Clock::now() < deadline) {
        auto n = consumer.poll(
            [&](const DeliveredRecord& r) {
              const auto len = size_of(d.records);
              fill(d.records, std::span(want).first(len));
              if (r.sequence != d.records || r.payload.size() != len || std::memcmp(r.payload.data(), want.data(), len) != 0)
                ++d.wrong;
              ++d.records;
            },
            256);
        if (!n) {
          d.error = n.error().message();
          break;
        }
      }
      d.stats = consumer.stats();
    } catch (const SetupError& e) {
      d.error = e.what();
    }
    return d;
  });

  ProducerOptions po;
  po.address = co.address;
  po.port = consumer.port();
  Producer producer = Producer::connect(po);
  std::uint64_t faults = 0, recoveries = 0;
  auto heal = [&](const Error& e) {
    INFO("producer: " << e.message());
    REQUIRE(e == errc::completion_error);
    auto at = producer.recover();
    INFO("recover: " << (at ? std::string("ok") : at.error().message()));
    REQUIRE(at);
    ++recoveries;
  };
  for (std::uint64_t seq = 0; seq < kRecords;) {
    if (seq > 0 && seq % kFaultEvery == 0 && faults < seq / kFaultEvery) {
      // Mid-batch: committed records are in flight or waiting when the QP dies.
      REQUIRE(producer.force_error());
      ++faults;
    }
    auto span = producer.claim(size_of(seq));
    if (!span) {
      if (span.error() == errc::would_block) continue;
      heal(span.error());
      continue;
    }
    fill(seq, span.value());
    if (auto r = producer.commit(); !r) heal(r.error());
    ++seq;
  }
  for (;;) {
    auto r = producer.drain(std::chrono::seconds(60));
    if (r) break;
    heal(r.error());
  }
  producer_done = true;
  const Delivery d = delivered.get();
  INFO("consumer error: " << d.error);
  CHECK(d.error.empty());
  CHECK(d.records == kRecords);
  CHECK(d.wrong == 0);
  CHECK(faults == kRecords / kFaultEvery - 1);
  CHECK(recoveries >= faults);
  CHECK(d.stats.resumes == recoveries);
  CHECK(producer.stats().recoveries == recoveries);
}

}  // namespace

TEST_CASE("QP forced to error mid-batch, resumed: exactly once, in order (imm)", "[softroce][recovery]") {
  run(wire::PublishMode::imm);
}

TEST_CASE("QP forced to error mid-batch, resumed: exactly once, in order (tail)", "[softroce][recovery]") {
  run(wire::PublishMode::tail);
}
