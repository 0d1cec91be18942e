#include "agent/core/interval_loop.h"

#include <chrono>
#include <random>

#include "gtest/gtest.h"

namespace strata::agent {
namespace {

const absl::Time kBoundary = absl::FromUnixSeconds(1'800'000'000);
const std::chrono::steady_clock::time_point kSteady{std::chrono::hours(1)};

absl::Duration Wait(const WindowPlan& plan) {
  return absl::FromChrono(plan.deadline - kSteady);
}

TEST(PlanWindowTest, AWindowEndsAtTheNextMultipleOfTheInterval) {
  const WindowPlan plan =
      PlanWindow(kBoundary + absl::Milliseconds(300), kSteady, absl::Seconds(1));
  EXPECT_EQ(plan.end, kBoundary + absl::Seconds(1));
  EXPECT_EQ(Wait(plan), absl::Milliseconds(700));
}

// Woken by the monotonic deadline a hair before the wall clock reaches the boundary, the
// loop ships and must wait a whole interval, not plan the boundary it is at once more (which
// woke it again at once, every few microseconds, until the wall clock passed it).
TEST(PlanWindowTest, AWakeUpJustBeforeABoundaryPlansTheNextOne) {
  for (absl::Duration early : {absl::Nanoseconds(1), absl::Microseconds(3),
                               absl::Microseconds(400), absl::Microseconds(999)}) {
    const WindowPlan plan = PlanWindow(kBoundary - early, kSteady, absl::Seconds(1));
    EXPECT_EQ(plan.end, kBoundary + absl::Seconds(1)) << early;
    EXPECT_EQ(Wait(plan), absl::Seconds(1) + early) << early;
  }
}

TEST(PlanWindowTest, TheDeadlineIsNeverBeforeTheEnd) {
  std::mt19937_64 rng(7);
  for (absl::Duration interval : {absl::Milliseconds(100), absl::Seconds(1), absl::Seconds(10)}) {
    for (int i = 0; i < 10'000; ++i) {
      const absl::Time now =
          kBoundary + absl::Nanoseconds(static_cast<int64_t>(rng() % 20'000'000'000));
      const WindowPlan plan = PlanWindow(now, kSteady, interval);
      ASSERT_GE(Wait(plan), plan.end - now) << now;
      ASSERT_GE(plan.end - now, kWindowSlack) << now;
      ASSERT_LE(plan.end - now, interval + kWindowSlack) << now;
      ASSERT_EQ(absl::ToUnixMillis(plan.end) % absl::ToInt64Milliseconds(interval), 0);
    }
  }
}

}  // namespace
}  // namespace strata::agent
