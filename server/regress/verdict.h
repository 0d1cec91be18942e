// From a release comparison's plan to the query service's Compare request, and from its
// answer to a verdict: the link between the release watcher and server/compare.
//
// The verdict follows the significant function with the largest relative change of its self
// share (of its total share where only that changed significantly: a leaf's two figures are
// one, and either test may be the one to pass): a rise is REGRESSED, a fall IMPROVED (shares
// move together: when one function gets slower every other one's share falls a little, and
// the largest relative move is the cause), among the moves at least the median function's
// minimum detectable change when there are such (a tiny function moves far, relatively, at a
// fraction of a point). No significant function: UNCHANGED; too few units (hosts, or one
// host's windows): NOT_ENOUGH_DATA. Where the comparison has per-request figures (its
// per_request_unit), the verdict is decided on those the same way and says so
// (ReleaseVerdict.unit): a function's CPU per request moves on its own. Per request is the
// noisier measure (a scraped count divides every window): where it finds no change and the
// shares do, the shares decide.
#ifndef STRATA_SERVER_REGRESS_VERDICT_H_
#define STRATA_SERVER_REGRESS_VERDICT_H_

#include <cstddef>

#include "server/regress/release_watcher.h"
#include "strata/v1/query.pb.h"
#include "strata/v1/regress.pb.h"

namespace strata::server::regress {

// `fdr`: the false discovery rate of the comparison (0: the query service's default).
v1::CompareRequest CompareRequestFor(const ComparisonPlan& plan, double fdr);

// The diff by line of the plan's two selections, lines counted as the comparison counts
// functions (ReleaseVerdict.which_lines).
v1::DiffRequest WhichLinesRequestFor(const ComparisonPlan& plan);

// The verdict's state, its significant functions (at most `max_functions`: the cause first,
// then the others by |delta|, largest first) and the comparison's sizes.
v1::ReleaseVerdict VerdictOf(const v1::CompareResponse& comparison, size_t max_functions = 10);

}  // namespace strata::server::regress

#endif  // STRATA_SERVER_REGRESS_VERDICT_H_
