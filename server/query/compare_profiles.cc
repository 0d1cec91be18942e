#include "server/query/compare_profiles.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <mutex>
#include <set>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "server/commit/batch_committer.h"
#include "server/compare/compare.h"
#include "server/query/diff.h"
#include "server/query/query_service.h"

namespace strata::server::query {
namespace {

// The keys compared: each function's self and total samples, and each path. Functions are
// rows of a FunctionMatcher shared by both groups; a path is its truncated flag and rows.
class KeyTable {
 public:
  enum Kind : uint8_t { kSelf, kTotal, kPath };
  struct Key {
    Kind kind;
    uint32_t id;  // function row, or path index
  };
  struct Path {
    bool truncated;
    std::vector<uint32_t> rows;
  };

  explicit KeyTable(SelfOf self_of) : self_of_(self_of) {}

  // A profile of one unit as counts per key.
  compare::Unit UnitOf(const Profile& profile, uint64_t cluster) {
    const std::vector<uint32_t> rows = matcher_.RowsOf(profile);
    absl::flat_hash_map<uint32_t, uint64_t> counts;
    for (const FunctionTotals& t : TopFunctions(profile, false, self_of_)) {
      // Two functions of one profile may share a name and module (two builds of a module):
      // their counts add up, as in Diff.
      if (t.self > 0) counts[KeyOf(kSelf, rows[t.function])] += t.self;
      if (t.total > 0) counts[KeyOf(kTotal, rows[t.function])] += t.total;
    }
    std::string path_key;
    for (const ResolvedStack& s : profile.stacks) {
      path_key.assign(1, s.truncated ? 't' : 'c');
      std::vector<uint32_t> path_rows;
      path_rows.reserve(s.frames.size());
      for (uint32_t f : s.frames) {
        path_rows.push_back(rows[f]);
        path_key.append(reinterpret_cast<const char*>(&rows[f]), sizeof(uint32_t));
      }
      auto [it, inserted] = path_index_.try_emplace(path_key, paths_.size());
      if (inserted) paths_.push_back({s.truncated, std::move(path_rows)});
      counts[KeyOf(kPath, it->second)] += s.count;
    }
    compare::Unit unit{cluster, profile.total, {}, profile.requests};
    unit.counts.reserve(counts.size());
    // A total summed over same-named functions can pass the unit's samples: it is capped.
    for (const auto& [key, n] : counts) unit.counts.emplace_back(key, std::min(n, profile.total));
    return unit;
  }

  uint32_t size() const { return static_cast<uint32_t>(keys_.size()); }
  const Key& key(uint32_t k) const { return keys_[k]; }
  const Path& path(uint32_t id) const { return paths_[id]; }
  const ResolvedFunction& function(uint32_t row) const { return matcher_.functions()[row]; }

 private:
  uint32_t KeyOf(Kind kind, uint32_t id) {
    auto [it, inserted] = index_.try_emplace(uint64_t{id} << 2 | kind, keys_.size());
    if (inserted) keys_.push_back({kind, id});
    return it->second;
  }

  const SelfOf self_of_;
  FunctionMatcher matcher_;
  absl::flat_hash_map<uint64_t, uint32_t> index_;
  std::vector<Key> keys_;
  absl::flat_hash_map<std::string, uint32_t> path_index_;
  std::vector<Path> paths_;
};

// The Benjamini-Hochberg families of a comparison's keys.
constexpr uint8_t kFunctionFamily = 0;
constexpr uint8_t kPathFamily = 1;

struct LoadedGroup {
  compare::Group group;
  uint32_t hosts = 0;
  std::set<std::string> unreachable;
};

// Loads the units of `g`, whose own load found `whole`, into `keys` (under `mu`) with
// `settings.threads` loads at once. A window of 0: a unit is a host over the range.
absl::StatusOr<LoadedGroup> LoadGroup(const ProfileLoader& load, const CompareGroupQuery& g,
                                      const Profile& whole, const CompareSettings& settings,
                                      int64_t window_ms, KeyTable* keys, std::mutex* mu) {
  LoadedGroup out;
  out.group.requests = g.requests;
  out.unreachable.insert(whole.unreachable_nodes.begin(), whole.unreachable_nodes.end());
  std::vector<std::string> hosts = whole.hosts;
  out.hosts = static_cast<uint32_t>(hosts.size());
  if (hosts.size() > settings.max_loads) {
    std::sort(hosts.begin(), hosts.end(), [](const std::string& a, const std::string& b) {
      return absl::HashOf(a) < absl::HashOf(b);
    });
    hosts.resize(settings.max_loads);
  }
  struct Slice {
    uint32_t host;
    int64_t from_ms, to_ms;
  };
  std::vector<Slice> slices;
  for (uint32_t h = 0; h < hosts.size(); ++h) {
    if (window_ms == 0) {
      slices.push_back({h, g.query.from_ms, g.query.to_ms});
      continue;
    }
    for (int64_t from = g.query.from_ms; from < g.query.to_ms; from += window_ms) {
      slices.push_back({h, from, std::min(from + window_ms, g.query.to_ms)});
    }
  }
  std::atomic<size_t> next{0};
  absl::Status error;
  auto work = [&] {
    for (size_t i = next++; i < slices.size(); i = next++) {
      ProfileQuery q = g.query;
      q.requests = g.requests == 0;  // typed requests replace the scraped ones
      q.host = hosts[slices[i].host];
      q.from_ms = slices[i].from_ms;
      q.to_ms = slices[i].to_ms;
      auto profile = load(q);
      std::lock_guard<std::mutex> lock(*mu);
      if (!profile.ok()) {
        if (error.ok()) error = profile.status();
        next = slices.size();
        return;
      }
      out.unreachable.insert(profile->unreachable_nodes.begin(), profile->unreachable_nodes.end());
      if (profile->total == 0) continue;
      out.group.units.push_back(keys->UnitOf(*profile, window_ms == 0 ? slices[i].host : i));
    }
  };
  std::vector<std::thread> threads;
  const size_t helpers = std::min<size_t>(std::max(settings.threads, 1), slices.size());
  for (size_t t = 1; t < helpers; ++t) threads.emplace_back(work);
  work();
  for (std::thread& t : threads) t.join();
  if (!error.ok()) return error;
  return out;
}

// The window of a unit: store windows, widened (doubled) until the loads fit.
int64_t UnitWindowMs(const CompareSettings& s, const ProfileQuery& q, size_t hosts) {
  if (!s.windows_independent) return 0;
  int64_t w = std::max<int64_t>(s.window_ms, commit::kWindowMs);
  w = (w + commit::kWindowMs - 1) / commit::kWindowMs * commit::kWindowMs;
  const int64_t length = std::max<int64_t>(q.to_ms - q.from_ms, 1);
  const size_t bounded = std::min(std::max<size_t>(hosts, 1), s.max_loads);
  while (w < length && static_cast<size_t>((length + w - 1) / w) * bounded > s.max_loads) w *= 2;
  return w;
}

bool HasLanguageFrames(const Profile& profile) {
  return std::ranges::any_of(profile.functions, IsLanguageFrame);
}

// A group's error, named: "baseline: ..." or "candidate: ...".
absl::Status Prefixed(const char* group, const absl::Status& status) {
  return absl::Status(status.code(), absl::StrCat(group, ": ", status.message()));
}

// Sets `value` when finite (NaN: not enough data, or no baseline to compare with).
template <typename Setter>
void SetFinite(double value, Setter setter) {
  if (std::isfinite(value)) setter(value);
}

// `scale` turns samples per request into the response's per_request_unit.
void SetEstimate(const compare::KeyComparison& k, double scale, v1::CompareEstimate* e) {
  const compare::Estimate& s = k.share;
  e->set_baseline_samples(k.baseline_samples);
  e->set_candidate_samples(k.candidate_samples);
  e->set_share_baseline(100 * s.baseline);
  e->set_share_candidate(100 * s.candidate);
  e->set_delta(100 * s.delta);
  SetFinite(100 * s.ci_low, [&](double v) { e->set_ci_low(v); });
  SetFinite(100 * s.ci_high, [&](double v) { e->set_ci_high(v); });
  SetFinite(s.p, [&](double v) { e->set_p(v); });
  SetFinite(s.q, [&](double v) { e->set_q(v); });
  e->set_significant(s.significant);
  e->set_tested(s.tested);
  SetFinite(100 * s.min_detectable, [&](double v) { e->set_min_detectable(v); });
  SetFinite(100 * s.relative, [&](double v) { e->set_relative(v); });
  SetFinite(100 * s.relative_ci_low, [&](double v) { e->set_relative_ci_low(v); });
  SetFinite(100 * s.relative_ci_high, [&](double v) { e->set_relative_ci_high(v); });
  SetFinite(100 * k.per_request_change, [&](double v) { e->set_per_request_change(v); });
  if (scale == 0) return;
  const compare::Estimate& r = k.per_request;
  v1::PerRequestEstimate* out = e->mutable_per_request();
  out->set_baseline(scale * r.baseline);
  out->set_candidate(scale * r.candidate);
  out->set_delta(scale * r.delta);
  SetFinite(scale * r.ci_low, [&](double v) { out->set_ci_low(v); });
  SetFinite(scale * r.ci_high, [&](double v) { out->set_ci_high(v); });
  SetFinite(r.p, [&](double v) { out->set_p(v); });
  SetFinite(r.q, [&](double v) { out->set_q(v); });
  out->set_significant(r.significant);
  out->set_tested(r.tested);
  SetFinite(scale * r.min_detectable, [&](double v) { out->set_min_detectable(v); });
  SetFinite(100 * r.relative, [&](double v) { out->set_relative(v); });
  SetFinite(100 * r.relative_ci_low, [&](double v) { out->set_relative_ci_low(v); });
  SetFinite(100 * r.relative_ci_high, [&](double v) { out->set_relative_ci_high(v); });
}

// Significant rows first (by q), then by |delta|; at most `limit`.
template <typename Row>
void RankRows(google::protobuf::RepeatedPtrField<Row>* rows, uint32_t limit,
              const std::function<std::pair<double, double>(const Row&)>& q_and_delta) {
  std::vector<Row> sorted(rows->begin(), rows->end());
  std::stable_sort(sorted.begin(), sorted.end(), [&](const Row& a, const Row& b) {
    const auto [qa, da] = q_and_delta(a);
    const auto [qb, db] = q_and_delta(b);
    if (qa != qb) return qa < qb;
    return da > db;
  });
  if (sorted.size() > limit) sorted.resize(limit);
  rows->Clear();
  for (Row& r : sorted) *rows->Add() = std::move(r);
}

}  // namespace

absl::StatusOr<v1::CompareResponse> CompareProfiles(const ProfileLoader& load,
                                                    const CompareGroupQuery& baseline,
                                                    const CompareGroupQuery& candidate,
                                                    const CompareSettings& settings) {
  if (!(settings.fdr > 0 && settings.fdr < 1) ||
      !(settings.confidence > 0 && settings.confidence < 1)) {
    return absl::InvalidArgumentError("fdr and confidence must lie in (0, 1)");
  }
  KeyTable keys(settings.language_self ? SelfOf::kLanguageFrame : SelfOf::kLeaf);
  std::mutex mu;
  v1::CompareResponse response;
  std::set<std::string> unreachable;
  std::vector<LoadedGroup> groups;
  const std::pair<const char*, const CompareGroupQuery*> named_groups[] = {
      {"baseline", &baseline}, {"candidate", &candidate}};
  std::vector<Profile> wholes;
  for (const auto& [name, g] : named_groups) {
    auto whole = load(g->query);
    if (!whole.ok()) return Prefixed(name, whole.status());
    wholes.push_back(*std::move(whole));
  }
  if (settings.language_self && std::ranges::any_of(wholes, HasLanguageFrames)) {
    response.add_notes(
        "self samples of Python and JIT functions include the native code they call");
  }
  CompareSettings unit_settings = settings;
  if (settings.one_host_windows && !settings.windows_independent &&
      wholes[0].hosts.size() == 1 && wholes[0].hosts == wholes[1].hosts) {
    unit_settings.windows_independent = true;
    response.add_notes(absl::StrCat("one host (", wholes[0].hosts[0],
                                    ") in both groups: its windows are the units"));
  }
  for (size_t i = 0; i < 2; ++i) {
    const auto [name, g] = named_groups[i];
    const Profile* const whole = &wholes[i];
    const int64_t window_ms = UnitWindowMs(unit_settings, g->query, whole->hosts.size());
    if (unit_settings.windows_independent) {
      if (window_ms > std::max<int64_t>(settings.window_ms, commit::kWindowMs)) {
        response.add_notes(absl::StrCat(name, ": windows widened to ", window_ms / 1000,
                                        " s to stay within ", settings.max_loads, " loads"));
      }
      response.set_window_s(static_cast<uint32_t>(window_ms / 1000));
    }
    auto loaded = LoadGroup(load, *g, *whole, settings, window_ms, &keys, &mu);
    if (!loaded.ok()) return Prefixed(name, loaded.status());
    if (loaded->hosts > settings.max_loads) {
      response.add_notes(absl::StrCat(name, ": ", settings.max_loads, " of ", loaded->hosts,
                                      " hosts (a sample by a hash of their names)"));
    }
    unreachable.insert(loaded->unreachable.begin(), loaded->unreachable.end());
    groups.push_back(*std::move(loaded));
  }
  // Two questions, a family each: which functions changed (self and total), and which paths.
  // Whole stacks make paths many; in one family they would raise every function's bar.
  std::vector<uint8_t> families(keys.size());
  for (uint32_t k = 0; k < keys.size(); ++k) {
    families[k] = keys.key(k).kind == KeyTable::kPath ? kPathFamily : kFunctionFamily;
  }
  auto result = compare::CompareGroups(groups[0].group, groups[1].group, keys.size(),
                                       {.fdr = settings.fdr,
                                        .confidence = settings.confidence,
                                        .min_share = settings.min_share,
                                        .families = std::move(families)});
  if (!result.ok()) return result.status();

  response.set_not_enough_data(result->not_enough_data);
  response.set_baseline_units(static_cast<uint32_t>(result->baseline_units));
  response.set_candidate_units(static_cast<uint32_t>(result->candidate_units));
  response.set_baseline_hosts(groups[0].hosts);
  response.set_candidate_hosts(groups[1].hosts);
  response.set_baseline_samples(result->baseline_samples);
  response.set_candidate_samples(result->candidate_samples);
  response.set_fdr(settings.fdr);
  auto tested = [&](uint8_t family) {
    return family < result->family_keys_tested.size()
               ? static_cast<uint32_t>(result->family_keys_tested[family])
               : 0u;
  };
  response.set_keys_compared(tested(kFunctionFamily));
  response.set_paths_compared(tested(kPathFamily));
  if (std::isfinite(result->baseline_samples_per_request)) {
    response.set_baseline_samples_per_request(result->baseline_samples_per_request);
    response.set_candidate_samples_per_request(result->candidate_samples_per_request);
    response.set_baseline_requests(result->baseline_requests);
    response.set_candidate_requests(result->candidate_requests);
  }
  // Samples per request, as CPU milliseconds per request where the sampling rate is known.
  double per_request_scale = 0;
  if (result->per_request) {
    per_request_scale = settings.sampling_hz > 0 ? 1000.0 / settings.sampling_hz : 1.0;
    response.set_per_request_unit(settings.sampling_hz > 0 ? "ms CPU/request"
                                                           : "samples/request");
    response.set_sampling_hz(settings.sampling_hz);
  }
  for (const std::string& n : unreachable) response.add_unreachable_nodes(n);

  absl::flat_hash_map<uint32_t, int> function_row;  // matcher row -> response row
  for (const compare::KeyComparison& k : result->keys) {
    const KeyTable::Key& key = keys.key(k.key);
    if (key.kind == KeyTable::kPath) {
      v1::PathComparison* row = response.add_paths();
      const KeyTable::Path& path = keys.path(key.id);
      for (uint32_t r : path.rows) SetFrame(keys.function(r), row->add_frames());
      row->set_truncated(path.truncated);
      SetEstimate(k, per_request_scale, row->mutable_samples());
      continue;
    }
    auto [it, inserted] = function_row.try_emplace(key.id, response.functions_size());
    if (inserted) SetFrame(keys.function(key.id), response.add_functions()->mutable_function());
    v1::FunctionComparison* row = response.mutable_functions(it->second);
    SetEstimate(k, per_request_scale,
                key.kind == KeyTable::kSelf ? row->mutable_self() : row->mutable_total());
  }
  // A row is significant by its share or its per-request figure.
  auto rank = [](const v1::CompareEstimate& e) {
    return std::min(e.significant() ? e.q() : 2.0,
                    e.per_request().significant() ? e.per_request().q() : 2.0);
  };
  RankRows<v1::FunctionComparison>(
      response.mutable_functions(), settings.limit, [&](const v1::FunctionComparison& r) {
        return std::pair{std::min(rank(r.self()), rank(r.total())),
                         std::abs(r.self().delta()) * 1e6 + std::abs(r.total().delta())};
      });
  RankRows<v1::PathComparison>(response.mutable_paths(), settings.limit,
                               [&](const v1::PathComparison& r) {
                                 return std::pair{rank(r.samples()), std::abs(r.samples().delta())};
                               });
  return response;
}

absl::StatusOr<v1::CompareResponse> CompareRequested(const v1::CompareRequest& request,
                                                     int64_t now_ms, uint32_t limit,
                                                     const ProfileLoader& load,
                                                     uint32_t sampling_hz) {
  v1::ProfileFilter filters[2] = {request.baseline(), request.candidate()};
  for (v1::ProfileFilter& f : filters) {
    if (f.service().empty()) f.set_service(request.service());
    if (!f.capture_id().empty()) {
      return absl::InvalidArgumentError("compare takes continuous profiles, not captures");
    }
  }
  // A group without a range has the other's.
  if (!filters[0].has_range()) *filters[0].mutable_range() = filters[1].range();
  if (!filters[1].has_range()) *filters[1].mutable_range() = filters[0].range();
  if (filters[0].SerializeAsString() == filters[1].SerializeAsString()) {
    return absl::InvalidArgumentError("baseline and candidate select the same samples");
  }
  CompareGroupQuery groups[2];
  for (int i = 0; i < 2; ++i) {
    auto q = ToProfileQuery(filters[i], now_ms);
    if (!q.ok()) return q.status();
    groups[i] = {*std::move(q),
                 i == 0 ? request.baseline_requests() : request.candidate_requests()};
  }
  CompareSettings settings;
  settings.windows_independent = request.windows_independent();
  settings.one_host_windows = request.one_host_windows();
  settings.language_self = request.language_self();
  if (request.window_s() > 0) settings.window_ms = int64_t{request.window_s()} * 1000;
  if (request.fdr() != 0) settings.fdr = request.fdr();
  if (request.confidence() != 0) settings.confidence = request.confidence();
  if (request.min_share() != 0) settings.min_share = request.min_share() / 100;
  settings.limit = limit;
  settings.sampling_hz = sampling_hz;
  return CompareProfiles(load, groups[0], groups[1], settings);
}

}  // namespace strata::server::query
