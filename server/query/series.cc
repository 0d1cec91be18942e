#include "server/query/series.h"

#include <algorithm>
#include <map>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/base/saturating.h"
#include "server/commit/batch_committer.h"
#include "server/query/profile.h"

namespace strata::server::query {
namespace {

constexpr int64_t kMinuteMs = 60'000;
constexpr int64_t kHourMs = 60 * kMinuteMs;
constexpr int64_t kAutoIntervals = 100;

// to += from, interval by interval (and their totals).
void AddCounts(const v1::SampleSeries& from, v1::SampleSeries* to) {
  to->set_total(base::SaturatingAdd(to->total(), from.total()));
  if (to->counts_size() < from.counts_size()) to->mutable_counts()->Resize(from.counts_size(), 0);
  for (int i = 0; i < from.counts_size(); ++i) {
    base::SaturatingAddTo(*to->mutable_counts()->Mutable(i), from.counts(i));
  }
}

}  // namespace

absl::StatusOr<int64_t> SeriesStep(int64_t from_ms, int64_t to_ms, int64_t step_ms) {
  if (from_ms < 0 || to_ms > kMaxQueryMs) {
    return absl::InvalidArgumentError(absl::StrCat(
        "time range from ", from_ms, " to ", to_ms, " ms outside 0 to ", kMaxQueryMs, " ms"));
  }
  if (from_ms >= to_ms) {
    return absl::InvalidArgumentError(absl::StrCat(
        "empty time range: from ", from_ms, " ms is not before to ", to_ms, " ms"));
  }
  if (step_ms == 0) {
    const int64_t wanted = (to_ms - from_ms + kAutoIntervals - 1) / kAutoIntervals;
    step_ms = ((wanted + kHourMs - 1) / kHourMs) * kHourMs;
    for (int64_t s : {commit::kWindowMs, kMinuteMs, 5 * kMinuteMs, 15 * kMinuteMs,
                      30 * kMinuteMs}) {
      if (s >= wanted) {
        step_ms = s;
        break;
      }
    }
  }
  if (step_ms < 0 || step_ms > kMaxQueryMs || step_ms % commit::kWindowMs != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "step ", step_ms, " ms is not a positive multiple of the ", commit::kWindowMs,
        " ms window"));
  }
  const int64_t first = SeriesIntervalStart(from_ms, step_ms);
  if ((to_ms - first + step_ms - 1) / step_ms > kMaxSeriesIntervals) {
    return absl::InvalidArgumentError(absl::StrCat(
        "step ", step_ms, " ms makes more than ", kMaxSeriesIntervals,
        " intervals of the range; choose a longer one"));
  }
  return step_ms;
}

store::Resolution SeriesResolution(int64_t step_ms) {
  if (step_ms % kHourMs == 0) return store::Resolution::kAuto;
  if (step_ms % kMinuteMs == 0) return store::Resolution::kMinute;
  return store::Resolution::kRaw;
}

void AddSeries(const v1::SeriesResponse& part, v1::SeriesResponse* sum) {
  sum->set_total_samples(base::SaturatingAdd(sum->total_samples(), part.total_samples()));
  absl::flat_hash_map<std::string, int> index;
  for (int i = 0; i < sum->series_size(); ++i) index.emplace(sum->series(i).value(), i);
  for (const v1::SampleSeries& p : part.series()) {
    auto [it, added] = index.try_emplace(p.value(), sum->series_size());
    v1::SampleSeries* s = added ? sum->add_series() : sum->mutable_series(it->second);
    if (added) s->set_value(p.value());
    AddCounts(p, s);
  }
}

void RankSeries(uint32_t limit, v1::SeriesResponse* response) {
  if (limit == 0) limit = 10;
  auto* series = response->mutable_series();
  std::sort(series->begin(), series->end(), [](const v1::SampleSeries& a,
                                               const v1::SampleSeries& b) {
    return a.total() != b.total() ? a.total() > b.total() : a.value() < b.value();
  });
  if (static_cast<uint32_t>(series->size()) <= limit) return;
  v1::SampleSeries other;
  other.set_other(true);
  for (int i = static_cast<int>(limit); i < series->size(); ++i) {
    AddCounts(series->Get(i), &other);
  }
  series->DeleteSubrange(static_cast<int>(limit), series->size() - static_cast<int>(limit));
  *series->Add() = std::move(other);
}

}  // namespace strata::server::query
