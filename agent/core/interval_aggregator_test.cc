#include "agent/core/interval_aggregator.h"

#include "agent/core/context_graph.h"
#include "gtest/gtest.h"

namespace strata::agent {
namespace {

TEST(IntervalAggregatorTest, CountsDistinctContextsAndEncodesThemOnce) {
  ContextGraph graph(7);
  const auto main = graph.NodeFor({"main", "/bin/app", "", 1});
  const auto a = graph.NodeFor({"a", "/bin/app", "", 2});
  const auto b = graph.NodeFor({"b", "/bin/app", "", 3});
  std::vector<encoding::PathFrame> pa{{main, 10}, {a, 0}}, pb{{main, 11}, {b, 0}};
  auto ea = *graph.AddPath(pa, false);
  auto eb = *graph.AddPath(pb, false);

  IntervalAggregator agg;
  for (int i = 0; i < 5; ++i) agg.Add(1, ea, 1);
  agg.Add(1, eb, 2);
  agg.Add(2, ea, 1);  // same context, another target
  EXPECT_EQ(agg.distinct_contexts(), 3u);
  EXPECT_EQ(agg.samples(), 8u);

  auto numbering = graph.CurrentNumbering();
  ASSERT_TRUE(numbering.ok());
  v1::SampleBatch batch;
  ASSERT_TRUE(agg.EncodeInto(**numbering, &batch).ok());
  EXPECT_TRUE(agg.empty());
  ASSERT_EQ(batch.contexts_size(), 3);
  uint64_t total = 0;
  for (const auto& c : batch.contexts()) {
    total += c.count();
    encoding::EncodedContext encoded{c.leaf(), {c.ids().begin(), c.ids().end()}};
    bool truncated = true;
    auto path = encoding::Decode(**numbering, encoded, &truncated);
    ASSERT_TRUE(path.ok()) << path.status();
    EXPECT_FALSE(truncated);
    const auto& expected = c.leaf() == a ? pa : pb;
    ASSERT_EQ(path->size(), 2u);
    EXPECT_EQ((*path)[0], expected[0]);
    EXPECT_EQ((*path)[1].function, expected[1].function);
    if (c.leaf() == a) EXPECT_EQ(c.count(), c.target_id() == 1 ? 5u : 1u);
  }
  EXPECT_EQ(total, 8u);
}

TEST(IntervalAggregatorTest, ReportsTheBound) {
  ContextGraph graph(7);
  const auto a = graph.NodeFor({"a", "/m", "", 1});
  std::vector<encoding::PathFrame> p{{a, 0}};
  auto e = *graph.AddPath(p, false);
  IntervalAggregator agg(/*max_contexts=*/2);
  EXPECT_TRUE(agg.Add(1, e, 1));
  EXPECT_TRUE(agg.Add(1, e, 1));  // same context: still one
  EXPECT_FALSE(agg.Add(2, e, 1));
}

}  // namespace
}  // namespace strata::agent
