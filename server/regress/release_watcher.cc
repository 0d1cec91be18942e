#include "server/regress/release_watcher.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"

namespace strata::server::regress {
namespace {

// Values a selector term cannot name literally (labels.h: globs and term separators).
bool SelectableValue(const std::string& value) {
  return !value.empty() && value.find_first_of(",*?[]!=") == std::string::npos;
}

}  // namespace

ReleaseWatcher::ReleaseWatcher(ReleaseWatcherOptions options, ReleaseWatcherInputs inputs,
                               const std::vector<store::ReleaseRecord>& stored)
    : options_(std::move(options)), inputs_(std::move(inputs)) {
  absl::MutexLock lock(&mu_);
  for (const store::ReleaseRecord& record : stored) {
    v1::ReleaseVerdict release;
    // A record that does not parse is dropped: its release is met again as known.
    if (release.ParseFromString(record.payload)) releases_[ReleaseId(release)] = release;
  }
}

std::string ReleaseWatcher::ReleaseId(const v1::ReleaseVerdict& release) {
  std::string id = release.service();
  id.push_back('\0');
  id += release.label();
  id.push_back('\0');
  id += release.candidate();
  return id;
}

absl::StatusOr<std::pair<std::string, std::vector<std::string>>> ReleaseWatcher::ReleaseValues(
    const std::string& service) {
  absl::StatusOr<std::map<std::string, std::vector<std::string>>> values =
      inputs_.label_values(service);
  if (!values.ok()) return values.status();
  for (const std::string& label : options_.labels) {
    auto it = values->find(label);
    if (it != values->end() && !it->second.empty()) return std::make_pair(label, it->second);
  }
  return std::make_pair(std::string(), std::vector<std::string>());
}

absl::StatusOr<std::vector<v1::ReleaseVerdict>> ReleaseWatcher::Check(int64_t now_ms) {
  absl::StatusOr<std::vector<std::string>> services = inputs_.services();
  if (!services.ok()) return services.status();
  absl::Status first_error;
  auto note = [&](const absl::Status& s) {
    if (!s.ok() && first_error.ok()) first_error = s;
  };
  std::set<std::string> dirty;             // release IDs to persist
  std::vector<v1::ReleaseVerdict> due;     // comparisons to run, copies
  for (const std::string& service : *services) {
    absl::StatusOr<std::pair<std::string, std::vector<std::string>>> values =
        ReleaseValues(service);
    if (!values.ok()) {
      note(values.status());
      continue;
    }
    const auto& [label, found] = *values;
    if (label.empty()) continue;
    std::string prefix = service;
    prefix.push_back('\0');
    prefix += label;
    prefix.push_back('\0');
    absl::MutexLock lock(&mu_);
    auto of_service = [&](auto&& fn) {
      for (auto it = releases_.lower_bound(prefix);
           it != releases_.end() && it->first.starts_with(prefix); ++it) {
        fn(it->second);
      }
    };
    // The releases known before this pass: new ones are compared with the newest of them.
    const v1::ReleaseVerdict* previous = nullptr;
    of_service([&](const v1::ReleaseVerdict& r) {
      if (previous == nullptr || r.first_seen_ms() > previous->first_seen_ms()) previous = &r;
    });
    const std::string baseline = previous != nullptr ? previous->candidate() : std::string();
    for (const std::string& value : found) {
      const std::string id = prefix + value;
      if (releases_.contains(id)) continue;
      v1::ReleaseVerdict release;
      release.set_service(service);
      release.set_label(label);
      release.set_candidate(value);
      release.set_first_seen_ms(now_ms);
      release.set_updated_ms(now_ms);
      // Met with the service (no release known before): no baseline to compare with.
      release.set_baseline(baseline);
      release.set_final(baseline.empty());
      releases_[id] = release;
      dirty.insert(id);
    }
    of_service([&](const v1::ReleaseVerdict& r) {
      if (!r.final() && !r.baseline().empty()) due.push_back(r);
    });
  }

  // The comparisons read profiles: run without the lock, so Verdicts() is not held up.
  std::vector<v1::ReleaseVerdict> changed;
  for (v1::ReleaseVerdict& release : due) {
    const v1::ReleaseVerdict::State before = release.state();
    const bool compared_before = release.comparisons() > 0;
    absl::Status s = Compare(release, now_ms);
    note(s);
    if (s.ok() && (release.state() != before || !compared_before)) changed.push_back(release);
    const std::string id = ReleaseId(release);
    absl::MutexLock lock(&mu_);
    releases_[id] = std::move(release);
    dirty.insert(id);
  }

  if (!dirty.empty()) {
    std::vector<store::ReleaseRecord> records;
    {
      absl::MutexLock lock(&mu_);
      for (const std::string& id : dirty) {
        store::ReleaseRecord& r = records.emplace_back();
        r.release_id = id;
        releases_.at(id).SerializeToString(&r.payload);
      }
    }
    note(inputs_.persist(records));
  }
  if (!first_error.ok() && changed.empty()) return first_error;
  return changed;
}

absl::Status ReleaseWatcher::Compare(v1::ReleaseVerdict& release, int64_t now_ms) {
  if (!SelectableValue(release.baseline()) || !SelectableValue(release.candidate())) {
    release.set_final(true);
    release.set_error("a release value a selector cannot name (one of , * ? [ ] ! =)");
    return absl::OkStatus();
  }
  ComparisonPlan plan;
  plan.service = release.service();
  plan.baseline_selector = absl::StrCat(release.label(), "=", release.baseline());
  plan.candidate_selector = absl::StrCat(release.label(), "=", release.candidate());
  plan.baseline_from_ms =
      release.first_seen_ms() - absl::ToInt64Milliseconds(options_.baseline_lookback);
  plan.baseline_to_ms = now_ms;
  plan.candidate_from_ms = release.first_seen_ms();
  plan.candidate_to_ms = now_ms;
  absl::StatusOr<v1::ReleaseVerdict> outcome = inputs_.compare(plan);
  release.set_updated_ms(now_ms);
  if (!outcome.ok()) {
    release.set_error(std::string(outcome.status().message()));
    return outcome.status();
  }
  release.clear_error();
  release.set_comparisons(release.comparisons() + 1);
  release.set_state(outcome->state());
  *release.mutable_functions() = outcome->functions();
  release.set_min_detectable(outcome->min_detectable());
  release.set_baseline_units(outcome->baseline_units());
  release.set_candidate_units(outcome->candidate_units());
  release.set_baseline_samples(outcome->baseline_samples());
  release.set_candidate_samples(outcome->candidate_samples());
  if (now_ms - release.first_seen_ms() >= absl::ToInt64Milliseconds(options_.window)) {
    release.set_final(true);
  }
  return absl::OkStatus();
}

std::vector<v1::ReleaseVerdict> ReleaseWatcher::Verdicts(const std::string& service,
                                                         int64_t since_ms) const {
  std::vector<v1::ReleaseVerdict> out;
  absl::MutexLock lock(&mu_);
  for (const auto& [id, release] : releases_) {
    if (release.baseline().empty() || release.first_seen_ms() < since_ms) continue;
    if (!service.empty() && release.service() != service) continue;
    out.push_back(release);
  }
  std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    return a.first_seen_ms() > b.first_seen_ms();
  });
  return out;
}

}  // namespace strata::server::regress
