#include "server/store/rollup_plan.h"

#include <algorithm>
#include <limits>

namespace strata::server::store {
namespace {

// 0 <= v; past the last multiple of `unit`, INT64_MAX (ranges may reach to the end of time).
int64_t RoundUp(int64_t v, int64_t unit) {
  const int64_t down = v / unit * unit;
  if (down == v) return v;
  return down > std::numeric_limits<int64_t>::max() - unit ? std::numeric_limits<int64_t>::max()
                                                           : down + unit;
}
int64_t RoundDown(int64_t v, int64_t unit) { return v / unit * unit; }

// [a, b) from the minute rollup where it is whole minutes before the seal, the rest raw.
void AddMinutes(int64_t a, int64_t b, const RollupSeal& seal, std::vector<Piece>* pieces) {
  const int64_t ms = RoundUp(a, kMinuteMs);
  const int64_t me = std::min(RoundDown(b, kMinuteMs), std::max(ms, seal.minute_ms));
  if (ms >= me) {
    pieces->push_back({Column::kSamples, a, b});
    return;
  }
  pieces->push_back({Column::kSamples, a, ms});
  pieces->push_back({Column::kRollupMinute, ms, me});
  pieces->push_back({Column::kSamples, me, b});
}

std::vector<Piece> NonEmpty(std::vector<Piece> pieces) {
  std::erase_if(pieces, [](const Piece& p) { return p.from >= p.to; });
  return pieces;
}

}  // namespace

std::vector<Piece> AutoPieces(int64_t from, int64_t to, const RollupSeal& seal) {
  std::vector<Piece> pieces;
  const int64_t hs = RoundUp(from, kHourMs);
  const int64_t he = std::min(RoundDown(to, kHourMs), std::max(hs, seal.hour_ms));
  if (hs < he) {
    AddMinutes(from, hs, seal, &pieces);
    pieces.push_back({Column::kRollupHour, hs, he});
    AddMinutes(he, to, seal, &pieces);
  } else {
    AddMinutes(from, to, seal, &pieces);
  }
  return pieces;
}

std::vector<Piece> PlanPieces(const SampleQuery& query, int64_t from, int64_t to,
                              bool whole_hours, const RollupSeal& seal) {
  if (to <= from) return {};
  if (query.capture_id) return {{Column::kCaptures, from, to}};
  // A fixed resolution reads its rollup up to the seal, then the next finer column.
  switch (query.resolution) {
    case Resolution::kRaw:
      return {{Column::kSamples, from, to}};
    case Resolution::kMinute: {
      const int64_t end = std::clamp(seal.minute_ms, from, to);
      return NonEmpty({{Column::kRollupMinute, from, end}, {Column::kSamples, end, to}});
    }
    case Resolution::kHour: {
      // Hour windows starting in [from, to), as a scan of the hour rollup returns them; past
      // the seal, the finer windows of those hours.
      const int64_t first = RoundUp(from, kHourMs);
      const int64_t hour_end = std::clamp(seal.hour_ms, std::min(first, to), to);
      const int64_t rest = std::max(from, hour_end);
      const int64_t minute_end = std::clamp(seal.minute_ms, rest, to);
      return NonEmpty({{Column::kRollupHour, std::min(first, hour_end), hour_end},
                       {Column::kRollupMinute, rest, minute_end},
                       {Column::kSamples, minute_end, to}});
    }
    case Resolution::kAuto:
      break;
  }
  return AutoPieces(from, to, seal);
}

}  // namespace strata::server::store
