#include "common/table/sorted_table.h"

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <set>
#include <new>
#include <random>
#include <span>
#include <tuple>
#include <vector>

#include "common/testing/counting_allocator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace strata::table {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;

CountTable MakeTable(const SortedTableOptions& options) {
  absl::StatusOr<CountTable> table = CountTable::Create(options);
  EXPECT_TRUE(table.ok()) << table.status();
  return *std::move(table);
}

// A table of 64 entries in 16 buckets, for chains built key by key: its period and the
// sort's depth and frequency thresholds.
struct ChainTableOptions {
  uint32_t period;
  uint32_t depth;
  uint32_t frequency;
};
CountTable ChainTable(const ChainTableOptions& o) {
  return MakeTable({.max_entries = 64,
                    .bucket_count = 16,
                    .period = o.period,
                    .depth_threshold = o.depth,
                    .frequency_threshold = o.frequency});
}

std::vector<uint64_t> ChainKeys(const CountTable& table, uint32_t bucket) {
  std::vector<uint64_t> keys;
  table.ForEachInChain(bucket, [&](uint64_t key, uint64_t, uint32_t) { keys.push_back(key); });
  return keys;
}

// Keys 1, 2, ... grouped by bucket: `per_bucket` keys from each of `buckets` distinct buckets.
std::vector<std::vector<uint64_t>> KeysByBucket(const CountTable& table, size_t buckets,
                                                size_t per_bucket) {
  std::map<uint32_t, std::vector<uint64_t>> by_bucket;
  std::vector<std::vector<uint64_t>> out;
  for (uint64_t key = 1; out.size() < buckets; ++key) {
    std::vector<uint64_t>& keys = by_bucket[table.BucketIndex(key)];
    keys.push_back(key);
    if (keys.size() == per_bucket) out.push_back(keys);
  }
  return out;
}

// A chain of `n` keys of one bucket, each added once, and a key of another bucket that ends
// periods without touching the chain.
struct AddedChain {
  std::vector<uint64_t> keys;
  uint64_t filler;
};
AddedChain AddChain(CountTable& table, size_t n) {
  const auto groups = KeysByBucket(table, 2, n);
  for (uint64_t k : groups[0]) table.Add(k);
  return {groups[0], groups[1][0]};
}

// Adds `count` to `filler` (alone in its chain) until the current period ends.
void FinishPeriod(CountTable& table, uint64_t filler) {
  const uint64_t periods = table.stats().periods;
  while (table.stats().periods == periods) ASSERT_NE(table.Add(filler), AddResult::kFull);
}

TEST(SortedTableTest, RejectsBadOptions) {
  EXPECT_FALSE(CountTable::Create({.max_entries = 0}).ok());
  EXPECT_FALSE(CountTable::Create({.max_entries = (1u << 31) + 1}).ok());
  EXPECT_FALSE(CountTable::Create({.period = (1u << 31) + 1}).ok());
  EXPECT_FALSE(CountTable::Create({.period = 100, .frequency_threshold = 100}).ok());
  EXPECT_TRUE(CountTable::Create({.period = 0, .frequency_threshold = 100}).ok());
  EXPECT_FALSE(CountTable::Create({.phase_change_factor = 1}).ok());
  absl::StatusOr<CountTable> ok = CountTable::Create({.max_entries = 1000, .bucket_count = 100});
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->bucket_count(), 128u);
  EXPECT_EQ(ok->capacity(), 1000u);
}

TEST(SortedTableTest, AddFindForEach) {
  CountTable table = MakeTable({.max_entries = 8});
  EXPECT_EQ(table.Add(42, 3), AddResult::kInserted);
  EXPECT_EQ(table.Add(42, 4), AddResult::kUpdated);
  EXPECT_EQ(table.Add(7), AddResult::kInserted);
  EXPECT_EQ(table.Find(42), 7u);
  EXPECT_EQ(table.Find(7), 1u);
  EXPECT_EQ(table.Find(8), std::nullopt);
  std::map<uint64_t, uint64_t> seen;
  table.ForEach([&](uint64_t key, uint64_t count) { seen[key] = count; });
  EXPECT_THAT(seen, ElementsAre(std::pair<const uint64_t, uint64_t>{7, 1},
                                std::pair<const uint64_t, uint64_t>{42, 7}));
  // A count that overflows the 32-bit period counter is still summed exactly.
  EXPECT_EQ(table.Add(7, uint64_t{1} << 40), AddResult::kUpdated);
  EXPECT_EQ(table.Find(7), (uint64_t{1} << 40) + 1);
}

TEST(SortedTableTest, FullTableRejectsNewKeysUntilDrained) {
  CountTable table = MakeTable({.max_entries = 3, .bucket_count = 2});
  for (uint64_t k = 1; k <= 3; ++k) ASSERT_EQ(table.Add(k, k), AddResult::kInserted);
  EXPECT_EQ(table.Add(4), AddResult::kFull);
  EXPECT_EQ(table.Add(2), AddResult::kUpdated);  // existing keys still update
  EXPECT_EQ(table.size(), 3u);
  EXPECT_EQ(table.stats().full_rejections, 1u);
  uint64_t drained = 0;
  table.Drain([&](uint64_t, uint64_t count) { drained += count; });
  EXPECT_EQ(drained, 1u + 3u + 3u);
  EXPECT_TRUE(table.empty());
  EXPECT_EQ(table.Find(2), std::nullopt);
  EXPECT_EQ(table.Add(4), AddResult::kInserted);
}

// Random skewed workloads on a small table that fills up again and again: every count added
// is handed over by exactly one Drain, per key.
TEST(SortedTableTest, ConservesCountsUnderForcedFlushes) {
  for (uint32_t seed : {1u, 2u, 3u, 4u}) {
    SCOPED_TRACE(seed);
    CountTable table = MakeTable({.max_entries = 300,
                                  .bucket_count = 32,  // deep chains: sorting is busy
                                  .period = 512,
                                  .depth_threshold = 1,
                                  .frequency_threshold = 4,
                                  .max_phase_changes = 8});
    std::mt19937_64 rng(seed);
    std::map<uint64_t, uint64_t> added, drained;
    auto drain = [&] { table.Drain([&](uint64_t k, uint64_t c) { drained[k] += c; }); };
    uint64_t drains = 0;
    for (int i = 0; i < 200000; ++i) {
      // Hot set shifts every 20000 updates; keys are scrambled 64-bit values.
      const uint64_t phase = static_cast<uint64_t>(i / 20000);
      const uint64_t r = rng() % 1000;
      const uint64_t rank = r < 700 ? r % 10 + phase * 10 : r;
      const uint64_t key = (rank + 1) * 0x9e3779b97f4a7c15ull ^ 0xabcdef;
      const uint64_t count = 1 + rng() % 5;
      added[key] += count;
      AddResult result = table.Add(key, count);
      if (result == AddResult::kFull) {
        drain();
        ++drains;
        ASSERT_EQ(table.Add(key, count), AddResult::kInserted);
      }
      ASSERT_LE(table.size(), table.capacity());
    }
    drain();
    EXPECT_GT(drains, 10u);
    EXPECT_GT(table.stats().chains_sorted, 0u);
    EXPECT_EQ(drained, added);
  }
}

// AddBatch stops at the first item that finds the table full; resuming after a drain
// conserves every count and leaves the same contents as item-by-item Add().
TEST(SortedTableTest, AddBatchStopsWhenFullAndMatchesAdd) {
  const SortedTableOptions options{.max_entries = 100, .bucket_count = 16, .period = 64,
                                   .frequency_threshold = 3};
  CountTable batched = MakeTable(options);
  CountTable single = MakeTable(options);
  std::mt19937_64 rng(3);
  std::vector<KeyCount<uint64_t>> items(5000);
  for (KeyCount<uint64_t>& item : items) {
    item = {rng() % 150 * 0x9e3779b97f4a7c15ull, rng() % 3 + 1};
  }
  std::map<uint64_t, uint64_t> added, from_batched, from_single;
  for (const KeyCount<uint64_t>& item : items) added[item.key] += item.count;

  std::span<const KeyCount<uint64_t>> rest(items);
  int drains = 0;
  while (!rest.empty()) {
    const size_t stored = batched.AddBatch(rest);
    ASSERT_LE(stored, rest.size());
    if (stored < rest.size()) {
      ASSERT_EQ(batched.size(), batched.capacity());
      batched.Drain([&](uint64_t k, uint64_t c) { from_batched[k] += c; });
      ++drains;
    }
    rest = rest.subspan(stored);
  }
  batched.Drain([&](uint64_t k, uint64_t c) { from_batched[k] += c; });
  EXPECT_GT(drains, 0);
  EXPECT_EQ(from_batched, added);

  for (const KeyCount<uint64_t>& item : items) {
    if (single.Add(item.key, item.count) == AddResult::kFull) {
      single.Drain([&](uint64_t k, uint64_t c) { from_single[k] += c; });
      ASSERT_EQ(single.Add(item.key, item.count), AddResult::kInserted);
    }
  }
  single.Drain([&](uint64_t k, uint64_t c) { from_single[k] += c; });
  EXPECT_EQ(from_single, added);
  EXPECT_EQ(single.stats().chains_sorted, batched.stats().chains_sorted);
}

TEST(SortedTableTest, NothingAllocatedAfterConstruction) {
  CountTable table = MakeTable({.max_entries = 200,
                                .bucket_count = 2,  // hot keys often share a chain
                                .period = 256,
                                .depth_threshold = 1,
                                .frequency_threshold = 2,
                                .max_phase_changes = 2});
  const size_t memory = table.memory_bytes();
  std::mt19937_64 rng(7);
  std::vector<uint64_t> keys(1000);
  for (uint64_t& k : keys) k = rng();
  std::vector<KeyCount<uint64_t>> batch(100);
  const uint64_t before = strata::testing::AllocationCount();
  uint64_t sum = 0;
  for (int i = 0; i < 100000; ++i) {
    // A hot key that switches every 5000 updates keeps sorts and phase changes happening.
    const uint64_t key = rng() % 10 != 0 ? keys[(i / 2000) % 20] : keys[rng() % 400];
    if (i % 2 == 0) {  // half of the updates one at a time, half in batches of 100
      if (table.Add(key) == AddResult::kFull) {
        table.Drain([&](uint64_t, uint64_t c) { sum += c; });
        table.Add(key);
      }
      continue;
    }
    batch[i / 2 % 100] = {key, 1};
    if (i / 2 % 100 != 99) continue;
    std::span<const KeyCount<uint64_t>> rest(batch);
    while (!(rest = rest.subspan(table.AddBatch(rest))).empty()) {
      table.Drain([&](uint64_t, uint64_t c) { sum += c; });
    }
  }
  const uint64_t after = strata::testing::AllocationCount();
  EXPECT_EQ(after, before);
  EXPECT_EQ(table.memory_bytes(), memory);
  EXPECT_GT(table.stats().chains_sorted, 0u);
  EXPECT_GT(table.stats().phase_changes_dropped, 0u);  // the event buffer is bounded too
  EXPECT_EQ(table.TakePhaseChanges().size(), 2u);
}

// Chain A (six keys, deeper than depth_threshold 2) and chain B (two keys) in one period.
TEST(SortedTableTest, SortMovesHotEntriesOfDeepChainsOnly) {
  CountTable table = ChainTable({.period = 1000, .depth = 2, .frequency = 3});
  const auto groups = KeysByBucket(table, 3, 6);
  const std::vector<uint64_t>& a = groups[0];
  const std::vector<uint64_t> b = {groups[1][0], groups[1][1]};
  const uint64_t filler = groups[2][0];
  for (uint64_t k : a) table.Add(k);  // period counts 1 each
  for (uint64_t k : b) table.Add(k);
  ASSERT_THAT(ChainKeys(table, table.BucketIndex(a[0])), ElementsAreArray(a));
  // Period counts: a0 1, a1 1, a2 21, a3 3 (not above 3), a4 11, a5 6 (ties broken by
  // position: none here). b1 is hot but its chain is shallow.
  table.Add(a[2], 20);
  table.Add(a[4], 10);
  table.Add(a[5], 5);
  table.Add(a[3], 2);
  for (int i = 0; i < 50; ++i) table.Add(b[1]);
  table.Add(filler);
  EXPECT_EQ(table.stats().chains_sorted, 0u);  // nothing before the period ends
  // Meanwhile each hit passed the entry before it, having twice its count: a2 passed a1, a4
  // and a5 passed a3 (a0, a2, a1, a4, a5, a3), and b1 passed b0 (no sort for a shallow chain).
  EXPECT_EQ(table.stats().entries_passed, 4u);
  EXPECT_THAT(ChainKeys(table, table.BucketIndex(b[0])), ElementsAre(b[1], b[0]));
  FinishPeriod(table, filler);
  EXPECT_THAT(ChainKeys(table, table.BucketIndex(a[0])),
              ElementsAre(a[2], a[4], a[5], a[0], a[1], a[3]));
  EXPECT_THAT(ChainKeys(table, table.BucketIndex(b[0])), ElementsAre(b[1], b[0]));
  EXPECT_EQ(table.stats().chains_sorted, 1u);
  // Hot a2, a4, a5 moved forward; cold a0 and a1 each had a hot entry behind them.
  EXPECT_EQ(table.stats().entries_moved, 5u);
}

// After a phase change the keys that got busy were cold when they were inserted, behind
// heads that have gone idle: on a hit behind the head, an entry with twice the period count
// of the one before it (and at least 4) passes it, hot or not.
TEST(SortedTableTest, BusierEntriesPassIdleOnesBeforeThem) {
  CountTable table = ChainTable({.period = 1000, .depth = 1, .frequency = 500});
  const auto [a, filler] = AddChain(table, 3);
  for (int i = 0; i < 300; ++i) table.Add(a[0]);  // busy at the head, never hot
  FinishPeriod(table, filler);
  // This period a0 is idle and a2 busy.
  for (int i = 0; i < 3; ++i) table.Add(a[2]);
  EXPECT_THAT(ChainKeys(table, table.BucketIndex(a[0])), ElementsAre(a[0], a[1], a[2]));
  table.Add(a[2]);
  EXPECT_THAT(ChainKeys(table, table.BucketIndex(a[0])), ElementsAre(a[0], a[2], a[1]));
  table.Add(a[2]);
  EXPECT_THAT(ChainKeys(table, table.BucketIndex(a[0])), ElementsAre(a[2], a[0], a[1]));
  EXPECT_EQ(table.stats().entries_passed, 2u);
  EXPECT_EQ(table.stats().chains_sorted, 0u);
  // Two entries as busy as each other do not trade places back and forth.
  for (int i = 0; i < 100; ++i) {
    table.Add(a[0]);
    table.Add(a[2]);
  }
  EXPECT_EQ(table.stats().entries_passed, 2u);
  EXPECT_EQ(table.Find(a[0]), 401u);
  EXPECT_EQ(table.Find(a[1]), 1u);
  EXPECT_EQ(table.Find(a[2]), 106u);
}

TEST(SortedTableTest, SortIsStableForEqualCountsAndSkipsOrderedChains) {
  CountTable table = ChainTable({.period = 1000, .depth = 2, .frequency = 3});
  const auto [a, filler] = AddChain(table, 5);
  table.Add(a[3], 9);  // a3 and a1 tie at 10: a1 was first, stays first
  table.Add(a[1], 9);
  FinishPeriod(table, filler);
  EXPECT_THAT(ChainKeys(table, table.BucketIndex(a[0])),
              ElementsAre(a[1], a[3], a[0], a[2], a[4]));
  // Next period only the head is hot: the chain is not even visited.
  const uint64_t sorted = table.stats().chains_sorted;
  table.Add(a[1], 50);
  FinishPeriod(table, filler);
  EXPECT_EQ(table.stats().chains_sorted, sorted);
  EXPECT_THAT(ChainKeys(table, table.BucketIndex(a[0])),
              ElementsAre(a[1], a[3], a[0], a[2], a[4]));
}

TEST(SortedTableTest, SortingOffNeverReorders) {
  CountTable table = MakeTable({.max_entries = 64,
                                .bucket_count = 16,
                                .sorting = false,
                                .period = 100,
                                .depth_threshold = 1,
                                .frequency_threshold = 1});
  const AddedChain chain = AddChain(table, 4);
  for (int i = 0; i < 1000; ++i) table.Add(chain.keys[3]);
  EXPECT_THAT(ChainKeys(table, table.BucketIndex(chain.keys[0])), ElementsAreArray(chain.keys));
  EXPECT_EQ(table.stats().chains_sorted, 0u);
  EXPECT_GT(table.stats().periods, 0u);
}

TEST(SortedTableTest, SortingShortensProbes) {
  CountTable table = ChainTable({.period = 100, .depth = 2, .frequency = 10});
  const auto groups = KeysByBucket(table, 1, 8);
  const std::vector<uint64_t>& a = groups[0];
  for (uint64_t k : a) table.Add(k);
  // 92 more hits on the tail (position 8) end the first period. Once its period count is 4
  // (and over twice the others' 1) it passes the entry before it on each hit: hits at 8, 8,
  // 8, then 7 to 2, then at the head.
  const TableStats start = table.stats();
  for (int i = 0; i < 92; ++i) table.Add(a[7]);
  EXPECT_EQ(table.stats().periods, 1u);
  EXPECT_DOUBLE_EQ(table.stats().MeanHitProbeLengthSince(start),
                   (8 + 8 + 8 + 7 + 6 + 5 + 4 + 3 + 2 + 83) / 92.0);
  const TableStats sorted = table.stats();
  for (int i = 0; i < 100; ++i) table.Add(a[7]);
  EXPECT_DOUBLE_EQ(table.stats().MeanHitProbeLengthSince(sorted), 1.0);
}

// One chain of four keys; the hot key switches from `a` to `b` after `switch_at` updates, at
// various offsets inside a period. Each period has 1000 updates.
std::vector<PhaseChange<uint64_t>> RunHotSwitch(uint64_t switch_at, uint64_t* a_key,
                                                uint64_t* b_key) {
  CountTable table = ChainTable({.period = 1000, .depth = 2, .frequency = 10});
  const auto groups = KeysByBucket(table, 1, 4);
  const uint64_t a = groups[0][0], b = groups[0][1], c = groups[0][2], d = groups[0][3];
  *a_key = a;
  *b_key = b;
  std::mt19937_64 rng(99);
  for (uint64_t i = 0; i < 20000; ++i) {
    const bool switched = i >= switch_at;
    const uint64_t r = rng() % 100;  // hot 90%, cold 1%, c 4%, d 5%
    const uint64_t hot = switched ? b : a, cold = switched ? a : b;
    table.Add(r < 90 ? hot : r < 91 ? cold : r < 95 ? c : d);
  }
  EXPECT_EQ(table.stats().phase_changes_dropped, 0u);
  return table.TakePhaseChanges();
}

TEST(SortedTableTest, RecordsPhaseChangeWhenHotKeySwitches) {
  for (uint64_t switch_at : {10000u, 10001u, 10250u, 10500u, 10530u, 10750u, 10999u}) {
    SCOPED_TRACE(switch_at);
    uint64_t a, b;
    const std::vector<PhaseChange<uint64_t>> changes = RunHotSwitch(switch_at, &a, &b);
    ASSERT_FALSE(changes.empty());
    bool b_over_a = false;
    for (const PhaseChange<uint64_t>& change : changes) {
      // Every reversal is the new hot key rising or the old one falling (c and d pass a when
      // it drops below them: a was 10x above them in the previous period).
      EXPECT_TRUE(change.rose_key == b || change.fell_key == a);
      EXPECT_GE(change.update_index, switch_at);
      EXPECT_LE(change.update_index, switch_at + 2000);
      if (change.fell_key == a) {
        b_over_a = true;
        EXPECT_TRUE(change.fell_prev_count >= 10 * uint64_t{change.rose_prev_count} ||
                    change.rose_count >= 10 * uint64_t{change.fell_count});
      }
    }
    EXPECT_TRUE(b_over_a);
  }
}

TEST(SortedTableTest, NoPhaseChangeForSmallSwaps) {
  CountTable table = ChainTable({.period = 1000, .depth = 2, .frequency = 10});
  const auto groups = KeysByBucket(table, 1, 6);
  const std::vector<uint64_t>& k = groups[0];
  std::mt19937_64 rng(5);
  // Two keys trade the lead every period (500 vs 400, 3-4x over the rest), plus noise.
  for (int period = 0; period < 40; ++period) {
    const uint64_t lead = k[period % 2], second = k[1 - period % 2];
    for (int i = 0; i < 1000; ++i) {
      const uint64_t r = rng() % 1000;
      table.Add(r < 500 ? lead : r < 900 ? second : k[2 + r % 4]);
    }
  }
  EXPECT_GT(table.stats().entries_moved, 30u);  // the two did swap, again and again
  EXPECT_EQ(table.stats().phase_changes, 0u);
  EXPECT_TRUE(table.TakePhaseChanges().empty());
}

// Owner-driven periods (period = 0), counts added in lumps as the server adds a batch: the
// hot key of a service switches between two keys that never share a chain. The ranking of
// the hot set sees it, whichever side of a period boundary the switch falls on.
TEST(SortedTableTest, OwnerDrivenPeriodsSeeSwitchAcrossChains) {
  for (int switch_lump : {0, 3, 5, 9}) {  // lumps into the switching period (10 per period)
    SCOPED_TRACE(switch_lump);
    CountTable table = MakeTable({.max_entries = 1000,
                                  .period = 0,
                                  .frequency_threshold = 20});
    const auto groups = KeysByBucket(table, 6, 1);  // six keys in six different chains
    const uint64_t a = groups[0][0], b = groups[1][0];
    std::mt19937_64 rng(3);
    for (int period = 0; period < 8; ++period) {
      for (int lump = 0; lump < 10; ++lump) {
        const bool switched = period > 3 || (period == 3 && lump >= switch_lump);
        table.Add(switched ? b : a, 40 + rng() % 10);
        table.Add(switched ? a : b, rng() % 2);
        for (int k = 2; k < 6; ++k) table.Add(groups[k][0], 2 + rng() % 3);
      }
      EXPECT_EQ(table.stats().periods, static_cast<uint64_t>(period));  // never on its own
      table.EndPeriod();
    }
    const std::vector<PhaseChange<uint64_t>> changes = table.TakePhaseChanges();
    ASSERT_FALSE(changes.empty());
    bool b_over_a = false;
    for (const PhaseChange<uint64_t>& change : changes) {
      // The new hot key rising, or the old one falling (the small keys pass a when it drops
      // below them: it was 10x above them in the previous period).
      EXPECT_TRUE(change.rose_key == b || change.fell_key == a);
      EXPECT_TRUE(change.period_index == 3 || change.period_index == 4) << change.period_index;
      b_over_a |= change.rose_key == b && change.fell_key == a;
    }
    EXPECT_TRUE(b_over_a);
  }
}

// Steady lumps (the same keys every period, +-20%) record nothing, across many periods.
TEST(SortedTableTest, OwnerDrivenPeriodsSteadyLumpsRecordNothing) {
  CountTable table = MakeTable({.max_entries = 1000, .period = 0, .frequency_threshold = 20});
  std::mt19937_64 rng(8);
  for (int period = 0; period < 50; ++period) {
    for (uint64_t key = 1; key <= 200; ++key) {
      // Zipf-like: key k gets ~2000/k per period.
      table.Add(key * 0x9e3779b97f4a7c15ull, 1 + (2000 / key) * (80 + rng() % 41) / 100);
    }
    table.EndPeriod();
  }
  EXPECT_EQ(table.stats().phase_changes, 0u);
}

// TakeCounts flushes counts but keeps keys, chain order and period history; RemoveIf drops
// entries and compacts without disturbing the order of the rest; nothing is lost.
TEST(SortedTableTest, TakeCountsAndRemoveIfKeepOrderAndConserve) {
  CountTable table = MakeTable({.max_entries = 64,
                                .bucket_count = 4,
                                .period = 0,
                                .depth_threshold = 1,
                                .frequency_threshold = 5});
  std::map<uint64_t, uint64_t> added, taken;
  for (uint64_t k = 1; k <= 40; ++k) {
    table.Add(k, k % 7 + 1);
    added[k] += k % 7 + 1;
  }
  table.Add(33, 50);
  added[33] += 50;
  table.EndPeriod();  // 33 sorts to the front of its chain
  const uint32_t b33 = table.BucketIndex(33);
  ASSERT_EQ(ChainKeys(table, b33).front(), 33u);
  std::vector<std::vector<uint64_t>> chains;
  for (uint32_t b = 0; b < 4; ++b) chains.push_back(ChainKeys(table, b));

  table.TakeCounts([&](uint64_t k, uint64_t c) { taken[k] += c; });
  EXPECT_EQ(taken, added);
  EXPECT_EQ(table.size(), 40u);
  EXPECT_EQ(table.Find(33), 0u);
  EXPECT_TRUE(table.TopN(10).empty());  // zero counts are not "top"
  for (uint32_t b = 0; b < 4; ++b) EXPECT_EQ(ChainKeys(table, b), chains[b]);

  // Remove the odd keys: every chain keeps its even keys in the same order.
  const size_t removed = table.RemoveIf([](uint64_t k, uint64_t, uint32_t) { return k % 2 == 1; });
  EXPECT_EQ(removed, 20u);
  EXPECT_EQ(table.size(), 20u);
  for (uint32_t b = 0; b < 4; ++b) {
    std::vector<uint64_t> even;
    for (uint64_t k : chains[b]) {
      if (k % 2 == 0) even.push_back(k);
    }
    EXPECT_EQ(ChainKeys(table, b), even);
  }
  for (uint64_t k = 1; k <= 40; ++k) {
    EXPECT_EQ(table.Find(k).has_value(), k % 2 == 0) << k;
  }
  // The freed slots are reused; counts keep adding up.
  added.clear();
  taken.clear();
  for (uint64_t k = 1; k <= 60; ++k) {
    ASSERT_NE(table.Add(k, 2), AddResult::kFull) << k;
    added[k] += 2;
  }
  EXPECT_EQ(table.size(), 60u);
  table.Drain([&](uint64_t k, uint64_t c) { taken[k] += c; });
  EXPECT_EQ(taken, added);
}

// Grow keeps entries, counts, chain order and the period history: a table grown from 16 to
// 1024 entries in the middle of a hot-path switch reports the same phase changes as one
// created at 1024.
TEST(SortedTableTest, GrowKeepsEntriesOrderAndPhaseHistory) {
  const SortedTableOptions small{.max_entries = 16,
                                 .period = 0,
                                 .depth_threshold = 1,
                                 .frequency_threshold = 20,
                                 .max_phase_changes = 256};
  SortedTableOptions big = small;
  big.max_entries = 1024;
  CountTable grown = MakeTable(small);
  CountTable reference = MakeTable(big);
  std::mt19937_64 rng(5);
  std::map<uint64_t, uint64_t> added;
  const uint64_t a = 1001, b = 2002;
  for (int period = 0; period < 8; ++period) {
    for (int lump = 0; lump < 10; ++lump) {
      const bool switched = period > 3 || (period == 3 && lump >= 5);
      std::vector<std::pair<uint64_t, uint64_t>> adds = {{switched ? b : a, 40 + rng() % 10},
                                                         {switched ? a : b, rng() % 2 + 1}};
      // More distinct keys every period: the small table fills up and grows.
      for (int k = 0; k < 2 + period * 3; ++k) adds.push_back({10 + k, 2 + rng() % 3});
      for (const auto& [key, count] : adds) {
        ASSERT_NE(reference.Add(key, count), AddResult::kFull);
        if (grown.Add(key, count) == AddResult::kFull) {
          // Chains of the table before growing, to check their order survives.
          std::vector<std::vector<uint64_t>> chains;
          for (uint32_t c = 0; c < grown.bucket_count(); ++c) chains.push_back(ChainKeys(grown, c));
          const size_t size_before = grown.size();
          SortedTableOptions next = small;
          next.max_entries = static_cast<uint32_t>(grown.capacity() * 2);
          ASSERT_TRUE(grown.Grow(next).ok());
          EXPECT_EQ(grown.size(), size_before);
          EXPECT_GT(grown.memory_bytes(), 0u);
          for (const auto& chain : chains) {
            // Keys of one old chain keep their relative order in their new chains.
            std::map<uint32_t, std::vector<uint64_t>> split;
            for (uint64_t k : chain) split[grown.BucketIndex(k)].push_back(k);
            for (const auto& [nb, keys] : split) {
              std::vector<uint64_t> now;
              for (uint64_t k : ChainKeys(grown, nb)) {
                if (std::find(keys.begin(), keys.end(), k) != keys.end()) now.push_back(k);
              }
              EXPECT_EQ(now, keys);
            }
          }
          ASSERT_EQ(grown.Add(key, count), AddResult::kInserted);
        }
        added[key] += count;
      }
    }
    grown.EndPeriod();
    reference.EndPeriod();
  }
  EXPECT_GE(grown.capacity(), 32u);
  EXPECT_EQ(grown.stats().updates, reference.stats().updates);
  EXPECT_EQ(grown.stats().periods, reference.stats().periods);
  auto pairs = [](const std::vector<PhaseChange<uint64_t>>& changes) {
    std::set<std::tuple<uint64_t, uint64_t, uint64_t>> out;
    for (const auto& c : changes) out.insert({c.rose_key, c.fell_key, c.period_index});
    return out;
  };
  const auto grown_changes = pairs(grown.TakePhaseChanges());
  EXPECT_FALSE(grown_changes.empty());
  EXPECT_EQ(grown_changes, pairs(reference.TakePhaseChanges()));
  std::map<uint64_t, uint64_t> taken;
  grown.Drain([&](uint64_t k, uint64_t c) { taken[k] += c; });
  EXPECT_EQ(taken, added);
}

TEST(SortedTableTest, GrowRejectsShrinkingOrChangedRules) {
  const SortedTableOptions o{.max_entries = 64, .period = 0, .frequency_threshold = 20};
  CountTable table = MakeTable(o);
  SortedTableOptions smaller = o;
  smaller.max_entries = 32;
  EXPECT_EQ(table.Grow(smaller).code(), absl::StatusCode::kInvalidArgument);
  SortedTableOptions other_rule = o;
  other_rule.max_entries = 128;
  other_rule.frequency_threshold = 10;
  EXPECT_EQ(table.Grow(other_rule).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(table.capacity(), 64u);
}

TEST(SortedTableTest, TopNMatchesReference) {
  CountTable table = MakeTable({.max_entries = 5000, .period = 4096, .frequency_threshold = 8});
  std::mt19937_64 rng(11);
  std::map<uint64_t, uint64_t> reference;
  for (int i = 0; i < 50000; ++i) {
    const uint64_t key = rng() % 3000 + 1;  // many ties among small counts
    const uint64_t count = rng() % 4 + 1;
    table.Add(key, count);
    reference[key] += count;
  }
  std::vector<KeyCount<uint64_t>> expected;
  for (const auto& [key, count] : reference) expected.push_back({key, count});
  std::sort(expected.begin(), expected.end(), [](const auto& x, const auto& y) {
    return x.count != y.count ? x.count > y.count : x.key < y.key;
  });
  for (size_t n : {0u, 1u, 10u, 100u, 2999u, 3000u, 10000u}) {
    SCOPED_TRACE(n);
    std::vector<KeyCount<uint64_t>> want(expected.begin(),
                                         expected.begin() + std::min(n, expected.size()));
    EXPECT_EQ(table.TopN(n), want);
  }
}

// All keys in one chain (a degenerate hash) still work, sort, and conserve counts.
struct ConstantHash {
  uint64_t operator()(uint64_t) const { return 0; }
};

TEST(SortedTableTest, DegenerateHashOneChain) {
  absl::StatusOr<SortedTable<uint64_t, ConstantHash>> table =
      SortedTable<uint64_t, ConstantHash>::Create(
          {.max_entries = 500, .period = 200, .depth_threshold = 2, .frequency_threshold = 5});
  ASSERT_TRUE(table.ok());
  uint64_t sum = 0;
  for (int i = 0; i < 20000; ++i) {
    // 498 arrives last, at the tail of the one chain, and is then a third of the updates.
    const uint64_t key = i >= 1000 && i % 3 == 0 ? 498 : static_cast<uint64_t>(i % 498);
    ASSERT_NE(table->Add(key), AddResult::kFull);
    ++sum;
  }
  uint64_t drained = 0;
  table->Drain([&](uint64_t, uint64_t c) { drained += c; });
  EXPECT_EQ(drained, sum);
  EXPECT_GT(table->stats().chains_sorted, 0u);
  EXPECT_EQ(table->stats().phase_changes, 0u);
}


// Everything the table reports about itself, for comparing two tables.
template <typename Table>
struct Snapshot {
  std::vector<std::vector<std::tuple<uint64_t, uint64_t, uint32_t>>> chains;
  TableStats stats;
  size_t size;

  explicit Snapshot(const Table& table) : stats(table.stats()), size(table.size()) {
    for (uint32_t b = 0; b < table.bucket_count(); ++b) {
      auto& chain = chains.emplace_back();
      table.ForEachInChain(b, [&](uint64_t k, uint64_t c, uint32_t pc) {
        chain.emplace_back(k, c, pc);
      });
    }
  }
  void ExpectEq(const Snapshot& other) const {
    EXPECT_EQ(chains, other.chains);
    EXPECT_EQ(size, other.size);
    EXPECT_EQ(stats.updates, other.stats.updates);
    EXPECT_EQ(stats.hits, other.stats.hits);
    EXPECT_EQ(stats.hit_probe_sum, other.stats.hit_probe_sum);
    EXPECT_EQ(stats.inserts, other.stats.inserts);
    EXPECT_EQ(stats.insert_probe_sum, other.stats.insert_probe_sum);
    EXPECT_EQ(stats.full_rejections, other.stats.full_rejections);
    EXPECT_EQ(stats.periods, other.stats.periods);
    EXPECT_EQ(stats.chains_sorted, other.stats.chains_sorted);
    EXPECT_EQ(stats.entries_moved, other.stats.entries_moved);
    EXPECT_EQ(stats.phase_changes, other.stats.phase_changes);
    EXPECT_EQ(stats.drains, other.stats.drains);
  }
};

// A random mix of Add (counts 0, 1, a few, 2^31 and 2^40), AddBatch of every size around
// the prefetch distances, EndPeriod, Clear, TakeCounts and RemoveIf on a small table that
// fills up. `batched` takes the batches, `single` the same items one Add at a time; both must
// end in the same state, `single`'s statistics must match a model that counts each Add by
// the probe length of its key before the Add, its period counts a model that restarts them at
// every period end, and every count is handed over exactly once.
template <typename Table>
void RunAgainstModel(Table& batched, Table& single, uint32_t seed, int steps) {
  std::mt19937_64 rng(seed);
  TableStats model;
  std::map<uint64_t, uint64_t> added, removed, taken_batched, taken_single;
  constexpr uint64_t kMaxPeriodCount = Table::kPeriodCountLimit;
  std::map<uint64_t, uint64_t> period_counts;  // keys absent: 0
  uint64_t periods = 0;
  auto key_at = [&](uint64_t r) { return (r + 1) * 0x9e3779b97f4a7c15ull ^ 0x5bd1e995; };
  auto next_item = [&]() -> KeyCount<uint64_t> {
    const uint64_t r = rng() % 100;
    const uint64_t key = key_at(r < 60 ? rng() % 8 : rng() % 400);
    const uint64_t c = rng() % 50;
    const uint64_t count = c == 0 ? 0 : c == 1 ? uint64_t{1} << 40 : c == 2 ? uint64_t{1} << 31
                           : c < 30 ? 1 : c % 7 + 1;
    return {key, count};
  };
  // Adds one item to `single` and to the model; false if the table was full.
  auto add_single = [&](const KeyCount<uint64_t>& item) {
    const uint32_t position = single.ProbeLength(item.key);
    const AddResult result = single.Add(item.key, item.count);
    if (position != 0) {
      EXPECT_EQ(result, AddResult::kUpdated);
      ++model.hits;
      model.hit_probe_sum += position;
    } else if (result == AddResult::kFull) {
      EXPECT_EQ(single.size(), single.capacity());
      ++model.full_rejections;
      return false;
    } else {
      EXPECT_EQ(result, AddResult::kInserted);
      ++model.inserts;
    }
    added[item.key] += item.count;
    // Period counts: the count, capped, restarting after every period end (the Add that
    // completes a period counts in that period).
    uint64_t& pc = period_counts[item.key];
    pc = std::min(pc + std::min(item.count, kMaxPeriodCount), kMaxPeriodCount);
    if (single.stats().periods != periods) {
      periods = single.stats().periods;
      period_counts.clear();
    }
    return true;
  };
  auto drain_both = [&] {
    period_counts.clear();
    batched.Drain([&](uint64_t k, uint64_t c) { taken_batched[k] += c; });
    single.Drain([&](uint64_t k, uint64_t c) { taken_single[k] += c; });
  };
  std::vector<KeyCount<uint64_t>> items;
  for (int step = 0; step < steps; ++step) {
    const uint64_t op = rng() % 100;
    if (op < 60) {
      // A batch of 0 .. 70 items (the prefetch ring holds 32).
      items.resize(rng() % 71);
      for (KeyCount<uint64_t>& item : items) item = next_item();
      std::span<const KeyCount<uint64_t>> rest(items);
      while (true) {
        const size_t stored = batched.AddBatch(rest);
        for (size_t i = 0; i < stored; ++i) ASSERT_TRUE(add_single(rest[i]));
        if (stored == rest.size()) break;
        ASSERT_FALSE(add_single(rest[stored]));  // full for both
        drain_both();
        rest = rest.subspan(stored);
      }
    } else if (op < 90) {
      const KeyCount<uint64_t> item = next_item();
      if (!add_single(item)) {
        ASSERT_EQ(batched.Add(item.key, item.count), AddResult::kFull);
        drain_both();
        ASSERT_TRUE(add_single(item));
      }
      ASSERT_NE(batched.Add(item.key, item.count), AddResult::kFull);
    } else if (op < 93) {
      batched.EndPeriod();
      single.EndPeriod();
      period_counts.clear();
      periods = single.stats().periods;
    } else if (op < 95) {
      drain_both();
    } else if (op < 98) {
      batched.TakeCounts([&](uint64_t k, uint64_t c) { taken_batched[k] += c; });
      single.TakeCounts([&](uint64_t k, uint64_t c) { taken_single[k] += c; });
    } else {
      const uint64_t odd = rng() % 2;
      ASSERT_EQ(batched.RemoveIf([&](uint64_t k, uint64_t, uint32_t) { return k % 2 == odd; }),
                single.RemoveIf([&](uint64_t k, uint64_t c, uint32_t) {
                  if (k % 2 == odd) {
                    removed[k] += c;
                    period_counts.erase(k);
                  }
                  return k % 2 == odd;
                }));
    }
    const TableStats stats = single.stats();
    ASSERT_EQ(stats.hits, model.hits) << step;
    ASSERT_EQ(stats.hit_probe_sum, model.hit_probe_sum) << step;
    ASSERT_EQ(stats.inserts, model.inserts) << step;
    ASSERT_EQ(stats.updates, model.hits + model.inserts) << step;
    ASSERT_EQ(stats.full_rejections, model.full_rejections) << step;
    if (step % 16 == 0) {
      for (uint32_t b = 0; b < single.bucket_count(); ++b) {
        single.ForEachInChain(b, [&](uint64_t k, uint64_t, uint32_t pc) {
          auto it = period_counts.find(k);
          ASSERT_EQ(pc, it == period_counts.end() ? 0 : it->second) << step;
        });
      }
    }
  }
  Snapshot<Table>(batched).ExpectEq(Snapshot<Table>(single));
  EXPECT_EQ(batched.TakePhaseChanges().size(), single.TakePhaseChanges().size());
  drain_both();
  EXPECT_EQ(taken_batched, taken_single);
  // RemoveIf drops counts on purpose; what it dropped is what is missing.
  for (auto& [key, count] : removed) taken_single[key] += count;
  EXPECT_EQ(taken_single, added);
}

TEST(SortedTableTest, StatsAndBatchesMatchAModel) {
  for (uint32_t period : {0u, 64u, 1000u}) {
    for (uint32_t seed : {1u, 2u}) {
      SCOPED_TRACE(::testing::Message() << "period " << period << " seed " << seed);
      const SortedTableOptions options{.max_entries = 120,
                                       .bucket_count = 16,  // chains of ~8: deep hits
                                       .period = period,
                                       .depth_threshold = 1,
                                       .frequency_threshold = 3,
                                       .max_phase_changes = 16};
      CountTable batched = MakeTable(options), single = MakeTable(options);
      RunAgainstModel(batched, single, seed, 3000);
      EXPECT_GT(single.stats().full_rejections, 0u);
      EXPECT_GT(single.stats().hit_probe_sum, single.stats().hits);  // some deep hits
      if (period != 0) {
        EXPECT_GT(single.stats().chains_sorted, 0u);
      }
    }
  }
}

// The model run with every key in one chain (the head fast path rarely applies).
TEST(SortedTableTest, StatsAndBatchesMatchAModelWithDegenerateHash) {
  using Table = SortedTable<uint64_t, ConstantHash>;
  const SortedTableOptions options{.max_entries = 100, .period = 128, .depth_threshold = 1,
                                   .frequency_threshold = 3};
  absl::StatusOr<Table> batched = Table::Create(options), single = Table::Create(options);
  ASSERT_TRUE(batched.ok() && single.ok());
  RunAgainstModel(*batched, *single, 5, 2000);
  EXPECT_GT(single->stats().chains_sorted, 0u);
}

// Period counts saturate at 2^24 - 1 (owner-driven periods have no bound on them) without
// spilling into the period tag, and counts stay exact.
TEST(SortedTableTest, PeriodCountsSaturate) {
  CountTable table = MakeTable({.max_entries = 8, .period = 0, .frequency_threshold = 10});
  const uint64_t a = 11, b = 12;
  auto period_count = [&](uint64_t key) {
    uint32_t out = 0;
    table.ForEachInChain(table.BucketIndex(key), [&](uint64_t k, uint64_t, uint32_t pc) {
      if (k == key) out = pc;
    });
    return out;
  };
  constexpr uint32_t kMax = CountTable::kPeriodCountLimit;
  table.Add(a, kMax - 10);
  table.Add(b, 3);
  EXPECT_EQ(period_count(a), kMax - 10);
  table.Add(a, 100);
  EXPECT_EQ(period_count(a), kMax);
  table.Add(a, uint64_t{1} << 40);
  table.Add(a, uint64_t{1} << 31);
  EXPECT_EQ(period_count(a), kMax);
  EXPECT_EQ(table.Find(a), kMax - 10 + 100 + (uint64_t{1} << 40) + (uint64_t{1} << 31));
  EXPECT_EQ(period_count(b), 3u);
  table.Add(b, uint64_t{1} << 40);  // a single count saturates too
  EXPECT_EQ(period_count(b), kMax);
  const uint64_t c = 14;
  table.Add(c, 3);
  table.Add(c, kMax - 3);  // exactly at the limit
  EXPECT_EQ(period_count(c), kMax);
  table.Add(c, 0);
  EXPECT_EQ(period_count(c), kMax);
  EXPECT_EQ(table.Find(c), kMax);
  table.EndPeriod();
  EXPECT_EQ(period_count(a), 0u);  // a new period, not a carry into the period number
  table.Add(a, 5);
  table.Add(b);
  EXPECT_EQ(period_count(a), 5u);
  EXPECT_EQ(period_count(b), 1u);
  EXPECT_EQ(table.stats().updates, 11u);
  // A new key with a huge count: saturated from the start.
  table.Add(13, uint64_t{1} << 40);
  EXPECT_EQ(period_count(13), kMax);
  EXPECT_EQ(table.stats().periods, 1u);

  // With counted periods a count of 2^31 or more ends the period at once.
  CountTable counted = MakeTable({.max_entries = 8, .period = 1u << 31});
  counted.Add(a, 1);
  EXPECT_EQ(counted.stats().periods, 0u);
  counted.Add(a, uint64_t{1} << 40);
  EXPECT_EQ(counted.stats().periods, 1u);
  EXPECT_EQ(counted.Find(a), (uint64_t{1} << 40) + 1);
  EXPECT_EQ(counted.stats().updates, 2u);
}

// Free slots hold poison keys (key 0 among them): keys 0 and ~0 are ordinary keys, also where
// the poison key's own home slot is, and after their slots are freed and reused.
TEST(SortedTableTest, KeyZeroAndMaxKey) {
  CountTable table = MakeTable({.max_entries = 16, .bucket_count = 8});
  const uint64_t max = ~uint64_t{0};
  EXPECT_EQ(table.Find(0), std::nullopt);
  EXPECT_EQ(table.Find(max), std::nullopt);
  EXPECT_EQ(table.ProbeLength(0), 0u);
  EXPECT_EQ(table.Add(0), AddResult::kInserted);
  EXPECT_EQ(table.Add(0, 2), AddResult::kUpdated);
  EXPECT_EQ(table.Add(max, 5), AddResult::kInserted);
  EXPECT_EQ(table.Find(0), 3u);
  EXPECT_EQ(table.Find(max), 5u);
  EXPECT_EQ(table.RemoveIf([](uint64_t k, uint64_t, uint32_t) { return k == 0; }), 1u);
  EXPECT_EQ(table.Find(0), std::nullopt);
  EXPECT_EQ(table.Add(0), AddResult::kInserted);  // not a hit on a freed slot
  EXPECT_EQ(table.size(), 2u);
  std::map<uint64_t, uint64_t> drained;
  table.Drain([&](uint64_t k, uint64_t c) { drained[k] += c; });
  EXPECT_EQ(drained, (std::map<uint64_t, uint64_t>{{0, 1}, {max, 5}}));
  for (int round = 0; round < 3; ++round) {  // free again: nothing matches key 0
    EXPECT_EQ(table.Add(0), AddResult::kInserted);
    EXPECT_EQ(table.Add(0), AddResult::kUpdated);
    EXPECT_EQ(table.stats().inserts, 4u + round);
    table.Clear();
  }
}

// A full table of keys that all collide in a few chains: every key is found behind its head,
// a new key is refused without disturbing anything, and after a drain the same keys fit again.
TEST(SortedTableTest, FullTableOfCollidingKeys) {
  CountTable table = MakeTable({.max_entries = 24, .bucket_count = 32, .period = 0});
  const auto groups = KeysByBucket(table, 3, 8);  // chains of 8 in a table of 32 slots
  for (int pass = 0; pass < 2; ++pass) {
    for (const auto& keys : groups) {
      for (uint64_t k : keys) ASSERT_EQ(table.Add(k, k % 5 + 1), AddResult::kInserted);
    }
    EXPECT_EQ(table.size(), 24u);
    const uint64_t extra = KeysByBucket(table, 4, 9)[3][8];
    EXPECT_EQ(table.Add(extra), AddResult::kFull);
    for (const auto& keys : groups) {
      EXPECT_THAT(ChainKeys(table, table.BucketIndex(keys[0])), ElementsAreArray(keys));
      for (size_t p = 0; p < keys.size(); ++p) {
        EXPECT_EQ(table.ProbeLength(keys[p]), p + 1);
        EXPECT_EQ(table.Find(keys[p]), keys[p] % 5 + 1);
      }
    }
    table.Drain([](uint64_t, uint64_t) {});
  }
}

// A chain whose home slot holds a deeper entry of another chain: the first key of the chain
// moves it out, and both chains keep their order.
TEST(SortedTableTest, FirstEntryMovesDeeperEntryOutOfItsHome) {
  CountTable table = MakeTable({.max_entries = 16, .bucket_count = 16, .period = 0});
  // Deeper entries take free slots from the top down when the tail's cache line (4 slots) is
  // full: fill one line's homes, then add second entries to them.
  std::map<uint32_t, std::vector<uint64_t>> by_bucket;
  for (uint64_t key = 1; by_bucket.size() < 16 || key < 2000; ++key) {
    by_bucket[table.BucketIndex(key)].push_back(key);
  }
  std::vector<uint64_t> heads, seconds;
  for (uint32_t b = 0; b < 4; ++b) {  // line 0: buckets 0..3
    heads.push_back(by_bucket[b][0]);
    seconds.push_back(by_bucket[b][1]);
  }
  for (uint64_t k : heads) ASSERT_EQ(table.Add(k), AddResult::kInserted);
  for (uint64_t k : seconds) ASSERT_EQ(table.Add(k), AddResult::kInserted);
  // The seconds went to slots 15, 14, 13, 12 (homes of buckets 15..12): claim those homes.
  for (uint32_t b = 12; b < 16; ++b) {
    ASSERT_EQ(table.Add(by_bucket[b][0], 7), AddResult::kInserted);
  }
  for (uint32_t b = 0; b < 4; ++b) {
    EXPECT_THAT(ChainKeys(table, b), ElementsAre(heads[b], seconds[b]));
    EXPECT_EQ(table.ProbeLength(seconds[b]), 2u);
  }
  for (uint32_t b = 12; b < 16; ++b) {
    EXPECT_THAT(ChainKeys(table, b), ElementsAre(by_bucket[b][0]));
    EXPECT_EQ(table.Find(by_bucket[b][0]), 7u);
  }
  EXPECT_EQ(table.size(), 12u);
}

// Counts carry from the slot's 16 bits into the high word, in Add and in AddBatch, and every
// path that moves entries (sorting, RemoveIf, Grow) moves the high word along.
TEST(SortedTableTest, CountsCarryIntoHighWord) {
  CountTable table = MakeTable({.max_entries = 32,
                                .bucket_count = 2,  // one deep chain: sorts move entries
                                .period = 0,
                                .depth_threshold = 1,
                                .frequency_threshold = 3});
  const uint64_t a = 101, b = 202, c = 303;
  const uint64_t low = 0xffffffffu;
  table.Add(a, low);
  table.Add(a);  // carries
  EXPECT_EQ(table.Find(a), uint64_t{1} << 32);
  const std::vector<KeyCount<uint64_t>> batch = {{b, low}, {b, 1}, {b, low}, {c, 3}};
  ASSERT_EQ(table.AddBatch(batch), batch.size());
  EXPECT_EQ(table.Find(b), 2 * low + 1);
  table.Add(c, (uint64_t{5} << 32) + 10);  // c is hot now: sorted ahead of a and b
  table.EndPeriod();
  EXPECT_EQ(table.Find(a), uint64_t{1} << 32);
  EXPECT_EQ(table.Find(b), 2 * low + 1);
  EXPECT_EQ(table.Find(c), (uint64_t{5} << 32) + 13);
  ASSERT_TRUE(table.Grow({.max_entries = 64,
                          .bucket_count = 2,
                          .period = 0,
                          .depth_threshold = 1,
                          .frequency_threshold = 3})
                  .ok());
  EXPECT_EQ(table.RemoveIf([&](uint64_t k, uint64_t, uint32_t) { return k == a; }), 1u);
  EXPECT_EQ(table.Find(b), 2 * low + 1);
  EXPECT_EQ(table.Find(c), (uint64_t{5} << 32) + 13);
  const std::vector<KeyCount<uint64_t>> top = table.TopN(2);
  ASSERT_EQ(top.size(), 2u);
  EXPECT_EQ(top[0], (KeyCount<uint64_t>{c, (uint64_t{5} << 32) + 13}));
  std::map<uint64_t, uint64_t> taken;
  table.TakeCounts([&](uint64_t k, uint64_t n) { taken[k] = n; });
  EXPECT_EQ(taken, (std::map<uint64_t, uint64_t>{{b, 2 * low + 1},
                                                 {c, (uint64_t{5} << 32) + 13}}));
  EXPECT_EQ(table.Find(b), 0u);
}

// Period tags repeat every 255 periods: an entry left untouched for hundreds of periods still
// reads as 0 counts in the current one (the sweep rewrites stale words first), with counted
// and with owner-driven periods.
TEST(SortedTableTest, PeriodCountsOfIdleEntriesStayZeroAcrossTagWraps) {
  for (uint32_t period : {0u, 16u}) {
    SCOPED_TRACE(period);
    CountTable table = MakeTable({.max_entries = 600, .period = period,
                                  .frequency_threshold = 2});
    auto period_count = [&](uint64_t key) {
      uint32_t out = ~0u;
      table.ForEachInChain(table.BucketIndex(key), [&](uint64_t k, uint64_t, uint32_t pc) {
        if (k == key) out = pc;
      });
      return out;
    };
    // Idle keys with counts in some period, one of them at every 16th slot or so.
    for (uint64_t k = 1; k <= 500; ++k) table.Add(k * 0x9e3779b97f4a7c15ull, k % 7 + 1);
    const uint64_t busy = 12345;
    for (int p = 0; p < 1200; ++p) {
      if (period == 0) {
        table.Add(busy);
        table.EndPeriod();
      } else {
        for (uint32_t i = 0; i < period; ++i) table.Add(busy);
      }
      if (p % 97 == 0 || (p > 250 && p < 260)) {
        for (uint64_t k = 1; k <= 500; k += 13) {
          ASSERT_EQ(period_count(k * 0x9e3779b97f4a7c15ull), 0u) << p << " " << k;
        }
      }
    }
    EXPECT_GE(table.stats().periods, 1200u);
    const uint64_t k7 = 7 * 0x9e3779b97f4a7c15ull;
    table.Add(k7, 2);
    EXPECT_EQ(period_count(k7), 2u);
    EXPECT_EQ(table.Find(k7), 7 % 7 + 1 + 2u);
  }
}

// Keys (bucket << 20 | id) that land in `bucket` of a table with 2^16 buckets: the hash undoes
// the table's mixing (an xor-shift, its own inverse, then a multiplication by an odd number).
struct BucketHash {
  static constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ull;
  static constexpr uint64_t Inverse(uint64_t a) {
    uint64_t x = a;  // Newton's iteration: each step doubles the correct low bits
    for (int i = 0; i < 6; ++i) x *= 2 - a * x;
    return x;
  }
  uint64_t operator()(uint64_t key) const {
    const uint64_t mixed = (key >> 20) << 48 | (key & 0xfffff);
    const uint64_t h = mixed * Inverse(kGolden);
    return h ^ (h >> 32);
  }
};

// Links reach 32k slots from their slot; a deeper entry placed further away (the near lines
// all taken) is linked through the parallel array, and moving, sorting and removing such
// entries keeps every chain intact.
TEST(SortedTableTest, FarLinks) {
  using Table = SortedTable<uint64_t, BucketHash>;
  absl::StatusOr<Table> table = Table::Create({.max_entries = 60000,
                                               .bucket_count = 1u << 16,
                                               .period = 0,
                                               .depth_threshold = 1,
                                               .frequency_threshold = 5});
  ASSERT_TRUE(table.ok());
  auto key = [](uint64_t bucket, uint64_t id) { return bucket << 20 | id; };
  ASSERT_EQ(table->BucketIndex(key(12345, 7)), 12345u);
  // Heads of buckets 0 .. 4095: the lines near slot 0 are full.
  for (uint64_t b = 0; b < 4096; ++b) ASSERT_EQ(table->Add(key(b, 0)), AddResult::kInserted);
  // Bucket 0's second entry goes to the top-most free slot (65535), its third next to that.
  const std::vector<uint64_t> chain = {key(0, 0), key(0, 1), key(0, 2), key(0, 3)};
  for (size_t i = 1; i < chain.size(); ++i) table->Add(chain[i], i);
  auto chain_keys = [&](uint32_t b) {
    std::vector<uint64_t> keys;
    table->ForEachInChain(b, [&](uint64_t k, uint64_t, uint32_t) { keys.push_back(k); });
    return keys;
  };
  EXPECT_EQ(chain_keys(0), chain);
  for (size_t i = 0; i < chain.size(); ++i) {
    EXPECT_EQ(table->ProbeLength(chain[i]), i + 1);
    EXPECT_EQ(table->Find(chain[i]), i == 0 ? 1u : i);
  }
  // Claiming the home slots up there moves bucket 0's deeper entries down again.
  for (uint64_t b = 65528; b < 65536; ++b) {
    ASSERT_EQ(table->Add(key(b, 0)), AddResult::kInserted);
  }
  EXPECT_EQ(chain_keys(0), chain);
  // The last one turns hot and sorts to the head.
  table->Add(chain[3], 10);
  table->EndPeriod();
  EXPECT_EQ(chain_keys(0), (std::vector<uint64_t>{chain[3], chain[0], chain[1], chain[2]}));
  EXPECT_EQ(table->RemoveIf([&](uint64_t k, uint64_t, uint32_t) { return k == chain[0]; }), 1u);
  EXPECT_EQ(chain_keys(0), (std::vector<uint64_t>{chain[3], chain[1], chain[2]}));
  EXPECT_EQ(table->Find(chain[2]), 2u);
  EXPECT_EQ(table->Find(chain[3]), 13u);
  uint64_t total = 0;
  table->Drain([&](uint64_t, uint64_t c) { total += c; });
  EXPECT_EQ(total, 4095u + 8 + 1 + 2 + 13);
}

// The server's key: 16 bytes (host, padding, stack ID).
struct CellKey {
  uint32_t host;
  uint32_t pad;
  uint64_t stack;
  friend bool operator==(const CellKey&, const CellKey&) = default;
  friend auto operator<=>(const CellKey&, const CellKey&) = default;
};
struct CellKeyHash {
  uint64_t operator()(const CellKey& k) const { return k.stack * 31 + k.host; }
};

TEST(SortedTableTest, SixteenByteKeys) {
  using Table = SortedTable<CellKey, CellKeyHash>;
  absl::StatusOr<Table> table = Table::Create({.max_entries = 200,
                                               .bucket_count = 32,
                                               .period = 256,
                                               .depth_threshold = 1,
                                               .frequency_threshold = 4});
  ASSERT_TRUE(table.ok());
  std::mt19937_64 rng(4);
  std::map<std::pair<uint32_t, uint64_t>, uint64_t> added, drained;
  auto drain = [&] {
    table->Drain([&](const CellKey& k, uint64_t c) { drained[{k.host, k.stack}] += c; });
  };
  std::vector<KeyCount<CellKey>> batch;
  for (int i = 0; i < 20000; ++i) {
    const uint64_t r = rng() % 10;
    const CellKey key{static_cast<uint32_t>(rng() % 3), 0, r < 7 ? rng() % 5 : rng() % 150};
    const uint64_t count = 1 + rng() % 3;
    added[{key.host, key.stack}] += count;
    if (i % 2 == 0) {  // half one at a time, half in batches of 37
      if (table->Add(key, count) == AddResult::kFull) {
        drain();
        ASSERT_EQ(table->Add(key, count), AddResult::kInserted);
      }
      continue;
    }
    batch.push_back({key, count});
    if (batch.size() < 37) continue;
    std::span<const KeyCount<CellKey>> rest(batch);
    while (true) {
      rest = rest.subspan(table->AddBatch(rest));
      if (rest.empty()) break;
      drain();
    }
    batch.clear();
  }
  ASSERT_EQ(table->AddBatch(batch), batch.size());
  std::vector<KeyCount<CellKey>> top = table->TopN(3);
  ASSERT_EQ(top.size(), 3u);
  EXPECT_GE(top[0].count, top[1].count);
  EXPECT_EQ(table->Find(top[0].key), top[0].count);
  EXPECT_GT(table->stats().chains_sorted, 0u);
  drain();
  EXPECT_EQ(drained, added);
}

}  // namespace
}  // namespace strata::table
