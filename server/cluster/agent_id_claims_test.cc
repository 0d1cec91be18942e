#include "server/cluster/agent_id_claims.h"

#include <memory>
#include <string>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "server/cluster/etcd/etcd_client.h"
#include "server/cluster/etcd/etcd_test_server.h"

namespace strata::server::cluster {
namespace {

class AgentIdClaimsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!EtcdTestServer::Available()) GTEST_SKIP() << "no etcd (Debian package etcd-server)";
    auto etcd = EtcdTestServer::Start();
    ASSERT_TRUE(etcd.ok()) << etcd.status();
    etcd_ = *std::move(etcd);
    auto client = EtcdClient::Create(etcd_->endpoint(), {.call_timeout = absl::Seconds(1)});
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
  }
  std::unique_ptr<EtcdTestServer> etcd_;
  std::unique_ptr<EtcdClient> client_;
  AgentIdClaimStats stats_;
};

TEST_F(AgentIdClaimsTest, TheFirstPrincipalOwnsAnIdOnEveryNode) {
  AgentIdClaims node1(client_.get(), "/c", &stats_), node2(client_.get(), "/c", &stats_);
  EXPECT_TRUE(node1.Claim("web-1", "token fleet", false).ok());
  EXPECT_TRUE(node2.Claim("web-1", "token fleet", false).ok());
  absl::Status other = node2.Claim("web-1", "certificate host-b", true);
  EXPECT_TRUE(absl::IsPermissionDenied(other)) << other;
  EXPECT_NE(other.message().find("belongs to token fleet"), std::string::npos) << other;
  EXPECT_EQ(stats_.refused.load(), 1u);
  auto stored = client_->GetPrefix("/c/agent-ids/");
  ASSERT_TRUE(stored.ok()) << stored.status();
  ASSERT_EQ(stored->kvs.size(), 1u);
  EXPECT_EQ(stored->kvs[0].key, "/c/agent-ids/web-1");
  EXPECT_EQ(stored->kvs[0].value, "token fleet");
}

// While etcd is away, an agent this node's store records with the same owner is taken; any
// other waits (Unavailable), without a call's deadline each while the back-off lasts. Claims
// work again once etcd is back.
TEST_F(AgentIdClaimsTest, WithoutEtcdOnlyAgentsRecordedHereAreTaken) {
  AgentIdClaims claims(client_.get(), "/c", &stats_, absl::Milliseconds(500));
  ASSERT_TRUE(claims.Claim("cached", "token fleet", false).ok());
  etcd_->Kill();
  EXPECT_TRUE(claims.Claim("cached", "token fleet", false).ok());
  EXPECT_TRUE(claims.Claim("recorded", "token fleet", true).ok());
  const absl::Time start = absl::Now();
  absl::Status unknown = claims.Claim("unknown", "token fleet", false);
  EXPECT_TRUE(absl::IsUnavailable(unknown)) << unknown;
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(100));  // within the back-off: no call
  EXPECT_EQ(stats_.unconfirmed.load(), 1u);

  ASSERT_TRUE(etcd_->Restart().ok());
  absl::SleepFor(absl::Milliseconds(600));  // the back-off's end
  absl::Status claimed = absl::UnavailableError("not tried");
  for (int i = 0; i < 20 && absl::IsUnavailable(claimed); ++i) {
    claimed = claims.Claim("unknown", "token fleet", false);
    if (absl::IsUnavailable(claimed)) absl::SleepFor(absl::Milliseconds(600));
  }
  EXPECT_TRUE(claimed.ok()) << claimed;
  EXPECT_TRUE(absl::IsPermissionDenied(claims.Claim("unknown", "token other", true)));
}

}  // namespace
}  // namespace strata::server::cluster
