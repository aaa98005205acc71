// The ring owner's sessions, sans I/O: who may attach, resume, connect a QP, heartbeat and
// detach, in which epoch, and when a lease runs out. The RingOwner turns each verdict into verbs
// work (registration, QP admission, revocation); this table never touches a device, so tests
// and the model drive it directly. States and transitions: protocol-spec/sessions.md.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "rdmaring/error.hpp"
#include "rdmaring/session_proof.hpp"
#include "rdmaring/wire.hpp"

namespace rdmaring {

using SessionId = std::uint64_t;

enum class SessionState {
  attached,   // epoch granted over the control channel; its QP has not connected yet
  connected,  // the epoch's QP is established
  broken,     // the epoch's QP died (error completion, disconnect); waiting for a resume
  resuming,   // a later epoch granted by resume; its QP has not connected yet
};
const char* to_string(SessionState s) noexcept;

struct SessionEntry {
  SessionId id = 0;
  SessionSecret secret{};
  // Who attached it (the channel's identity): control messages for it are taken from that
  // identity only.
  std::string identity;
  std::uint64_t epoch = 1;
  SessionState state = SessionState::attached;
  // The epoch the session was in when it started resuming, until the new epoch's QP connects: a
  // producer whose resume reply was lost (or that died right after it, or whose request was
  // duplicated) asks again from any epoch from there up to the current one, and must be let in.
  std::optional<std::uint64_t> unconfirmed;
  std::chrono::steady_clock::time_point last_seen;
};

// What a control message or connect request claims.
struct Credentials {
  SessionId session = 0;
  std::uint64_t epoch = 0;
  std::span<const std::byte> proof;
  // Control messages only (resume, heartbeat, detach): who the channel authenticated ("" on a
  // plaintext channel) and the binding the proof covers. Connect requests carry neither.
  std::string_view identity;
  std::optional<ChannelBinding> binding;
};

struct SessionCounters {
  std::uint64_t attaches = 0;
  std::uint64_t resumes = 0;
  std::uint64_t restores = 0;  // sessions re-created from the application's durable record
  std::uint64_t connects = 0;
  std::uint64_t detaches = 0;
  std::uint64_t expired = 0;   // leases that ran out
  std::uint64_t refused_unknown = 0;
  std::uint64_t refused_proof = 0;     // a proof that does not match, or a control message bound to no channel
  std::uint64_t refused_identity = 0;  // a control message for a session of another identity
  std::uint64_t refused_stale = 0;  // replay fencing: a message or QP from an epoch the session left
  std::uint64_t refused_state = 0;  // a second QP for an epoch already connected
  std::uint64_t refused_capacity = 0;
};

class SessionTable {
 public:
  using Clock = std::chrono::steady_clock;
  // lease: how long a session may go without a publish or heartbeat; zero means for ever.
  SessionTable(std::size_t max_sessions, std::chrono::nanoseconds lease) noexcept;

  // A new session of `identity` in epoch 1 with a fresh id and secret. Errors: no_capacity.
  Result<SessionEntry> attach(std::string_view identity, Clock::time_point now);
  // Fences the caller's epoch and grants the next; returns the new epoch. Errors:
  // unauthenticated, unknown_session, bad_proof, unauthorized, stale_epoch.
  Result<std::uint64_t> resume(const Credentials& who, Clock::time_point now);
  // A resume of a session this table does not know, which the application vouches for after an
  // owner restart with its durable record: the session's `secret`, `identity` (who.identity must
  // be it) and floor (who.epoch must not be below `min_epoch`). The session continues in
  // who.epoch + 1. Errors: unauthenticated, bad_proof, unauthorized, stale_epoch, no_capacity,
  // invalid_argument (the session is known).
  Result<std::uint64_t> restore(const Credentials& who, const SessionSecret& secret, std::string_view identity,
                                std::uint64_t min_epoch, Clock::time_point now);
  // A QP's connect request. Admitted only for the current epoch of a session that has no QP.
  // Errors: unknown_session, bad_proof, stale_epoch, invalid_argument (already connected).
  // (rdma_cm carries no channel: the proof binds none, and no identity is asked.)
  Result<void> admit_connect(const wire::ConnectData& request, Clock::time_point now);
  void on_connected(SessionId id) noexcept;
  void on_broken(SessionId id, std::uint64_t epoch) noexcept;  // ignored for another epoch
  // A publish observed on the data path: keeps the lease.
  void touch(SessionId id, Clock::time_point now) noexcept;
  // Errors: as resume's.
  Result<void> heartbeat(const Credentials& who, Clock::time_point now);
  Result<void> detach(const Credentials& who);
  // The owner ends a session on its own account (its producer broke the protocol, or its ring
  // could not be registered again).
  void remove(SessionId id) noexcept { sessions_.erase(id); }
  // Sessions whose lease ran out, removed from the table.
  std::vector<SessionId> expire(Clock::time_point now);

  const SessionEntry* find(SessionId id) const noexcept;
  std::size_t size() const noexcept { return sessions_.size(); }
  // Sessions `identity` holds now.
  std::size_t held(std::string_view identity) const noexcept;
  const SessionCounters& counters() const noexcept { return counters_; }

 private:
  // The session `who` names, if its proof for `purpose` holds. Counts refusals.
  Result<SessionEntry*> verify(const Credentials& who, ProofPurpose purpose);
  Result<void> bound(const Credentials& who, ProofPurpose purpose);
  Result<void> prove(const Credentials& who, ProofPurpose purpose, const SessionSecret& secret,
                     std::string_view identity);
  Error stale(const SessionEntry& s, std::uint64_t epoch, const char* what);
  static bool admits(const SessionEntry& s, std::uint64_t epoch) noexcept;

  std::size_t max_sessions_;
  std::chrono::nanoseconds lease_;
  std::map<SessionId, SessionEntry> sessions_;
  SessionCounters counters_;
};

}  // namespace rdmaring
