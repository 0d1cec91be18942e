#include "server/regress/release_watcher.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "server/regress/verdict.h"

namespace strata::server::regress {
namespace {

// Values a selector term cannot name literally (labels.h: globs and term separators).
bool SelectableValue(const std::string& value) {
  return !value.empty() && value.find_first_of(",*?[]!=") == std::string::npos;
}

store::ReleaseRecord RecordOf(const std::string& id, const v1::ReleaseVerdict& release) {
  store::ReleaseRecord record;
  record.release_id = id;
  release.SerializeToString(&record.payload);
  return record;
}

// The service and selectors of a comparison of `release` (none for a phase change of a
// service without a release label: all its samples).
ComparisonPlan SelectionsOf(const v1::ReleaseVerdict& release) {
  ComparisonPlan plan;
  plan.service = release.service();
  if (release.kind() != v1::ReleaseVerdict::PHASE || !release.label().empty()) {
    plan.baseline_selector = absl::StrCat(release.label(), "=", release.baseline());
    plan.candidate_selector = absl::StrCat(release.label(), "=", release.candidate());
  }
  return plan;
}

// A verdict made before verdicts carried their lines (stored, or sent by an older node of a
// cluster): those of its last comparison's ranges.
void AddMissingWhichLines(v1::ReleaseVerdict* release) {
  if (release->comparisons() == 0 || release->has_which_lines()) return;
  ComparisonPlan plan = SelectionsOf(*release);
  plan.baseline_from_ms = release->baseline_from_ms();
  plan.baseline_to_ms = release->baseline_to_ms();
  plan.candidate_from_ms = release->candidate_from_ms();
  plan.candidate_to_ms = release->candidate_to_ms();
  *release->mutable_which_lines() = WhichLinesRequestFor(plan);
}

}  // namespace

ReleaseWatcher::ReleaseWatcher(ReleaseWatcherOptions options, ReleaseWatcherInputs inputs,
                               const std::vector<store::ReleaseRecord>& stored)
    : options_(std::move(options)), inputs_(std::move(inputs)) {
  absl::MutexLock lock(&mu_);
  for (const store::ReleaseRecord& record : stored) {
    v1::ReleaseVerdict release;
    // A record that does not parse is dropped: its release is met again as known.
    if (!release.ParseFromString(record.payload)) continue;
    AddMissingWhichLines(&release);
    int64_t& listed = listed_ms_[release.service()];
    listed = std::max(listed, release.updated_ms());
    releases_[ReleaseId(release)] = release;
  }
}

bool ReleaseWatcher::RanLater(const v1::ReleaseVerdict& a, const v1::ReleaseVerdict& b) {
  auto ran_at = [](const v1::ReleaseVerdict& r) {
    return std::make_pair(std::max(r.last_running_ms(), r.first_seen_ms()), r.first_seen_ms());
  };
  return ran_at(a) > ran_at(b);
}

std::string ReleaseWatcher::ReleaseId(const v1::ReleaseVerdict& release) {
  std::string id = release.service();
  id.push_back('\0');
  if (release.kind() == v1::ReleaseVerdict::PHASE) {
    return absl::StrCat(id, "\x01", absl::Dec(release.first_seen_ms(), absl::kZeroPad20));
  }
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
  const int64_t window_ms = absl::ToInt64Milliseconds(options_.window);
  for (const std::string& service : *services) {
    absl::StatusOr<std::pair<std::string, std::vector<std::string>>> values =
        ReleaseValues(service);
    if (!values.ok()) {
      note(values.status());
      continue;
    }
    const auto& [label, found] = *values;
    // Since the last listing (what is new now ran since then), or since now if there was none.
    int64_t ran_since_ms = now_ms;
    {
      absl::MutexLock lock(&mu_);
      if (auto listed = listed_ms_.find(service); listed != listed_ms_.end()) {
        ran_since_ms = std::min(now_ms, listed->second - kLateSamplesMs);
      }
    }
    std::vector<std::string> running;
    if (inputs_.running && !label.empty()) {
      absl::StatusOr<std::vector<std::string>> ran =
          inputs_.running(service, label, ran_since_ms, now_ms + 1);
      if (ran.ok()) {
        running = *std::move(ran);
      } else {
        note(ran.status());
      }
    }
    std::vector<int64_t> phase_starts;
    if (inputs_.phases) {
      absl::StatusOr<std::vector<int64_t>> starts =
          inputs_.phases(service, now_ms - window_ms, now_ms + 1);
      if (starts.ok()) {
        phase_starts = *std::move(starts);
      } else {
        note(starts.status());
      }
    }
    absl::MutexLock lock(&mu_);
    listed_ms_[service] = now_ms;
    if (!label.empty()) {
      std::string prefix = service;
      prefix.push_back('\0');
      prefix += label;
      prefix.push_back('\0');
      // The releases known before this pass: new ones are compared with the one that ran
      // most recently.
      const v1::ReleaseVerdict* previous = nullptr;
      for (auto it = releases_.lower_bound(prefix);
           it != releases_.end() && it->first.starts_with(prefix); ++it) {
        v1::ReleaseVerdict& r = it->second;
        if (std::find(running.begin(), running.end(), r.candidate()) != running.end() &&
            r.last_running_ms() < now_ms) {
          r.set_last_running_ms(now_ms);
          dirty.insert(it->first);
        }
        if (previous == nullptr || RanLater(r, *previous)) previous = &r;
      }
      const std::string baseline = previous != nullptr ? previous->candidate() : std::string();
      for (const std::string& value : found) {
        const std::string id = prefix + value;
        if (releases_.contains(id)) continue;
        v1::ReleaseVerdict release;
        release.set_service(service);
        release.set_label(label);
        release.set_candidate(value);
        release.set_first_seen_ms(now_ms);
        release.set_last_running_ms(now_ms);
        release.set_candidate_from_ms(ran_since_ms);
        release.set_updated_ms(now_ms);
        // Met with the service (no release known before): no baseline to compare with.
        release.set_baseline(baseline);
        release.set_final(baseline.empty());
        releases_[id] = release;
        dirty.insert(id);
      }
    }
    AddPhases(service, label, phase_starts, now_ms, dirty);
    const std::string of_service = service + std::string(1, '\0');
    for (auto it = releases_.lower_bound(of_service);
         it != releases_.end() && it->first.starts_with(of_service); ++it) {
      const v1::ReleaseVerdict& r = it->second;
      if (!r.final() && (!r.baseline().empty() || r.kind() == v1::ReleaseVerdict::PHASE)) {
        due.push_back(r);
      }
    }
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
    absl::MutexLock persisting(&persist_mu_);
    std::vector<store::ReleaseRecord> records;
    {
      absl::MutexLock lock(&mu_);
      for (const std::string& id : dirty) records.push_back(RecordOf(id, releases_.at(id)));
    }
    note(inputs_.persist(records));
  }
  if (!first_error.ok() && changed.empty()) return first_error;
  return changed;
}

void ReleaseWatcher::AddPhases(const std::string& service, const std::string& label,
                               const std::vector<int64_t>& phase_starts, int64_t now_ms,
                               std::set<std::string>& dirty) {
  const int64_t window_ms = absl::ToInt64Milliseconds(options_.window);
  const std::string of_service = service + std::string(1, '\0');
  for (int64_t start : std::set<int64_t>(phase_starts.begin(), phase_starts.end())) {
    bool covered = false;                       // by a comparison begun shortly before
    const v1::ReleaseVerdict* running = nullptr;  // the release running at `start`
    for (auto it = releases_.lower_bound(of_service);
         it != releases_.end() && it->first.starts_with(of_service); ++it) {
      const v1::ReleaseVerdict& r = it->second;
      const bool compared = r.kind() == v1::ReleaseVerdict::PHASE || !r.baseline().empty();
      if (compared && r.first_seen_ms() <= start && start - r.first_seen_ms() < window_ms) {
        covered = true;
      }
      if (r.kind() == v1::ReleaseVerdict::RELEASE && !label.empty() && r.label() == label &&
          r.first_seen_ms() <= start &&
          (running == nullptr || r.first_seen_ms() > running->first_seen_ms())) {
        running = &r;
      }
    }
    if (covered) continue;
    v1::ReleaseVerdict phase;
    phase.set_kind(v1::ReleaseVerdict::PHASE);
    phase.set_service(service);
    if (running != nullptr) {
      phase.set_label(label);
      phase.set_baseline(running->candidate());
      phase.set_candidate(running->candidate());
    }
    phase.set_first_seen_ms(start);
    phase.set_updated_ms(now_ms);
    const std::string id = ReleaseId(phase);
    releases_[id] = std::move(phase);
    dirty.insert(id);
  }
}

absl::Status ReleaseWatcher::Compare(v1::ReleaseVerdict& release, int64_t now_ms) {
  const bool phase = release.kind() == v1::ReleaseVerdict::PHASE;
  // A phase change of a service without a release label compares all its samples.
  const bool whole_service = phase && release.label().empty();
  if (!whole_service &&
      (!SelectableValue(release.baseline()) || !SelectableValue(release.candidate()))) {
    release.set_final(true);
    release.set_error("a release value a selector cannot name (one of , * ? [ ] ! =)");
    return absl::OkStatus();
  }
  ComparisonPlan plan = SelectionsOf(release);
  plan.baseline_from_ms =
      release.first_seen_ms() - absl::ToInt64Milliseconds(options_.baseline_lookback);
  // A release runs beside its baseline while it rolls out; a phase change splits one
  // release's time in two.
  plan.baseline_to_ms =
      phase ? release.first_seen_ms() - absl::ToInt64Milliseconds(options_.phase_onset) : now_ms;
  plan.candidate_from_ms = release.first_seen_ms();
  if (!phase && release.candidate_from_ms() != 0) {
    plan.candidate_from_ms = std::min(plan.candidate_from_ms, release.candidate_from_ms());
  }
  plan.candidate_to_ms = now_ms;
  plan.windows_independent = phase;
  plan.one_host_windows = !phase;
  plan.window_s =
      static_cast<uint32_t>(std::max<int64_t>(1, absl::ToInt64Seconds(options_.phase_unit)));
  absl::StatusOr<v1::ReleaseVerdict> outcome = inputs_.compare(plan);
  release.set_updated_ms(now_ms);
  if (!outcome.ok()) {
    release.set_error(std::string(outcome.status().message()));
    return outcome.status();
  }
  release.clear_error();
  release.set_comparisons(release.comparisons() + 1);
  release.set_baseline_from_ms(plan.baseline_from_ms);
  release.set_baseline_to_ms(plan.baseline_to_ms);
  release.set_candidate_from_ms(plan.candidate_from_ms);
  release.set_candidate_to_ms(plan.candidate_to_ms);
  *release.mutable_which_lines() = WhichLinesRequestFor(plan);
  release.set_state(outcome->state());
  *release.mutable_functions() = outcome->functions();
  release.set_min_detectable(outcome->min_detectable());
  release.set_unit(outcome->unit());
  release.set_baseline_units(outcome->baseline_units());
  release.set_candidate_units(outcome->candidate_units());
  release.set_window_s(outcome->window_s());
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
    if (release.kind() == v1::ReleaseVerdict::RELEASE && release.baseline().empty()) continue;
    if (release.first_seen_ms() < since_ms) continue;
    if (!service.empty() && release.service() != service) continue;
    out.push_back(release);
  }
  std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    return a.first_seen_ms() > b.first_seen_ms();
  });
  return out;
}

std::vector<v1::ReleaseVerdict> ReleaseWatcher::Releases() const {
  std::vector<v1::ReleaseVerdict> out;
  absl::MutexLock lock(&mu_);
  out.reserve(releases_.size());
  for (const auto& [id, release] : releases_) out.push_back(release);
  return out;
}

bool ReleaseWatcher::Supersedes(const v1::ReleaseVerdict& a, const v1::ReleaseVerdict& b) {
  if (a.comparisons() != b.comparisons()) return a.comparisons() > b.comparisons();
  if (a.final() != b.final()) return a.final();
  return a.updated_ms() > b.updated_ms();
}

absl::StatusOr<size_t> ReleaseWatcher::Keep(const std::vector<v1::ReleaseVerdict>& states) {
  absl::MutexLock persisting(&persist_mu_);
  std::map<std::string, const v1::ReleaseVerdict*> newer;  // by ReleaseId
  {
    absl::MutexLock lock(&mu_);
    for (const v1::ReleaseVerdict& state : states) {
      if (state.service().empty()) continue;  // not a release of anything
      const std::string id = ReleaseId(state);
      auto held = releases_.find(id);
      if (held != releases_.end() && !Supersedes(state, held->second)) continue;
      auto [it, added] = newer.try_emplace(id, &state);
      if (!added && Supersedes(state, *it->second)) it->second = &state;
    }
  }
  if (newer.empty()) return 0;
  std::vector<store::ReleaseRecord> records;
  for (const auto& [id, state] : newer) records.push_back(RecordOf(id, *state));
  if (absl::Status s = inputs_.persist(records); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  // Check may have moved a release on meanwhile (two nodes checking at once): the later
  // state stays.
  size_t taken = 0;
  for (const auto& [id, state] : newer) {
    auto [it, added] = releases_.try_emplace(id, *state);
    if (added || Supersedes(*state, it->second)) {
      it->second = *state;
      AddMissingWhichLines(&it->second);
      ++taken;
    }
  }
  return taken;
}

}  // namespace strata::server::regress
