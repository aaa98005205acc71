// SQLite, as the consumer and the check use it: a connection and prepared statements that close
// themselves, every error a std::runtime_error naming the database's message, and the schema.
#pragma once

#include <sqlite3.h>

#include <bit>
#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

namespace pipeline {

// sessions: one row per session the consumer's owner granted: its durable record (the secret,
// whose it is, the lowest epoch it may resume from: RingOwner's SessionRecord, upserted) and the
// sequence after the last event stored (with the record, RingOwner's DurableSession), and why it
// ended, once it has.
// events: one row per delivery, in the order they were stored. Deliberately no unique key on
// (session, sequence) or (source, idx): a record delivered twice would be stored twice, and the
// check would see it, rather than a constraint hiding it.
inline constexpr std::string_view kSchema = R"sql(
CREATE TABLE IF NOT EXISTS sessions(
  id INTEGER PRIMARY KEY, secret BLOB NOT NULL, identity TEXT NOT NULL, min_epoch INTEGER NOT NULL,
  next_sequence INTEGER NOT NULL, closed TEXT);
CREATE TABLE IF NOT EXISTS events(
  session INTEGER NOT NULL, sequence INTEGER NOT NULL, source INTEGER NOT NULL, idx INTEGER NOT NULL,
  account INTEGER NOT NULL, amount_cents INTEGER NOT NULL, memo TEXT NOT NULL);
)sql";

// SQLite's integers are signed 64-bit; session ids and sequences are unsigned, stored bit for bit.
inline std::int64_t to_sql(std::uint64_t v) { return std::bit_cast<std::int64_t>(v); }
inline std::uint64_t from_sql(std::int64_t v) { return std::bit_cast<std::uint64_t>(v); }

class Statement {
 public:
  Statement(sqlite3* db, std::string_view sql) : db_(db) {
    check(sqlite3_prepare_v2(db, sql.data(), static_cast<int>(sql.size()), &stmt_, nullptr), "prepare");
  }
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;
  ~Statement() { sqlite3_finalize(stmt_); }

  Statement& bind(int i, std::int64_t v) {
    check(sqlite3_bind_int64(stmt_, i, v), "bind");
    return *this;
  }
  // SQLITE_STATIC: the bytes must outlive the step, which they do in every caller (a ring
  // record, valid until the handler returns). SQLite copies them into its page.
  Statement& bind(int i, std::string_view text) {
    check(sqlite3_bind_text(stmt_, i, text.data(), static_cast<int>(text.size()), SQLITE_STATIC), "bind");
    return *this;
  }
  Statement& bind_blob(int i, const void* data, std::size_t size) {
    check(sqlite3_bind_blob(stmt_, i, data, static_cast<int>(size), SQLITE_STATIC), "bind");
    return *this;
  }
  // True while there is a row to read; the statement is reset when it is done. A caller that
  // stops reading early calls reset().
  bool step() {
    const int rc = sqlite3_step(stmt_);
    if (rc == SQLITE_ROW) return true;
    reset();
    if (rc != SQLITE_DONE) check(rc, "step");
    return false;
  }
  void reset() { sqlite3_reset(stmt_); }
  // Runs a statement that returns no row, and makes it ready for the next bindings.
  void run() {
    if (step()) throw std::runtime_error("SQLite statement returned a row: " + std::string(sqlite3_sql(stmt_)));
  }
  std::int64_t integer(int column) const { return sqlite3_column_int64(stmt_, column); }
  std::string_view text(int column) const {
    const auto* p = reinterpret_cast<const char*>(sqlite3_column_text(stmt_, column));
    return {p ? p : "", static_cast<std::size_t>(sqlite3_column_bytes(stmt_, column))};
  }
  std::basic_string_view<std::byte> blob(int column) const {
    const auto* p = static_cast<const std::byte*>(sqlite3_column_blob(stmt_, column));
    return {p, static_cast<std::size_t>(sqlite3_column_bytes(stmt_, column))};
  }

 private:
  void check(int rc, const char* what) const {
    if (rc != SQLITE_OK) throw std::runtime_error(std::string("SQLite ") + what + ": " + sqlite3_errmsg(db_));
  }
  sqlite3* db_;
  sqlite3_stmt* stmt_ = nullptr;
};

class Database {
 public:
  // Opens (creating it unless `read_only`) the database at `path` and makes sure the schema is
  // there.
  Database(const std::filesystem::path& path, bool read_only) {
    const int flags = read_only ? SQLITE_OPEN_READONLY : SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE;
    if (sqlite3_open_v2(path.c_str(), &db_, flags, nullptr) != SQLITE_OK) {
      const std::string message = db_ ? sqlite3_errmsg(db_) : "out of memory";
      sqlite3_close(db_);
      throw std::runtime_error("SQLite open " + path.string() + ": " + message);
    }
    if (read_only) return;
    // WAL: a commit appends to the log, and a reader (the check, an operator) never blocks the
    // service. synchronous NORMAL keeps every commit across a kill of the process, not across a
    // crash of the machine (README.md next to this file: what FULL would cost).
    exec("PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL;");
    exec(kSchema);
  }
  Database(const Database&) = delete;
  Database& operator=(const Database&) = delete;
  ~Database() { sqlite3_close(db_); }

  void exec(std::string_view sql) {
    char* error = nullptr;
    if (sqlite3_exec(db_, std::string(sql).c_str(), nullptr, nullptr, &error) != SQLITE_OK) {
      const std::string message = error ? error : sqlite3_errmsg(db_);
      sqlite3_free(error);
      throw std::runtime_error("SQLite: " + message);
    }
  }
  Statement prepare(std::string_view sql) { return Statement(db_, sql); }

 private:
  sqlite3* db_ = nullptr;
};

}  // namespace pipeline
