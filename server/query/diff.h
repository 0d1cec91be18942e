// Differences between two profiles (two time ranges of one service, or two services):
// per-function self/total and per-path changes, compared as shares of each profile's own
// total so that ranges of different lengths compare. Functions match by name and module —
// function IDs differ between builds, and so do a module's directory from one release to the
// next and a perf map's path from one process to the next (base::IdentityOf) — and paths by
// their sequence of functions.
#ifndef STRATA_SERVER_QUERY_DIFF_H_
#define STRATA_SERVER_QUERY_DIFF_H_

#include <cstdint>
#include <deque>
#include <future>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/base/frame_kind.h"
#include "server/query/profile.h"

namespace strata::server::query {

// Matches functions across profiles: a dense row per (name, module identity), in order of
// first sight.
class FunctionMatcher {
 public:
  // The row of each of `profile`'s functions (by index into Profile::functions).
  std::vector<uint32_t> RowsOf(const Profile& profile);
  // The function first seen for each row.
  const std::deque<ResolvedFunction>& functions() const { return functions_; }

 private:
  // Keyed by views of functions_' own names and modules (a deque: they never move), so a
  // lookup builds no key.
  absl::flat_hash_map<std::pair<std::string_view, base::ModuleIdentity>, uint32_t> rows_;
  std::deque<ResolvedFunction> functions_;
};

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

// The two sides of a diff, `load(base)` and `load(current)`, independent: the base's on a
// second thread meanwhile. An error of the base's says so.
template <typename T, typename LoadFn>
absl::StatusOr<std::pair<T, T>> LoadBoth(const ProfileQuery& base, const ProfileQuery& current,
                                         const LoadFn& load) {
  std::future<absl::StatusOr<T>> base_load =
      std::async(std::launch::async, [&] { return load(base); });
  absl::StatusOr<T> compared = load(current);
  absl::StatusOr<T> base_result = base_load.get();
  if (!base_result.ok()) {
    return absl::Status(base_result.status().code(),
                        absl::StrCat("base: ", base_result.status().message()));
  }
  if (!compared.ok()) return compared.status();
  return std::pair<T, T>(*std::move(base_result), *std::move(compared));
}

}  // namespace strata::server::query

#endif  // STRATA_SERVER_QUERY_DIFF_H_
