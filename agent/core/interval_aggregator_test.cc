#include "agent/core/interval_aggregator.h"

#include <map>
#include <random>
#include <set>
#include <tuple>

#include "agent/core/batch_builder.h"
#include "agent/core/context_graph.h"
#include "common/encoding/packed_contexts.h"
#include "gtest/gtest.h"

namespace strata::agent {
namespace {

std::vector<encoding::ContextRecord> Unpack(const v1::SampleBatch& batch) {
  EXPECT_EQ(batch.contexts_size(), 0);
  // The agent writes the current layout.
  EXPECT_TRUE(!batch.packed_contexts().empty() &&
              static_cast<uint8_t>(batch.packed_contexts()[0]) == encoding::kPackedContextsVersion3);
  auto records = encoding::DecodePackedContexts(batch.packed_contexts());
  EXPECT_TRUE(records.ok()) << records.status();
  return records.ok() ? *records : std::vector<encoding::ContextRecord>{};
}

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
  const auto contexts = Unpack(batch);
  ASSERT_EQ(contexts.size(), 3u);
  uint64_t total = 0;
  for (const auto& c : contexts) {
    total += c.count;
    bool truncated = true;
    auto path = encoding::Decode(**numbering, c.context, &truncated);
    ASSERT_TRUE(path.ok()) << path.status();
    EXPECT_FALSE(truncated);
    const auto& expected = c.context.leaf == a ? pa : pb;
    ASSERT_EQ(path->size(), 2u);
    EXPECT_EQ((*path)[0], expected[0]);
    EXPECT_EQ((*path)[1].function, expected[1].function);
    if (c.context.leaf == a) {
      EXPECT_EQ(c.count, c.target_id == 1 ? 5u : 1u);
    }
  }
  EXPECT_EQ(total, 8u);
}

TEST(IntervalAggregatorTest, ScaledEncodingLeavesOutContextsScaledToZero) {
  ContextGraph graph(7);
  const auto main = graph.NodeFor({"main", "/bin/app", "", 1});
  const auto a = graph.NodeFor({"a", "/bin/app", "", 2});
  const auto b = graph.NodeFor({"b", "/bin/app", "", 3});
  auto ea = *graph.AddPath(std::vector<encoding::PathFrame>{{main, 10}, {a, 0}}, false);
  auto eb = *graph.AddPath(std::vector<encoding::PathFrame>{{main, 11}, {b, 0}}, false);
  IntervalAggregator agg;
  agg.Add(1, ea, 2500);
  agg.Add(1, eb, 999);
  auto numbering = graph.CurrentNumbering();
  ASSERT_TRUE(numbering.ok());
  v1::SampleBatch batch;
  absl::StatusOr<size_t> encoded =
      agg.EncodeScaledInto(**numbering, &batch, [](uint64_t n) { return n / 1000; });
  ASSERT_TRUE(encoded.ok()) << encoded.status();
  EXPECT_EQ(*encoded, 1u);
  std::vector<encoding::ContextRecord> records = Unpack(batch);
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0].count, 2u);
  EXPECT_TRUE(agg.empty());
}

TEST(OffCpuPeriodsTest, WholePeriodsAndAnUnbiasedRound) {
  // 1 s at 99 Hz is 99 periods, whatever the random draw.
  EXPECT_EQ(OffCpuPeriods(1'000'000'000, 99, 0), 99u);
  EXPECT_EQ(OffCpuPeriods(1'000'000'000, 99, 999'999'999), 99u);
  // 15 ms at 100 Hz is 1.5 periods: 2 when the draw is under half, else 1.
  EXPECT_EQ(OffCpuPeriods(15'000'000, 100, 0), 2u);
  EXPECT_EQ(OffCpuPeriods(15'000'000, 100, 499'999'999), 2u);
  EXPECT_EQ(OffCpuPeriods(15'000'000, 100, 500'000'000), 1u);
  EXPECT_EQ(OffCpuPeriods(~0ull, 10000, 0), UINT32_MAX);
  // Many short intervals sum to their expected periods: 100,000 intervals of 3 ms at 99 Hz
  // (0.297 periods each) give 29,700, within a few standard deviations (~145).
  std::mt19937_64 random(42);
  uint64_t sum = 0;
  for (int i = 0; i < 100000; ++i) sum += OffCpuPeriods(3'000'000, 99, random() % 1'000'000'000);
  EXPECT_NEAR(static_cast<double>(sum), 29700.0, 600.0);
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
  EXPECT_TRUE(agg.full());
}

// A random program-like stream: paths over a small graph with recursion.
struct Stream {
  ContextGraph graph{9};
  std::vector<std::vector<encoding::EdgeId>> paths;
  std::vector<std::vector<encoding::PathFrame>> frames;

  explicit Stream(size_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<encoding::NodeId> nodes;
    for (int i = 0; i < 40; ++i) {
      nodes.push_back(graph.NodeFor({"f" + std::to_string(i), "/bin/app", "", uint64_t(i) * 16}));
    }
    for (size_t k = 0; k < n; ++k) {
      std::vector<encoding::PathFrame> p;
      const size_t depth = 1 + rng() % 12;
      for (size_t d = 0; d < depth; ++d) p.push_back({nodes[rng() % nodes.size()], 0x10 + rng() % 3});
      p.back().call_site = 0;
      auto e = graph.AddPath(p, rng() % 10 == 0);
      EXPECT_TRUE(e.ok());
      paths.push_back(*e);
      frames.push_back(p);
    }
  }
};

using Totals = std::map<std::pair<uint32_t, std::vector<uint64_t>>, uint64_t>;

// A decoded path as comparable numbers (function, call site, ..., truncated flag).
std::vector<uint64_t> Flatten(const std::vector<encoding::PathFrame>& path, bool truncated) {
  std::vector<uint64_t> out;
  for (const auto& f : path) {
    out.push_back(f.function);
    out.push_back(f.call_site);
  }
  out.push_back(truncated);
  return out;
}

// Decodes a batch and adds its counts to `totals`.
void Accumulate(const encoding::Numbering& numbering, const v1::SampleBatch& batch,
                Totals* totals) {
  for (const auto& c : Unpack(batch)) {
    bool truncated = false;
    auto path = encoding::Decode(numbering, c.context, &truncated);
    ASSERT_TRUE(path.ok()) << path.status();
    (*totals)[{c.target_id, Flatten(*path, truncated)}] += c.count;
  }
}

void CheckConservation(IntervalAggregatorOptions options, size_t adds_after_full) {
  Stream stream(300, 5);
  auto numbering = stream.graph.CurrentNumbering();
  ASSERT_TRUE(numbering.ok());
  IntervalAggregator agg(std::move(options));
  std::mt19937 rng(11);
  Totals expected, shipped;
  size_t batches = 0, pending_after_full = 0;
  uint64_t added = 0;
  for (int i = 0; i < 20000; ++i) {
    // Zipf-ish: low indices are hot.
    const size_t k = std::min<size_t>(stream.paths.size() - 1, (rng() % 300) * (rng() % 300) / 300);
    const uint32_t target = 1 + rng() % 3;
    const uint64_t count = 1 + (rng() % 8 == 0 ? rng() % 5 : 0);
    const bool ok = agg.Add(target, stream.paths[k], count);
    added += count;
    bool truncated = false;
    auto encoded = encoding::Encoder(**numbering).Encode(stream.paths[k]);
    ASSERT_TRUE(encoded.ok());
    auto path = encoding::Decode(**numbering, *encoded, &truncated);
    ASSERT_TRUE(path.ok());
    expected[{target, Flatten(*path, truncated)}] += count;
    if (!ok && ++pending_after_full > adds_after_full) {
      // The owner ships an early batch, some adds after the bound was reported.
      v1::SampleBatch batch;
      ASSERT_TRUE(agg.EncodeInto(**numbering, &batch).ok());
      Accumulate(**numbering, batch, &shipped);
      ++batches;
      pending_after_full = 0;
      EXPECT_TRUE(agg.empty());
      EXPECT_FALSE(agg.full());
    }
  }
  v1::SampleBatch last;
  ASSERT_TRUE(agg.EncodeInto(**numbering, &last).ok());
  Accumulate(**numbering, last, &shipped);
  EXPECT_GT(batches, 10u);
  EXPECT_EQ(shipped, expected);
  uint64_t sum = 0;
  for (const auto& [k, v] : shipped) sum += v;
  EXPECT_EQ(sum, added);
}

TEST(IntervalAggregatorTest, ConservesCountsAcrossEarlyBatches) {
  CheckConservation({.max_contexts = 64}, 0);
}

TEST(IntervalAggregatorTest, ConservesCountsAddedAfterTheBound) {
  // The owner ships only after 25 more samples: they go to the spill.
  CheckConservation({.max_contexts = 64}, 25);
  CheckConservation({.max_contexts = 1000, .max_path_edges = 200}, 10);
}

// The table starts small and doubles while contexts arrive, up to max_contexts: every count
// is kept across the growths, and the bound is where it was.
TEST(IntervalAggregatorTest, TableGrowsToTheBoundKeepingEveryCount) {
  Stream stream(400, 7);
  auto numbering = stream.graph.CurrentNumbering();
  ASSERT_TRUE(numbering.ok());
  IntervalAggregator agg({.max_contexts = 700});
  Totals expected, shipped;
  std::set<std::pair<uint32_t, std::vector<encoding::EdgeId>>> distinct;
  size_t accepted = 0;
  for (int round = 0; round < 2; ++round) {
    for (uint32_t target = 1; target <= 3; ++target) {
      for (const auto& path : stream.paths) {
        distinct.insert({target, path});
        if (agg.Add(target, path, target)) ++accepted;
        bool truncated = false;
        auto encoded = encoding::Encoder(**numbering).Encode(path);
        ASSERT_TRUE(encoded.ok());
        auto decoded = encoding::Decode(**numbering, *encoded, &truncated);
        ASSERT_TRUE(decoded.ok());
        expected[{target, Flatten(*decoded, truncated)}] += target;
      }
    }
  }
  ASSERT_GT(distinct.size(), 700u);
  // Accepted until the 700th distinct context; the rest went to the spill, counted.
  EXPECT_TRUE(agg.full());
  EXPECT_EQ(agg.distinct_contexts(), distinct.size());
  EXPECT_GE(agg.table_stats().inserts, 700u);
  EXPECT_LT(accepted, 2 * 3 * stream.paths.size());
  v1::SampleBatch batch;
  ASSERT_TRUE(agg.EncodeInto(**numbering, &batch).ok());
  Accumulate(**numbering, batch, &shipped);
  EXPECT_EQ(shipped, expected);
  // The grown table stays for the next interval.
  EXPECT_FALSE(agg.full());
  for (size_t i = 0; i < 700; ++i) {
    EXPECT_TRUE(agg.Add(1 + static_cast<uint32_t>(i % 3), stream.paths[i / 3 % stream.paths.size()], 1));
  }
}

TEST(IntervalAggregatorTest, CollidingHashesNeverShareACount) {
  // Every context of a target hashes to the same key; consecutive keys collide too.
  CheckConservation({.max_contexts = 50,
                     .hash = [](uint32_t target, std::span<const encoding::EdgeId>) {
                       return uint64_t{target};
                     }},
                    3);
  IntervalAggregator agg({.hash = [](uint32_t, std::span<const encoding::EdgeId>) {
    return ~uint64_t{0};  // probing wraps around to 0
  }});
  Stream stream(20, 3);
  for (const auto& p : stream.paths) agg.Add(1, p, 1);
  EXPECT_GT(agg.collisions(), 0u);
  EXPECT_EQ(agg.samples(), 20u);
}

}  // namespace
}  // namespace strata::agent
