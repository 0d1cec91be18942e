// Compare (query.proto): two groups of a service's samples (baseline and candidate, each a
// selector and a range) split into units — a host over the range, or with independent
// windows a host's window (also where both groups are one host, if asked) — loaded through whatever serves profiles (a cluster's
// ProfileSource or this server's reader), keyed by function self and total (functions matched
// by name and module as in Diff: diff.h's FunctionMatcher) and by path, and compared by
// server/compare. The loads per group are bounded: past the bound a sample of the hosts
// (chosen by a hash of their names, so unbiased and stable) or a wider window, said in the
// response's notes.
#ifndef STRATA_SERVER_QUERY_COMPARE_PROFILES_H_
#define STRATA_SERVER_QUERY_COMPARE_PROFILES_H_

#include <cstdint>
#include <functional>

#include "absl/status/statusor.h"
#include "server/query/profile.h"
#include "strata/v1/query.pb.h"

namespace strata::server::query {

using ProfileLoader = std::function<absl::StatusOr<Profile>(const ProfileQuery&)>;

struct CompareGroupQuery {
  ProfileQuery query;
  // Throughput over the range as the user gave it; 0: unknown, the units' own
  // (Profile::requests, scraped by the agents) are used where every unit has them.
  uint64_t requests = 0;
};

struct CompareSettings {
  bool windows_independent = false;
  // Windows as units when both groups hold one host only, the same one (CompareRequest).
  bool one_host_windows = false;
  // Self samples of Python and JIT functions include the native code they call
  // (SelfOf::kLanguageFrame; CompareRequest.language_self).
  bool language_self = false;
  int64_t window_ms = 60'000;  // of a unit with windows_independent; rounded up to store windows
  double fdr = 0.05;
  double confidence = 0.95;  // of the intervals
  double min_share = 0.001;  // of the rows tested (compare::Options)
  uint32_t limit = 20;       // rows per table
  size_t max_loads = 256;    // per group, besides the group's own load
  int threads = 4;           // loads at once; `load` must be thread-safe
  // Of the service's samples, to report CPU time per request; 0: unknown (samples/request).
  uint32_t sampling_hz = 0;
};

// InvalidArgument for a bad fdr or confidence; a group's load errors, prefixed with the group's
// name.
absl::StatusOr<v1::CompareResponse> CompareProfiles(const ProfileLoader& load,
                                                    const CompareGroupQuery& baseline,
                                                    const CompareGroupQuery& candidate,
                                                    const CompareSettings& settings);

// The request's groups and settings (query.proto's defaults; `now_ms` ends open ranges),
// compared with CompareProfiles. InvalidArgument also for a capture, or two groups selecting
// the same samples.
absl::StatusOr<v1::CompareResponse> CompareRequested(const v1::CompareRequest& request,
                                                     int64_t now_ms, uint32_t limit,
                                                     const ProfileLoader& load,
                                                     uint32_t sampling_hz = 0);

}  // namespace strata::server::query

#endif  // STRATA_SERVER_QUERY_COMPARE_PROFILES_H_
