// The check: the consumer's database against the events the producer makes. Every session's
// sequences once each, from 0, in the order stored, up to the sequence its durable record names;
// every source's events once each, in order, as make_event() makes them; --events in all.
#include <cstdint>
#include <iostream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "pipeline.hpp"
#include "store.hpp"

namespace pipeline {

int run_check(const CheckOptions& o) {
  Database db(o.database, true);
  std::vector<std::string> problems;
  const auto problem = [&problems](std::string text) { problems.push_back(std::move(text)); };

  std::map<std::uint64_t, std::uint64_t> due_sequence;  // per session
  std::vector<std::uint64_t> due_index(o.threads, 0);   // per source
  std::uint64_t stored = 0;
  Statement events =
      db.prepare("SELECT session, sequence, source, idx, account, amount_cents, memo FROM events ORDER BY rowid");
  while (events.step()) {
    ++stored;
    const std::uint64_t session = from_sql(events.integer(0));
    const std::uint64_t sequence = from_sql(events.integer(1));
    const Event e{.source = static_cast<std::uint32_t>(events.integer(2)),
                  .account = static_cast<std::uint32_t>(events.integer(4)),
                  .index = from_sql(events.integer(3)),
                  .amount_cents = events.integer(5),
                  .memo = std::string(events.text(6))};
    const std::string where = "row " + std::to_string(stored) + " (session " + std::to_string(session) + " #" +
                              std::to_string(sequence) + ", source " + std::to_string(e.source) + " event " +
                              std::to_string(e.index) + "): ";
    std::uint64_t& due = due_sequence[session];
    if (sequence != due) problem(where + "sequence " + std::to_string(due) + " was due: a record doubled or lost");
    due = sequence + 1;
    if (e.source >= o.threads) {
      problem(where + "no such source");
      continue;
    }
    if (e.index != due_index[e.source])
      problem(where + "event " + std::to_string(due_index[e.source]) + " of this source was due: doubled, lost or reordered");
    due_index[e.source] = e.index + 1;
    if (e != make_event(e.source, e.index)) problem(where + "contents differ from what the producer made");
  }

  Statement sessions = db.prepare("SELECT id, next_sequence, identity, min_epoch FROM sessions");
  std::vector<std::string> session_lines;
  while (sessions.step()) {
    const std::uint64_t id = from_sql(sessions.integer(0));
    const std::uint64_t durable = from_sql(sessions.integer(1));
    // Whose it is and the epoch below which no resume is admitted: the durable record the owner
    // upserted last (on_session).
    session_lines.push_back("check: session " + std::to_string(id) + " of '" + std::string(sessions.text(2)) +
                            "': " + std::to_string(durable) + " events, min_epoch " +
                            std::to_string(from_sql(sessions.integer(3))));
    const auto it = due_sequence.find(id);
    const std::uint64_t have = it == due_sequence.end() ? 0 : it->second;
    if (durable != have)
      problem("session " + std::to_string(id) + ": its durable record says " + std::to_string(durable) +
              " events, the events table has sequences up to " + std::to_string(have));
  }
  for (std::uint32_t source = 0; source < o.threads; ++source) {
    if (due_index[source] != events_of(source, o.events, o.threads))
      problem("source " + std::to_string(source) + ": " + std::to_string(due_index[source]) + " events stored, not " +
              std::to_string(events_of(source, o.events, o.threads)));
  }
  if (stored != o.events) problem(std::to_string(stored) + " events stored, not " + std::to_string(o.events));

  std::cout << "check: " << stored << " events stored in " << due_sequence.size() << " session(s), from "
            << o.threads << " sources" << std::endl;
  for (const std::string& line : session_lines) std::cout << line << '\n';
  if (problems.empty()) {
    std::cout << "check: passed: every session's sequences once each, from 0; every source's events once each, "
                 "in order, as made"
              << std::endl;
    return 0;
  }
  constexpr std::size_t kShown = 10;
  for (std::size_t i = 0; i < problems.size() && i < kShown; ++i) std::cout << "check: " << problems[i] << '\n';
  std::cout << "check: FAILED: " << problems.size() << " problem(s)" << std::endl;
  return 1;
}

}  // namespace pipeline
