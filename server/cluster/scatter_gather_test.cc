#include "server/cluster/scatter_gather.h"

#include <map>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "server/cluster/ring_testing.h"

namespace strata::server::cluster {
namespace {

v1::HostTotalsResponse Totals(std::map<std::string, uint64_t> hosts) {
  v1::HostTotalsResponse out;
  out.mutable_hosts()->insert(hosts.begin(), hosts.end());
  return out;
}

// Node ID -> the hosts it is asked for.
std::map<std::string, std::vector<std::string>> Assignment(const HostPick& pick) {
  std::map<std::string, std::vector<std::string>> out;
  EXPECT_EQ(pick.nodes.size(), pick.requests.size());
  for (size_t i = 0; i < pick.nodes.size(); ++i) {
    out[pick.nodes[i].id].assign(pick.requests[i].hosts().begin(),
                                 pick.requests[i].hosts().end());
  }
  return out;
}

using Hosts = std::vector<std::string>;

TEST(ChooseHostsTest, EachHostFromItsFullestReplicaTiesToTheFirstNodeOfTheRing) {
  const std::vector<RingMember> nodes = TestMembers(3);
  // Answers in another order than the ring's: ties still go to the node first in the ring.
  const NodeAnswers<v1::HostTotalsResponse> totals = {
      {"n3", Totals({{"a", 10}, {"b", 7}, {"c", 5}})},
      {"n1", Totals({{"a", 10}, {"c", 5}})},
      {"n2", Totals({{"b", 9}, {"d", 1}})},
  };
  v1::LocalProfileRequest request;
  request.mutable_filter()->set_service("svc");
  request.add_hosts("stale");  // replaced by each node's hosts
  const HostPick pick = ChooseHosts(nodes, totals, request);
  EXPECT_EQ(Assignment(pick),
            (std::map<std::string, Hosts>{{"n1", {"a", "c"}}, {"n2", {"b", "d"}}}));
  EXPECT_EQ(pick.host_samples,
            (std::map<std::string, uint64_t>{{"a", 10}, {"b", 9}, {"c", 5}, {"d", 1}}));
  for (const v1::LocalProfileRequest& r : pick.requests) EXPECT_EQ(r.filter().service(), "svc");
  EXPECT_EQ(pick.nodes[0].address, "127.0.0.1:7001");
}

TEST(ChooseHostsTest, HostsOfANodeThatDidNotAnswerGoToTheirOtherReplicas) {
  const std::vector<RingMember> nodes = TestMembers(3);
  const NodeAnswers<v1::HostTotalsResponse> totals = {
      {"n1", Totals({{"a", 10}, {"b", 9}, {"c", 4}})},
      {"n2", Totals({{"a", 10}, {"d", 3}})},
      {"n3", Totals({{"b", 8}, {"c", 4}, {"d", 3}})},
  };
  const HostPick first = ChooseHosts(nodes, totals, {});
  EXPECT_EQ(Assignment(first),
            (std::map<std::string, Hosts>{{"n1", {"a", "b", "c"}}, {"n2", {"d"}}}));
  // n1 did not answer phase 2: its hosts again, without it. Host b's replica holds fewer
  // samples (it missed a batch): that is what there is. d was answered: not asked again.
  const std::set<std::string> orphaned = {"a", "b", "c"};
  const HostPick again = ChooseHosts(nodes, totals, {}, {"n1"}, &orphaned);
  EXPECT_EQ(Assignment(again),
            (std::map<std::string, Hosts>{{"n2", {"a"}}, {"n3", {"b", "c"}}}));
  EXPECT_EQ(again.host_samples,
            (std::map<std::string, uint64_t>{{"a", 10}, {"b", 8}, {"c", 4}}));
  // A host only the excluded node holds is nobody's.
  const std::set<std::string> only_n1 = {"e"};
  const NodeAnswers<v1::HostTotalsResponse> with_e = {{"n1", Totals({{"e", 1}})},
                                                      {"n2", Totals({})}};
  EXPECT_TRUE(ChooseHosts(nodes, with_e, {}, {"n1"}, &only_n1).nodes.empty());
}

TEST(ChooseHostsTest, AnswersOfNodesNotOnTheRingAreIgnored) {
  const NodeAnswers<v1::HostTotalsResponse> totals = {{"n9", Totals({{"a", 100}})},
                                                      {"n2", Totals({{"a", 1}})}};
  const HostPick pick = ChooseHosts(TestMembers(2), totals, {});
  EXPECT_EQ(Assignment(pick), (std::map<std::string, Hosts>{{"n2", {"a"}}}));
}

}  // namespace
}  // namespace strata::server::cluster
