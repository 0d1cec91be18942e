#include "server/app/grpc_log.h"

#include "gtest/gtest.h"

namespace strata::server::app {
namespace {

TEST(GrpcLogTest, LinesTheServerActsOnOrLogsQuietly) {
  EXPECT_TRUE(IsListenerLost("Failed accept4: Too many open files"));
  EXPECT_FALSE(IsListenerLost("Handshake failed with fatal error SSL_ERROR_SSL"));
  // A client's SNI name the certificate does not hold: logged at every connection otherwise.
  EXPECT_TRUE(IsClientsDoing("No match found for server name: 127.0.0.1."));
  EXPECT_FALSE(IsClientsDoing("Handshake failed with fatal error SSL_ERROR_SSL: certificate "
                              "verify failed."));
}

}  // namespace
}  // namespace strata::server::app
