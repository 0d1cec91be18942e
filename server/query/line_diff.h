// Differences between two profiles per source line (DiffRequest.by_line): the self samples of
// each line (TopLines, both profiles) as shares of each profile's own samples with a leaf
// address, so that ranges of different lengths compare. Lines match by the function, file
// and line of each frame of their inline chain, not by module: a release's binary has
// another path, and a perf map another name, where the source is the same.
#ifndef STRATA_SERVER_QUERY_LINE_DIFF_H_
#define STRATA_SERVER_QUERY_LINE_DIFF_H_

#include <cstdint>

#include "strata/v1/query.pb.h"

namespace strata::server::query {

// The `limit` lines whose share moved most (by absolute self_delta_pct, then by key), with
// both profiles' totals and unresolved samples. `base` and `current` hold every line
// (TopLines without a limit that cuts them).
v1::DiffResponse DiffLines(const v1::TopResponse& base, const v1::TopResponse& current,
                           uint32_t limit);

}  // namespace strata::server::query

#endif  // STRATA_SERVER_QUERY_LINE_DIFF_H_
