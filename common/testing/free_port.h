// Loopback ports for tests that must name a server's port before the server starts (cluster
// nodes restarted on the same address, etcd's client and peer URLs). Asking the kernel for
// port 0 and closing the socket gives a port that the next such request may get again (two
// nodes' gRPC and HTTP ports once came out the same), and that any client's connection may
// take as its local port before the server binds it. These ports are never handed out twice
// in one process, and are taken from below the kernel's range for connections' local ports.
#ifndef STRATA_COMMON_TESTING_FREE_PORT_H_
#define STRATA_COMMON_TESTING_FREE_PORT_H_

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <mutex>
#include <random>
#include <set>

namespace strata::testing {

// Whether a listening socket could bind 127.0.0.1:`port` now (0: whatever the kernel picks);
// returns the port bound, or 0.
inline int BindLoopbackPort(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  socklen_t len = sizeof(addr);
  const bool bound = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
                     getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  close(fd);
  return bound ? ntohs(addr.sin_port) : 0;
}

// A loopback TCP port nothing is bound to now, that this process was not handed before; 0
// if none was found.
inline int FreeLoopbackPort() {
  static std::mutex mu;
  static std::set<int>* const handed_out = new std::set<int>;
  static std::mt19937 rng{std::random_device{}()};
  std::lock_guard lock(mu);
  // Connections' local ports come from ip_local_port_range (32768-60999 by default).
  int ephemeral_low = 32768;
  if (std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range"); range) {
    range >> ephemeral_low;
  }
  constexpr int kLowest = 10000;
  if (ephemeral_low > kLowest + 1000) {
    std::uniform_int_distribution<int> below(kLowest, ephemeral_low - 1);
    for (int attempt = 0; attempt < 1000; ++attempt) {
      const int port = below(rng);
      if (!handed_out->contains(port) && BindLoopbackPort(port) == port) {
        handed_out->insert(port);
        return port;
      }
    }
  }
  for (int attempt = 0; attempt < 100; ++attempt) {  // a range set to start low
    const int port = BindLoopbackPort(0);
    if (port != 0 && handed_out->insert(port).second) return port;
  }
  return 0;
}

}  // namespace strata::testing

#endif  // STRATA_COMMON_TESTING_FREE_PORT_H_
