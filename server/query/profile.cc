#include "server/query/profile.h"

#include <algorithm>
#include <map>
#include <memory>
#include <set>
#include <string_view>
#include <tuple>

#include "absl/container/flat_hash_map.h"
#include "common/base/saturating.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "common/labels/labels.h"
#include "re2/re2.h"
#include "common/base/frame_kind.h"
#include "server/commit/profile_type.h"
#include "server/query/quality.h"
#include "server/query/series.h"
#include "server/store/stack_counts.h"

namespace strata::server::query {

bool IsLanguageFrame(const ResolvedFunction& f) {
  const base::FrameKind kind = base::FrameKindOf(f.module);
  return kind == base::FrameKind::kPython || kind == base::FrameKind::kJava ||
         kind == base::FrameKind::kJit;
}

void SetFrame(const ResolvedFunction& f, v1::Frame* out) {
  out->set_function(f.name);
  out->set_module(f.module);
  out->set_kind(static_cast<v1::FrameKind>(base::FrameKindOf(f.module)));
  if (!f.file.empty()) out->set_file(f.file);
  if (f.line != 0) out->set_line(f.line);
  if (f.inlined) out->set_inlined(true);
}

std::vector<FunctionTotals> TopFunctions(const Profile& profile, bool sort_by_total,
                                         SelfOf self_of) {
  std::vector<FunctionTotals> totals(profile.functions.size());
  for (uint32_t i = 0; i < totals.size(); ++i) totals[i].function = i;
  std::vector<bool> language;  // by function, with SelfOf::kLanguageFrame
  if (self_of == SelfOf::kLanguageFrame) {
    language.resize(profile.functions.size());
    for (uint32_t i = 0; i < language.size(); ++i) {
      language[i] = IsLanguageFrame(profile.functions[i]);
    }
  }
  std::vector<uint32_t> seen(profile.functions.size(), UINT32_MAX);
  for (uint32_t s = 0; s < profile.stacks.size(); ++s) {
    const ResolvedStack& stack = profile.stacks[s];
    if (stack.frames.empty()) continue;
    uint32_t self = stack.frames.back();
    if (!language.empty()) {
      auto inner = std::find_if(stack.frames.rbegin(), stack.frames.rend(),
                                [&](uint32_t f) { return language[f]; });
      if (inner != stack.frames.rend()) self = *inner;
    }
    totals[self].self += stack.count;
    for (uint32_t f : stack.frames) {
      if (seen[f] == s) continue;
      seen[f] = s;
      totals[f].total += stack.count;
    }
  }
  std::erase_if(totals, [](const FunctionTotals& t) { return t.total == 0; });
  std::sort(totals.begin(), totals.end(), [&](const FunctionTotals& a, const FunctionTotals& b) {
    const uint64_t ka = sort_by_total ? a.total : a.self, kb = sort_by_total ? b.total : b.self;
    if (ka != kb) return ka > kb;
    const uint64_t sa = sort_by_total ? a.self : a.total, sb = sort_by_total ? b.self : b.total;
    if (sa != sb) return sa > sb;
    return profile.functions[a.function].name < profile.functions[b.function].name;
  });
  return totals;
}

void MergeFunctionsAcrossBuilds(Profile* profile) {
  if (!profile->call_sites.empty()) return;
  using Key = std::tuple<std::string_view, base::ModuleIdentity, std::string_view, uint32_t, bool>;
  absl::flat_hash_map<Key, uint32_t> index_of;
  std::vector<uint32_t> renumbered(profile->functions.size());
  std::vector<ResolvedFunction> kept;
  for (uint32_t i = 0; i < profile->functions.size(); ++i) {
    const ResolvedFunction& f = profile->functions[i];
    auto [it, inserted] = index_of.try_emplace(
        Key{f.name, base::IdentityOf(f.module), f.file, f.line, f.inlined},
        static_cast<uint32_t>(index_of.size()));
    renumbered[i] = it->second;
  }
  if (index_of.size() == profile->functions.size()) return;  // one build each: the common case
  kept.resize(index_of.size());
  std::vector<bool> placed(kept.size(), false);
  for (uint32_t i = 0; i < profile->functions.size(); ++i) {
    if (placed[renumbered[i]]) continue;
    placed[renumbered[i]] = true;
    kept[renumbered[i]] = std::move(profile->functions[i]);
  }
  profile->functions = std::move(kept);  // the keys' views pointed into the old functions

  absl::flat_hash_map<std::string, uint32_t> stack_at;  // (truncated, frames) -> kept stack
  std::vector<ResolvedStack> stacks;
  stacks.reserve(profile->stacks.size());
  std::string key;
  bool summed = false;
  for (ResolvedStack& stack : profile->stacks) {
    for (uint32_t& f : stack.frames) f = renumbered[f];
    key.assign(1, stack.truncated ? 't' : 'c');
    key.append(reinterpret_cast<const char*>(stack.frames.data()),
               stack.frames.size() * sizeof(uint32_t));
    auto [it, inserted] = stack_at.try_emplace(key, static_cast<uint32_t>(stacks.size()));
    if (inserted) {
      stacks.push_back(std::move(stack));
    } else {
      base::SaturatingAddTo(stacks[it->second].count, stack.count);
      summed = true;
    }
  }
  if (summed) {
    std::stable_sort(stacks.begin(), stacks.end(), [](const ResolvedStack& a,
                                                      const ResolvedStack& b) {
      return a.count > b.count;
    });
  }
  profile->stacks = std::move(stacks);
}

// Stack and function records are immutable (content-addressed IDs), so what a load resolved
// stays valid: later loads translate cached stacks through dense function numbers instead of
// copying, decoding and hashing every frame again. Entries are never removed, so a lookup
// made under the lock holds for the whole load; once full, further stacks and functions are
// resolved per load from the store (whose intern caches still serve them).
class ProfileReader::Resolved {
 public:
  // Appends the stacks of `counts` (in that order) to profile->stacks, their functions to
  // profile->functions, and their counts to profile->total, skipping stacks that do not
  // match `focus` (when given) or that match `ignore` (when given).
  absl::Status Resolve(store::Store& store, const std::vector<store::StackCount>& counts,
                       const RE2* focus, const RE2* ignore, Profile* profile);

  explicit Resolved(symbolize::Symbolizer* symbolizer) : symbolizer_(symbolizer) {}

 private:
  // Frames agents could not name (stripped modules) are named from debug files by build ID;
  // those still unnamed are tried again whenever the symbolizer has new debug information.
  struct Unnamed {
    uint32_t number;  // function number
    std::string build_id;
    uint64_t start_offset;
  };
  static bool NeedsName(const store::FunctionInfo& info);
  // Names `info` in place when it needs a name and one is known; returns whether it did.
  bool Symbolize(store::FunctionInfo* info) const;
  // Names cached functions that were unnamed when the debug information was not there yet.
  void RenameCached();

  static constexpr size_t kMaxStacks = size_t{1} << 20;
  static constexpr size_t kMaxFunctions = size_t{1} << 20;

  struct Function {
    uint64_t id;
    std::string name, module;
    bool symbolized = false;  // named by the server: functions of one name are merged
  };
  struct Stack {
    uint64_t offset = 0;  // into frames_
    uint32_t size = 0;
    bool truncated = false;
    bool cached = false;  // in a load's lookup results: found in stacks_
  };

  absl::Mutex mu_;
  std::vector<Function> functions_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, uint32_t> function_number_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, Stack> stacks_ ABSL_GUARDED_BY(mu_);
  std::vector<uint32_t> frames_ ABSL_GUARDED_BY(mu_);  // function numbers, outermost first

  symbolize::Symbolizer* const symbolizer_;  // null: names as the agents sent them
  absl::Mutex rename_mu_;                    // one RenameCached at a time
  std::vector<Unnamed> unnamed_ ABSL_GUARDED_BY(mu_);
  uint64_t named_generation_ ABSL_GUARDED_BY(rename_mu_) = 0;
};

bool ProfileReader::Resolved::NeedsName(const store::FunctionInfo& info) {
  return !info.build_id.empty() && base::FrameKindOf(info.module) == base::FrameKind::kUser &&
         IsUnnamedFunction(info.name);
}

bool ProfileReader::Resolved::Symbolize(store::FunctionInfo* info) const {
  if (symbolizer_ == nullptr || !NeedsName(*info)) return false;
  std::optional<std::string> name =
      symbolizer_->FunctionName(BuildIdHex(info->build_id), info->start_offset);
  if (!name) return false;
  info->name = *std::move(name);
  return true;
}

void ProfileReader::Resolved::RenameCached() {
  if (symbolizer_ == nullptr) return;
  absl::MutexLock rename_lock(&rename_mu_);
  const uint64_t generation = symbolizer_->generation();
  if (generation == named_generation_) return;
  std::vector<Unnamed> pending;
  {
    absl::ReaderMutexLock lock(&mu_);
    pending = unnamed_;
  }
  // Looked up without the lock: a lookup may read a file or ask debuginfod.
  std::vector<std::pair<uint32_t, std::string>> named;
  for (const Unnamed& u : pending) {
    if (auto name = symbolizer_->FunctionName(u.build_id, u.start_offset)) {
      named.emplace_back(u.number, *std::move(name));
    }
  }
  named_generation_ = generation;
  if (named.empty()) return;
  absl::MutexLock lock(&mu_);
  for (auto& [number, name] : named) {
    functions_[number].name = std::move(name);
    functions_[number].symbolized = true;
  }
  std::erase_if(unnamed_, [&](const Unnamed& u) {
    return std::any_of(named.begin(), named.end(),
                       [&](const auto& n) { return n.first == u.number; });
  });
}

absl::Status ProfileReader::Resolved::Resolve(store::Store& store,
                                              const std::vector<store::StackCount>& counts,
                                              const RE2* focus, const RE2* ignore,
                                              Profile* profile) {
  RenameCached();
  // 1. Stacks resolved by earlier loads (kept by value: entries are never removed and the
  // frames they point to never move within frames_' indices), and those that are not.
  std::vector<Stack> found(counts.size());
  std::vector<uint64_t> missing;
  {
    absl::ReaderMutexLock lock(&mu_);
    constexpr size_t kAhead = 8;  // hash probes are cache misses: overlap a few
    for (size_t i = 0; i < counts.size(); ++i) {
      if (i + kAhead < counts.size()) stacks_.prefetch(counts[i + kAhead].stack_id);
      if (auto it = stacks_.find(counts[i].stack_id); it != stacks_.end()) {
        found[i] = it->second;
      } else {
        missing.push_back(counts[i].stack_id);
      }
    }
  }
  // 2. Read those (and their unknown functions) from the store, without holding the lock.
  absl::flat_hash_map<uint64_t, store::StackFrames> fetched;
  absl::flat_hash_map<uint64_t, store::FunctionInfo> fetched_functions;
  absl::flat_hash_set<uint64_t> symbolized;  // fetched functions named here
  if (!missing.empty()) {
    fetched.reserve(missing.size());
    for (uint64_t stack_id : missing) {
      auto frames = store.interner().GetStack(stack_id);
      if (!frames.ok()) {
        return absl::DataLossError(absl::StrCat("stack ", stack_id,
                                                " cannot be read: ", frames.status().message()));
      }
      fetched.emplace(stack_id, *std::move(frames));
    }
    std::vector<uint64_t> unknown;
    {
      absl::ReaderMutexLock lock(&mu_);
      for (const auto& [stack_id, frames] : fetched) {
        for (uint64_t fid : frames.function_ids) {
          if (!function_number_.contains(fid)) unknown.push_back(fid);
        }
      }
    }
    for (uint64_t fid : unknown) {
      if (fetched_functions.contains(fid)) continue;
      auto info = store.interner().GetFunction(fid);
      if (!info.ok()) {
        return absl::DataLossError(
            absl::StrCat("function ", fid, " cannot be read: ", info.status().message()));
      }
      fetched_functions.emplace(fid, *std::move(info));
    }
    for (auto& [fid, info] : fetched_functions) {
      if (Symbolize(&info)) symbolized.insert(fid);
    }
    // 3. Keep them for later loads, while there is room.
    absl::MutexLock lock(&mu_);
    for (const auto& [fid, info] : fetched_functions) {
      if (functions_.size() >= kMaxFunctions) break;
      const uint32_t number = static_cast<uint32_t>(functions_.size());
      if (function_number_.try_emplace(fid, number).second) {
        const bool named_here = symbolized.contains(fid);
        functions_.push_back({fid, info.name, info.module, named_here});
        if (!named_here && symbolizer_ != nullptr && NeedsName(info)) {
          unnamed_.push_back({number, BuildIdHex(info.build_id), info.start_offset});
        }
      }
    }
    for (const auto& [stack_id, frames] : fetched) {
      if (stacks_.size() >= kMaxStacks) break;
      if (stacks_.contains(stack_id)) continue;
      const uint64_t offset = frames_.size();
      bool complete = true;
      for (uint64_t fid : frames.function_ids) {
        auto it = function_number_.find(fid);
        if (it == function_number_.end()) {
          complete = false;
          break;
        }
        frames_.push_back(it->second);
      }
      if (!complete) {
        frames_.resize(offset);
        continue;
      }
      stacks_.emplace(stack_id, Stack{offset, static_cast<uint32_t>(frames.function_ids.size()),
                                      frames.truncated, true});
    }
  }

  // 4. Build the profile: function numbers map to profile indices through a dense table.
  absl::ReaderMutexLock lock(&mu_);
  std::vector<uint32_t> index_of_number(functions_.size(), UINT32_MAX);
  absl::flat_hash_map<uint64_t, uint32_t> index_of_uncached;  // functions beyond the cache
  // Per profile function: does it match focus / ignore (computed once per function).
  std::vector<uint8_t> matches_focus, matches_ignore;
  // Server-named functions: several unnamed pieces of one function (addresses the agent had
  // no symbol for) become one.
  absl::flat_hash_map<std::pair<std::string_view, std::string_view>, uint32_t>
      index_of_symbolized;
  // The profile's functions, copied once their number is known (a vector grown one by one
  // moved them all several times). The names stay put meanwhile: under the lock nothing is
  // added to functions_, and `fetched_functions` is only read.
  struct FunctionSource {
    uint64_t id;
    const std::string* name;
    const std::string* module;
  };
  std::vector<FunctionSource> sources;
  auto add_function = [&](uint64_t id, const std::string& name, const std::string& module,
                          bool symbolized_here) {
    if (symbolized_here) {
      auto [it, inserted] = index_of_symbolized.try_emplace(
          std::pair<std::string_view, std::string_view>{name, module},
          static_cast<uint32_t>(sources.size()));
      if (!inserted) return it->second;
    }
    sources.push_back({id, &name, &module});
    matches_focus.push_back(focus && RE2::PartialMatch(name, *focus));
    matches_ignore.push_back(ignore && RE2::PartialMatch(name, *ignore));
    return static_cast<uint32_t>(sources.size() - 1);
  };
  auto index_of = [&](uint32_t number) {
    uint32_t& index = index_of_number[number];
    if (index == UINT32_MAX) {
      const Function& f = functions_[number];
      index = add_function(f.id, f.name, f.module, f.symbolized);
    }
    return index;
  };
  for (size_t k = 0; k < counts.size(); ++k) {
    const store::StackCount& c = counts[k];
    // Cached frames lie wherever earlier loads put them: fetch a few stacks ahead.
    if (k + 4 < counts.size() && found[k + 4].cached) {
      __builtin_prefetch(frames_.data() + found[k + 4].offset);
    }
    // Built in place (its frames are inline: moving it would copy them), taken back below if
    // focus or ignore rule it out.
    ResolvedStack& stack = profile->stacks.emplace_back();
    stack.stack_id = c.stack_id;
    stack.count = c.count;
    bool has_focus = !focus, has_ignore = false;
    auto add_frame = [&](uint32_t index) {
      stack.frames.push_back(index);
      has_focus |= matches_focus[index] != 0;
      has_ignore |= matches_ignore[index] != 0;
    };
    if (found[k].cached) {
      // The common case, a week's 100,000 stacks of ~20 frames: plain stores, and the focus
      // and ignore tables read only when the query has them.
      const Stack& s = found[k];
      stack.truncated = s.truncated;
      stack.frames.resize(s.size);
      uint32_t* const out = stack.frames.data();
      const uint32_t* const numbers = frames_.data() + s.offset;
      for (uint32_t i = 0; i < s.size; ++i) out[i] = index_of(numbers[i]);
      if (focus || ignore) {
        for (uint32_t i = 0; i < s.size; ++i) {
          has_focus |= matches_focus[out[i]] != 0;
          has_ignore |= matches_ignore[out[i]] != 0;
        }
      }
    } else {
      // Missed in step 1, so fetched in step 2; functions not numbered were fetched too.
      const store::StackFrames& frames = fetched.at(c.stack_id);
      stack.truncated = frames.truncated;
      stack.frames.reserve(frames.function_ids.size());
      for (uint64_t fid : frames.function_ids) {
        if (auto n = function_number_.find(fid); n != function_number_.end()) {
          add_frame(index_of(n->second));
          continue;
        }
        auto [it, inserted] = index_of_uncached.try_emplace(fid, 0);
        if (inserted) {
          const store::FunctionInfo& info = fetched_functions.at(fid);
          it->second = add_function(fid, info.name, info.module, symbolized.contains(fid));
        }
        add_frame(it->second);
      }
    }
    if (!has_focus || has_ignore) {
      profile->stacks.pop_back();
      continue;
    }
    base::SaturatingAddTo(profile->total, c.count);
  }
  profile->functions.reserve(sources.size());
  for (const FunctionSource& f : sources) profile->functions.push_back({f.id, *f.name, *f.module});
  return absl::OkStatus();
}

std::string FrameLabel(const ResolvedFunction& f) {
  std::string label = f.name;
  if (!f.file.empty()) {
    absl::StrAppend(&label, " ", f.file);
    if (f.line != 0) absl::StrAppend(&label, ":", f.line);
  }
  if (f.inlined) label += " [inlined]";
  return label;
}

absl::StatusOr<std::vector<store::ServiceSummary>> ListServices(
    store::Store* store, const aggregate::LiveSamples* live) {
  if (live == nullptr) return store->samples().ListServices();
  // As in ProfileReader::SumSamples: a flush between the two reads would count a window twice.
  absl::StatusOr<std::vector<store::ServiceSummary>> services;
  std::vector<store::ServiceSummary> live_services;
  for (;;) {
    const uint64_t generation = live->FlushGeneration("");
    services = store->samples().ListServices();
    if (!services.ok()) return services;
    live_services = live->LiveServices();
    if (live->FlushGeneration("") == generation) break;
  }
  for (const store::ServiceSummary& l : live_services) {
    auto it = std::find_if(services->begin(), services->end(),
                           [&](const auto& s) { return s.service == l.service; });
    if (it == services->end()) {
      services->push_back(l);
      continue;
    }
    it->first_window_ms = std::min(it->first_window_ms, l.first_window_ms);
    it->last_window_ms = std::max(it->last_window_ms, l.last_window_ms);
    base::SaturatingAddTo(it->total_samples, l.total_samples);
  }
  std::sort(services->begin(), services->end(),
            [](const auto& a, const auto& b) { return a.service < b.service; });
  return services;
}

ProfileReader::ProfileReader(store::Store* store, const aggregate::LiveSamples* live,
                             symbolize::Symbolizer* symbolizer)
    : store_(store), live_(live), resolved_(std::make_unique<Resolved>(symbolizer)) {}

absl::StatusOr<store::SampleTotals> ProfileReader::SumSamples(const store::SampleQuery& query) {
  if (live_ == nullptr || query.capture_id) return store_->samples().SumSamples(query);
  // A window flush between reading the store and reading the tables would count its samples
  // twice (or not at all): retry until no flush happened in between. The live counts go into
  // the store's sum before its stacks are ordered, so a long range's list is merged once.
  for (;;) {
    const uint64_t generation = live_->FlushGeneration(query.service);
    bool current = true;
    auto totals = store_->samples().SumSamples(query, [&](auto* stacks, auto* hosts) {
      current = live_->AddLiveCounts(query, generation, stacks, hosts);
      return current;
    });
    if (current) return totals;
  }
}

ProfileReader::~ProfileReader() = default;

absl::StatusOr<store::SampleQuery> ProfileReader::Prepare(const ProfileQuery& query,
                                                          std::unique_ptr<RE2>* focus_re,
                                                          std::unique_ptr<RE2>* ignore_re) {
  std::unique_ptr<RE2>& focus = *focus_re;
  std::unique_ptr<RE2>& ignore = *ignore_re;
  if (query.service.empty() && query.capture_id.empty()) {
    return absl::InvalidArgumentError("a service is required");
  }
  // (A range that no window starts in is empty, not wrong: ToProfileQuery.)
  if (query.from_ms > query.to_ms) {
    return absl::InvalidArgumentError(
        absl::StrCat("empty time range: from ", query.from_ms, " ms is not before to ",
                     query.to_ms, " ms"));
  }
  for (auto [pattern, re, what] : {std::tuple{&query.focus, &focus, "focus"},
                                   std::tuple{&query.ignore, &ignore, "ignore"}}) {
    if (pattern->empty()) continue;
    *re = std::make_unique<RE2>(*pattern, RE2::Quiet);
    if (!(*re)->ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("invalid --", what, " regex '", *pattern, "': ", (*re)->error()));
    }
  }
  std::optional<labels::Selector> selector;
  if (!query.selector.empty()) {
    auto parsed = labels::Selector::Parse(query.selector);
    if (!parsed.ok()) return parsed.status();
    if (!parsed->empty()) {
      if (!query.capture_id.empty()) {
        return absl::InvalidArgumentError(
            "label selectors apply to continuous profiles, not to captures");
      }
      selector = *std::move(parsed);
    }
  }
  if (query.type != v1::PROFILE_CPU && !query.capture_id.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "captures are CPU profiles; there is no ", commit::ProfileTypeName(query.type),
        " profile of a capture"));
  }
  if (query.capture_id.empty()) {
    auto services = ListServices(store_, live_);
    if (!services.ok()) return services.status();
    bool known = false;
    std::vector<std::string> names;
    for (const auto& s : *services) {
      known |= s.service == query.service;
      names.push_back(s.service);
    }
    if (!known) {
      return absl::NotFoundError(absl::StrCat(
          "unknown service '", query.service, "'",
          names.empty() ? " (no service has reported samples yet)"
                        : absl::StrCat(" (known: ", absl::StrJoin(names, ", "), ")")));
    }
  }

  store::SampleQuery sq;
  sq.service = query.service;
  sq.from_ms = query.from_ms;
  sq.to_ms = query.to_ms;
  sq.resolution = query.resolution;
  if (!query.host.empty()) sq.host = query.host;
  if (!query.capture_id.empty()) sq.capture_id = query.capture_id;
  if (selector || (query.capture_id.empty() && query.type != v1::PROFILE_WALL)) {
    // The selector and the profile type pick label sets; the store and the live tables keep
    // the sets' IDs. A service with one profile type only needs no set filter for it.
    auto sets = store_->interner().ListLabelSets(query.service);
    if (!sets.ok()) return sets.status();
    sq.label_sets.emplace();
    bool all = true;
    for (const store::LabelSetRecord& r : *sets) {
      if (commit::InProfile(r.labels, query.type) && (!selector || selector->Matches(r.labels))) {
        sq.label_sets->insert(r.id);
      } else {
        all = false;
      }
    }
    if (all && !selector) sq.label_sets.reset();
  }
  sq.hosts = query.hosts;
  return sq;
}

absl::StatusOr<std::vector<std::pair<std::string, uint64_t>>> ProfileReader::HostSamples(
    const ProfileQuery& query) {
  std::unique_ptr<RE2> focus, ignore;
  auto sq = Prepare(query, &focus, &ignore);
  if (!sq.ok()) return sq.status();
  sq->hosts_only = true;
  auto totals = SumSamples(*sq);
  if (!totals.ok()) return totals.status();
  std::vector<std::pair<std::string, uint64_t>> out;
  for (size_t i = 0; i < totals->hosts.size(); ++i) {
    out.emplace_back(totals->hosts[i], totals->host_samples[i]);
  }
  return out;
}

absl::StatusOr<v1::SeriesResponse> ProfileReader::Series(const ProfileQuery& query,
                                                        int64_t step_ms,
                                                        const std::string& group_by) {
  std::unique_ptr<RE2> focus, ignore;
  auto sq = Prepare(query, &focus, &ignore);
  if (!sq.ok()) return sq.status();
  // Focus and ignore pick stacks: the range's stacks are resolved once (whole hours from the
  // store's hour aggregates), and the scan keeps the cells of those that passed.
  std::optional<absl::flat_hash_set<uint64_t>> kept;
  if (focus != nullptr || ignore != nullptr) {
    auto totals = SumSamples(*sq);
    if (!totals.ok()) return totals.status();
    Profile matching;
    absl::Status resolved =
        resolved_->Resolve(*store_, totals->stacks, focus.get(), ignore.get(), &matching);
    if (!resolved.ok()) return resolved;
    kept.emplace();
    for (const ResolvedStack& s : matching.stacks) kept->insert(s.stack_id);
  }
  // Label set ID -> its group's value.
  absl::flat_hash_map<uint64_t, std::string> value_of_set;
  const bool by_host = group_by == kSeriesByHost;
  if (!group_by.empty() && !by_host && query.capture_id.empty()) {
    auto sets = store_->interner().ListLabelSets(query.service);
    if (!sets.ok()) return sets.status();
    for (const store::LabelSetRecord& r : *sets) {
      auto it = std::find_if(r.labels.begin(), r.labels.end(),
                             [&](const labels::Label& l) { return l.first == group_by; });
      if (it != r.labels.end()) value_of_set.emplace(r.id, it->second);
    }
  }
  const int64_t from = SeriesIntervalStart(query.from_ms, step_ms);
  const size_t intervals = static_cast<size_t>((query.to_ms - from + step_ms - 1) / step_ms);
  if (!query.capture_id.empty()) {
    sq->resolution = store::Resolution::kRaw;
  } else {
    sq->resolution = SeriesResolution(step_ms);
  }
  std::map<std::string, std::vector<uint64_t>> counts;
  uint64_t total = 0;
  std::vector<uint64_t>* last = nullptr;  // the previous cell's group (cells come in runs)
  const std::string* last_value = nullptr;
  auto add = [&](int64_t window, const std::string& host, uint64_t stack, uint64_t label_set,
                 uint64_t count) {
    if (count == 0 || window < from) return;
    if (kept && !kept->contains(stack)) return;
    const size_t i = static_cast<size_t>((window - from) / step_ms);
    if (i >= intervals) return;
    static const std::string kNone;
    const std::string* value = &kNone;
    if (by_host) {
      value = &host;
    } else if (auto it = value_of_set.find(label_set); it != value_of_set.end()) {
      value = &it->second;
    }
    if (last == nullptr || *last_value != *value) {
      auto [it, added] = counts.try_emplace(*value);
      if (added) it->second.assign(intervals, 0);
      last = &it->second;
      last_value = &it->first;
    }
    base::SaturatingAddTo((*last)[i], count);
    base::SaturatingAddTo(total, count);
  };
  // As in SumSamples: the open windows' counts are added unless a flush moved them into the
  // store meanwhile (then both are read again).
  for (;;) {
    counts.clear();
    total = 0;
    last = nullptr;
    const uint64_t generation = live_ != nullptr ? live_->FlushGeneration(query.service) : 0;
    absl::Status scanned = store_->samples().ScanSamples(
        *sq, [&](const store::SampleKey& key, uint64_t count) {
          add(key.window_start_ms, key.host, key.stack_id, key.label_set, count);
        });
    if (!scanned.ok()) return scanned;
    if (live_ == nullptr || sq->capture_id) break;
    last = nullptr;
    if (live_->ForEachLiveCell(*sq, generation, add)) break;
  }
  v1::SeriesResponse response;
  response.set_from_ms(from);
  response.set_step_ms(step_ms);
  response.set_total_samples(total);
  for (auto& [value, per_interval] : counts) {
    v1::SampleSeries* s = response.add_series();
    s->set_value(value);
    uint64_t sum = 0;
    for (uint64_t c : per_interval) base::SaturatingAddTo(sum, c);
    s->set_total(sum);
    s->mutable_counts()->Add(per_interval.begin(), per_interval.end());
  }
  return response;
}

absl::StatusOr<Profile> ProfileReader::Load(const ProfileQuery& query) {
  std::unique_ptr<RE2> focus, ignore;
  auto sq = Prepare(query, &focus, &ignore);
  if (!sq.ok()) return sq.status();
  // Summed per stack by the store (whole hours come from its per-hour aggregates).
  auto totals = SumSamples(*sq);
  if (!totals.ok()) return totals.status();
  // Resolving in the final order (heaviest first, as the store returns them) makes function
  // indices deterministic and leaves nothing to sort afterwards.
  const std::vector<store::StackCount>& counts = totals->stacks;

  Profile profile;
  profile.hosts = std::move(totals->hosts);
  profile.host_samples = std::move(totals->host_samples);
  profile.stacks.reserve(counts.size());
  absl::Status resolved = resolved_->Resolve(*store_, counts, focus.get(), ignore.get(), &profile);
  if (!resolved.ok()) return resolved;
  if (query.requests && query.capture_id.empty()) {
    std::vector<std::optional<std::string>> hosts;
    if (!query.host.empty()) {
      hosts.emplace_back(query.host);
    } else if (query.hosts) {
      hosts.assign(query.hosts->begin(), query.hosts->end());
    } else {
      hosts.emplace_back(std::nullopt);
    }
    for (const std::optional<std::string>& host : hosts) {
      auto requests = store_->meta().SumRequests(query.service, query.from_ms, query.to_ms, host);
      if (!requests.ok()) return requests.status();
      profile.requests += *requests;
    }
  }
  return profile;
}

}  // namespace strata::server::query
