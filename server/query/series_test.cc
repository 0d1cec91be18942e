#include "server/query/series.h"

#include <cstdint>
#include <functional>
#include <limits>
#include <vector>

#include "common/testing/temp_dir.h"
#include "gtest/gtest.h"
#include "server/query/profile.h"

namespace strata::server::query {
namespace {

constexpr int64_t kMinute = 60'000;
constexpr int64_t kHour = 60 * kMinute;

// The query of service "svc" over [from_ms, to_ms), changed by `edit`.
ProfileQuery Range(int64_t from_ms, int64_t to_ms,
                   const std::function<void(ProfileQuery&)>& edit = nullptr) {
  ProfileQuery q;
  q.service = "svc";
  q.from_ms = from_ms;
  q.to_ms = to_ms;
  if (edit) edit(q);
  return q;
}

std::vector<uint64_t> Counts(const v1::SampleSeries& s) {
  return std::vector<uint64_t>(s.counts().begin(), s.counts().end());
}

const v1::SampleSeries* Find(const v1::SeriesResponse& r, const std::string& value) {
  for (const v1::SampleSeries& s : r.series()) {
    if (s.value() == value && !s.other()) return &s;
  }
  return nullptr;
}

// Ranges and steps at the ends of int64: refused, not wrapped into an interval count.
TEST(SeriesStepTest, TimesAndStepsBeyondTheQueryRangeAreRefused) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  EXPECT_FALSE(SeriesStep(0, kMax - 5000, 10'000).ok());
  EXPECT_FALSE(SeriesStep(-kMax, 10'000, 10'000).ok());
  EXPECT_FALSE(SeriesStep(0, kHour, kMax / 10'000 * 10'000).ok());
  EXPECT_TRUE(SeriesStep(0, kMaxQueryMs, 0).ok());
  EXPECT_TRUE(SeriesStep(kMaxQueryMs - kHour, kMaxQueryMs, kMaxQueryMs / 10'000 * 10'000).ok());
}

TEST(SeriesStepTest, AutomaticStepsAreRoundAndExplicitOnesChecked) {
  EXPECT_EQ(*SeriesStep(0, 15 * kMinute, 0), 10'000);
  EXPECT_EQ(*SeriesStep(0, kHour, 0), kMinute);
  EXPECT_EQ(*SeriesStep(0, 6 * kHour, 0), 5 * kMinute);
  EXPECT_EQ(*SeriesStep(0, 24 * kHour, 0), 15 * kMinute);
  EXPECT_EQ(*SeriesStep(0, 7 * 24 * kHour, 0), 2 * kHour);
  EXPECT_EQ(*SeriesStep(0, kHour, 20'000), 20'000);
  EXPECT_TRUE(absl::IsInvalidArgument(SeriesStep(0, kHour, 15'000).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(SeriesStep(0, kHour, -10'000).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(SeriesStep(5, 5, 0).status()));
  // 7 days of 10 s intervals are too many.
  EXPECT_TRUE(absl::IsInvalidArgument(SeriesStep(0, 7 * 24 * kHour, 10'000).status()));
  EXPECT_EQ(SeriesResolution(2 * kHour), store::Resolution::kAuto);
  EXPECT_EQ(SeriesResolution(5 * kMinute), store::Resolution::kMinute);
  EXPECT_EQ(SeriesResolution(30'000), store::Resolution::kRaw);
  EXPECT_EQ(SeriesIntervalStart(-1, 10'000), -10'000);
  EXPECT_EQ(SeriesIntervalStart(25'000, 10'000), 20'000);
}

TEST(SeriesMergeTest, PartsAddByValueAndRankingFoldsTheRest) {
  v1::SeriesResponse a, b, sum;
  auto add = [](v1::SeriesResponse* r, const std::string& value, std::vector<uint64_t> c) {
    v1::SampleSeries* s = r->add_series();
    s->set_value(value);
    uint64_t total = 0;
    for (uint64_t v : c) total += v;
    s->set_total(total);
    s->mutable_counts()->Add(c.begin(), c.end());
    r->set_total_samples(r->total_samples() + total);
  };
  add(&a, "v1", {1, 2, 3});
  add(&a, "v2", {0, 1, 0});
  add(&b, "v2", {5, 0, 0});
  add(&b, "v3", {0, 0, 1});
  AddSeries(a, &sum);
  AddSeries(b, &sum);
  EXPECT_EQ(sum.total_samples(), 13u);
  ASSERT_EQ(sum.series_size(), 3);
  EXPECT_EQ(Counts(*Find(sum, "v2")), (std::vector<uint64_t>{5, 1, 0}));
  RankSeries(1, &sum);
  ASSERT_EQ(sum.series_size(), 2);
  EXPECT_EQ(sum.series(0).value(), "v1");  // 6, then v2's 6 by value
  EXPECT_TRUE(sum.series(1).other());
  EXPECT_EQ(Counts(sum.series(1)), (std::vector<uint64_t>{5, 1, 1}));
  EXPECT_EQ(sum.series(1).total(), 7u);
}

class SeriesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s = store::Store::Open(dir_.path(), {});
    ASSERT_TRUE(s.ok()) << s.status();
    store_ = std::move(*s);
    store::WriteBatch wb;
    auto fn = [&](const char* name) {
      return *store_->interner().InternFunction({name, "/bin/x", "", 0}, &wb);
    };
    const uint64_t main = fn("main"), a = fn("a"), b = fn("b");
    a_ = *store_->interner().InternStack({{main, a}, false, {}}, &wb);
    b_ = *store_->interner().InternStack({{main, b}, false, {}}, &wb);
    v1_ = *store_->interner().InternLabelSet("svc", {{"version", "1"}}, 100, &wb);
    v2_ = *store_->interner().InternLabelSet("svc", {{"region", "eu"}, {"version", "2"}}, 100,
                                             &wb);
    ASSERT_TRUE(store_->Commit(&wb).ok());
  }
  void Add(int64_t window, const std::string& host, uint64_t stack, uint64_t count,
           uint64_t label_set) {
    store::WriteBatch wb;
    wb.AddSamples("svc", window, host, stack, count, label_set);
    ASSERT_TRUE(store_->Commit(&wb).ok());
  }
  v1::SeriesResponse Series(const ProfileQuery& q, int64_t step,
                            const std::string& group_by = "") {
    auto r = ProfileReader(store_.get()).Series(q, step, group_by);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : v1::SeriesResponse();
  }

  strata::testing::TempDir dir_;
  std::unique_ptr<store::Store> store_;
  uint64_t a_ = 0, b_ = 0, v1_ = 0, v2_ = 0;
};

TEST_F(SeriesTest, CountsPerIntervalLabelAndHostWithFiltersApplied) {
  Add(10'000, "h1", a_, 5, v1_);
  Add(20'000, "h2", b_, 3, v2_);
  Add(20'000, "h1", a_, 2, 0);
  Add(50'000, "h1", b_, 4, v2_);
  // [5 s, 45 s) at 20 s: intervals from 0 (the start rounded down): 0-20, 20-40, 40-60.
  v1::SeriesResponse all = Series(Range(5'000, 45'000), 20'000);
  EXPECT_EQ(all.from_ms(), 0);
  EXPECT_EQ(all.step_ms(), 20'000);
  EXPECT_EQ(all.total_samples(), 10u);
  ASSERT_EQ(all.series_size(), 1);
  EXPECT_EQ(Counts(all.series(0)), (std::vector<uint64_t>{5, 5, 0}));

  v1::SeriesResponse by_version = Series(Range(0, 60'000), 10'000, "version");
  EXPECT_EQ(Counts(*Find(by_version, "1")), (std::vector<uint64_t>{0, 5, 0, 0, 0, 0}));
  EXPECT_EQ(Counts(*Find(by_version, "2")), (std::vector<uint64_t>{0, 0, 3, 0, 0, 4}));
  EXPECT_EQ(Counts(*Find(by_version, "")), (std::vector<uint64_t>{0, 0, 2, 0, 0, 0}));

  v1::SeriesResponse by_host = Series(Range(0, 60'000), 30'000, kSeriesByHost);
  EXPECT_EQ(Counts(*Find(by_host, "h1")), (std::vector<uint64_t>{7, 4}));
  EXPECT_EQ(Counts(*Find(by_host, "h2")), (std::vector<uint64_t>{3, 0}));

  auto only = [](const std::function<void(ProfileQuery&)>& edit) {
    return Range(0, 60'000, edit);
  };
  EXPECT_EQ(Series(only([](auto& q) { q.focus = "^b$"; }), 30'000).total_samples(), 7u);
  EXPECT_EQ(Series(only([](auto& q) { q.ignore = "^b$"; }), 30'000).total_samples(), 7u);
  EXPECT_EQ(Series(only([](auto& q) { q.selector = "region=eu"; }), 60'000).total_samples(), 7u);
  EXPECT_EQ(Series(only([](auto& q) { q.host = "h2"; }), 60'000).total_samples(), 3u);
}

TEST_F(SeriesTest, RollupsGiveWhatRawWindowsGive) {
  // Samples over three hours, rolled up into minutes and hours; the series read at each
  // resolution must equal the sums of the raw windows.
  std::vector<uint64_t> per_hour(3, 0), per_five_minutes(36, 0);
  for (int64_t w = 0; w < 3 * kHour; w += 70'000) {
    const uint64_t count = 1 + static_cast<uint64_t>(w / 70'000) % 7;
    Add(w, w % 140'000 == 0 ? "h1" : "h2", w % 3 == 0 ? a_ : b_, count, v1_);
    per_hour[w / kHour] += count;
    per_five_minutes[w / (5 * kMinute)] += count;
  }
  ASSERT_TRUE(store_->RollUp(3 * kHour).ok());
  v1::SeriesResponse hours = Series(Range(0, 3 * kHour), kHour);
  ASSERT_EQ(hours.series_size(), 1);
  EXPECT_EQ(Counts(hours.series(0)), per_hour);
  v1::SeriesResponse minutes = Series(Range(0, 3 * kHour), 5 * kMinute, "version");
  ASSERT_NE(Find(minutes, "1"), nullptr);
  EXPECT_EQ(Counts(*Find(minutes, "1")), per_five_minutes);
}

TEST_F(SeriesTest, UnknownServiceAndBadFiltersAreErrors) {
  ProfileReader reader(store_.get());
  EXPECT_TRUE(absl::IsNotFound(
      reader.Series(Range(0, kHour, [](auto& q) { q.service = "nope"; }), kMinute, "").status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      reader.Series(Range(0, kHour, [](auto& q) { q.focus = "("; }), kMinute, "").status()));
}

}  // namespace
}  // namespace strata::server::query
