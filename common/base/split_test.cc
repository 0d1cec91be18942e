#include "common/base/split.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace strata::base {
namespace {

using ::testing::ElementsAre;

TEST(SplitTest, KeepsEmptyPieces) {
  EXPECT_THAT(Split("a,,b", ','), ElementsAre("a", "", "b"));
  EXPECT_THAT(Split("", ','), ElementsAre(""));
  EXPECT_THAT(Split(",", ','), ElementsAre("", ""));
  EXPECT_THAT(Split("abc", ','), ElementsAre("abc"));
  EXPECT_THAT(Split("x\ny\n", '\n'), ElementsAre("x", "y", ""));
}

}  // namespace
}  // namespace strata::base
