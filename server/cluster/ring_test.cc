#include "server/cluster/ring.h"

#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "server/cluster/ring_testing.h"

namespace strata::server::cluster {
namespace {

TEST(RingTest, OwnersAreDistinctAndTheSameOnEveryNode) {
  std::vector<RingMember> members = TestMembers(3);
  const Ring a(members);
  std::reverse(members.begin(), members.end());
  const Ring b(members);  // another node's view: same members, another order
  for (int i = 0; i < 1000; ++i) {
    const std::string host = absl::StrCat("host-", i);
    std::vector<const RingMember*> owners = a.Owners(host, 2);
    ASSERT_EQ(owners.size(), 2u);
    EXPECT_NE(owners[0]->id, owners[1]->id);
    std::vector<const RingMember*> other = b.Owners(host, 2);
    EXPECT_EQ(owners[0]->id, other[0]->id);
    EXPECT_EQ(owners[1]->id, other[1]->id);
  }
  EXPECT_EQ(a.Owners("h", 5).size(), 3u);  // never more owners than nodes
  EXPECT_TRUE(Ring().Owners("h", 2).empty());
}

TEST(RingTest, OwnershipIsBalancedAndSumsToOne) {
  const Ring ring(TestMembers(3));
  double sum = 0;
  for (const RingMember& m : ring.members()) {
    const double share = ring.Ownership(m.id);
    EXPECT_GT(share, 0.25) << m.id;
    EXPECT_LT(share, 0.42) << m.id;
    sum += share;
  }
  EXPECT_NEAR(sum, 1.0, 1e-9);
  // Keys follow the shares.
  std::map<std::string, int> first;
  for (int i = 0; i < 30'000; ++i) ++first[ring.Owners(absl::StrCat("h", i), 1)[0]->id];
  for (const auto& [id, n] : first) EXPECT_NEAR(n / 30'000.0, ring.Ownership(id), 0.02) << id;
}

// What fan-out queries rely on: a node joining or leaving changes at most one owner of a
// key, so with two replicas one owner holds the key's samples from before and after.
TEST(RingTest, AJoinOrALeaveKeepsAllButOneOwnerOfEveryKey) {
  const Ring three(TestMembers(3));
  const Ring four(TestMembers(4));
  int moved = 0;
  for (int i = 0; i < 5000; ++i) {
    const std::string host = absl::StrCat("host-", i);
    std::set<std::string> before, after;
    for (const RingMember* m : three.Owners(host, 2)) before.insert(m->id);
    for (const RingMember* m : four.Owners(host, 2)) after.insert(m->id);
    int kept = 0;
    for (const std::string& id : after) kept += before.count(id);
    EXPECT_GE(kept, 1) << host;
    if (kept == 1) {
      ++moved;
      EXPECT_TRUE(after.count("n4")) << host;  // only to the new node
    }
  }
  // The new node takes about its share: half of the keys gain it as one of two owners.
  EXPECT_GT(moved, 5000 * 0.3);
  EXPECT_LT(moved, 5000 * 0.7);
}

TEST(RingTest, FindAndIsOwner) {
  const Ring ring(TestMembers(3));
  ASSERT_NE(ring.Find("n2"), nullptr);
  EXPECT_EQ(ring.Find("n2")->address, "127.0.0.1:7002");
  EXPECT_EQ(ring.Find("n9"), nullptr);
  const std::vector<const RingMember*> owners = ring.Owners("web-1", 2);
  EXPECT_TRUE(ring.IsOwner("web-1", 2, owners[0]->id));
  EXPECT_TRUE(ring.IsOwner("web-1", 2, owners[1]->id));
  EXPECT_EQ(ring.Ownership("n9"), 0);
}

}  // namespace
}  // namespace strata::server::cluster
