// Timelines: a service's samples per interval over a range, one series per value of a label
// (or per host) when asked. The interval rules and the ranking of series live here; the
// counting itself is ProfileReader::Series (one store scan at the interval's resolution), and
// in a cluster each node counts its hosts' samples and the coordinator adds the parts.
#ifndef STRATA_SERVER_QUERY_SERIES_H_
#define STRATA_SERVER_QUERY_SERIES_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "server/store/records.h"
#include "strata/v1/query.pb.h"

namespace strata::server::query {

// SeriesRequest.group_by for the samples' host (hosts are not labels).
inline constexpr char kSeriesByHost[] = "host";
// Most intervals one series may have.
inline constexpr int64_t kMaxSeriesIntervals = 10'000;

// The interval for [from_ms, to_ms): `step_ms` when given (a positive multiple of the commit
// window), else about 100 intervals rounded up to 10 s, 1, 5, 15 or 30 min or whole hours.
// InvalidArgument for a step that is not a multiple of the window or makes too many
// intervals.
absl::StatusOr<int64_t> SeriesStep(int64_t from_ms, int64_t to_ms, int64_t step_ms);

// The coarsest store resolution whose windows lie inside one interval of `step_ms`: hour
// rollups for whole hours, minute rollups for whole minutes, raw windows otherwise.
store::Resolution SeriesResolution(int64_t step_ms);

// Start of the interval holding `ms`.
inline int64_t SeriesIntervalStart(int64_t ms, int64_t step_ms) {
  return ms - ((ms % step_ms) + step_ms) % step_ms;
}

// Adds `part` (same from_ms and step_ms) into `sum`, series by value.
void AddSeries(const v1::SeriesResponse& part, v1::SeriesResponse* sum);

// Orders `response`'s series by total (largest first, then by value) and keeps `limit` of
// them (0: 10); the others are summed into one series marked `other`.
void RankSeries(uint32_t limit, v1::SeriesResponse* response);

}  // namespace strata::server::query

#endif  // STRATA_SERVER_QUERY_SERIES_H_
