#include "common/encoding/graph_delta_edges.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace strata::encoding {
namespace {

v1::GraphDelta Delta(uint32_t first_node, int edges) {
  v1::GraphDelta d;
  d.set_first_node(first_node);
  d.set_first_edge(10);
  for (int i = 0; i < edges; ++i) {
    v1::CallEdge* e = d.add_edges();
    e->set_caller(i == 0 ? 0 : first_node + i - 1);
    e->set_call_site(i == 0 ? 0 : 0x401000 + 0x40 * i);
    e->set_callee(first_node + i);
  }
  return d;
}

TEST(GraphDeltaEdgesTest, PackedEdgesUnpackToTheSameDelta) {
  const v1::GraphDelta original = Delta(5, 20);
  v1::GraphDelta d = original;
  PackDeltaEdges(&d);
  EXPECT_EQ(d.edges_size(), 0);
  EXPECT_FALSE(d.packed_edges().empty());
  EXPECT_LT(d.ByteSizeLong(), original.ByteSizeLong() / 3);
  ASSERT_TRUE(UnpackDeltaEdges(&d, 20).ok());
  EXPECT_EQ(d.SerializeAsString(), original.SerializeAsString());
  // A delta without packed edges is left alone, and so is one without edges.
  ASSERT_TRUE(UnpackDeltaEdges(&d, 0).ok());
  EXPECT_EQ(d.SerializeAsString(), original.SerializeAsString());
  v1::GraphDelta empty = Delta(5, 0);
  PackDeltaEdges(&empty);
  EXPECT_TRUE(empty.packed_edges().empty());
}

TEST(GraphDeltaEdgesTest, RefusedDeltasAreLeftUnchanged) {
  v1::GraphDelta d = Delta(5, 20);
  PackDeltaEdges(&d);
  const std::string packed = d.SerializeAsString();
  absl::Status s = UnpackDeltaEdges(&d, 19);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_EQ(d.SerializeAsString(), packed);
  d.add_edges()->set_callee(3);
  const std::string both = d.SerializeAsString();
  s = UnpackDeltaEdges(&d, 100);
  EXPECT_THAT(s.message(), ::testing::HasSubstr("both edges and packed_edges"));
  EXPECT_EQ(d.SerializeAsString(), both);
}

}  // namespace
}  // namespace strata::encoding
