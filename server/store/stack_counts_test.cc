#include "server/store/stack_counts.h"

#include <algorithm>
#include <random>

#include "gtest/gtest.h"

namespace strata::server::store {
namespace {

TEST(AddToSortedTest, MatchesSortingEverythingAgain) {
  std::mt19937_64 rng(7);
  for (int round = 0; round < 200; ++round) {
    const size_t n = rng() % 300;
    absl::flat_hash_map<uint64_t, uint64_t> all;
    std::vector<StackCount> sorted;
    for (size_t i = 0; i < n; ++i) {
      const uint64_t id = rng() % 1000, count = rng() % 20;
      if (all.try_emplace(id, count).second) sorted.push_back({id, count});
    }
    SortHeavierFirst(&sorted);
    absl::flat_hash_map<uint64_t, uint64_t> extra;
    const size_t k = rng() % 40;
    for (size_t i = 0; i < k; ++i) {
      const uint64_t id = rng() % 1000;
      const uint64_t count = rng() % 8 == 0 ? UINT64_MAX - 3 : rng() % 20;  // saturates
      extra[id] = count;
    }
    for (const auto& [id, count] : extra) {
      uint64_t& c = all[id];
      c = c > UINT64_MAX - count ? UINT64_MAX : c + count;
    }
    std::vector<StackCount> want;
    for (const auto& [id, count] : all) want.push_back({id, count});
    std::sort(want.begin(), want.end(), HeavierFirst);
    EXPECT_EQ(AddToSorted(sorted, extra), want) << "round " << round;
  }
}

TEST(AddToSortedTest, NothingToAddIsACopy) {
  const std::vector<StackCount> sorted{{3, 9}, {1, 4}, {2, 4}};
  EXPECT_EQ(AddToSorted(sorted, {}), sorted);
  EXPECT_EQ(AddToSorted({}, {{5, 1}}), (std::vector<StackCount>{{5, 1}}));
}

}  // namespace
}  // namespace strata::server::store
