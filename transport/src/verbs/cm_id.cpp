#include "rdmaring/verbs/cm_id.hpp"

#include "rdmaring/verbs/error.hpp"
#include "rdmaring/verbs/event_channel.hpp"

#include <arpa/inet.h>
#include <netdb.h>

#include <cerrno>
#include <optional>

namespace rdmaring::verbs {
namespace {

using std::chrono::milliseconds;

struct FreeAddrinfo {
  void operator()(addrinfo* ai) const noexcept { freeaddrinfo(ai); }
};
using AddrinfoPtr = std::unique_ptr<addrinfo, FreeAddrinfo>;

// Numeric or named, IPv4 or IPv6: whatever getaddrinfo gives first.
AddrinfoPtr lookup(const std::string& addr, std::uint16_t port, int flags) {
  addrinfo hints{};
  hints.ai_flags = AI_NUMERICSERV | flags;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* result = nullptr;
  const std::string service = std::to_string(port);
  if (int rc = getaddrinfo(addr.c_str(), service.c_str(), &hints, &result); rc != 0) {
    throw SetupError(make_error(errc::bad_config, "getaddrinfo(" + addr + "): " + gai_strerror(rc),
                                rc == EAI_SYSTEM ? errno : 0));
  }
  return AddrinfoPtr(result);
}

// "169.254.0.1:7471" or "[fe80::1]:7471"; empty for an unset address.
std::string describe_sockaddr(const sockaddr* sa) {
  char host[INET6_ADDRSTRLEN] = {};
  if (sa->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(sa);
    inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
    return std::string(host) + ":" + std::to_string(ntohs(in->sin_port));
  }
  if (sa->sa_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(sa);
    inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof host);
    return "[" + std::string(host) + "]:" + std::to_string(ntohs(in6->sin6_port));
  }
  return {};
}

}  // namespace

CmId::CmId(const EventChannel& channel) {
  rdma_cm_id* id = nullptr;
  if (rdma_create_id(channel.get(), &id, nullptr, RDMA_PS_TCP) != 0) {
    throw_verbs("rdma_create_id", "cm id", errno);
  }
  id_.reset(id);
}

Context CmId::context() const {
  if (id_->verbs == nullptr) {
    throw SetupError(make_error(errc::no_device, describe() +
                                                     " is bound to no device yet: resolve() or "
                                                     "bind to a device's address first"));
  }
  return Context::borrow(id_->verbs);
}

void CmId::resolve(const std::string& addr, std::uint16_t port, milliseconds timeout, const std::string& source) {
  const AddrinfoPtr dst = lookup(addr, port, 0);
  const AddrinfoPtr src = source.empty() ? nullptr : lookup(source, 0, AI_PASSIVE);
  const int timeout_ms = static_cast<int>(timeout.count());
  if (rdma_resolve_addr(id_.get(), src ? src->ai_addr : nullptr, dst->ai_addr, timeout_ms) != 0) {
    throw_verbs("rdma_resolve_addr", describe_sockaddr(dst->ai_addr), errno);
  }
  expect_event(id_.get(), RDMA_CM_EVENT_ADDR_RESOLVED, "rdma_resolve_addr", describe(), timeout);
  if (rdma_resolve_route(id_.get(), timeout_ms) != 0) {
    throw_verbs("rdma_resolve_route", describe(), errno);
  }
  expect_event(id_.get(), RDMA_CM_EVENT_ROUTE_RESOLVED, "rdma_resolve_route", describe(), timeout);
}

void CmId::bind_and_listen(const std::string& addr, std::uint16_t port, int backlog) {
  const AddrinfoPtr local = lookup(addr, port, AI_PASSIVE);
  if (rdma_bind_addr(id_.get(), local->ai_addr) != 0) {
    throw_verbs("rdma_bind_addr", describe_sockaddr(local->ai_addr), errno);
  }
  if (rdma_listen(id_.get(), backlog) != 0) throw_verbs("rdma_listen", describe(), errno);
}

std::uint16_t CmId::local_port() const noexcept { return ntohs(rdma_get_src_port(id_.get())); }

ConnectRequest CmId::next_request(milliseconds timeout) {
  return adopt_request(
      expect_event(id_.get(), RDMA_CM_EVENT_CONNECT_REQUEST, "rdma_listen", describe(), timeout));
}

ConnectRequest CmId::adopt_request(const CmEvent& request) {
  return ConnectRequest{CmId(request.id()), request.copy_private_data()};
}

Result<std::optional<ConnectRequest>> CmId::poll_request() {
  auto event = next_event(id_->channel, milliseconds(0));
  if (!event) {
    if (event.error() == errc::timed_out) return std::optional<ConnectRequest>{};
    return std::move(event).error();
  }
  if (event.value().type() != RDMA_CM_EVENT_CONNECT_REQUEST) return std::optional<ConnectRequest>{};
  return std::optional<ConnectRequest>{adopt_request(event.value())};
}

void CmId::migrate(const EventChannel& channel) {
  if (rdma_migrate_id(id_.get(), channel.get()) != 0) throw_verbs("rdma_migrate_id", describe(), errno);
}

std::vector<std::byte> CmId::connect(const rdma_conn_param& param, milliseconds timeout) {
  rdma_conn_param p = param;
  if (rdma_connect(id_.get(), &p) != 0) throw_verbs("rdma_connect", describe(), errno);
  return expect_event(id_.get(), RDMA_CM_EVENT_ESTABLISHED, "rdma_connect", describe(), timeout)
      .copy_private_data();
}

void CmId::accept(const rdma_conn_param& param, milliseconds timeout) {
  start_accept(param);
  expect_event(id_.get(), RDMA_CM_EVENT_ESTABLISHED, "rdma_accept", describe(), timeout);
}

void CmId::start_accept(const rdma_conn_param& param) {
  rdma_conn_param p = param;
  if (rdma_accept(id_.get(), &p) != 0) throw_verbs("rdma_accept", describe(), errno);
}

void CmId::disconnect(milliseconds timeout) {
  if (rdma_disconnect(id_.get()) != 0) throw_verbs("rdma_disconnect", describe(), errno);
  expect_event(id_.get(), RDMA_CM_EVENT_DISCONNECTED, "rdma_disconnect", describe(), timeout);
}

Result<void> CmId::start_disconnect() {
  if (rdma_disconnect(id_.get()) != 0) return verbs_error("rdma_disconnect", describe(), errno);
  return boost::outcome_v2::success();
}

std::string CmId::describe() const {
  std::string s = "cm id";
  if (std::string local = describe_sockaddr(rdma_get_local_addr(id_.get())); !local.empty()) {
    s += " " + local;
  }
  if (std::string peer = describe_sockaddr(rdma_get_peer_addr(id_.get())); !peer.empty()) {
    s += " -> " + peer;
  }
  if (id_->verbs != nullptr) s += " on " + std::string(device_name(id_->verbs));
  return s;
}

void CmId::Destroy::operator()(rdma_cm_id* id) const noexcept {
  // Blocks until every event retrieved for this id is acked (CmEvent does so when destroyed),
  // so an event must not outlive its id; the id's QueuePair must be gone before it. Failure
  // leaves nothing a destructor could do.
  (void)rdma_destroy_id(id);
}

}  // namespace rdmaring::verbs
