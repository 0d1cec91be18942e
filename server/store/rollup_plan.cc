#include "server/store/rollup_plan.h"

namespace strata::server::store {

std::vector<Piece> AutoPieces(int64_t from, int64_t to) {
  auto round_up = [](int64_t v, int64_t unit) { return (v + unit - 1) / unit * unit; };
  auto round_down = [](int64_t v, int64_t unit) { return v / unit * unit; };
  std::vector<Piece> pieces;
  // Splits [a, b) into raw edges around whole minutes.
  auto add_minutes = [&](int64_t a, int64_t b) {
    int64_t ms = round_up(a, kMinuteMs), me = round_down(b, kMinuteMs);
    if (ms >= me) {
      pieces.push_back({Column::kSamples, a, b});
      return;
    }
    pieces.push_back({Column::kSamples, a, ms});
    pieces.push_back({Column::kRollupMinute, ms, me});
    pieces.push_back({Column::kSamples, me, b});
  };
  int64_t hs = round_up(from, kHourMs), he = round_down(to, kHourMs);
  if (hs < he) {
    add_minutes(from, hs);
    pieces.push_back({Column::kRollupHour, hs, he});
    add_minutes(he, to);
  } else {
    add_minutes(from, to);
  }
  return pieces;
}

std::vector<Piece> PlanPieces(const SampleQuery& query, int64_t from, int64_t to,
                              bool whole_hours) {
  if (to <= from) return {};
  if (query.capture_id) return {{Column::kCaptures, from, to}};
  switch (query.resolution) {
    case Resolution::kRaw:
      return {{Column::kSamples, from, to}};
    case Resolution::kMinute:
      return {{Column::kRollupMinute, from, to}};
    case Resolution::kHour: {
      if (!whole_hours) return {{Column::kRollupHour, from, to}};
      // Hour windows starting in [from, to), as a scan of the hour rollup returns them.
      const int64_t first = from % kHourMs == 0 ? from : from - from % kHourMs + kHourMs;
      if (first < to) return {{Column::kRollupHour, first, to}};
      return {};
    }
    case Resolution::kAuto:
      break;
  }
  return AutoPieces(from, to);
}

}  // namespace strata::server::store
