#include "common/testing/free_port.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <set>

#include "gtest/gtest.h"

namespace strata::testing {
namespace {

int EphemeralLow() {
  int low = 32768;
  std::ifstream("/proc/sys/net/ipv4/ip_local_port_range") >> low;
  return low;
}

TEST(FreeLoopbackPortTest, NeverHandsOutAPortTwiceAndEachCanBeListenedOn) {
  std::set<int> seen;
  for (int i = 0; i < 300; ++i) {
    const int port = FreeLoopbackPort();
    ASSERT_NE(port, 0);
    EXPECT_TRUE(seen.insert(port).second) << port << " handed out twice";
    if (EphemeralLow() > 11000) {
      EXPECT_LT(port, EphemeralLow()) << "in the range of connections' local ports";
    }
  }
  // The last one is free: a server can listen on it.
  const int port = *seen.rbegin();
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  EXPECT_EQ(listen(fd, 1), 0);
  // A port something listens on is not free.
  EXPECT_EQ(BindLoopbackPort(port), 0);
  close(fd);
}

}  // namespace
}  // namespace strata::testing
