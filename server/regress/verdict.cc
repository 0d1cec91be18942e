#include "server/regress/verdict.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace strata::server::regress {

v1::CompareRequest CompareRequestFor(const ComparisonPlan& plan, double fdr) {
  v1::CompareRequest request;
  request.set_service(plan.service);
  v1::ProfileFilter* baseline = request.mutable_baseline();
  baseline->set_service(plan.service);
  baseline->set_selector(plan.baseline_selector);
  baseline->mutable_range()->set_from_ms(plan.baseline_from_ms);
  baseline->mutable_range()->set_to_ms(plan.baseline_to_ms);
  v1::ProfileFilter* candidate = request.mutable_candidate();
  candidate->set_service(plan.service);
  candidate->set_selector(plan.candidate_selector);
  candidate->mutable_range()->set_from_ms(plan.candidate_from_ms);
  candidate->mutable_range()->set_to_ms(plan.candidate_to_ms);
  request.set_windows_independent(plan.windows_independent);
  request.set_window_s(plan.window_s);
  request.set_fdr(fdr);
  return request;
}

v1::ReleaseVerdict VerdictOf(const v1::CompareResponse& comparison, size_t max_functions) {
  v1::ReleaseVerdict verdict;
  verdict.set_baseline_units(comparison.baseline_units());
  verdict.set_candidate_units(comparison.candidate_units());
  verdict.set_baseline_samples(comparison.baseline_samples());
  verdict.set_candidate_samples(comparison.candidate_samples());
  if (comparison.not_enough_data()) {
    verdict.set_state(v1::ReleaseVerdict::NOT_ENOUGH_DATA);
    return verdict;
  }
  std::vector<double> detectable;
  std::vector<v1::ReleaseFunctionChange> changes;
  const v1::ReleaseFunctionChange* cause = nullptr;
  for (const v1::FunctionComparison& f : comparison.functions()) {
    if (f.self().tested()) detectable.push_back(f.self().min_detectable());
    // The self share where it changed significantly, else the total.
    const bool self = f.self().significant();
    if (!self && !f.total().significant()) continue;
    const v1::CompareEstimate& e = self ? f.self() : f.total();
    v1::ReleaseFunctionChange& c = changes.emplace_back();
    c.set_name(f.function().function());
    c.set_module(f.function().module());
    c.set_self(self);
    c.set_baseline_share(e.share_baseline());
    c.set_candidate_share(e.share_candidate());
    c.set_delta(e.delta());
    c.set_ci_low(e.ci_low());
    c.set_ci_high(e.ci_high());
    c.set_relative(e.relative());
    c.set_q(e.q());
  }
  // The cause: the largest relative move of a self share (a function new in the candidate
  // has no baseline share, hence no relative change: it counts as the largest).
  for (const v1::ReleaseFunctionChange& c : changes) {
    if (!c.self()) continue;
    auto size = [](const v1::ReleaseFunctionChange& x) {
      return x.baseline_share() == 0 ? INFINITY : std::fabs(x.relative());
    };
    if (cause == nullptr || size(c) > size(*cause)) cause = &c;
  }
  if (cause == nullptr && !changes.empty()) cause = &changes.front();
  verdict.set_state(cause == nullptr    ? v1::ReleaseVerdict::UNCHANGED
                    : cause->delta() > 0 ? v1::ReleaseVerdict::REGRESSED
                                         : v1::ReleaseVerdict::IMPROVED);
  std::stable_sort(changes.begin(), changes.end(), [](const auto& a, const auto& b) {
    return std::fabs(a.delta()) > std::fabs(b.delta());
  });
  if (changes.size() > max_functions) changes.resize(max_functions);
  for (v1::ReleaseFunctionChange& c : changes) *verdict.add_functions() = std::move(c);
  if (!detectable.empty()) {
    std::nth_element(detectable.begin(), detectable.begin() + detectable.size() / 2,
                     detectable.end());
    verdict.set_min_detectable(detectable[detectable.size() / 2]);
  }
  return verdict;
}

}  // namespace strata::server::regress
