/* librdmaring-chaos-bind.so: LD_PRELOADed into the chaos run's producer and probe processes so
 * that their control channel (TCP) leaves from their test host's address, as it would from a
 * host of its own. All test hosts share one network namespace (tests/softroce/testhosts), where
 * an unbound connection to another host's address takes the loopback path and would never see
 * a pulled cable or netem; bound to the host's address, policy routing sends it over the host's
 * veth. ProducerOptions::source_address binds only the RDMA connection, hence this shim.
 *
 * RDMARING_CHAOS_BIND=ADDR: an AF_INET stream socket that is not bound yet is bound to ADDR
 * (port 0) before connect(). Without the variable, connect() is untouched. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

typedef int (*connect_fn)(int, __CONST_SOCKADDR_ARG, socklen_t);

/* glibc declares connect() with __CONST_SOCKADDR_ARG, a transparent union under _GNU_SOURCE. */
int connect(int fd, __CONST_SOCKADDR_ARG arg, socklen_t len) {
  const struct sockaddr* addr = arg.__sockaddr__;
  static connect_fn real = NULL;
  if (real == NULL) {
    void* sym = dlsym(RTLD_NEXT, "connect");
    memcpy(&real, &sym, sizeof real);
  }
  const char* source = getenv("RDMARING_CHAOS_BIND");
  if (source != NULL && addr != NULL && addr->sa_family == AF_INET) {
    int type = 0;
    socklen_t type_len = sizeof type;
    struct sockaddr_in local;
    socklen_t local_len = sizeof local;
    memset(&local, 0, sizeof local);
    if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &type_len) == 0 && type == SOCK_STREAM &&
        getsockname(fd, (struct sockaddr*)&local, &local_len) == 0 && local.sin_port == 0 &&
        local.sin_addr.s_addr == htonl(INADDR_ANY)) {
      struct sockaddr_in bind_to;
      memset(&bind_to, 0, sizeof bind_to);
      bind_to.sin_family = AF_INET;
      if (inet_pton(AF_INET, source, &bind_to.sin_addr) == 1)
        (void)bind(fd, (const struct sockaddr*)&bind_to, sizeof bind_to);
    }
  }
  return real(fd, arg, len);
}
