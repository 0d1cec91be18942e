#include "server/regress/verdict.h"

#include <algorithm>
#include <cstddef>
#include <cmath>
#include <string>
#include <vector>

namespace strata::server::regress {

namespace {

// One of the plan's two selections: `service`'s samples matching `selector` in [from, to).
v1::ProfileFilter SelectionOf(const std::string& service, const std::string& selector,
                              int64_t from_ms, int64_t to_ms) {
  v1::ProfileFilter f;
  f.set_service(service);
  f.set_selector(selector);
  f.mutable_range()->set_from_ms(from_ms);
  f.mutable_range()->set_to_ms(to_ms);
  return f;
}
v1::ProfileFilter BaselineOf(const ComparisonPlan& p) {
  return SelectionOf(p.service, p.baseline_selector, p.baseline_from_ms, p.baseline_to_ms);
}
v1::ProfileFilter CandidateOf(const ComparisonPlan& p) {
  return SelectionOf(p.service, p.candidate_selector, p.candidate_from_ms, p.candidate_to_ms);
}

}  // namespace

v1::CompareRequest CompareRequestFor(const ComparisonPlan& plan, double fdr) {
  v1::CompareRequest request;
  request.set_service(plan.service);
  *request.mutable_baseline() = BaselineOf(plan);
  *request.mutable_candidate() = CandidateOf(plan);
  request.set_windows_independent(plan.windows_independent);
  request.set_one_host_windows(plan.one_host_windows);
  // A Python or Java service's release is about its own functions: the runtime's native code
  // they call is theirs.
  request.set_language_self(true);
  request.set_window_s(plan.window_s);
  request.set_fdr(fdr);
  return request;
}

v1::DiffRequest WhichLinesRequestFor(const ComparisonPlan& plan) {
  v1::DiffRequest request;
  *request.mutable_base() = BaselineOf(plan);
  *request.mutable_filter() = CandidateOf(plan);
  request.set_by_line(true);
  request.set_language_self(true);  // as CompareRequestFor
  return request;
}

namespace {

// A function's figures in the verdict's measure: shares of the samples, or per request.
struct Figures {
  bool tested, significant;
  double min_detectable, baseline, candidate, delta, ci_low, ci_high, relative, q;
};

Figures FiguresOf(const v1::CompareEstimate& e, bool per_request) {
  if (!per_request) {
    return {e.tested(),   e.significant(), e.min_detectable(), e.share_baseline(),
            e.share_candidate(), e.delta(), e.ci_low(), e.ci_high(), e.relative(), e.q()};
  }
  const v1::PerRequestEstimate& r = e.per_request();
  return {r.tested(), r.significant(), r.min_detectable(), r.baseline(), r.candidate(),
          r.delta(),  r.ci_low(),      r.ci_high(),        r.relative(), r.q()};
}

// The verdict on shares or per request (`per_request`).
v1::ReleaseVerdict VerdictOn(const v1::CompareResponse& comparison, bool per_request,
                             size_t max_functions) {
  v1::ReleaseVerdict verdict;
  verdict.set_baseline_units(comparison.baseline_units());
  verdict.set_candidate_units(comparison.candidate_units());
  verdict.set_window_s(comparison.window_s());
  verdict.set_baseline_samples(comparison.baseline_samples());
  verdict.set_candidate_samples(comparison.candidate_samples());
  if (comparison.not_enough_data()) {
    verdict.set_state(v1::ReleaseVerdict::NOT_ENOUGH_DATA);
    return verdict;
  }
  if (per_request) verdict.set_unit(comparison.per_request_unit());
  std::vector<std::pair<double, double>> detectable;  // each function's, and its share
  std::vector<v1::ReleaseFunctionChange> changes;
  const v1::ReleaseFunctionChange* cause = nullptr;
  for (const v1::FunctionComparison& f : comparison.functions()) {
    const Figures self_figures = FiguresOf(f.self(), per_request);
    if (self_figures.tested) {
      detectable.emplace_back(self_figures.min_detectable,
                              std::max(self_figures.baseline, self_figures.candidate));
    }
    // The self figure where it changed significantly, else the total.
    const bool self = self_figures.significant;
    const Figures e = self ? self_figures : FiguresOf(f.total(), per_request);
    if (!e.significant) continue;
    v1::ReleaseFunctionChange& c = changes.emplace_back();
    c.set_name(f.function().function());
    c.set_module(f.function().module());
    c.set_self(self);
    c.set_baseline_share(e.baseline);
    c.set_candidate_share(e.candidate);
    c.set_delta(e.delta);
    c.set_ci_low(e.ci_low);
    c.set_ci_high(e.ci_high);
    c.set_relative(e.relative);
    c.set_q(e.q);
  }
  // The median weighted by share: what a change of the functions that hold the samples must
  // reach to be found. Dozens of functions of a fraction of a point each (kernel entry paths)
  // have small MDEs of their own, and a plain median of them would read "measured, no change"
  // where the hot functions' changes could not have been told from noise yet.
  double min_detectable = 0;
  if (!detectable.empty()) {
    std::sort(detectable.begin(), detectable.end());
    double total = 0;
    for (const auto& [mde, share] : detectable) total += share;
    double below = 0;
    min_detectable = detectable[detectable.size() / 2].first;  // no shares: the plain median
    for (const auto& [mde, share] : detectable) {
      below += share;
      if (total > 0 && below >= total / 2) {
        min_detectable = mde;
        break;
      }
    }
  }
  // The cause: the largest relative move of a self share (a function new in the candidate
  // has no baseline share, hence no relative change: it counts as the largest), among the
  // moves at least as large as the comparison could detect for a typical sample's function
  // when there are such. A small function's move is significant at a fraction of a point and may be
  // large relatively (a kernel entry path -64 % at -0.17 pt): it must not turn a function's
  // +17 pt into IMPROVED.
  bool material_move = false;
  for (const v1::ReleaseFunctionChange& c : changes) {
    material_move |= std::fabs(c.delta()) >= min_detectable;
  }
  for (const v1::ReleaseFunctionChange& c : changes) {
    if (material_move && std::fabs(c.delta()) < min_detectable) continue;
    auto size = [](const v1::ReleaseFunctionChange& x) {
      return x.baseline_share() == 0 ? INFINITY : std::fabs(x.relative());
    };
    if (cause == nullptr || size(c) > size(*cause)) cause = &c;
  }
  verdict.set_state(cause == nullptr    ? v1::ReleaseVerdict::UNCHANGED
                    : cause->delta() > 0 ? v1::ReleaseVerdict::REGRESSED
                                         : v1::ReleaseVerdict::IMPROVED);
  // The cause first: a REGRESSED verdict led by another function's larger fall (the shares
  // the slower function took from it) reads as a contradiction. Then the rest, largest first.
  const ptrdiff_t cause_at = cause == nullptr ? -1 : cause - changes.data();
  if (cause_at > 0) std::swap(changes[0], changes[static_cast<size_t>(cause_at)]);
  std::stable_sort(changes.begin() + (cause_at >= 0 ? 1 : 0), changes.end(),
                   [](const auto& a, const auto& b) {
                     return std::fabs(a.delta()) > std::fabs(b.delta());
                   });
  if (changes.size() > max_functions) changes.resize(max_functions);
  for (v1::ReleaseFunctionChange& c : changes) *verdict.add_functions() = std::move(c);
  verdict.set_min_detectable(min_detectable);
  return verdict;
}

}  // namespace

v1::ReleaseVerdict VerdictOf(const v1::CompareResponse& comparison, size_t max_functions) {
  const bool per_request = !comparison.per_request_unit().empty();
  v1::ReleaseVerdict verdict = VerdictOn(comparison, per_request, max_functions);
  if (per_request && verdict.state() == v1::ReleaseVerdict::UNCHANGED) {
    v1::ReleaseVerdict on_shares = VerdictOn(comparison, false, max_functions);
    if (on_shares.state() != v1::ReleaseVerdict::UNCHANGED) return on_shares;
  }
  return verdict;
}

}  // namespace strata::server::regress
