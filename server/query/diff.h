// Differences between two profiles (two time ranges of one service, or two services):
// per-function self/total and per-path changes, compared as shares of each profile's own
// total so that ranges of different lengths compare. Functions match by (name, module) —
// function IDs differ between builds — and paths by their sequence of functions.
#ifndef STRATA_SERVER_QUERY_DIFF_H_
#define STRATA_SERVER_QUERY_DIFF_H_

#include <cstdint>
#include <string>
#include <vector>

#include "server/query/profile.h"

namespace strata::server::query {

struct FunctionChange {
  ResolvedFunction function;
  uint64_t base_self = 0, self = 0;
  uint64_t base_total = 0, total = 0;
  double self_delta_pct = 0;   // percentage points
  double total_delta_pct = 0;
};

struct PathChange {
  std::vector<ResolvedFunction> frames;  // outermost first
  bool truncated = false;
  uint64_t base_samples = 0, samples = 0;
  double delta_pct = 0;
};

struct ProfileDiff {
  uint64_t base_total = 0, total = 0;
  std::vector<FunctionChange> functions;  // by |self_delta_pct|, then |total_delta_pct|
  std::vector<PathChange> paths;          // by |delta_pct|
};

// At most `limit` rows per table; rows without any change are left out.
ProfileDiff DiffProfiles(const Profile& base, const Profile& current, size_t limit);

}  // namespace strata::server::query

#endif  // STRATA_SERVER_QUERY_DIFF_H_
