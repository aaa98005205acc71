// CmId: one rdma_cm endpoint (a listener or one side of a connection).
//
// rdma_cm, not the caller, picks the device a connection uses (from the address it resolves or
// binds), so everything a queue pair needs starts from context() here. Each set-up step waits
// for its one expected event with a deadline and throws naming the step and what arrived
// instead, so a failed connect reads "rdma_connect(cm id ...): expected ESTABLISHED, got
// REJECTED" rather than a hang.
#pragma once

#include "rdmaring/error.hpp"
#include "rdmaring/verbs/context.hpp"

#include <rdma/rdma_cma.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <optional>
#include <string>
#include <vector>

namespace rdmaring::verbs {

class CmEvent;
class EventChannel;
struct ConnectRequest;

class CmId {
 public:
  // Creates an RC id (RDMA_PS_TCP) whose events arrive on `channel`.
  // Assumes: `channel` outlives the id; no other thread takes events from it while a set-up
  // step below waits.
  // Throws: SetupError errc::verbs_failure with the errno of rdma_create_id.
  explicit CmId(const EventChannel& channel);

  rdma_cm_id* get() const noexcept { return id_.get(); }

  // The device rdma_cm bound the id to, borrowed (librdmacm closes it).
  // Assumes: the returned Context is not used after the id is destroyed.
  // Throws: SetupError errc::no_device when the id is bound to no device yet (before resolve(),
  // or listening on a wildcard address).
  Context context() const;

  // Client: resolves `addr`:`port` to a device, address and route (rdma_resolve_addr, then
  // rdma_resolve_route), each step bounded by `timeout`. A non-empty `source` binds the local
  // address (a test host sharing the namespace with others is told apart by it).
  // Throws: SetupError errc::bad_config when `addr` does not parse (getaddrinfo);
  // errc::timed_out; errc::verbs_failure with the call's errno, or naming the event that
  // arrived instead of ADDR_RESOLVED / ROUTE_RESOLVED (e.g. ADDR_ERROR, status -errno).
  void resolve(const std::string& addr, std::uint16_t port, std::chrono::milliseconds timeout,
               const std::string& source = {});

  // Server: binds to `addr`:`port` (port 0: an ephemeral port, see local_port()) and listens.
  // Throws: SetupError errc::bad_config when `addr` does not parse; errc::verbs_failure with the
  // errno of rdma_bind_addr or rdma_listen.
  void bind_and_listen(const std::string& addr, std::uint16_t port, int backlog);

  // The local port in host byte order (rdma_get_src_port); 0 before bind or resolve.
  std::uint16_t local_port() const noexcept;

  // Server: waits for the next CONNECT_REQUEST on this listening id and takes ownership of the
  // id it carries. The event is acked before this returns, so the new id may be destroyed at
  // any time (destroying it without accept() rejects the connection).
  // Assumes: bind_and_listen() succeeded.
  // Throws: SetupError as expect_event does.
  ConnectRequest next_request(std::chrono::milliseconds timeout);

  // Server: takes ownership of the new id a CONNECT_REQUEST event carries, for an owner that
  // dispatches all its ids' events from one channel.
  // Assumes: `request` is a CONNECT_REQUEST. The returned id is destroyed (rejecting the
  // connection unless accepted) only after the event is acked: rdma_destroy_id waits for that.
  static ConnectRequest adopt_request(const CmEvent& request);

  // Server: the next CONNECT_REQUEST on this listening id if one is already waiting; never
  // blocks. Errors: verbs_failure with the errno of rdma_get_cm_event.
  Result<std::optional<ConnectRequest>> poll_request();

  // Moves this id's events to `channel` (rdma_migrate_id), so that a connection's own events
  // (ESTABLISHED, DISCONNECTED) never reach whoever waits on the listener's channel.
  // Throws: SetupError with the errno of rdma_migrate_id.
  void migrate(const EventChannel& channel);

  // Client: connects with `param` (the QP created on this id carries the connection) and waits
  // for ESTABLISHED; returns the private data of the peer's accept (padded by IB/RoCE CM).
  // Assumes: resolve() succeeded and a QueuePair exists on this id; param.private_data_len is
  // at most 56 B over IB/RoCE (196 B for accept()), the room the CM's REQ (REP) leaves.
  // Throws: SetupError with the errno of rdma_connect; as expect_event does (REJECTED,
  // UNREACHABLE, CONNECT_ERROR, timeout).
  std::vector<std::byte> connect(const rdma_conn_param& param, std::chrono::milliseconds timeout);

  // Server: accepts the connection this id came with (next_request) and waits for ESTABLISHED.
  // Assumes: a QueuePair exists on this id, with its receives posted if the peer may send.
  // Throws: SetupError with the errno of rdma_accept; as expect_event does.
  void accept(const rdma_conn_param& param, std::chrono::milliseconds timeout);
  // Server: accept() without the wait; ESTABLISHED (or an error event) arrives on the channel,
  // for an owner that serves every connection from one event loop.
  // Throws: SetupError with the errno of rdma_accept.
  void start_accept(const rdma_conn_param& param);

  // Starts, or answers, the disconnect and waits for DISCONNECTED. Either side may call it,
  // before or after the peer did; the QP moves to the error state and flushes.
  // Throws: SetupError with the errno of rdma_disconnect; as expect_event does.
  void disconnect(std::chrono::milliseconds timeout);
  // disconnect() without the wait, for an owner whose events arrive on its shared channel: the
  // QP moves to the error state and the peer is told. Errors: verbs_failure with the errno of
  // rdma_disconnect (EINVAL once the connection is already gone).
  Result<void> start_disconnect();

  // "cm id 169.254.0.1:40000 -> 169.254.0.1:51234 on rxe0", from the id's current addresses.
  std::string describe() const;

 private:
  explicit CmId(rdma_cm_id* adopted) noexcept : id_(adopted) {}

  struct Destroy {
    void operator()(rdma_cm_id* id) const noexcept;
  };
  std::unique_ptr<rdma_cm_id, Destroy> id_;
};

// An incoming connection: its id (owned) and the private data the client sent with
// rdma_connect (padded by IB/RoCE CM, so possibly longer than what was sent).
struct ConnectRequest {
  CmId id;
  std::vector<std::byte> private_data;
};

}  // namespace rdmaring::verbs
