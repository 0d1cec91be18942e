// Which column families a sample query reads over which parts of its range.
#include "server/store/rollup_plan.h"

#include <ostream>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace strata::server::store {

bool operator==(const Piece& a, const Piece& b) {
  return a.column == b.column && a.from == b.from && a.to == b.to;
}

void PrintTo(const Piece& p, std::ostream* os) {
  *os << "{column " << static_cast<int>(p.column) << ", " << p.from << ", " << p.to << "}";
}

namespace {

constexpr int64_t kSecond = 1000;
constexpr int64_t kMinute = 60 * kSecond;
constexpr int64_t kHour = 60 * kMinute;
constexpr RollupSeal kAllSealed{INT64_MAX, INT64_MAX};

SampleQuery Query(Resolution resolution) {
  SampleQuery q;
  q.service = "svc";
  q.resolution = resolution;
  return q;
}

TEST(RollupPlanTest, FixedResolutionsReadOneColumn) {
  EXPECT_EQ(PlanPieces(Query(Resolution::kRaw), 10, 20, false, kAllSealed),
            (std::vector<Piece>{{Column::kSamples, 10, 20}}));
  EXPECT_EQ(PlanPieces(Query(Resolution::kMinute), 10, 20, false, kAllSealed),
            (std::vector<Piece>{{Column::kRollupMinute, 10, 20}}));
  EXPECT_EQ(PlanPieces(Query(Resolution::kHour), 0, 20, false, kAllSealed),
            (std::vector<Piece>{{Column::kRollupHour, 0, 20}}));
  // No hour window starts in [10, 20).
  EXPECT_TRUE(PlanPieces(Query(Resolution::kHour), 10, 20, false, kAllSealed).empty());
}

TEST(RollupPlanTest, WholeHoursStartAtTheFirstHourWindowInTheRange) {
  EXPECT_EQ(PlanPieces(Query(Resolution::kHour), 10, 2 * kHour + 5, true, kAllSealed),
            (std::vector<Piece>{{Column::kRollupHour, kHour, 2 * kHour + 5}}));
  EXPECT_EQ(PlanPieces(Query(Resolution::kHour), kHour, 2 * kHour, true, kAllSealed),
            (std::vector<Piece>{{Column::kRollupHour, kHour, 2 * kHour}}));
  EXPECT_TRUE(PlanPieces(Query(Resolution::kHour), 10, kHour, true, kAllSealed).empty());
}

TEST(RollupPlanTest, CapturesAreAlwaysRaw) {
  for (Resolution r : {Resolution::kRaw, Resolution::kHour, Resolution::kAuto}) {
    SampleQuery q = Query(r);
    q.capture_id = "cap";
    EXPECT_EQ(PlanPieces(q, 0, 3 * kHour, true, kAllSealed),
              (std::vector<Piece>{{Column::kCaptures, 0, 3 * kHour}}));
  }
}

TEST(RollupPlanTest, EmptyRangeReadsNothing) {
  EXPECT_TRUE(PlanPieces(Query(Resolution::kAuto), 20, 20, false, kAllSealed).empty());
  EXPECT_TRUE(PlanPieces(Query(Resolution::kRaw), 20, 10, false, kAllSealed).empty());
}

TEST(RollupPlanTest, AutoUsesTheCoarsestRollupThatCoversExactly) {
  const int64_t from = kHour - kMinute - 10 * kSecond;  // 00:58:50
  const int64_t to = 3 * kHour + 2 * kMinute + 20 * kSecond;  // 03:02:20
  EXPECT_EQ(PlanPieces(Query(Resolution::kAuto), from, to, true, kAllSealed),
            (std::vector<Piece>{
                {Column::kSamples, from, kHour - kMinute},
                {Column::kRollupMinute, kHour - kMinute, kHour},
                {Column::kSamples, kHour, kHour},
                {Column::kRollupHour, kHour, 3 * kHour},
                {Column::kSamples, 3 * kHour, 3 * kHour},
                {Column::kRollupMinute, 3 * kHour, 3 * kHour + 2 * kMinute},
                {Column::kSamples, 3 * kHour + 2 * kMinute, to},
            }));
}

TEST(RollupPlanTest, AutoWithinAnHourUsesMinutesAndRawEdges) {
  EXPECT_EQ(AutoPieces(30 * kSecond, 3 * kMinute + 10 * kSecond, kAllSealed),
            (std::vector<Piece>{
                {Column::kSamples, 30 * kSecond, kMinute},
                {Column::kRollupMinute, kMinute, 3 * kMinute},
                {Column::kSamples, 3 * kMinute, 3 * kMinute + 10 * kSecond},
            }));
  EXPECT_EQ(AutoPieces(10 * kSecond, 50 * kSecond, kAllSealed),
            (std::vector<Piece>{{Column::kSamples, 10 * kSecond, 50 * kSecond}}));
}

// Past a service's seal the rollups are not complete yet: whole hours come from the minute
// rollup up to the minute seal, and the rest raw.
TEST(RollupPlanTest, RangesPastTheSealAreReadFromFinerColumns) {
  const int64_t from = kHour - kMinute - 10 * kSecond;        // 00:58:50
  const int64_t to = 3 * kHour + 2 * kMinute + 20 * kSecond;  // 03:02:20
  const RollupSeal seal{2 * kHour + 5 * kMinute, 2 * kHour};
  EXPECT_EQ(PlanPieces(Query(Resolution::kAuto), from, to, true, seal),
            (std::vector<Piece>{
                {Column::kSamples, from, kHour - kMinute},
                {Column::kRollupMinute, kHour - kMinute, kHour},
                {Column::kSamples, kHour, kHour},
                {Column::kRollupHour, kHour, 2 * kHour},
                {Column::kSamples, 2 * kHour, 2 * kHour},
                {Column::kRollupMinute, 2 * kHour, 2 * kHour + 5 * kMinute},
                {Column::kSamples, 2 * kHour + 5 * kMinute, to},
            }));
  // Nothing sealed in range: raw only.
  EXPECT_EQ(PlanPieces(Query(Resolution::kAuto), from, to, true, RollupSeal{0, 0}),
            (std::vector<Piece>{{Column::kSamples, from, to}}));
  // Fixed resolutions continue in the next finer column past the seal.
  EXPECT_EQ(PlanPieces(Query(Resolution::kMinute), 0, to, false, seal),
            (std::vector<Piece>{{Column::kRollupMinute, 0, 2 * kHour + 5 * kMinute},
                                {Column::kSamples, 2 * kHour + 5 * kMinute, to}}));
  EXPECT_EQ(PlanPieces(Query(Resolution::kHour), 10, to, true, seal),
            (std::vector<Piece>{{Column::kRollupHour, kHour, 2 * kHour},
                                {Column::kRollupMinute, 2 * kHour, 2 * kHour + 5 * kMinute},
                                {Column::kSamples, 2 * kHour + 5 * kMinute, to}}));
}

}  // namespace
}  // namespace strata::server::store
