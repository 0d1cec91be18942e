// The CLI's common filter: a range given as --from/--to is [from, to), so that two ranges that
// meet at T (before and after a deploy) share no window; --since ends now, taking in now's own
// window.
#include "cli/client.h"

#include "common/base/clock.h"
#include "gtest/gtest.h"

namespace strata::cli {
namespace {

TEST(BuildFilterTest, AGivenEndIsExclusiveAndNowIsIncluded) {
  FilterOptions f;
  f.service = "api";
  f.from = "2026-12-04T10:00:00Z";
  f.to = "2026-12-04T10:05:00Z";
  const v1::ProfileFilter before = BuildFilter(f);
  EXPECT_EQ(before.service(), "api");
  EXPECT_EQ(before.range().from_ms(), 1'796'378'400'000);
  EXPECT_EQ(before.range().to_ms(), 1'796'378'700'000);
  f.from = f.to;
  f.to = "2026-12-04T10:10:00Z";
  EXPECT_EQ(BuildFilter(f).range().from_ms(), before.range().to_ms());

  FilterOptions recent;
  recent.since = "10m";
  const int64_t now_before = base::NowMs();
  const v1::ProfileFilter last = BuildFilter(recent);
  EXPECT_GT(last.range().to_ms(), now_before);  // the window holding now
  EXPECT_EQ(last.range().to_ms() - last.range().from_ms(), 600'001);
}

// Headers and errors name the range and the flags as given: an end without a start is the
// --since before it, and a bad range names the flags the user set.
TEST(BuildFilterTest, HeadersAndErrorsSayWhatWasGiven) {
  FilterOptions f;
  f.since = "10m";
  f.to = "2026-12-04T10:05:00Z";
  EXPECT_EQ(RangeText(f), "10m before 2026-12-04T10:05:00Z");
  EXPECT_EQ(BuildFilter(f).range().from_ms(), 1'796'378'700'000 - 600'000);
  FilterOptions future;
  future.from = "2999-01-01T00:00:00Z";
  EXPECT_EXIT(BuildFilter(future), ::testing::ExitedWithCode(1), "--from must be in the past");
  FilterOptions reversed;
  reversed.from = "2026-12-04T10:05:00Z";
  reversed.to = "2026-12-04T10:00:00Z";
  EXPECT_EXIT(BuildFilter(reversed, "--base-"), ::testing::ExitedWithCode(1),
              "--base-from must be before --base-to");
}

}  // namespace
}  // namespace strata::cli
