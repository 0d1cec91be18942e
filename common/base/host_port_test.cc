#include "common/base/host_port.h"

#include "gtest/gtest.h"

namespace strata::base {
namespace {

TEST(HostPortTest, PortsAbove65535AreRefused) {
  for (const char* good : {"127.0.0.1:7070", "[::1]:65535", "host:0", "dns:///h:443",
                           "ipv4:10.0.0.1:7070", "ipv6:[::1]:7070", "unix:/run/strata.sock",
                           "host:http", ""}) {
    EXPECT_TRUE(CheckAddressPort(good).ok()) << good;
  }
  for (const char* bad : {"127.0.0.1:65536", "[::1]:99999", "h:84606", "h:00000000000000070000",
                          "h:99999999999999999999999"}) {
    absl::Status s = CheckAddressPort(bad);
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << bad;
    EXPECT_NE(s.message().find("out of range"), std::string::npos) << s;
  }
}

// gRPC would listen on port 443 for "127.0.0.1", and dial the scheme's default.
TEST(HostPortTest, AddressesWithoutAPortAreRefused) {
  for (const char* bad : {"127.0.0.1", "host", "host:", "[::1]", "[::1]:", "dns:///host"}) {
    absl::Status s = CheckAddressPort(bad);
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << bad;
    EXPECT_NE(s.message().find("has no port"), std::string::npos) << s;
  }
}

}  // namespace
}  // namespace strata::base
