#include "agent/core/context_graph.h"

#include "gtest/gtest.h"

namespace strata::agent {
namespace {

TEST(ContextGraphTest, FunctionsAreKeyedByBuildIdOrModuleStartAndName) {
  ContextGraph graph(42);
  const auto a = graph.NodeFor({"f", "/usr/lib/libx.so", "BID", 0x100});
  // The same library under another path (another container) is the same function.
  EXPECT_EQ(graph.NodeFor({"f", "/proc/1/root/usr/lib/libx.so", "BID", 0x100}), a);
  EXPECT_NE(graph.NodeFor({"f", "/usr/lib/libx.so", "BID", 0x200}), a);
  const auto b = graph.NodeFor({"g", "/bin/app", "", 0x100});
  EXPECT_EQ(graph.NodeFor({"g", "/bin/app", "", 0x100}), b);
  EXPECT_NE(graph.NodeFor({"g", "/bin/other", "", 0x100}), b);
  // A stripped copy of the library (same build ID) has no name for the function: its node
  // must not lend that placeholder to the named one, nor take the name.
  const auto unnamed = graph.NodeFor({"libx.so+0x300", "/opt/copy/libx.so", "BID", 0x300});
  const auto named = graph.NodeFor({"h", "/usr/lib/libx.so", "BID", 0x300});
  EXPECT_NE(named, unnamed);
  EXPECT_EQ(graph.NodeFor({"h", "/proc/1/root/usr/lib/libx.so", "BID", 0x300}), named);
  EXPECT_EQ(graph.num_nodes(), 2u + 6u);
}

TEST(ContextGraphTest, ExtendPathReusesAKnownPrefix) {
  ContextGraph graph(42);
  const auto main = graph.NodeFor({"main", "/bin/app", "", 0x10});
  const auto loop = graph.NodeFor({"loop", "/bin/app", "", 0x20});
  const auto a = graph.NodeFor({"a", "/bin/app", "", 0x30});
  const auto b = graph.NodeFor({"b", "/bin/app", "", 0x40});
  std::vector<encoding::PathFrame> path{{main, 0x15}, {loop, 0x25}, {a, 0}};
  std::vector<encoding::EdgeId> edges;
  ASSERT_TRUE(graph.ExtendPath(path, false, 0, &edges).ok());
  EXPECT_EQ(edges, *graph.AddPath(path, false));
  // The leaf changes below the same two outer frames: only the last edge is new.
  path.back() = {b, 0};
  const auto before = graph.num_edges();
  ASSERT_TRUE(graph.ExtendPath(path, false, 2, &edges).ok());
  EXPECT_EQ(edges, *graph.AddPath(path, false));
  EXPECT_EQ(graph.num_edges(), before + 1);
  // A bad prefix length or node is an error, not a crash.
  EXPECT_FALSE(graph.ExtendPath(path, false, 4, &edges).ok());
  path.back() = {encoding::kRootNode, 0};
  EXPECT_FALSE(graph.ExtendPath(path, false, 2, &edges).ok());
  EXPECT_EQ(edges.size(), 2u);
}

TEST(ContextGraphTest, DeltaCarriesRecordsAndEdgesFromAnyPoint) {
  ContextGraph graph(42);
  const auto main = graph.NodeFor({"main", "/bin/app", "", 0x10});
  const auto work = graph.NodeFor({"work", "/bin/app", "", 0x20});
  std::vector<encoding::PathFrame> path{{main, 0x15}, {work, 0}};
  ASSERT_TRUE(graph.AddPath(path, false).ok());

  v1::GraphDelta all = graph.DeltaFrom(0, 0);
  EXPECT_EQ(all.first_node(), encoding::kFirstFunctionNode);
  ASSERT_EQ(all.nodes_size(), 2);
  EXPECT_EQ(all.nodes(0).id(), main);
  EXPECT_EQ(all.nodes(1).name(), "work");
  EXPECT_EQ(all.nodes(1).start_offset(), 0x20u);
  ASSERT_EQ(all.edges_size(), 2);  // root -> main, main -> work
  EXPECT_EQ(all.edges(1).caller(), main);
  EXPECT_EQ(all.edges(1).call_site(), 0x15u);

  v1::GraphDelta tail = graph.DeltaFrom(main + 1, 1);
  EXPECT_EQ(tail.first_node(), work);
  EXPECT_EQ(tail.nodes_size(), 1);
  EXPECT_EQ(tail.first_edge(), 1u);
  EXPECT_EQ(tail.edges_size(), 1);
  EXPECT_EQ(graph.DeltaFrom(100, 100).nodes_size(), 0);
}

// A large graph goes out in bounded messages; every message's edges reference only nodes
// the server has after it, and the messages together are the whole graph.
TEST(ContextGraphTest, DeltasAreBoundedAndSelfContained) {
  ContextGraph graph(7);
  std::vector<encoding::PathFrame> path;
  for (uint64_t i = 0; i < 50; ++i) {
    path.push_back({graph.NodeFor({"f" + std::to_string(i), "/bin/app", "", i * 16}), i * 16 + 5});
    ASSERT_TRUE(graph.AddPath(path, false).ok());
  }
  // A name longer than the server takes, with a two-byte character across the limit.
  const std::string long_name = std::string(ContextGraph::kMaxNameBytes - 1, 'x') + "\xc3\xa9yz";
  const auto long_node = graph.NodeFor({long_name, "/bin/app", "", 4096});
  uint32_t nodes = 0;
  uint64_t edges = 0;
  int messages = 0;
  while (nodes < graph.num_nodes() || edges < graph.num_edges()) {
    v1::GraphDelta d = graph.DeltaFrom(nodes, edges, /*max_nodes=*/7, /*max_edges=*/9);
    ASSERT_TRUE(d.nodes_size() > 0 || d.edges_size() > 0) << "no progress at " << nodes;
    EXPECT_LE(d.nodes_size(), 7);
    EXPECT_LE(d.edges_size(), 9);
    const uint32_t after = std::max<uint32_t>(nodes, encoding::kFirstFunctionNode) + d.nodes_size();
    for (const v1::CallEdge& e : d.edges()) {
      EXPECT_LT(e.caller(), after);
      EXPECT_LT(e.callee(), after);
    }
    for (const v1::FunctionNode& n : d.nodes()) EXPECT_LE(n.name().size(), ContextGraph::kMaxNameBytes);
    nodes = after;
    edges = d.first_edge() + d.edges_size();
    ++messages;
  }
  EXPECT_GE(messages, 8);
  EXPECT_EQ(edges, graph.num_edges());
  v1::GraphDelta last = graph.DeltaFrom(long_node, graph.num_edges());
  ASSERT_EQ(last.nodes_size(), 1);
  EXPECT_EQ(last.nodes(0).name(), long_name.substr(0, ContextGraph::kMaxNameBytes - 1));
}

TEST(ContextGraphTest, NumberingFollowsTheEpoch) {
  ContextGraph graph(1);
  const auto a = graph.NodeFor({"a", "/m", "", 1});
  const auto b = graph.NodeFor({"b", "/m", "", 2});
  std::vector<encoding::PathFrame> p1{{a, 0}};
  ASSERT_TRUE(graph.AddPath(p1, false).ok());
  auto n1 = graph.CurrentNumbering();
  ASSERT_TRUE(n1.ok());
  EXPECT_EQ((*n1)->epoch(), 1u);
  EXPECT_EQ(graph.CurrentNumbering()->get(), n1->get());  // cached
  std::vector<encoding::PathFrame> p2{{a, 5}, {b, 0}};
  ASSERT_TRUE(graph.AddPath(p2, false).ok());
  EXPECT_EQ((*graph.CurrentNumbering())->epoch(), 2u);
}

}  // namespace
}  // namespace strata::agent
