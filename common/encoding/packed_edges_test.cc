#include "common/encoding/packed_edges.h"

#include <limits>
#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace strata::encoding {
namespace {

using ::testing::HasSubstr;

constexpr NodeId kMaxNode = std::numeric_limits<NodeId>::max();

std::vector<CallEdge> RoundTrip(const std::vector<CallEdge>& edges, NodeId next_node) {
  auto packed = EncodePackedEdges(edges, next_node);
  EXPECT_TRUE(packed.has_value());
  if (!packed) return {};
  std::vector<CallEdge> out{{7, 7, 7}};  // decoding appends
  absl::Status s = DecodePackedEdges(*packed, next_node, edges.size(), &out);
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(out.front(), (CallEdge{7, 7, 7}));
  out.erase(out.begin());
  return out;
}

// Edges as an agent discovers them: paths from the root through new and known functions,
// call sites as offsets in one module.
std::vector<CallEdge> DiscoveryOrder(size_t paths, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<CallEdge> edges;
  NodeId next = kFirstFunctionNode;
  for (size_t p = 0; p < paths; ++p) {
    NodeId caller = kRootNode;
    uint64_t site = 0;
    const int depth = 2 + static_cast<int>(rng() % 12);
    for (int d = 0; d < depth; ++d) {
      const NodeId callee = next > 2 && rng() % 3 == 0 ? kFirstFunctionNode + rng() % (next - 2)
                                                        : next++;
      edges.push_back({caller, site, callee});
      caller = callee;
      site = 0x400000 + uint64_t{callee} * 0x180 + rng() % 0x100;
    }
  }
  return edges;
}

TEST(PackedEdgesTest, RoundTripsEdgesInDiscoveryOrder) {
  const std::vector<CallEdge> edges = DiscoveryOrder(200, 1);
  EXPECT_EQ(RoundTrip(edges, kFirstFunctionNode), edges);
  // The prediction of new nodes is only a prediction: any next_node decodes the same.
  EXPECT_EQ(RoundTrip(edges, 12345), edges);
  EXPECT_EQ(RoundTrip(edges, 0), edges);
  EXPECT_EQ(RoundTrip(edges, kMaxNode), edges);
}

TEST(PackedEdgesTest, RoundTripsExtremeValues) {
  const std::vector<CallEdge> edges = {
      {kMaxNode, std::numeric_limits<uint64_t>::max(), 0},
      {0, 0, kMaxNode},
      {kMaxNode, 0, kMaxNode},
      {kTruncatedNode, 0, 2},
      {2, uint64_t{1} << 63, 2},
      {2, 1, 3},
  };
  EXPECT_EQ(RoundTrip(edges, kFirstFunctionNode), edges);
  EXPECT_EQ(RoundTrip({{5, 9, 6}}, 6), (std::vector<CallEdge>{{5, 9, 6}}));
}

TEST(PackedEdgesTest, RoundTripsRandomEdges) {
  std::mt19937_64 rng(7);
  for (int round = 0; round < 50; ++round) {
    std::vector<CallEdge> edges(1 + rng() % 300);
    for (auto& e : edges) {
      e = {static_cast<NodeId>(rng() % 64), rng() % 4 == 0 ? rng() : rng() % 512,
           static_cast<NodeId>(rng())};
    }
    EXPECT_EQ(RoundTrip(edges, static_cast<NodeId>(rng())), edges) << round;
  }
}

// What the field is for: far fewer bytes than one CallEdge message per edge.
TEST(PackedEdgesTest, TakesAFewBytesAnEdgeInDiscoveryOrder) {
  const std::vector<CallEdge> edges = DiscoveryOrder(100, 3);
  auto packed = EncodePackedEdges(edges, kFirstFunctionNode);
  ASSERT_TRUE(packed.has_value());
  const double per_edge = static_cast<double>(packed->size()) / edges.size();
  EXPECT_LT(per_edge, 2.5) << packed->size() << " bytes for " << edges.size() << " edges";
}

TEST(PackedEdgesTest, NothingToPackOrTooPredictableIsLeftUnpacked) {
  EXPECT_FALSE(EncodePackedEdges({}, kFirstFunctionNode).has_value());
  // One path through 100,000 new functions: each edge costs a small fraction of a bit.
  std::vector<CallEdge> chain;
  for (NodeId n = kFirstFunctionNode; n < 100'000; ++n) {
    chain.push_back({n == kFirstFunctionNode ? kRootNode : n - 1, 0, n});
  }
  EXPECT_FALSE(EncodePackedEdges(chain, kFirstFunctionNode).has_value());
}

TEST(PackedEdgesTest, RefusesMoreEdgesThanAllowed) {
  const std::vector<CallEdge> edges = DiscoveryOrder(10, 5);
  auto packed = EncodePackedEdges(edges, kFirstFunctionNode);
  ASSERT_TRUE(packed.has_value());
  std::vector<CallEdge> out;
  absl::Status s = DecodePackedEdges(*packed, kFirstFunctionNode, edges.size() - 1, &out);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("edges in"));
  EXPECT_TRUE(out.empty());
}

TEST(PackedEdgesTest, RefusesMalformedBuffers) {
  std::vector<CallEdge> out;
  EXPECT_THAT(DecodePackedEdges("", 2, 100, &out).message(), HasSubstr("empty"));
  EXPECT_THAT(DecodePackedEdges("\x02\x10", 2, 100, &out).message(), HasSubstr("version"));
  const std::vector<CallEdge> edges = DiscoveryOrder(20, 9);
  const std::string packed = *EncodePackedEdges(edges, kFirstFunctionNode);
  // Every truncation, a byte more, a trailing zero and every flipped bit: an error or other
  // edges, never a crash or a read past the buffer; the appended edges are dropped on error.
  int refused = 0;
  for (size_t n = 1; n < packed.size(); ++n) {
    out.clear();
    refused += !DecodePackedEdges(packed.substr(0, n), 2, 1000, &out).ok();
  }
  EXPECT_GE(refused, static_cast<int>(packed.size()) - 2);
  EXPECT_FALSE(DecodePackedEdges(packed + '\x01', 2, 1000, &out).ok());
  EXPECT_FALSE(DecodePackedEdges(packed + '\0', 2, 1000, &out).ok());
  for (size_t i = 1; i < packed.size(); ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      std::string corrupt = packed;
      corrupt[i] = static_cast<char>(corrupt[i] ^ (1 << bit));
      out.clear();
      if (!DecodePackedEdges(corrupt, 2, 1000, &out).ok()) {
        EXPECT_TRUE(out.empty());
      }
    }
  }
}

}  // namespace
}  // namespace strata::encoding
