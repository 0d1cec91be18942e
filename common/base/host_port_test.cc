#include "common/base/host_port.h"

#include "gtest/gtest.h"

namespace strata::base {
namespace {

TEST(HostPortTest, PortsAbove65535AreRefused) {
  for (const char* good : {"127.0.0.1:7070", "[::1]:65535", "host:0", "dns:///h:443",
                           "unix:/run/strata.sock", "host", "host:", "host:http"}) {
    EXPECT_TRUE(CheckPortInRange(good).ok()) << good;
  }
  for (const char* bad : {"127.0.0.1:65536", "[::1]:99999", "h:84606", "h:00000000000000070000",
                          "h:99999999999999999999999"}) {
    absl::Status s = CheckPortInRange(bad);
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << bad;
    EXPECT_NE(s.message().find("out of range"), std::string::npos) << s;
  }
}

}  // namespace
}  // namespace strata::base
