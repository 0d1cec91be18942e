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
    if (inserted) out.cluster_totals.push_back(0);
    out.cluster_totals[it->second] += static_cast<double>(unit.total);
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

struct Ratio {
  double share = 0;
  double variance = 0;
};

// The ratio estimator of `key` over a group's clusters and its bias-reduced (CR2) linearised
// variance: cluster c's squared residual is divided by 1 - h_c, h_c = n_c / n its leverage.
Ratio RatioOf(const GroupCounts& g, uint32_t key) {
  const double n = std::accumulate(g.cluster_totals.begin(), g.cluster_totals.end(), 0.0);
  const size_t k = g.cluster_totals.size();
  Ratio r;
  if (n == 0) return r;
  std::vector<double> x(k, 0.0);
  if (auto it = g.key_counts.find(key); it != g.key_counts.end()) {
    for (const auto& [c, count] : it->second) x[c] = count;
  }
  r.share = std::accumulate(x.begin(), x.end(), 0.0) / n;
  if (k < 2) return r;
  double sum_sq = 0;
  for (size_t c = 0; c < k; ++c) {
    const double residual = x[c] - r.share * g.cluster_totals[c];
    sum_sq += residual * residual / (1 - g.cluster_totals[c] / n);
  }
  r.variance = sum_sq / (n * n);
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

void SetNoVerdict(KeyComparison* row) {
  row->std_error = row->df = row->ci_low = row->ci_high = kNaN;
  row->p = row->q = row->min_detectable = kNaN;
  row->relative_ci_low = row->relative_ci_high = kNaN;
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
  const bool per_request = baseline.requests > 0 && candidate.requests > 0;
  out.baseline_samples_per_request =
      per_request ? static_cast<double>(b->samples) / static_cast<double>(baseline.requests) : kNaN;
  out.candidate_samples_per_request =
      per_request ? static_cast<double>(c->samples) / static_cast<double>(candidate.requests)
                  : kNaN;

  std::vector<uint32_t> keys;
  for (const auto& [key, n] : b->key_samples) keys.push_back(key);
  for (const auto& [key, n] : c->key_samples) {
    if (!b->key_samples.contains(key)) keys.push_back(key);
  }
  std::sort(keys.begin(), keys.end());

  const double df_b = out.not_enough_data ? 0 : BellMcCaffreyDf(b->cluster_totals);
  const double df_c = out.not_enough_data ? 0 : BellMcCaffreyDf(c->cluster_totals);
  std::vector<double> p_values;
  std::vector<size_t> tested;  // indices into out.keys
  for (uint32_t key : keys) {
    KeyComparison row;
    row.key = key;
    if (auto it = b->key_samples.find(key); it != b->key_samples.end()) {
      row.baseline_samples = it->second;
    }
    if (auto it = c->key_samples.find(key); it != c->key_samples.end()) {
      row.candidate_samples = it->second;
    }
    const Ratio rb = RatioOf(*b, key);
    const Ratio rc = RatioOf(*c, key);
    row.share_baseline = rb.share;
    row.share_candidate = rc.share;
    row.delta = rc.share - rb.share;
    row.relative = rb.share > 0 ? row.delta / rb.share : kNaN;
    row.per_request_change = per_request && row.baseline_samples > 0
                                 ? (static_cast<double>(row.candidate_samples) /
                                    static_cast<double>(candidate.requests)) /
                                           (static_cast<double>(row.baseline_samples) /
                                            static_cast<double>(baseline.requests)) -
                                       1
                                 : kNaN;
    if (out.not_enough_data) {
      SetNoVerdict(&row);
      out.keys.push_back(row);
      continue;
    }
    row.std_error = std::sqrt(rb.variance + rc.variance);
    row.df = WelchDf(rb.variance, df_b, rc.variance, df_c);
    const double t_ci = TwoSidedQuantile(1 - options.confidence, row.df);
    row.ci_low = row.delta - t_ci * row.std_error;
    row.ci_high = row.delta + t_ci * row.std_error;
    row.min_detectable = (TwoSidedQuantile(options.fdr, row.df) +
                          TwoSidedQuantile(2 * (1 - options.power), row.df)) *
                         row.std_error;
    row.relative_ci_low = rb.share > 0 ? row.ci_low / rb.share : kNaN;
    row.relative_ci_high = rb.share > 0 ? row.ci_high / rb.share : kNaN;
    const double pooled = static_cast<double>(row.baseline_samples + row.candidate_samples) /
                          static_cast<double>(out.baseline_samples + out.candidate_samples);
    row.tested = pooled >= options.min_share;
    if (row.tested) {
      // No spread at all (e.g. the root frame's total, 100 % of every unit): a difference
      // without noise is certain, no difference is no evidence.
      row.p = row.std_error > 0 ? TwoSidedP(row.delta / row.std_error, row.df)
                                : (row.delta == 0 ? 1.0 : 0.0);
      tested.push_back(out.keys.size());
      p_values.push_back(row.p);
    } else {
      row.p = row.q = kNaN;
    }
    out.keys.push_back(row);
  }
  const std::vector<double> q = BenjaminiHochberg(p_values);
  for (size_t i = 0; i < tested.size(); ++i) {
    KeyComparison& row = out.keys[tested[i]];
    row.q = q[i];
    row.significant = q[i] <= options.fdr;
  }
  out.keys_tested = tested.size();
  return out;
}

}  // namespace strata::server::compare
