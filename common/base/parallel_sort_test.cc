#include "common/base/parallel_sort.h"

#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace strata::base {
namespace {

TEST(SortOnTwoThreadsTest, SortsAsStdSortAboveAndBelowTheThreshold) {
  std::mt19937_64 rng(7);
  for (size_t n : {size_t{0}, size_t{1}, size_t{1000}, kMinParallelSort - 1, kMinParallelSort,
                   size_t{100'001}}) {
    // Few distinct first keys: most order is decided by the second, as for stacks by count.
    std::vector<std::pair<uint32_t, uint64_t>> values(n);
    for (auto& v : values) v = {static_cast<uint32_t>(rng() % 16), rng()};
    auto by_first_descending = [](const auto& a, const auto& b) {
      return a.first != b.first ? a.first > b.first : a.second < b.second;
    };
    std::vector<std::pair<uint32_t, uint64_t>> want = values;
    std::sort(want.begin(), want.end(), by_first_descending);
    SortOnTwoThreads(values.begin(), values.end(), by_first_descending);
    EXPECT_EQ(values, want) << n;
  }
}

}  // namespace
}  // namespace strata::base
