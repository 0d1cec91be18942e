#include <chrono>
#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "common/encoding/graph.h"
#include "common/encoding/numbering.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace strata::encoding {
namespace {

using ::testing::ElementsAre;

std::shared_ptr<const Numbering> MustCompute(const CallGraph& g, uint64_t epoch) {
  auto n = Numbering::Compute(g, epoch);
  EXPECT_TRUE(n.ok()) << n.status();
  return *n;
}

// Outgoing edges of every node over all edges (forward and back), for path generation.
std::vector<std::vector<EdgeId>> OutEdges(const CallGraph& g) {
  std::vector<std::vector<EdgeId>> out(g.num_nodes());
  for (EdgeId e = 0; e < g.num_edges(); ++e) out[g.edge(e).caller].push_back(e);
  return out;
}

// Encodes `path`, checks Decode/DecodeEdges give it back, and returns the encoding.
EncodedContext RoundTrip(const Numbering& num, const std::vector<EdgeId>& path) {
  Encoder enc(num);
  auto ctx = enc.Encode(path);
  EXPECT_TRUE(ctx.ok()) << ctx.status();
  if (!ctx.ok()) return {};
  for (uint64_t id : ctx->ids) EXPECT_LT(id, kMaxContexts);
  std::vector<EdgeId> decoded;
  bool truncated = false;
  absl::Status s = num.DecodeEdges(*ctx, &decoded, &truncated, 1 << 20);
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(decoded, path);
  EXPECT_EQ(truncated, num.edge(path[0]).caller == kTruncatedNode);
  auto frames = Decode(num, *ctx, &truncated, 1 << 20);
  EXPECT_TRUE(frames.ok()) << frames.status();
  if (frames.ok()) {
    EXPECT_EQ(frames->size(), path.size());
    for (size_t i = 0; i < path.size() && i < frames->size(); ++i) {
      EXPECT_EQ((*frames)[i].function, num.edge(path[i]).callee);
      const uint64_t site = i + 1 < path.size() ? num.edge(path[i + 1]).call_site : 0;
      EXPECT_EQ((*frames)[i].call_site, site);
    }
  }
  return *ctx;
}

// Checks uniqueness and round trip of every path starting at the root or the truncated marker
// with at most `max_len` edges. Returns the number of paths checked.
size_t CheckAllPaths(const CallGraph& g, const Numbering& num, size_t max_len) {
  const auto out = OutEdges(g);
  std::map<std::pair<NodeId, std::vector<uint64_t>>, std::vector<EdgeId>> seen;
  std::vector<EdgeId> path;
  size_t count = 0;
  auto visit = [&](auto&& self, NodeId at) -> void {
    for (EdgeId e : out[at]) {
      path.push_back(e);
      EncodedContext ctx = RoundTrip(num, path);
      ++count;
      auto [it, inserted] = seen.emplace(std::make_pair(ctx.leaf, ctx.ids), path);
      EXPECT_TRUE(inserted) << "two paths share an encoding";
      if (path.size() < max_len) self(self, g.edge(e).callee);
      path.pop_back();
    }
  };
  visit(visit, kRootNode);
  visit(visit, kTruncatedNode);
  return count;
}

enum class Shape { kAcyclic, kRecursion, kMutualRecursion, kMultiCallSite, kMixed };

// A random graph of `nodes` functions: root calls a few entry points, the truncated marker
// a few functions; other edges follow `shape`.
CallGraph RandomGraph(Shape shape, int nodes, int extra_edges, uint32_t seed) {
  std::mt19937 rng(seed);
  CallGraph g;
  for (int i = 0; i < nodes; ++i) g.AddNode();
  auto node = [&](int lo, int hi) {
    return static_cast<NodeId>(kFirstFunctionNode + std::uniform_int_distribution<int>(lo, hi)(rng));
  };
  EXPECT_TRUE(g.AddEdge({kRootNode, 0, kFirstFunctionNode}).ok());
  EXPECT_TRUE(g.AddEdge({kRootNode, 0, node(0, nodes - 1)}).ok());
  EXPECT_TRUE(g.AddEdge({kTruncatedNode, 0, node(0, nodes - 1)}).ok());
  // A spine so that most nodes are reachable.
  for (int i = 1; i < nodes; ++i) {
    EXPECT_TRUE(g.AddEdge({node(0, i - 1), static_cast<uint64_t>(0x100 + i),
                           static_cast<NodeId>(kFirstFunctionNode + i)})
                    .ok());
  }
  for (int k = 0; k < extra_edges; ++k) {
    NodeId a = node(0, nodes - 1), b = node(0, nodes - 1);
    uint64_t site = 0x1000 + rng() % 64;
    switch (shape) {
      case Shape::kAcyclic:
        if (a == b) continue;
        if (a > b) std::swap(a, b);
        break;
      case Shape::kRecursion:
        if (k % 3 == 0) {
          b = a;  // self recursion
        } else if (a > b) {
          std::swap(a, b);
        }
        break;
      case Shape::kMutualRecursion:
        break;  // arbitrary direction: cycles of any length
      case Shape::kMultiCallSite:
        if (a > b) std::swap(a, b);
        if (a == b) continue;
        for (int s = 0; s < 3; ++s) EXPECT_TRUE(g.AddEdge({a, site + 8 * s, b}).ok());
        continue;
      case Shape::kMixed:
        if (k % 2 == 0 && a != b) {
          EXPECT_TRUE(g.AddEdge({std::min(a, b), site + 1, std::max(a, b)}).ok());
        }
        break;
    }
    EXPECT_TRUE(g.AddEdge({a, site, b}).ok());
  }
  return g;
}

TEST(CallGraphTest, NodesAndEdges) {
  CallGraph g;
  EXPECT_EQ(g.num_nodes(), 2u);
  EXPECT_EQ(g.AddNode(), 2u);
  EXPECT_EQ(g.AddNode(), 3u);
  auto e0 = g.AddEdge({kRootNode, 0, 2});
  ASSERT_TRUE(e0.ok());
  EXPECT_EQ(*e0, 0u);
  auto e1 = g.AddEdge({2, 0x10, 3});
  ASSERT_TRUE(e1.ok());
  EXPECT_EQ(*e1, 1u);
  // Idempotent.
  EXPECT_EQ(*g.AddEdge({2, 0x10, 3}), 1u);
  EXPECT_EQ(g.num_edges(), 2u);
  // Another call site is another edge.
  EXPECT_EQ(*g.AddEdge({2, 0x18, 3}), 2u);
  EXPECT_EQ(g.FindEdge(2, 0x18, 3), std::optional<EdgeId>(2));
  EXPECT_EQ(g.FindEdge(2, 0x20, 3), std::nullopt);
  EXPECT_FALSE(g.AddEdge({2, 0, 4}).ok());           // unknown callee
  EXPECT_FALSE(g.AddEdge({9, 0, 3}).ok());           // unknown caller
  EXPECT_FALSE(g.AddEdge({2, 0, kRootNode}).ok());   // into the root
  EXPECT_FALSE(g.AddEdge({2, 0, kTruncatedNode}).ok());
  EXPECT_EQ(g.num_edges(), 3u);
}

TEST(CallGraphTest, BackEdgeClassification) {
  CallGraph g;
  const NodeId a = g.AddNode(), b = g.AddNode(), c = g.AddNode();
  EdgeId ra = *g.AddEdge({kRootNode, 0, a});
  EdgeId ab = *g.AddEdge({a, 1, b});
  EdgeId bc = *g.AddEdge({b, 2, c});
  EdgeId ca = *g.AddEdge({c, 3, a});  // closes a -> b -> c -> a
  EdgeId cc = *g.AddEdge({c, 4, c});  // self recursion
  EdgeId ac = *g.AddEdge({a, 5, c});  // forward shortcut
  EXPECT_FALSE(g.is_back_edge(ra));
  EXPECT_FALSE(g.is_back_edge(ab));
  EXPECT_FALSE(g.is_back_edge(bc));
  EXPECT_TRUE(g.is_back_edge(ca));
  EXPECT_TRUE(g.is_back_edge(cc));
  EXPECT_FALSE(g.is_back_edge(ac));
}

// The incremental topological order must classify exactly the edges that close a cycle among
// the earlier non-back edges (checked against a plain reachability search). Twelve nodes
// give most pairs several call sites.
TEST(CallGraphTest, BackEdgesMatchBruteForce) {
  for (uint32_t run = 1; run <= 10; ++run) {
    const uint32_t seed = (run + 1) / 2;
    CallGraph g = RandomGraph(Shape::kMutualRecursion, run % 2 ? 60 : 12, 400, seed);
    std::vector<std::vector<NodeId>> fwd(g.num_nodes());
    size_t backs = 0;
    for (EdgeId e = 0; e < g.num_edges(); ++e) {
      const CallEdge& ce = g.edge(e);
      std::vector<bool> seen(g.num_nodes(), false);
      std::vector<NodeId> stack = {ce.callee};
      bool reaches = false;
      while (!stack.empty() && !reaches) {
        NodeId n = stack.back();
        stack.pop_back();
        if (n == ce.caller) reaches = true;
        if (seen[n]) continue;
        seen[n] = true;
        for (NodeId w : fwd[n]) stack.push_back(w);
      }
      ASSERT_EQ(g.is_back_edge(e), reaches) << "seed " << seed << " edge " << e;
      if (!reaches) fwd[ce.caller].push_back(ce.callee);
      backs += reaches;
    }
    EXPECT_GT(backs, 10u);
  }
}

// Another call site of a (caller, callee) pair is classified like the pair's first edge,
// back or not, without searching.
TEST(CallGraphTest, AnotherCallSiteOfAPairTakesNoSearch) {
  CallGraph g;
  const NodeId a = g.AddNode(), b = g.AddNode(), c = g.AddNode();
  ASSERT_TRUE(g.AddEdge({kRootNode, 0, c}).ok());
  ASSERT_TRUE(g.AddEdge({c, 1, b}).ok());
  ASSERT_TRUE(g.AddEdge({b, 2, a}).ok());  // against the order: searches
  const EdgeId back = *g.AddEdge({a, 3, c});
  ASSERT_TRUE(g.is_back_edge(back));
  const uint64_t steps = g.search_steps();
  EXPECT_GT(steps, 0u);
  EXPECT_TRUE(g.is_back_edge(*g.AddEdge({a, 4, c})));
  EXPECT_FALSE(g.is_back_edge(*g.AddEdge({b, 5, a})));
  EXPECT_EQ(g.search_steps(), steps);
}

// An agent names a new stack's functions leaf first, then adds its edges root first: each
// edge's callee is new, without edges, and takes a position of its own instead of the whole
// stack so far being reordered (2,000 frames: 4,000,000 steps before).
TEST(CallGraphTest, ANewDeepStackCostsItsDepth) {
  constexpr int kDepth = 2000;
  CallGraph g;
  std::vector<PathFrame> outer_to_leaf(kDepth);
  for (int i = kDepth - 1; i >= 0; --i) outer_to_leaf[i] = {g.AddNode(), 0x100u + i};
  ASSERT_TRUE(g.AddPath(outer_to_leaf, false).ok());
  EXPECT_LT(g.search_steps(), uint64_t{4} * kDepth);
  // The same stack under another caller: its edges exist but one.
  const NodeId caller = g.AddNode();
  std::vector<PathFrame> longer = {{caller, 0x10}};
  longer.insert(longer.end(), outer_to_leaf.begin(), outer_to_leaf.end());
  ASSERT_TRUE(g.AddPath(longer, false).ok());
  EXPECT_EQ(g.num_edges(), kDepth + 2u);
  for (EdgeId e = 0; e < g.num_edges(); ++e) EXPECT_FALSE(g.is_back_edge(e));
}

// Edges k+1 -> k for k = 2, 3, ...: each new edge's callee heads the whole chain so far in the
// topological order, and Pearce-Kelly reorders all of it.
std::vector<CallEdge> ChainAgainstItsOrder(NodeId nodes) {
  std::vector<CallEdge> edges;
  for (NodeId k = kFirstFunctionNode; k + 1 < kFirstFunctionNode + nodes; ++k) {
    edges.push_back({k + 1, 0x10, k});
  }
  return edges;
}

TEST(MalformedTest, DeltasPastTheSearchBudgetAreRefusedAtomically) {
  constexpr NodeId kNodes = 2000;
  const std::vector<CallEdge> chain = ChainAgainstItsOrder(kNodes);
  CallGraph unbounded;
  ASSERT_TRUE(AppendNodes(unbounded, kFirstFunctionNode, kNodes).ok());
  ASSERT_TRUE(AppendEdges(unbounded, 0, chain).ok());
  // Quadratic: about n^2 / 2 nodes visited, each with its one successor.
  EXPECT_GT(unbounded.search_steps(), uint64_t{kNodes} * kNodes / 2);

  CallGraph g;
  ASSERT_TRUE(AppendNodes(g, kFirstFunctionNode, kNodes).ok());
  const std::vector<CallEdge> head = {{kRootNode, 0, kFirstFunctionNode + kNodes - 1}};
  ASSERT_TRUE(AppendEdges(g, 0, head).ok());
  const absl::Status refused = AppendEdges(g, 1, chain, /*max_search_steps=*/100'000);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_THAT(refused.message(), ::testing::HasSubstr("100000 search steps"));
  EXPECT_EQ(g.num_edges(), 1u);
  EXPECT_GT(g.search_steps(), 100'000u);  // the work done stays counted
  for (const CallEdge& e : chain) EXPECT_FALSE(g.FindEdge(e.caller, e.call_site, e.callee));

  // What is left classifies as if the refused edges had never come.
  ASSERT_TRUE(AppendEdges(g, 1, std::span(chain).subspan(0, 50)).ok());
  const std::vector<CallEdge> closing = {{kFirstFunctionNode, 0x20, kFirstFunctionNode + 50}};
  ASSERT_TRUE(AppendEdges(g, 51, closing).ok());
  EXPECT_TRUE(g.is_back_edge(51));
  const std::vector<CallEdge> open = {{kFirstFunctionNode, 0x20, kFirstFunctionNode + 51}};
  ASSERT_TRUE(AppendEdges(g, 52, open).ok());
  EXPECT_FALSE(g.is_back_edge(52));
}

// Hand-checked numbering: root -> a; a -> b (x2 call sites); a -> c; b -> d; c -> d; d -> b back.
TEST(NumberingTest, HandComputedAnnotations) {
  CallGraph g;
  const NodeId a = g.AddNode(), b = g.AddNode(), c = g.AddNode(), d = g.AddNode();
  EdgeId ra = *g.AddEdge({kRootNode, 0, a});
  EdgeId ab1 = *g.AddEdge({a, 1, b});
  EdgeId ab2 = *g.AddEdge({a, 2, b});
  EdgeId ac = *g.AddEdge({a, 3, c});
  EdgeId bd = *g.AddEdge({b, 4, d});
  EdgeId cd = *g.AddEdge({c, 5, d});
  EdgeId db = *g.AddEdge({d, 6, b});
  auto num = MustCompute(g, g.num_edges());
  EXPECT_EQ(num->num_contexts(a), 1u);
  // b: one dummy (for d->b), then ab1, ab2.
  EXPECT_EQ(num->num_contexts(b), 3u);
  EXPECT_EQ(num->num_contexts(c), 1u);
  EXPECT_EQ(num->num_contexts(d), 4u);
  EXPECT_EQ(num->kind(db), EdgeKind::kBack);
  EXPECT_EQ(num->annotation(db), 0u);
  EXPECT_EQ(num->annotation(ab1), 1u);
  EXPECT_EQ(num->annotation(ab2), 2u);
  EXPECT_EQ(num->annotation(bd), 0u);
  EXPECT_EQ(num->annotation(cd), 3u);
  Encoder enc(*num);
  // root a b(2) d b(back) d: segment 1 = a b2 d = 2; segment 2 = dummy b, d = 0.
  auto ctx = enc.Encode(std::vector<EdgeId>{ra, ab2, bd, db, bd});
  ASSERT_TRUE(ctx.ok());
  EXPECT_EQ(ctx->leaf, d);
  EXPECT_THAT(ctx->ids, ElementsAre(2u, 0u));
  bool truncated = true;
  auto frames = Decode(*num, *ctx, &truncated);
  ASSERT_TRUE(frames.ok()) << frames.status();
  EXPECT_FALSE(truncated);
  EXPECT_THAT(*frames, ElementsAre(PathFrame{a, 2}, PathFrame{b, 4}, PathFrame{d, 6},
                                   PathFrame{b, 4}, PathFrame{d, 0}));
  // Acyclic contexts need one number.
  auto flat = enc.Encode(std::vector<EdgeId>{ra, ac, cd});
  ASSERT_TRUE(flat.ok());
  EXPECT_THAT(flat->ids, ElementsAre(3u));
}

class ExhaustiveTest : public ::testing::TestWithParam<Shape> {};

TEST_P(ExhaustiveTest, AllShortPathsAreUniqueAndRoundTrip) {
  for (uint32_t seed = 1; seed <= 12; ++seed) {
    CallGraph g = RandomGraph(GetParam(), 7, 10, seed * 7919);
    auto num = MustCompute(g, g.num_edges());
    size_t paths = CheckAllPaths(g, *num, 7);
    EXPECT_GT(paths, 10u);
    if (HasFailure()) {
      ADD_FAILURE() << "seed " << seed;
      return;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, ExhaustiveTest,
                         ::testing::Values(Shape::kAcyclic, Shape::kRecursion,
                                           Shape::kMutualRecursion, Shape::kMultiCallSite,
                                           Shape::kMixed));

TEST(ExhaustiveTest, EveryPrefixEpochRoundTrips) {
  // Numberings of old epochs, computed on the grown graph, stay valid for their paths.
  CallGraph g = RandomGraph(Shape::kMixed, 6, 9, 4242);
  for (uint64_t epoch = 1; epoch <= g.num_edges(); ++epoch) {
    CallGraph prefix;
    ASSERT_TRUE(prefix.EnsureNodes(g.num_nodes()).ok());
    ASSERT_TRUE(AppendEdges(prefix, 0, g.edges().subspan(0, epoch)).ok());
    auto num = MustCompute(g, epoch);
    CheckAllPaths(prefix, *num, 6);
    ASSERT_FALSE(HasFailure()) << "epoch " << epoch;
  }
}

// Random walks from the root over all edges.
std::vector<EdgeId> RandomWalk(const CallGraph& g, const std::vector<std::vector<EdgeId>>& out,
                               std::mt19937& rng, size_t max_len, bool exact = false) {
  std::vector<EdgeId> path;
  NodeId at = rng() % 8 == 0 && !out[kTruncatedNode].empty() ? kTruncatedNode : kRootNode;
  const size_t len = exact ? max_len : 1 + rng() % max_len;
  while (path.size() < len && !out[at].empty()) {
    EdgeId e = out[at][rng() % out[at].size()];
    path.push_back(e);
    at = g.edge(e).callee;
  }
  return path;
}

TEST(LargeGraphTest, SampledPathsAreUniqueAndRoundTrip) {
  // 12,000 functions, program-like layering, recursion, multi call sites, and a few
  // functions with thousands of callers (allocators, logging).
  std::mt19937 rng(20240601);
  CallGraph g;
  const int kNodes = 12000;
  for (int i = 0; i < kNodes; ++i) g.AddNode();
  auto fn = [](int i) { return static_cast<NodeId>(kFirstFunctionNode + i); };
  for (int i = 0; i < 8; ++i) ASSERT_TRUE(g.AddEdge({kRootNode, 0, fn(i)}).ok());
  ASSERT_TRUE(g.AddEdge({kTruncatedNode, 0, fn(500)}).ok());
  for (int i = 8; i < kNodes; ++i) {
    const int callers = 1 + rng() % 3;
    for (int k = 0; k < callers; ++k) {
      int from = std::max(0, i - 1 - static_cast<int>(rng() % 400));
      ASSERT_TRUE(g.AddEdge({fn(from), 0x40 + rng() % 32, fn(i)}).ok());
    }
  }
  const int hubs[] = {kNodes - 1, kNodes - 2, 3000};
  for (int hub : hubs) {
    for (int k = 0; k < 3000; ++k) {
      ASSERT_TRUE(g.AddEdge({fn(rng() % (kNodes - 3)), 0x900 + rng() % 4, fn(hub)}).ok());
    }
  }
  for (int k = 0; k < 2000; ++k) {  // recursion and mutual recursion
    int a = rng() % kNodes;
    int b = k % 4 == 0 ? a : std::max(0, a - static_cast<int>(rng() % 50));
    ASSERT_TRUE(g.AddEdge({fn(a), 0x700 + rng() % 8, fn(b)}).ok());
  }
  ASSERT_GE(g.num_edges(), 30000u);
  auto num = MustCompute(g, g.num_edges());
  EXPECT_GT(num->num_push_edges(), 0u) << "fan-in should force selective reduction";
  const auto out = OutEdges(g);
  absl::flat_hash_map<std::pair<NodeId, std::vector<uint64_t>>, std::vector<EdgeId>> seen;
  for (int i = 0; i < 20000; ++i) {
    std::vector<EdgeId> path = RandomWalk(g, out, rng, 60);
    EncodedContext ctx = RoundTrip(*num, path);
    auto [it, inserted] = seen.emplace(std::make_pair(ctx.leaf, ctx.ids), path);
    if (!inserted) {
      EXPECT_EQ(it->second, path) << "distinct paths share an encoding";
    }
    if (HasFailure()) return;
  }
}

TEST(DeterminismTest, SameEdgeListSameNumbering) {
  CallGraph a = RandomGraph(Shape::kMixed, 300, 900, 99);
  CallGraph b;
  ASSERT_TRUE(AppendNodes(b, 2, a.num_nodes() - 2).ok());
  // Apply in three deltas, as the server does.
  const uint64_t m = a.num_edges();
  for (uint64_t from : {uint64_t{0}, m / 3, 2 * m / 3}) {
    const uint64_t to = from == 2 * m / 3 ? m : from + m / 3;
    auto delta = ExportEdges(a, from, to);
    ASSERT_TRUE(delta.ok());
    ASSERT_TRUE(AppendEdges(b, from, *delta).ok());
  }
  ASSERT_EQ(b.num_edges(), m);
  auto na = MustCompute(a, m), nb = MustCompute(b, m);
  for (EdgeId e = 0; e < m; ++e) {
    EXPECT_EQ(a.is_back_edge(e), b.is_back_edge(e));
    EXPECT_EQ(na->kind(e), nb->kind(e));
    EXPECT_EQ(na->annotation(e), nb->annotation(e));
  }
  for (NodeId v = 0; v < a.num_nodes(); ++v) {
    EXPECT_EQ(na->num_contexts(v), nb->num_contexts(v));
  }
}

TEST(DeterminismTest, AddingEdgesNeverReclassifies) {
  CallGraph g = RandomGraph(Shape::kMutualRecursion, 200, 300, 5);
  std::vector<bool> before;
  for (EdgeId e = 0; e < g.num_edges(); ++e) before.push_back(g.is_back_edge(e));
  const uint64_t old_epoch = g.num_edges();
  auto old_num = MustCompute(g, old_epoch);
  std::mt19937 rng(6);
  for (int k = 0; k < 2000; ++k) {
    NodeId a = kFirstFunctionNode + rng() % 200, b = kFirstFunctionNode + rng() % 200;
    ASSERT_TRUE(g.AddEdge({a, 0x5000 + rng() % 16, b}).ok());
  }
  for (EdgeId e = 0; e < old_epoch; ++e) EXPECT_EQ(g.is_back_edge(e), before[e]);
  // The numbering of the old epoch recomputed on the grown graph is unchanged.
  auto again = MustCompute(g, old_epoch);
  for (EdgeId e = 0; e < old_epoch; ++e) {
    EXPECT_EQ(again->kind(e), old_num->kind(e));
    EXPECT_EQ(again->annotation(e), old_num->annotation(e));
  }
}

// A reloaded graph takes the flags its classification gave: the same edges, the same back
// edges, and an order under which later edges classify as in the graph that never reloaded.
TEST(RestoreEdgesTest, ARestoredGraphClassifiesLaterEdgesAsTheOriginal) {
  for (uint32_t seed = 1; seed <= 6; ++seed) {
    CallGraph g = RandomGraph(seed % 2 ? Shape::kMutualRecursion : Shape::kMixed, 150, 400, seed);
    std::vector<uint8_t> flags;
    for (EdgeId e = 0; e < g.num_edges(); ++e) flags.push_back(g.is_back_edge(e));
    CallGraph r;
    ASSERT_TRUE(AppendNodes(r, kFirstFunctionNode, g.num_nodes() - kFirstFunctionNode).ok());
    ASSERT_TRUE(RestoreEdges(r, g.edges(), flags).ok());
    EXPECT_EQ(r.search_steps(), 0u);
    ASSERT_EQ(r.num_edges(), g.num_edges());
    for (EdgeId e = 0; e < g.num_edges(); ++e) ASSERT_EQ(r.is_back_edge(e), g.is_back_edge(e));
    std::mt19937 rng(seed);
    for (int k = 0; k < 1000; ++k) {
      const CallEdge e{static_cast<NodeId>(kFirstFunctionNode + rng() % 150),
                       0x9000 + rng() % 8, static_cast<NodeId>(kFirstFunctionNode + rng() % 150)};
      const EdgeId in_g = *g.AddEdge(e);
      ASSERT_EQ(*r.AddEdge(e), in_g);
      ASSERT_EQ(r.is_back_edge(in_g), g.is_back_edge(in_g)) << "seed " << seed << " edge " << k;
    }
    auto ng = MustCompute(g, g.num_edges()), nr = MustCompute(r, r.num_edges());
    for (EdgeId e = 0; e < g.num_edges(); ++e) EXPECT_EQ(ng->annotation(e), nr->annotation(e));
  }
}

// A chain added against its order costs Pearce-Kelly n^2 / 2 steps; restoring it, none.
TEST(RestoreEdgesTest, RestoringCostsNoSearch) {
  constexpr NodeId kNodes = 2000;
  const std::vector<CallEdge> chain = ChainAgainstItsOrder(kNodes);
  CallGraph g;
  ASSERT_TRUE(AppendNodes(g, kFirstFunctionNode, kNodes).ok());
  ASSERT_TRUE(RestoreEdges(g, chain, std::vector<uint8_t>(chain.size(), 0)).ok());
  EXPECT_EQ(g.search_steps(), 0u);
  // The chain's top (the last node) reaches its bottom: an edge back up closes a cycle.
  EXPECT_TRUE(g.is_back_edge(*g.AddEdge({kFirstFunctionNode, 0x20, kFirstFunctionNode + 10})));
  EXPECT_FALSE(g.is_back_edge(*g.AddEdge({kFirstFunctionNode + 10, 0x20, kFirstFunctionNode})));
}

// Flags no classification produces are refused and leave the graph without edges.
TEST(RestoreEdgesTest, ImpossibleFlagsAreRefused) {
  auto restore = [](std::vector<CallEdge> edges, std::vector<uint8_t> flags) {
    CallGraph g;
    EXPECT_TRUE(AppendNodes(g, kFirstFunctionNode, 3).ok());
    absl::Status s = RestoreEdges(g, edges, flags);
    EXPECT_FALSE(s.ok());
    EXPECT_EQ(g.num_edges(), 0u);
    // Usable again, its order valid: edges classify as in a new graph.
    const NodeId x = kFirstFunctionNode, y = x + 1;
    EXPECT_FALSE(g.is_back_edge(*g.AddEdge({kRootNode, 0, y})));
    EXPECT_FALSE(g.is_back_edge(*g.AddEdge({y, 9, x})));
    EXPECT_TRUE(g.is_back_edge(*g.AddEdge({x, 9, y})));
    return s;
  };
  const NodeId a = kFirstFunctionNode, b = a + 1, c = a + 2;
  const absl::Status cycle = restore({{kRootNode, 0, a}, {a, 1, b}, {b, 2, c}, {c, 3, a}},
                                     {0, 0, 0, 0});
  EXPECT_EQ(cycle.code(), absl::StatusCode::kDataLoss) << cycle;
  EXPECT_THAT(cycle.message(), ::testing::HasSubstr("cycle"));
  const absl::Status self = restore({{kRootNode, 0, a}, {a, 1, a}}, {0, 0});
  EXPECT_EQ(self.code(), absl::StatusCode::kDataLoss) << self;
  const absl::Status pair = restore({{kRootNode, 0, a}, {b, 1, a}, {b, 2, a}}, {0, 0, 1});
  EXPECT_EQ(pair.code(), absl::StatusCode::kDataLoss) << pair;
  const absl::Status count = restore({{kRootNode, 0, a}}, {});
  EXPECT_EQ(count.code(), absl::StatusCode::kInvalidArgument) << count;
  const absl::Status unknown = restore({{kRootNode, 0, c + 1}}, {0});
  EXPECT_EQ(unknown.code(), absl::StatusCode::kInvalidArgument) << unknown;
  const absl::Status repeated = restore({{kRootNode, 0, a}, {a, 1, b}, {a, 1, b}}, {0, 0, 0});
  EXPECT_EQ(repeated.code(), absl::StatusCode::kInvalidArgument) << repeated;

  CallGraph g;
  ASSERT_TRUE(AppendNodes(g, kFirstFunctionNode, 3).ok());
  ASSERT_TRUE(RestoreEdges(g, std::vector<CallEdge>{{kRootNode, 0, a}, {a, 1, b}, {b, 2, a}},
                           std::vector<uint8_t>{0, 0, 1}).ok());
  EXPECT_TRUE(g.is_back_edge(2));
  const absl::Status again = RestoreEdges(g, std::vector<CallEdge>{{a, 5, c}},
                                          std::vector<uint8_t>{0});
  EXPECT_EQ(again.code(), absl::StatusCode::kFailedPrecondition) << again;
}

TEST(OverflowTest, MoreThan2To63ContextsRoundTrip) {
  // A ladder of 80 levels, each joined to the next by three call sites: 3^80 > 2^126
  // contexts at the bottom.
  CallGraph g;
  std::vector<NodeId> level;
  for (int i = 0; i < 81; ++i) level.push_back(g.AddNode());
  ASSERT_TRUE(g.AddEdge({kRootNode, 0, level[0]}).ok());
  for (int i = 0; i < 80; ++i) {
    for (uint64_t s = 0; s < 3; ++s) ASSERT_TRUE(g.AddEdge({level[i], 0x10 + s, level[i + 1]}).ok());
  }
  ASSERT_TRUE(g.AddEdge({level[80], 0x99, level[40]}).ok());  // recursion on top
  auto num = MustCompute(g, g.num_edges());
  EXPECT_GT(num->num_push_edges(), 0u);
  for (NodeId v : level) EXPECT_LE(num->num_contexts(v), kMaxContexts);
  EXPECT_GT(num->num_contexts(level[39]), uint64_t{1} << 60);
  const auto out = OutEdges(g);
  std::mt19937 rng(77);
  std::set<std::vector<uint64_t>> seen_full;
  for (int i = 0; i < 6000; ++i) {
    // Every other walk is exactly as long as the ladder.
    std::vector<EdgeId> path = RandomWalk(g, out, rng, i % 2 ? 200 : 81, i % 2 == 0);
    EncodedContext ctx = RoundTrip(*num, path);
    // Full-length paths end at the same leaf: all distinct paths need distinct ids.
    if (ctx.leaf == level[80] && path.size() == 81) {
      EXPECT_TRUE(seen_full.insert(ctx.ids).second);
      EXPECT_GE(ctx.ids.size(), 2u);
    }
    if (HasFailure()) return;
  }
  EXPECT_GT(seen_full.size(), 100u);
}

TEST(TruncatedTest, TruncatedStacksDecodeAsTruncated) {
  CallGraph g;
  const NodeId main_fn = g.AddNode(), work = g.AddNode(), leaf = g.AddNode();
  std::vector<PathFrame> full = {{main_fn, 0x10}, {work, 0x20}, {leaf, 0}};
  std::vector<PathFrame> partial = {{work, 0x20}, {leaf, 0}};
  std::shared_ptr<const Numbering> num;
  auto c_full = EncodePath(g, full, false, &num);
  auto c_part = EncodePath(g, partial, true, &num);
  auto c_part_root = EncodePath(g, partial, false, &num);
  ASSERT_TRUE(c_full.ok() && c_part.ok() && c_part_root.ok());
  EXPECT_EQ(num->epoch(), g.num_edges());
  Encoder enc(*num);
  // Re-encode the first one against the newest epoch.
  c_full = enc.Encode(*g.FindPath(full, false));
  ASSERT_TRUE(c_full.ok());
  EXPECT_NE(c_part->ids, c_part_root->ids);
  bool truncated = false;
  auto f = Decode(*num, *c_part, &truncated);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_TRUE(truncated);
  EXPECT_EQ(*f, partial);
  f = Decode(*num, *c_part_root, &truncated);
  ASSERT_TRUE(f.ok());
  EXPECT_FALSE(truncated);
  EXPECT_EQ(*f, partial);
  f = Decode(*num, *c_full, &truncated);
  ASSERT_TRUE(f.ok());
  EXPECT_FALSE(truncated);
  EXPECT_EQ(*f, full);
}

TEST(MalformedTest, DecoderRejectsBadInput) {
  CallGraph g;
  const NodeId a = g.AddNode(), b = g.AddNode(), unreached = g.AddNode();
  EdgeId ra = *g.AddEdge({kRootNode, 0, a});
  EdgeId ab = *g.AddEdge({a, 1, b});
  EdgeId ba = *g.AddEdge({b, 2, a});  // recursion
  (void)ra;
  (void)ab;
  (void)ba;
  auto num = MustCompute(g, g.num_edges());
  bool t = false;
  auto bad = [&](EncodedContext c, size_t depth = kDefaultMaxDecodeDepth) {
    return !Decode(*num, c, &t, depth).ok();
  };
  EXPECT_TRUE(bad({b, {}}));                     // empty ids
  EXPECT_TRUE(bad({99, {0}}));                   // unknown leaf
  EXPECT_TRUE(bad({kRootNode, {0}}));            // leaf is the root
  EXPECT_TRUE(bad({kTruncatedNode, {0}}));       // leaf is the marker
  EXPECT_TRUE(bad({unreached, {0}}));            // node without contexts
  EXPECT_TRUE(bad({b, {num->num_contexts(b)}}));  // id out of range
  EXPECT_TRUE(bad({b, {~uint64_t{0}}}));
  EXPECT_TRUE(bad({a, {0}}));      // a's id 0 is the dummy: needs an outer id
  EXPECT_TRUE(bad({a, {5, 0}}));   // outer id out of range at b
  EXPECT_TRUE(bad({a, {0, 0, 1}}));  // unused outer id
  // a's incoming ranges: [0] dummy of b->a, [1] root->a.
  EXPECT_FALSE(bad({a, {1, 0}}));  // root a b a
  EXPECT_TRUE(bad({a, {0, 0}}));   // outer segment would start at a dummy again: underflow
  // Deep recursion: a (b a)^50 needs 101 frames.
  std::vector<uint64_t> deep(51, 0);
  deep[0] = 1;
  EXPECT_FALSE(bad({a, deep}));
  EXPECT_TRUE(bad({a, deep}, 100));
  EXPECT_FALSE(bad({a, deep}, 101));
  // Epoch mismatches.
  EXPECT_FALSE(Numbering::Compute(g, g.num_edges() + 1).ok());
  NumberingCache cache;
  EXPECT_FALSE(cache.Get(g, 10).ok());
  auto n1 = cache.Get(g, 1);
  ASSERT_TRUE(n1.ok());
  EXPECT_EQ((*n1)->epoch(), 1u);
  EXPECT_EQ(cache.Get(g, 1)->get(), n1->get());  // cached
  // Encoder input.
  Encoder enc(**n1);
  EXPECT_FALSE(enc.Encode(std::vector<EdgeId>{}).ok());
  EXPECT_FALSE(enc.Encode(std::vector<EdgeId>{0, 1}).ok());  // edge 1 beyond epoch 1
  Encoder full(*num);
  EXPECT_FALSE(full.Encode(std::vector<EdgeId>{1}).ok());     // does not start at the root
  EXPECT_FALSE(full.Encode(std::vector<EdgeId>{0, 1, 1}).ok());  // discontinuous
  EXPECT_FALSE(g.FindPath(std::vector<PathFrame>{{a, 7}, {b, 0}}, false).ok());
  EXPECT_FALSE(g.AddPath(std::vector<PathFrame>{}, false).ok());
  EXPECT_FALSE(g.AddPath(std::vector<PathFrame>{{a, 1}, {kRootNode, 0}}, false).ok());
}

// Numberings of older epochs go when a newer one is computed; a batch sent again, of an
// older epoch, leaves the newer ones cached.
TEST(NumberingCacheTest, KeepsTheNewestEpochsAndWhatWasAskedForSince) {
  CallGraph g = RandomGraph(Shape::kMixed, 300, 900, 7);
  NumberingCache cache;
  auto epoch_100 = cache.Get(g, 100);
  ASSERT_TRUE(epoch_100.ok());
  const size_t one = cache.MemoryBytes();
  auto epoch_500 = cache.Get(g, 500);
  ASSERT_TRUE(epoch_500.ok());
  auto epoch_900 = cache.Get(g, 900);
  ASSERT_TRUE(epoch_900.ok());
  EXPECT_EQ(cache.MemoryBytes(), (*epoch_900)->MemoryBytes());  // 100 and 500 went
  EXPECT_GT(cache.MemoryBytes(), one);
  auto again_500 = cache.Get(g, 500);  // a batch sent again
  ASSERT_TRUE(again_500.ok());
  EXPECT_NE(again_500->get(), epoch_500->get());  // computed again
  EXPECT_EQ(cache.Get(g, 900)->get(), epoch_900->get());  // still cached
  EXPECT_EQ(cache.Get(g, 500)->get(), again_500->get());
  EXPECT_EQ(cache.MemoryBytes(), (*epoch_900)->MemoryBytes() + (*again_500)->MemoryBytes());
}

TEST(MalformedTest, BadDeltasAreRejectedAtomically) {
  CallGraph src;
  for (int i = 0; i < 4; ++i) src.AddNode();
  ASSERT_TRUE(src.AddEdge({kRootNode, 0, 2}).ok());
  ASSERT_TRUE(src.AddEdge({2, 1, 3}).ok());
  ASSERT_TRUE(src.AddEdge({3, 2, 4}).ok());
  EXPECT_FALSE(ExportEdges(src, 2, 4).ok());
  EXPECT_FALSE(ExportEdges(src, 2, 1).ok());
  auto all = *ExportEdges(src, 0, 3);

  CallGraph dst;
  EXPECT_EQ(AppendNodes(dst, 3, 4).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(AppendNodes(dst, 2, 2).ok());  // nodes 2, 3 only
  EXPECT_EQ(AppendEdges(dst, 1, all).code(), absl::StatusCode::kFailedPrecondition);
  // Edge 2 references node 4, which dst lacks: nothing is applied.
  EXPECT_EQ(AppendEdges(dst, 0, all).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(dst.num_edges(), 0u);
  ASSERT_TRUE(AppendNodes(dst, 4, 1).ok());
  // Duplicates inside the delta or against the graph.
  std::vector<CallEdge> dup = {all[0], all[0]};
  EXPECT_FALSE(AppendEdges(dst, 0, dup).ok());
  EXPECT_EQ(dst.num_edges(), 0u);
  ASSERT_TRUE(AppendEdges(dst, 0, std::span(all).subspan(0, 1)).ok());
  EXPECT_FALSE(AppendEdges(dst, 1, std::span(all).subspan(0, 2)).ok());
  std::vector<CallEdge> into_root = {{2, 5, kRootNode}};
  EXPECT_FALSE(AppendEdges(dst, 1, into_root).ok());
  ASSERT_TRUE(AppendEdges(dst, 1, std::span(all).subspan(1)).ok());
  EXPECT_EQ(dst.num_edges(), 3u);
  EXPECT_FALSE(dst.EnsureNodes(size_t{1} << 40).ok());
}

// Random garbage: decoding returns an error or a path that encodes back to the same input.
TEST(MalformedTest, RandomGarbageNeverCrashesOrLoops) {
  CallGraph g = RandomGraph(Shape::kMixed, 400, 2000, 31337);
  auto num = MustCompute(g, g.num_edges());
  Encoder enc(*num);
  std::mt19937_64 rng(8675309);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(8);
  size_t ok = 0, rejected = 0;
  std::vector<EdgeId> edges;
  // Up to the deadline, and past it until both outcomes were seen often enough: a slow
  // machine (a sanitizer build beside other work) gets through fewer inputs in the time.
  auto more = [&] {
    return std::chrono::steady_clock::now() < deadline || ok <= 1000 || rejected <= 1000;
  };
  for (int i = 0; i < 3'000'000 && more(); ++i) {
    EncodedContext c;
    c.leaf = static_cast<NodeId>(rng() % (g.num_nodes() + 3));
    const size_t n = rng() % 6;
    for (size_t k = 0; k < n; ++k) {
      const uint64_t limit = num->num_contexts(c.leaf) + 2;
      switch (rng() % 4) {
        case 0: c.ids.push_back(rng()); break;
        case 1: c.ids.push_back(rng() % limit); break;
        default: c.ids.push_back(rng() % 4); break;
      }
    }
    bool truncated = false;
    absl::Status s = num->DecodeEdges(c, &edges, &truncated, 64);
    if (!s.ok()) {
      ++rejected;
      continue;
    }
    ++ok;
    auto back = enc.Encode(edges);
    ASSERT_TRUE(back.ok()) << back.status();
    ASSERT_EQ(*back, c) << "decoded path does not re-encode to its input";
  }
  EXPECT_GT(ok, 1000u);
  EXPECT_GT(rejected, 1000u);
}

}  // namespace
}  // namespace strata::encoding
