// server/compare: is a difference between two groups of profiles (baseline and candidate,
// e.g. version=1 and version=2 of a service) larger than the noise? Statistics only: the
// caller (server/query) loads the samples and names the keys (function self, function total,
// hot path); this library sees counts.
//
// Statistical model. Each group is a list of units: the samples of one host in one time
// window, with the unit's total and its count per key. A key's share in a group is the ratio
// estimator p = sum(x_u) / sum(n_u). Samples are not independent draws: hosts differ (CPU
// model, data, load) and the samples of one host and window come together, so a binomial
// variance over 10^6 samples calls every difference significant. The variance of p is the
// linearised (cluster-robust) one over the units' spread, bias-reduced for few clusters (CR2,
// Bell and McCaffrey):
//     var(p) = sum_c (x_c - p n_c)^2 / (1 - h_c) / (sum n)^2,   h_c = n_c / sum n,
// summed over clusters c: k/(k-1) times the plain sum when the clusters are of one size. A
// cluster is the units sharing Unit::cluster, summed first: with one host per cluster, a
// host's windows are not taken for independent evidence (a host's bias persists from one
// window to the next). Give every unit its own cluster only when its windows are known to be
// independent. The difference d = p_c - p_b has se = sqrt(var_b + var_c); the interval and the
// two-sided p-value use Student's t with Welch-Satterthwaite degrees of freedom over the two
// variances, each with its Bell-McCaffrey degrees of freedom: k - 1 for clusters of one size,
// fewer when a few clusters carry most of the samples (with k - 1 regardless, 20 % of A/A
// comparisons of 10 hosts of log-normally spread sizes flagged a key at fdr 0.05; with these,
// 1 %). The normal replaces t past 10^4 degrees of freedom. Benjamini-Hochberg over the keys
// compared (of each family, Options::families) gives q-values; a key is significant when
// q <= fdr. The minimum detectable effect
// is (t_{1-fdr/2} + t_{power}) * se at the key's degrees of freedom. Fewer than two clusters
// with samples in either group is "not enough data": shares and deltas, no verdict.
//
// Per request. When every unit of both groups knows the requests it served (n_u replaced by
// r_u), each key is compared a second time as samples per request, sum(x_u) / sum(r_u), by
// the same estimator, variance, degrees of freedom and a Benjamini-Hochberg of its own: a
// candidate that serves more requests per CPU second shows here while its shares stay put.
#ifndef STRATA_SERVER_COMPARE_COMPARE_H_
#define STRATA_SERVER_COMPARE_COMPARE_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace strata::server::compare {

struct Unit {
  // Units with one cluster ID are summed before the variance (one host's windows).
  uint64_t cluster = 0;
  uint64_t total = 0;  // samples of the unit
  // (key, samples): keys below CompareGroups' num_keys, each at most once, samples <= total.
  std::vector<std::pair<uint32_t, uint64_t>> counts;
  uint64_t requests = 0;  // requests the unit served; 0: unknown
};

struct Group {
  std::vector<Unit> units;
  // Optional throughput: requests served by the group over its range (0: unknown). With both
  // groups' counts, samples per request are reported too (without an interval: there is one
  // count per group, no spread). Units' own requests are the better evidence: see above.
  uint64_t requests = 0;
};

struct Options {
  double fdr = 0.05;         // Benjamini-Hochberg false discovery rate, also the MDE's alpha
  double confidence = 0.95;  // of the intervals
  double power = 0.8;        // of the minimum detectable effect
  // Keys below this share of both groups' samples together are not tested (no p, q nor
  // verdict; their intervals are still given). Hundreds of rare paths (an interrupt's kernel
  // frames) would otherwise raise Benjamini-Hochberg's bar for every key. Filtering on the
  // pooled share, blind to the groups, keeps the FDR.
  double min_share = 0.001;
  // Each key's family (indexed by key; empty: all keys in family 0). Benjamini-Hochberg runs
  // over each family apart, the FDR held within each: a family per question the caller
  // answers (which functions changed; which paths did), so that the many keys of one do not
  // raise the bar of the other.
  std::vector<uint8_t> families;
};

// One key's difference between the groups in one measure: shares are fractions of each
// group's samples (0..1), per request samples per request; deltas are in the same unit.
struct Estimate {
  double baseline = 0, candidate = 0;
  double delta = 0;  // candidate - baseline
  // The fields below are NaN when there is not enough data.
  double std_error = 0;
  double df = 0;  // Welch-Satterthwaite over each group's Bell-McCaffrey ones
  double ci_low = 0, ci_high = 0;
  bool tested = false;  // p and q are NaN for keys not tested (rare, or not enough data)
  double p = 1, q = 1;
  bool significant = false;
  double min_detectable = 0;  // smallest |delta| found with `power` at alpha = fdr
  // delta / baseline: "+5 %" of the key's CPU, with the interval scaled alike (the
  // baseline's own noise is in se). NaN when the baseline has none of the key.
  double relative = 0, relative_ci_low = 0, relative_ci_high = 0;
};

struct KeyComparison {
  uint32_t key = 0;
  uint64_t baseline_samples = 0, candidate_samples = 0;
  Estimate share;
  // Without requests in every unit (Comparison::per_request false): every field NaN.
  Estimate per_request;
  // With the groups' request counts (Group::requests): (candidate samples / request) /
  // (baseline samples / request) - 1; NaN without them.
  double per_request_change = 0;
};

struct Comparison {
  bool not_enough_data = false;
  size_t baseline_units = 0, candidate_units = 0;  // units with samples
  size_t baseline_clusters = 0, candidate_clusters = 0;
  uint64_t baseline_samples = 0, candidate_samples = 0;
  // Every unit of both groups knows its requests: KeyComparison::per_request is filled.
  bool per_request = false;
  uint64_t baseline_requests = 0, candidate_requests = 0;  // the units' or the groups' count
  // Samples per request of each group; NaN without requests (of the units or the groups).
  double baseline_samples_per_request = 0, candidate_samples_per_request = 0;
  std::vector<KeyComparison> keys;  // keys with samples in either group, by key
  size_t keys_tested = 0;           // keys tested, of every family (in each measure)
  // Per family (Options::families): the m of its Benjamini-Hochberg.
  std::vector<size_t> family_keys_tested;
};

// InvalidArgument: fdr, confidence or power outside (0, 1), min_share outside [0, 1), families
// neither empty nor of num_keys, a key >= num_keys, a key twice in one unit, or a count above
// its unit's total. Units without samples are
// left out.
absl::StatusOr<Comparison> CompareGroups(const Group& baseline, const Group& candidate,
                                         uint32_t num_keys, const Options& options = {});

// Benjamini-Hochberg q-values (adjusted p-values) of `p`, in its order.
std::vector<double> BenjaminiHochberg(const std::vector<double>& p);

}  // namespace strata::server::compare

#endif  // STRATA_SERVER_COMPARE_COMPARE_H_
