// A ring owner embedded in a service's own epoll loop: the owner's fd() sits beside a TCP
// listener (and a signalfd), and the loop drains, arms, then sleeps until any of them is ready
// (README.md next to this file; README.md's "Idle costs no CPU" for the rule).
//   event-loop ADDRESS [--control-port P] [--status-port S] [--records N]
//              [--ca FILE --cert FILE --key FILE | --insecure-plaintext]
// Serves a ring owner on ADDRESS:P (default 7471) and answers every TCP connection to
// 127.0.0.1:S (default 7472) with one line, the number of records delivered so far. Runs until
// SIGINT or SIGTERM, or with --records N until N records came and no session is open. A port of
// 0 takes a free one; the first line printed names both. The control channel is mutual TLS:
// --ca, --cert and --key (default: RDMARING_CA, RDMARING_CERT, RDMARING_KEY) name the PEM files.
#include <rdmaring/ring_owner.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iostream>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

namespace {

struct Options {
  std::string address;
  std::uint16_t control_port = 7471;
  std::uint16_t status_port = 7472;
  std::optional<std::uint64_t> records;
  rdmaring::ControlSecurity security;  // mutual TLS unless --insecure-plaintext
};

std::string from_env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

template <class Number>
Number parse_number(std::string_view flag, std::string_view text) {
  Number n{};
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), n);
  if (error != std::errc{} || end != text.data() + text.size())
    throw UsageError(std::string(flag) + " takes a number in range, not '" + std::string(text) + "'");
  return n;
}

Options parse(int argc, char** argv) {
  if (argc < 2) throw UsageError("no ADDRESS given");
  Options o{.address = argv[1]};
  // The control channel's material: the environment's unless a flag names another file.
  o.security = {.ca = from_env("RDMARING_CA"), .certificate = from_env("RDMARING_CERT"),
                .private_key = from_env("RDMARING_KEY")};
  bool plaintext = false;
  for (int i = 2; i < argc; i += 2) {
    const std::string_view flag = argv[i];
    if (flag == "--insecure-plaintext") {
      plaintext = true;
      --i;  // a flag without a value
      continue;
    }
    if (i + 1 == argc) throw UsageError(std::string(flag) + " needs a value");
    const std::string_view value = argv[i + 1];
    if (flag == "--control-port") o.control_port = parse_number<std::uint16_t>(flag, value);
    else if (flag == "--status-port") o.status_port = parse_number<std::uint16_t>(flag, value);
    else if (flag == "--records") o.records = parse_number<std::uint64_t>(flag, value);
    else if (flag == "--ca") o.security.ca = value;
    else if (flag == "--cert") o.security.certificate = value;
    else if (flag == "--key") o.security.private_key = value;
    else throw UsageError("unknown option '" + std::string(flag) + "'");
  }
  if (plaintext) {
    if (!o.security.ca.empty() || !o.security.certificate.empty() || !o.security.private_key.empty())
      throw UsageError("--insecure-plaintext with TLS material (flags or RDMARING_CA/CERT/KEY): say one or the other");
    o.security = {.insecure_plaintext = true};
  } else if (o.security.ca.empty() || o.security.certificate.empty() || o.security.private_key.empty()) {
    throw UsageError("the control channel is mutual TLS: give --ca, --cert and --key (or RDMARING_CA, RDMARING_CERT, "
                     "RDMARING_KEY), or --insecure-plaintext");
  }
  return o;
}

int check(int rc, const char* call) {
  if (rc < 0) throw std::system_error(errno, std::system_category(), call);
  return rc;
}

// A descriptor, closed with its owner.
class Fd {
 public:
  explicit Fd(int fd) noexcept : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Fd& operator=(Fd&&) = delete;
  ~Fd() {
    if (fd_ >= 0) close(fd_);
  }
  int get() const noexcept { return fd_; }

 private:
  int fd_;
};

// Loopback only: the status port is for the operator on this machine, not the network.
Fd listen_on_loopback(std::uint16_t port) {
  Fd s(check(socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0), "socket"));
  const int on = 1;
  check(setsockopt(s.get(), SOL_SOCKET, SO_REUSEADDR, &on, sizeof on), "setsockopt(SO_REUSEADDR)");
  sockaddr_in a{.sin_family = AF_INET, .sin_port = htons(port), .sin_addr = {htonl(INADDR_LOOPBACK)}};
  check(bind(s.get(), reinterpret_cast<const sockaddr*>(&a), sizeof a), "bind(127.0.0.1)");
  check(listen(s.get(), 16), "listen");
  return s;
}

std::uint16_t bound_port(const Fd& s) {
  sockaddr_in a{};
  socklen_t len = sizeof a;
  check(getsockname(s.get(), reinterpret_cast<sockaddr*>(&a), &len), "getsockname");
  return ntohs(a.sin_port);
}

// Answers every connection waiting on the (non-blocking) listener, then closes it.
void answer_status(const Fd& listener, std::uint64_t delivered) {
  const std::string line = std::to_string(delivered) + "\n";
  for (;;) {
    const int c = accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (c < 0 && (errno == ECONNABORTED || errno == EINTR)) continue;
    const Fd connection(check(c, "accept4"));
    // A few bytes into a new connection's empty send buffer: this blocking send does not block.
    // A client that has gone already is its own problem, not the service's (MSG_NOSIGNAL).
    if (send(connection.get(), line.data(), line.size(), MSG_NOSIGNAL) < 0)
      std::cerr << "event-loop: status answer: " << std::strerror(errno) << '\n';
  }
}

int fail(std::string_view what, const rdmaring::Error& e) {
  std::cerr << "event-loop: " << what << ": " << e.message() << '\n';
  return 1;
}

int serve(const Options& o) {
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  // Blocked before RingOwner::start, whose control thread inherits the mask: a stop signal then
  // waits in the signalfd for this loop, rather than ending the process on whichever thread.
  if (const int e = pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr); e != 0)
    throw std::system_error(e, std::system_category(), "pthread_sigmask");
  const Fd signals(check(signalfd(-1, &stop_signals, SFD_NONBLOCK | SFD_CLOEXEC), "signalfd"));
  const Fd listener = listen_on_loopback(o.status_port);
  // A session that ends makes owner->fd() readable too: with --records the loop notices the last.
  const auto owner =
      rdmaring::RingOwner::start({.address = o.address, .control_port = o.control_port, .security = o.security});

  const Fd epoll(check(epoll_create1(EPOLL_CLOEXEC), "epoll_create1"));
  for (const int fd : {owner->fd(), signals.get(), listener.get()}) {
    epoll_event ev{.events = EPOLLIN, .data = {.fd = fd}};
    check(epoll_ctl(epoll.get(), EPOLL_CTL_ADD, fd, &ev), "epoll_ctl");
  }
  std::cout << "event-loop: owner on " << o.address << " port " << owner->control_port()
            << ", status on 127.0.0.1 port " << bound_port(listener) << ", "
            << (o.security.insecure_plaintext ? "PLAIN TCP" : "mutual TLS") << std::endl;

  std::uint64_t delivered = 0;
  const auto count = [&delivered](const rdmaring::Delivery&) { ++delivered; };
  bool stop_signalled = false;
  for (;;) {
    // Drain: poll until a poll finds nothing.
    for (;;) {
      auto polled = owner->poll(count, 256);
      if (!polled) return fail("poll", polled.error());
      if (polled.value() == 0) break;
    }
    if (stop_signalled || (o.records && delivered >= *o.records && owner->session_count() == 0)) break;
    // Then arm. False: a record came in since the last poll and would not wake epoll: poll again.
    auto armed = owner->arm();
    if (!armed) return fail("arm", armed.error());
    if (!armed.value()) continue;
    std::array<epoll_event, 8> events;
    const int ready = epoll_wait(epoll.get(), events.data(), static_cast<int>(events.size()), -1);
    if (ready < 0 && errno == EINTR) continue;
    for (const epoll_event& event : std::span(events).first(static_cast<std::size_t>(check(ready, "epoll_wait")))) {
      const int fd = event.data.fd;
      if (fd == listener.get()) {
        answer_status(listener, delivered);
      } else if (fd == signals.get()) {
        signalfd_siginfo info{};
        check(static_cast<int>(read(signals.get(), &info, sizeof info)), "read(signalfd)");
        stop_signalled = true;
      }
      // owner->fd() readable needs nothing here: the loop's next poll takes the work, or sees
      // session_count() fall.
    }
  }
  std::cout << "event-loop: " << delivered << " records delivered, "
            << (stop_signalled ? "stopped by a signal" : "every session closed") << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) try {
  return serve(parse(argc, argv));
} catch (const UsageError& e) {
  std::cerr << "event-loop: " << e.what()
            << " (usage: event-loop ADDRESS [--control-port P] [--status-port S] [--records N] "
               "[--ca FILE --cert FILE --key FILE | --insecure-plaintext])\n";
  return 2;
} catch (const std::exception& e) {
  // SetupError (a bad address, no RDMA device behind it, a port in use) or a system call's error.
  std::cerr << "event-loop: " << e.what() << '\n';
  return 1;
}
