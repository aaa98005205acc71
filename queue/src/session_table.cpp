#include "rdmaring/session_table.hpp"

#include <algorithm>

namespace rdmaring {
namespace {

const char* to_string(ProofPurpose p) noexcept {
  switch (p) {
    case ProofPurpose::connect: return "connect";
    case ProofPurpose::resume: return "resume";
    case ProofPurpose::heartbeat: return "heartbeat";
    case ProofPurpose::detach: return "detach";
  }
  return "?";
}

// A connect request travels in rdma_cm's private data, on no control channel: its proof binds
// none and it names no identity. Every other message comes over a control connection.
bool on_channel(ProofPurpose p) noexcept { return p != ProofPurpose::connect; }

}  // namespace

const char* to_string(SessionState s) noexcept {
  switch (s) {
    case SessionState::attached: return "attached";
    case SessionState::connected: return "connected";
    case SessionState::broken: return "broken";
    case SessionState::resuming: return "resuming";
  }
  return "?";
}

SessionTable::SessionTable(std::size_t max_sessions, std::chrono::nanoseconds lease) noexcept
    : max_sessions_(max_sessions), lease_(lease) {}

Result<SessionEntry> SessionTable::attach(std::string_view identity, Clock::time_point now) {
  if (sessions_.size() >= max_sessions_) {
    ++counters_.refused_capacity;
    return make_error(errc::no_capacity, "attach: " + std::to_string(max_sessions_) + " sessions already");
  }
  SessionEntry s;
  do s.id = random_session_id();
  while (sessions_.count(s.id));
  s.secret = random_secret();
  s.identity = identity;
  s.last_seen = now;
  sessions_.emplace(s.id, s);
  ++counters_.attaches;
  return s;
}

// Without a binding a proof would be the same on every connection: any captured copy would do.
Result<void> SessionTable::bound(const Credentials& who, ProofPurpose purpose) {
  if (!on_channel(purpose) || who.binding) return success();
  ++counters_.refused_proof;
  return make_error(errc::unauthenticated,
                    std::string(to_string(purpose)) + " without a channel binding: call hello first");
}

// The proof first, then the identity: a caller who cannot prove learns nothing of whose session
// it names.
Result<void> SessionTable::prove(const Credentials& who, ProofPurpose purpose, const SessionSecret& secret,
                                 std::string_view identity) {
  const bool proven = on_channel(purpose)
                          ? proof_matches(secret, purpose, who.session, who.epoch, *who.binding, who.proof)
                          : proof_matches(secret, purpose, who.session, who.epoch, who.proof);
  if (!proven) {
    ++counters_.refused_proof;
    return make_error(errc::bad_proof, std::string(to_string(purpose)) + " proof for session " +
                                           std::to_string(who.session) + " epoch " + std::to_string(who.epoch));
  }
  if (on_channel(purpose) && who.identity != identity) {
    ++counters_.refused_identity;
    return make_error(errc::unauthorized, "session " + std::to_string(who.session) + " belongs to '" +
                                              std::string(identity) + "', not '" + std::string(who.identity) + "'");
  }
  return success();
}

Result<SessionEntry*> SessionTable::verify(const Credentials& who, ProofPurpose purpose) {
  BOOST_OUTCOME_TRYV(bound(who, purpose));
  const auto it = sessions_.find(who.session);
  if (it == sessions_.end()) {
    ++counters_.refused_unknown;
    return make_error(errc::unknown_session, "session " + std::to_string(who.session));
  }
  BOOST_OUTCOME_TRYV(prove(who, purpose, it->second.secret, it->second.identity));
  return &it->second;
}

// The current epoch, or, while resuming, any epoch from the unconfirmed one up: a duplicated or
// late resume request from that window fences the epoch its producer was just granted, and the
// producer (which asks from the epoch it holds) must still get back in. Once the new epoch's QP
// connects, the window closes.
bool SessionTable::admits(const SessionEntry& s, std::uint64_t epoch) noexcept {
  return epoch == s.epoch || (s.unconfirmed && *s.unconfirmed <= epoch && epoch < s.epoch);
}

Error SessionTable::stale(const SessionEntry& s, std::uint64_t epoch, const char* what) {
  ++counters_.refused_stale;
  return make_error(errc::stale_epoch, std::string(what) + " for session " + std::to_string(s.id) + " epoch " +
                                           std::to_string(epoch) + ": the session is in epoch " +
                                           std::to_string(s.epoch));
}

Result<std::uint64_t> SessionTable::resume(const Credentials& who, Clock::time_point now) {
  BOOST_OUTCOME_TRY(s, verify(who, ProofPurpose::resume));
  if (!admits(*s, who.epoch)) return stale(*s, who.epoch, "resume");
  // The window's lower end stays: a retry from it, or a late copy of any request in it, may come
  // yet. Every admission fences, so none of them can deliver a record twice.
  if (!s->unconfirmed) s->unconfirmed = s->epoch;
  ++s->epoch;
  s->state = SessionState::resuming;
  s->last_seen = now;
  ++counters_.resumes;
  return s->epoch;
}

Result<std::uint64_t> SessionTable::restore(const Credentials& who, const SessionSecret& secret,
                                            std::string_view identity, std::uint64_t min_epoch, Clock::time_point now) {
  BOOST_OUTCOME_TRYV(bound(who, ProofPurpose::resume));
  if (sessions_.count(who.session))
    return make_error(errc::invalid_argument, "restore: session " + std::to_string(who.session) + " is known");
  BOOST_OUTCOME_TRYV(prove(who, ProofPurpose::resume, secret, identity));
  // The restarted owner remembers no epoch; the durable floor is what keeps a resume captured
  // before the last confirmed epoch from being restored.
  if (who.epoch < min_epoch) {
    ++counters_.refused_stale;
    return make_error(errc::stale_epoch, "resume from epoch " + std::to_string(who.epoch) +
                                             " below the durable floor " + std::to_string(min_epoch));
  }
  if (sessions_.size() >= max_sessions_) {
    ++counters_.refused_capacity;
    return make_error(errc::no_capacity, "restore: " + std::to_string(max_sessions_) + " sessions already");
  }
  SessionEntry s{who.session, secret, std::string(identity), who.epoch + 1, SessionState::resuming, who.epoch, now};
  sessions_.emplace(s.id, s);
  ++counters_.restores;
  return s.epoch;
}

Result<void> SessionTable::admit_connect(const wire::ConnectData& request, Clock::time_point now) {
  BOOST_OUTCOME_TRY(s, verify(Credentials{request.session, request.epoch, request.proof}, ProofPurpose::connect));
  if (request.epoch != s->epoch) return stale(*s, request.epoch, "connect");
  if (s->state != SessionState::attached && s->state != SessionState::resuming) {
    ++counters_.refused_state;
    return make_error(errc::invalid_argument, "connect for session " + std::to_string(s->id) + " epoch " +
                                                  std::to_string(s->epoch) + ": the epoch's QP is " +
                                                  to_string(s->state));
  }
  s->last_seen = now;
  return success();
}

void SessionTable::on_connected(SessionId id) noexcept {
  const auto it = sessions_.find(id);
  if (it == sessions_.end()) return;
  it->second.state = SessionState::connected;
  // The producer connected with this epoch's proof: it has the grant, the fallback can go.
  it->second.unconfirmed.reset();
  ++counters_.connects;
}

void SessionTable::on_broken(SessionId id, std::uint64_t epoch) noexcept {
  const auto it = sessions_.find(id);
  if (it != sessions_.end() && it->second.epoch == epoch && it->second.state == SessionState::connected)
    it->second.state = SessionState::broken;
}

void SessionTable::touch(SessionId id, Clock::time_point now) noexcept {
  const auto it = sessions_.find(id);
  if (it != sessions_.end()) it->second.last_seen = now;
}

Result<void> SessionTable::heartbeat(const Credentials& who, Clock::time_point now) {
  BOOST_OUTCOME_TRY(s, verify(who, ProofPurpose::heartbeat));
  if (!admits(*s, who.epoch)) return stale(*s, who.epoch, "heartbeat");
  s->last_seen = now;
  return success();
}

Result<void> SessionTable::detach(const Credentials& who) {
  BOOST_OUTCOME_TRY(s, verify(who, ProofPurpose::detach));
  if (who.epoch != s->epoch) return stale(*s, who.epoch, "detach");
  sessions_.erase(s->id);
  ++counters_.detaches;
  return success();
}

std::vector<SessionId> SessionTable::expire(Clock::time_point now) {
  std::vector<SessionId> gone;
  if (lease_ == std::chrono::nanoseconds::zero()) return gone;
  for (auto it = sessions_.begin(); it != sessions_.end();) {
    if (now - it->second.last_seen > lease_) {
      gone.push_back(it->first);
      it = sessions_.erase(it);
      ++counters_.expired;
    } else {
      ++it;
    }
  }
  return gone;
}

std::size_t SessionTable::held(std::string_view identity) const noexcept {
  return static_cast<std::size_t>(std::count_if(sessions_.begin(), sessions_.end(),
                                                [identity](const auto& kv) { return kv.second.identity == identity; }));
}

const SessionEntry* SessionTable::find(SessionId id) const noexcept {
  const auto it = sessions_.find(id);
  return it == sessions_.end() ? nullptr : &it->second;
}

}  // namespace rdmaring
