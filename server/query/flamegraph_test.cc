#include "server/query/flamegraph.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "server/query/diff.h"
#include "server/query/pprof.h"

namespace strata::server {
namespace {

using ::testing::HasSubstr;

// main > a > {b: 6, c: 3}, main > d: 1 (truncated stack [truncated] > x: 2).
Profile SmallProfile() {
  Profile p;
  for (const char* name : {"main", "a", "b", "c", "d", "x"}) {
    p.functions.push_back({p.functions.size() + 100, name, "/bin/m"});
  }
  p.stacks = {{1, 6, false, {0, 1, 2}}, {2, 3, false, {0, 1, 3}}, {3, 2, true, {5}},
              {4, 1, false, {0, 4}}};
  p.total = 12;
  return p;
}

TEST(FlameTreeTest, MergesStacksInPreOrderWithOffsets) {
  FlameTree tree = BuildFlameTree(SmallProfile(), 0);
  ASSERT_EQ(tree.nodes.size(), 8u);  // all, [truncated], x, main, a, b, c, d
  EXPECT_EQ(tree.nodes[0].total, 12u);
  std::vector<std::string> names;
  for (const auto& n : tree.nodes) names.push_back(tree.functions[n.function].name);
  EXPECT_THAT(names, testing::ElementsAre("all", "[truncated]", "x", "main", "a", "b", "c", "d"));
  EXPECT_EQ(tree.nodes[3].offset, 2u);  // main follows [truncated] (2 samples)
  EXPECT_EQ(tree.nodes[6].offset, 8u);  // c follows b within a
  EXPECT_EQ(tree.nodes[5].self, 6u);
  EXPECT_EQ(tree.max_depth, 3u);
  EXPECT_EQ(tree.nodes[4].parent, 3u);
}

TEST(FlameTreeTest, PruningKeepsHeaviestConnectedNodes) {
  FlameTree tree = BuildFlameTree(SmallProfile(), 3);  // main (10), a (9), b (6)
  EXPECT_EQ(tree.pruned, 4u);
  std::vector<std::string> names;
  for (const auto& n : tree.nodes) names.push_back(tree.functions[n.function].name);
  EXPECT_THAT(names, testing::ElementsAre("all", "main", "a", "b"));
  EXPECT_EQ(tree.nodes[1].total, 10u);  // pruned children still count
}

TEST(FlameTreeTest, Renderings) {
  const Profile p = SmallProfile();
  EXPECT_EQ(RenderFolded(p), "main;a;b 6\nmain;a;c 3\n[truncated];x 2\nmain;d 1\n");
  FlameTree tree = BuildFlameTree(p, 0);
  EXPECT_THAT(RenderFlameJson(tree),
              HasSubstr("{\"name\":\"b\",\"module\":\"/bin/m\",\"value\":6,\"self\":6,"
                        "\"children\":[]},{\"name\":\"c\""));
  const std::string svg = RenderFlameSvg(tree, "t <&>");
  EXPECT_THAT(svg, HasSubstr("<text id=\"title\" x=\"600\" y=\"22\">t &lt;&amp;&gt;</text>"));
  EXPECT_THAT(svg, HasSubstr("<title>b (6 samples, 50.00%) /bin/m</title>"));
  EXPECT_THAT(RenderFlameHtml(tree, "t"), testing::StartsWith("<!DOCTYPE html>"));
}

TEST(DiffTest, ComparesShares) {
  Profile base = SmallProfile();
  Profile now = SmallProfile();
  now.stacks[0].count = 2;  // b: 6/12 -> 2/8
  now.total = 8;
  ProfileDiff d = DiffProfiles(base, now, 10);
  ASSERT_FALSE(d.functions.empty());
  EXPECT_EQ(d.functions[0].function.name, "b");
  EXPECT_NEAR(d.functions[0].self_delta_pct, 25.0 - 50.0, 1e-9);
  EXPECT_EQ(d.paths[0].frames.back().name, "b");
  EXPECT_EQ(d.paths[0].base_samples, 6u);
  EXPECT_EQ(d.paths[0].samples, 2u);
}

TEST(PprofTest, GzipsAnEncodedProfile) {
  auto data = EncodePprof(SmallProfile(), {1000, 2000});
  ASSERT_TRUE(data.ok());
  EXPECT_EQ(data->substr(0, 2), "\x1f\x8b");
  const std::string raw = EncodePprofProto(SmallProfile(), {1000, 2000});
  EXPECT_THAT(raw, HasSubstr("samples"));
  EXPECT_THAT(raw, HasSubstr("/bin/m"));
}

}  // namespace
}  // namespace strata::server
