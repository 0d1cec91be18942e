#include "server/compare/student_t.h"

#include <cmath>

#include "gtest/gtest.h"

namespace strata::server::compare {
namespace {

TEST(StudentTTest, TailsMatchTables) {
  EXPECT_NEAR(TwoSidedP(12.7062, 1), 0.05, 1e-5);
  EXPECT_NEAR(TwoSidedP(2.22814, 10), 0.05, 1e-5);
  EXPECT_NEAR(TwoSidedP(2.04227, 30), 0.05, 1e-5);
  EXPECT_NEAR(TwoSidedP(1.95996, 1e6), 0.05, 1e-5);
  EXPECT_NEAR(TwoSidedP(0, 5), 1.0, 1e-12);
  EXPECT_NEAR(TwoSidedP(-2.22814, 10), 0.05, 1e-5);
  EXPECT_EQ(TwoSidedP(INFINITY, 3), 0);
  EXPECT_TRUE(std::isnan(TwoSidedP(1, 0)));
}

TEST(StudentTTest, QuantilesInvertTails) {
  EXPECT_NEAR(TwoSidedQuantile(0.05, 10), 2.228139, 1e-5);
  EXPECT_NEAR(TwoSidedQuantile(0.05, 4), 2.776445, 1e-5);
  EXPECT_NEAR(TwoSidedQuantile(0.01, 20), 2.845340, 1e-5);
  // One-sided 80 %: z_0.8 = 0.841621 in the normal limit.
  EXPECT_NEAR(TwoSidedQuantile(0.4, 1e6), 0.841621, 1e-5);
  // Fractional degrees of freedom (Welch) lie between their integer neighbours.
  const double q = TwoSidedQuantile(0.05, 2.5);
  EXPECT_LT(q, TwoSidedQuantile(0.05, 2));
  EXPECT_GT(q, TwoSidedQuantile(0.05, 3));
  EXPECT_TRUE(std::isnan(TwoSidedQuantile(0, 3)));
}

}  // namespace
}  // namespace strata::server::compare
