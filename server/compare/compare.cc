#include "server/compare/compare.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "server/compare/student_t.h"

namespace strata::server::compare {
namespace {

const double kNaN = std::nan("");

// One group's counts per cluster: cluster totals, and each key's count per cluster (dense
// over the clusters that hold the key).
struct GroupCounts {
  std::vector<double> cluster_totals;
  std::vector<double> cluster_requests;  // by the same index
  bool every_unit_has_requests = true;
  uint64_t requests = 0;
  // key -> (cluster index, samples) of the clusters with samples of the key.
  absl::flat_hash_map<uint32_t, std::vector<std::pair<uint32_t, double>>> key_counts;
  absl::flat_hash_map<uint32_t, uint64_t> key_samples;
  size_t units = 0;
  uint64_t samples = 0;
};

absl::StatusOr<GroupCounts> Summarize(const Group& group, uint32_t num_keys, const char* name) {
  GroupCounts out;
  absl::flat_hash_map<uint64_t, uint32_t> cluster_index;
  absl::flat_hash_map<uint32_t, absl::flat_hash_map<uint32_t, double>> by_key;
  for (size_t i = 0; i < group.units.size(); ++i) {
    const Unit& unit = group.units[i];
    if (unit.total == 0) continue;
    auto [it, inserted] = cluster_index.try_emplace(unit.cluster, out.cluster_totals.size());
    if (inserted) {
      out.cluster_totals.push_back(0);
      out.cluster_requests.push_back(0);
    }
    out.cluster_totals[it->second] += static_cast<double>(unit.total);
    out.cluster_requests[it->second] += static_cast<double>(unit.requests);
    out.every_unit_has_requests &= unit.requests > 0;
    out.requests += unit.requests;
    ++out.units;
    out.samples += unit.total;
    std::vector<uint32_t> seen;
    for (const auto& [key, count] : unit.counts) {
      if (key >= num_keys || count > unit.total) {
        return absl::InvalidArgumentError(absl::StrCat(name, " unit ", i, ": key ", key, " with ",
                                                       count, " of ", unit.total, " samples (",
                                                       num_keys, " keys)"));
      }
      seen.push_back(key);
      if (count == 0) continue;
      by_key[key][it->second] += static_cast<double>(count);
      out.key_samples[key] += count;
    }
    std::sort(seen.begin(), seen.end());
    if (std::adjacent_find(seen.begin(), seen.end()) != seen.end()) {
      return absl::InvalidArgumentError(absl::StrCat(name, " unit ", i, ": a key twice"));
    }
  }
  for (auto& [key, clusters] : by_key) {
    out.key_counts[key].assign(clusters.begin(), clusters.end());
  }
  return out;
}

// What a key's samples are divided by: its group's samples (shares) or requests.
enum class Measure { kShare, kPerRequest };

const std::vector<double>& Denominators(const GroupCounts& g, Measure measure) {
  return measure == Measure::kShare ? g.cluster_totals : g.cluster_requests;
}

struct Ratio {
  double value = 0;
  double variance = 0;
};

// The ratio estimator of `key` over a group's clusters and its bias-reduced (CR2) linearised
// variance: cluster c's squared residual is divided by 1 - h_c, h_c = n_c / n its leverage,
// n_c the cluster's denominator (samples or requests).
Ratio RatioOf(const GroupCounts& g, uint32_t key, Measure measure) {
  const std::vector<double>& denominators = Denominators(g, measure);
  const double n = std::accumulate(denominators.begin(), denominators.end(), 0.0);
  const size_t k = denominators.size();
  Ratio r;
  if (n == 0) return r;
  std::vector<double> x(k, 0.0);
  if (auto it = g.key_counts.find(key); it != g.key_counts.end()) {
    for (const auto& [c, count] : it->second) x[c] = count;
  }
  const double x_total = std::accumulate(x.begin(), x.end(), 0.0);
  r.value = x_total / n;
  if (k < 2) return r;
  double sum_sq = 0;
  for (size_t c = 0; c < k; ++c) {
    const double residual = x[c] - r.value * denominators[c];
    sum_sq += residual * residual / (1 - denominators[c] / n);
  }
  // Never under what sampling alone gives (each sample a draw: binomial for a share, Poisson
  // per request; half a sample added, so that 0 % and 100 % keep some): the spread of a few
  // clusters can agree by chance. Three hosts with one sample each outside a function that has
  // every other sample (99.98 % against the baseline's 100 %) otherwise made a certain change.
  const double drawn = x_total + 0.5;
  const double share = drawn / (n + 1);
  const double sampling =
      measure == Measure::kShare ? share * (1 - share) / n : drawn / (n * n);
  r.variance = std::max(sum_sq / (n * n), sampling);
  return r;
}

// Bell-McCaffrey degrees of freedom of a group's CR2 variance: (tr AM)^2 / tr (AM)^2 for the
// quadratic form V = e'Ae of the residuals e = (I - 1h')y, Cov(e) ~ M = (I - 1h')(I - h1'),
// with a_c = h_c^2 / (1 - h_c), under a working model of equal variances of the clusters'
// shares y_c (host-to-host spread dominates sampling noise). k - 1 for clusters of one size,
// fewer the more a few clusters carry the samples. Closed form of the traces, O(k):
// M_ij = [i = j] + s2 - h_i - h_j with s2 = sum h^2.
double BellMcCaffreyDf(const std::vector<double>& cluster_totals) {
  const double n = std::accumulate(cluster_totals.begin(), cluster_totals.end(), 0.0);
  double s2 = 0;
  for (double t : cluster_totals) s2 += (t / n) * (t / n);
  double a0 = 0, a1 = 0, a2 = 0, diagonal = 0;  // sum a, a h, a h^2; sum a^2 (1 + 2 s2 - 4 h)
  for (double t : cluster_totals) {
    const double h = t / n;
    const double a = h * h / (1 - h);
    a0 += a;
    a1 += a * h;
    a2 += a * h * h;
    diagonal += a * a * (1 + 2 * s2 - 4 * h);
  }
  const double trace = a0 * (1 + s2) - 2 * a1;
  const double trace_sq =
      diagonal + s2 * s2 * a0 * a0 + 2 * a0 * a2 - 4 * s2 * a0 * a1 + 2 * a1 * a1;
  return trace * trace / trace_sq;
}

// Welch-Satterthwaite over the two groups' variances with their own degrees of freedom.
double WelchDf(double var_b, double df_b, double var_c, double df_c) {
  const double denominator = var_b * var_b / df_b + var_c * var_c / df_c;
  if (denominator == 0) return df_b + df_c;
  return (var_b + var_c) * (var_b + var_c) / denominator;
}

void SetNoVerdict(Estimate* e) {
  e->std_error = e->df = e->ci_low = e->ci_high = kNaN;
  e->p = e->q = e->min_detectable = kNaN;
  e->relative_ci_low = e->relative_ci_high = kNaN;
}

// The keys of one measure that are tested, for Benjamini-Hochberg.
struct TestedKeys {
  void Add(Estimate* e) {
    if (!e->tested) return;
    p.push_back(e->p);
    estimates.push_back(e);
  }
  std::vector<double> p;
  std::vector<Estimate*> estimates;
};

// `key`'s estimate in `measure` from both groups' counts (degrees of freedom df_b, df_c; 0
// without enough data), tested when `test`; q and significant are set later (SetQValues).
Estimate EstimateOf(const GroupCounts& b, const GroupCounts& c, uint32_t key, Measure measure,
                    double df_b, double df_c, bool test, const Options& options) {
  const Ratio rb = RatioOf(b, key, measure);
  const Ratio rc = RatioOf(c, key, measure);
  Estimate e;
  e.baseline = rb.value;
  e.candidate = rc.value;
  e.delta = rc.value - rb.value;
  e.relative = rb.value > 0 ? e.delta / rb.value : kNaN;
  if (df_b == 0 || df_c == 0) {
    SetNoVerdict(&e);
    return e;
  }
  e.std_error = std::sqrt(rb.variance + rc.variance);
  e.df = WelchDf(rb.variance, df_b, rc.variance, df_c);
  const double t_ci = TwoSidedQuantile(1 - options.confidence, e.df);
  e.ci_low = e.delta - t_ci * e.std_error;
  e.ci_high = e.delta + t_ci * e.std_error;
  e.min_detectable = (TwoSidedQuantile(options.fdr, e.df) +
                      TwoSidedQuantile(2 * (1 - options.power), e.df)) *
                     e.std_error;
  e.relative_ci_low = rb.value > 0 ? e.ci_low / rb.value : kNaN;
  e.relative_ci_high = rb.value > 0 ? e.ci_high / rb.value : kNaN;
  e.tested = test;
  if (test) {
    // std_error > 0: a group with degrees of freedom has samples (or requests), so at least
    // the sampling variance (RatioOf).
    e.p = TwoSidedP(e.delta / e.std_error, e.df);
  } else {
    e.p = e.q = kNaN;
  }
  return e;
}

void SetQValues(const TestedKeys& tested, double fdr) {
  const std::vector<double> q = BenjaminiHochberg(tested.p);
  for (size_t i = 0; i < q.size(); ++i) {
    tested.estimates[i]->q = q[i];
    tested.estimates[i]->significant = q[i] <= fdr;
  }
}

Estimate Unknown() {
  Estimate e;
  e.baseline = e.candidate = e.delta = e.relative = kNaN;
  SetNoVerdict(&e);
  return e;
}

}  // namespace

std::vector<double> BenjaminiHochberg(const std::vector<double>& p) {
  const size_t m = p.size();
  std::vector<size_t> order(m);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return p[a] < p[b]; });
  std::vector<double> q(m);
  double running_min = 1;
  for (size_t rank = m; rank >= 1; --rank) {
    const size_t i = order[rank - 1];
    running_min = std::min(running_min, p[i] * static_cast<double>(m) / static_cast<double>(rank));
    q[i] = running_min;
  }
  return q;
}

absl::StatusOr<Comparison> CompareGroups(const Group& baseline, const Group& candidate,
                                         uint32_t num_keys, const Options& options) {
  for (double v : {options.fdr, options.confidence, options.power}) {
    if (!(v > 0 && v < 1)) {
      return absl::InvalidArgumentError("fdr, confidence and power must lie in (0, 1)");
    }
  }
  if (!(options.min_share >= 0 && options.min_share < 1)) {
    return absl::InvalidArgumentError("min_share must lie in [0, 1)");
  }
  if (!options.families.empty() && options.families.size() != num_keys) {
    return absl::InvalidArgumentError(absl::StrCat("families: ", options.families.size(),
                                                   " for ", num_keys, " keys"));
  }
  auto b = Summarize(baseline, num_keys, "baseline");
  if (!b.ok()) return b.status();
  auto c = Summarize(candidate, num_keys, "candidate");
  if (!c.ok()) return c.status();

  Comparison out;
  out.baseline_units = b->units;
  out.candidate_units = c->units;
  out.baseline_clusters = b->cluster_totals.size();
  out.candidate_clusters = c->cluster_totals.size();
  out.baseline_samples = b->samples;
  out.candidate_samples = c->samples;
  out.not_enough_data = out.baseline_clusters < 2 || out.candidate_clusters < 2;
  out.per_request = b->every_unit_has_requests && c->every_unit_has_requests && b->units > 0 &&
                    c->units > 0;
  const bool groups_requests = baseline.requests > 0 && candidate.requests > 0;
  if (groups_requests) {
    out.baseline_requests = baseline.requests;
    out.candidate_requests = candidate.requests;
  } else if (out.per_request) {
    out.baseline_requests = b->requests;
    out.candidate_requests = c->requests;
  }
  const bool any_requests = groups_requests || out.per_request;
  out.baseline_samples_per_request =
      any_requests ? static_cast<double>(b->samples) / static_cast<double>(out.baseline_requests)
                   : kNaN;
  out.candidate_samples_per_request =
      any_requests ? static_cast<double>(c->samples) / static_cast<double>(out.candidate_requests)
                   : kNaN;

  std::vector<uint32_t> keys;
  for (const auto& [key, n] : b->key_samples) keys.push_back(key);
  for (const auto& [key, n] : c->key_samples) {
    if (!b->key_samples.contains(key)) keys.push_back(key);
  }
  std::sort(keys.begin(), keys.end());

  const bool enough = !out.not_enough_data;
  const double df_b = enough ? BellMcCaffreyDf(b->cluster_totals) : 0;
  const double df_c = enough ? BellMcCaffreyDf(c->cluster_totals) : 0;
  const double df_b_requests = enough && out.per_request ? BellMcCaffreyDf(b->cluster_requests) : 0;
  const double df_c_requests = enough && out.per_request ? BellMcCaffreyDf(c->cluster_requests) : 0;
  out.keys.reserve(keys.size());  // TestedKeys points into it
  const size_t num_families =
      options.families.empty()
          ? 1
          : size_t{*std::max_element(options.families.begin(), options.families.end())} + 1;
  std::vector<TestedKeys> tested_shares(num_families), tested_per_request(num_families);
  for (uint32_t key : keys) {
    KeyComparison& row = out.keys.emplace_back();
    row.key = key;
    if (auto it = b->key_samples.find(key); it != b->key_samples.end()) {
      row.baseline_samples = it->second;
    }
    if (auto it = c->key_samples.find(key); it != c->key_samples.end()) {
      row.candidate_samples = it->second;
    }
    row.per_request_change = groups_requests && row.baseline_samples > 0
                                 ? (static_cast<double>(row.candidate_samples) /
                                    static_cast<double>(candidate.requests)) /
                                           (static_cast<double>(row.baseline_samples) /
                                            static_cast<double>(baseline.requests)) -
                                       1
                                 : kNaN;
    const double pooled = static_cast<double>(row.baseline_samples + row.candidate_samples) /
                          static_cast<double>(out.baseline_samples + out.candidate_samples);
    const bool test = enough && pooled >= options.min_share;
    const size_t family = options.families.empty() ? 0 : options.families[key];
    row.share = EstimateOf(*b, *c, key, Measure::kShare, df_b, df_c, test, options);
    tested_shares[family].Add(&row.share);
    if (!out.per_request) {
      row.per_request = Unknown();
      continue;
    }
    row.per_request = EstimateOf(*b, *c, key, Measure::kPerRequest, df_b_requests,
                                 df_c_requests, test, options);
    tested_per_request[family].Add(&row.per_request);
  }
  for (size_t f = 0; f < num_families; ++f) {
    SetQValues(tested_shares[f], options.fdr);
    SetQValues(tested_per_request[f], options.fdr);
    out.family_keys_tested.push_back(tested_shares[f].p.size());
    out.keys_tested += tested_shares[f].p.size();
  }
  return out;
}

}  // namespace strata::server::compare
