#include "server/cluster/membership.h"

#include <chrono>
#include <memory>
#include <string>

#include "absl/time/clock.h"
#include "common/testing/wait_for.h"
#include "gtest/gtest.h"
#include "server/cluster/etcd/etcd_client.h"
#include "server/cluster/etcd/etcd_test_server.h"
#include "strata/v1/cluster.pb.h"

namespace strata::server::cluster {
namespace {

template <typename Pred>
bool WaitFor(Pred done, absl::Duration timeout) {
  return strata::testing::WaitFor(done, absl::ToChronoMilliseconds(timeout),
                                  std::chrono::milliseconds(50));
}

class MembershipTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!EtcdTestServer::Available()) GTEST_SKIP() << "no etcd (Debian package etcd-server)";
    auto etcd = EtcdTestServer::Start();
    ASSERT_TRUE(etcd.ok()) << etcd.status();
    etcd_ = *std::move(etcd);
  }
  std::unique_ptr<Membership> Join(const std::string& id, const std::string& address,
                                   absl::Duration ttl = absl::Seconds(3)) {
    auto m = Membership::Join({.etcd_endpoints = etcd_->endpoint(),
                               .node_id = id,
                               .advertise = address,
                               .lease_ttl = ttl});
    EXPECT_TRUE(m.ok()) << m.status();
    return m.ok() ? *std::move(m) : nullptr;
  }
  std::unique_ptr<EtcdTestServer> etcd_;
};

TEST_F(MembershipTest, NodesSeeEachOtherJoinAndLeave) {
  auto a = Join("a", "127.0.0.1:1");
  auto b = Join("b", "127.0.0.1:2");
  ASSERT_TRUE(a && b);
  EXPECT_TRUE(WaitFor([&] { return a->ring()->members().size() == 2; }, absl::Seconds(10)));
  EXPECT_EQ(b->ring()->members().size(), 2u);
  EXPECT_EQ(a->ring()->Find("b")->address, "127.0.0.1:2");
  EXPECT_TRUE(a->lease_held());
  b.reset();  // leaves: its lease is revoked, so it goes at once, not after the TTL
  EXPECT_TRUE(WaitFor([&] { return a->ring()->members().size() == 1; }, absl::Seconds(2)));
  ASSERT_EQ(a->departed().size(), 1u);
  EXPECT_EQ(a->departed()[0].id, "b");
  // Back with the same ID: no longer departed.
  b = Join("b", "127.0.0.1:2");
  EXPECT_TRUE(WaitFor([&] { return a->ring()->members().size() == 2; }, absl::Seconds(10)));
  EXPECT_TRUE(a->departed().empty());
}

// A member that stops refreshing its lease (a killed node) leaves the ring after the TTL.
TEST_F(MembershipTest, MemberWhoseLeaseExpiresLeavesTheRing) {
  auto a = Join("a", "127.0.0.1:1");
  ASSERT_TRUE(a);
  auto etcd = EtcdClient::Create(etcd_->endpoint());
  ASSERT_TRUE(etcd.ok());
  auto lease = (*etcd)->GrantLease(absl::Seconds(2));
  ASSERT_TRUE(lease.ok()) << lease.status();
  v1::ClusterMember ghost;
  ghost.set_id("ghost");
  ghost.set_address("127.0.0.1:9");
  ghost.set_tokens(16);
  // As a node registers: its record for good, and its live key under the lease.
  ASSERT_TRUE((*etcd)->Put("/strata/members/ghost", ghost.SerializeAsString()).ok());
  ASSERT_TRUE((*etcd)->Put("/strata/nodes/ghost", ghost.SerializeAsString(), *lease).ok());
  EXPECT_TRUE(WaitFor([&] { return a->ring()->Find("ghost") != nullptr; }, absl::Seconds(10)));
  EXPECT_TRUE(WaitFor([&] { return a->ring()->Find("ghost") == nullptr; }, absl::Seconds(20)));
  EXPECT_EQ(a->departed().size(), 1u);
}

// A node down before another (re)started is known to it as down, from its record in etcd;
// forgetting it (a node removed for good) removes it everywhere. A live node cannot be
// forgotten.
TEST_F(MembershipTest, DownNodesAreKnownAcrossRestartsUntilForgotten) {
  auto a = Join("a", "127.0.0.1:1");
  auto b = Join("b", "127.0.0.1:2");
  auto c = Join("c", "127.0.0.1:3");
  ASSERT_TRUE(a && b && c);
  c.reset();
  ASSERT_TRUE(WaitFor([&] { return a->departed().size() == 1; }, absl::Seconds(10)));
  a.reset();
  a = Join("a", "127.0.0.1:1");  // restarted: it never saw c
  ASSERT_TRUE(a);
  ASSERT_EQ(a->departed().size(), 1u);
  EXPECT_EQ(a->departed()[0].id, "c");
  EXPECT_EQ(a->departed()[0].address, "127.0.0.1:3");

  auto etcd = EtcdClient::Create(etcd_->endpoint());
  ASSERT_TRUE(etcd.ok());
  EXPECT_EQ(Membership::Forget(**etcd, "/strata", "b").code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Membership::Forget(**etcd, "/strata", "zz").code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(Membership::Forget(**etcd, "/strata", "c").ok());
  EXPECT_TRUE(WaitFor([&] { return a->departed().empty() && b->departed().empty(); },
                      absl::Seconds(10)));
  EXPECT_EQ(a->ring()->members().size(), 2u);
  // A forgotten node that comes back joins as any node does.
  c = Join("c", "127.0.0.1:3");
  ASSERT_TRUE(c);
  EXPECT_TRUE(WaitFor([&] { return a->ring()->members().size() == 3; }, absl::Seconds(10)));
}

TEST_F(MembershipTest, SecondNodeWithALiveNodesIdIsRefused) {
  auto a = Join("a", "127.0.0.1:1");
  ASSERT_TRUE(a);
  auto twin = Membership::Join({.etcd_endpoints = etcd_->endpoint(),
                                .node_id = "a",
                                .advertise = "127.0.0.1:5"});
  ASSERT_FALSE(twin.ok());
  EXPECT_TRUE(absl::IsAlreadyExists(twin.status())) << twin.status();
  EXPECT_FALSE(Membership::Join({.etcd_endpoints = etcd_->endpoint(), .node_id = "x"}).ok());
}

// etcd away longer than the TTL: the node stops counting as a member (lease_held false),
// keeps its cached ring, and registers again once etcd is back.
TEST_F(MembershipTest, LeaseLostWhileEtcdIsAwayIsTakenAgain) {
  auto a = Join("a", "127.0.0.1:1", absl::Seconds(3));
  auto b = Join("b", "127.0.0.1:2", absl::Seconds(3));
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(WaitFor([&] { return a->ring()->members().size() == 2; }, absl::Seconds(10)));
  etcd_->Kill();
  EXPECT_TRUE(WaitFor([&] { return !a->lease_held(); }, absl::Seconds(15)));
  EXPECT_EQ(a->ring()->members().size(), 2u);  // cached
  ASSERT_TRUE(etcd_->Restart().ok()) << etcd_->LogTail();
  EXPECT_TRUE(WaitFor([&] { return a->lease_held() && b->lease_held(); }, absl::Seconds(30)));
  EXPECT_TRUE(WaitFor([&] { return a->ring()->members().size() == 2 &&
                                   b->ring()->members().size() == 2; },
                      absl::Seconds(30)));
  EXPECT_GE(a->stats().watch_restarts, 1u);
}

}  // namespace
}  // namespace strata::server::cluster
