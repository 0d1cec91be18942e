#include <cstdint>

#include "common/base/log.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

TEST(LogBudgetTest, LinesPastTheBudgetAreCountedAndReportedWithTheNextLineWritten) {
  constexpr int64_t kSecond = 1'000'000'000;
  LogBudget budget(2, 10 * kSecond);
  uint64_t left_out = 99;
  EXPECT_TRUE(budget.Take(0, &left_out));
  EXPECT_EQ(left_out, 0u);
  EXPECT_TRUE(budget.Take(kSecond, &left_out));
  for (int i = 0; i < 5; ++i) EXPECT_FALSE(budget.Take(2 * kSecond, &left_out));
  EXPECT_TRUE(budget.Take(10 * kSecond, &left_out));  // a new period
  EXPECT_EQ(left_out, 5u);
  EXPECT_TRUE(budget.Take(11 * kSecond, &left_out));
  EXPECT_EQ(left_out, 0u);
  EXPECT_FALSE(budget.Take(12 * kSecond, &left_out));
}

}  // namespace
}  // namespace strata
