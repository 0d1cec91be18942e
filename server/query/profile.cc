#include "server/query/profile.h"

#include <algorithm>
#include <memory>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "re2/re2.h"

namespace strata::server {

std::vector<FunctionTotals> TopFunctions(const Profile& profile, bool sort_by_total) {
  std::vector<FunctionTotals> totals(profile.functions.size());
  for (uint32_t i = 0; i < totals.size(); ++i) totals[i].function = i;
  std::vector<uint32_t> seen(profile.functions.size(), UINT32_MAX);
  for (uint32_t s = 0; s < profile.stacks.size(); ++s) {
    const ResolvedStack& stack = profile.stacks[s];
    if (stack.frames.empty()) continue;
    totals[stack.frames.back()].self += stack.count;
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

absl::StatusOr<Profile> ProfileReader::Load(const ProfileQuery& query) {
  if (query.service.empty() && query.capture_id.empty()) {
    return absl::InvalidArgumentError("a service is required");
  }
  if (query.from_ms >= query.to_ms) {
    return absl::InvalidArgumentError(
        absl::StrCat("empty time range: from ", query.from_ms, " ms is not before to ",
                     query.to_ms, " ms"));
  }
  std::unique_ptr<RE2> focus, ignore;
  for (auto [pattern, re, what] : {std::tuple{&query.focus, &focus, "focus"},
                                   std::tuple{&query.ignore, &ignore, "ignore"}}) {
    if (pattern->empty()) continue;
    *re = std::make_unique<RE2>(*pattern, RE2::Quiet);
    if (!(*re)->ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("invalid --", what, " regex '", *pattern, "': ", (*re)->error()));
    }
  }
  if (query.capture_id.empty()) {
    auto services = store_->ListServices();
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
  // Summed per stack by the store (whole hours come from its per-hour aggregates).
  auto totals = store_->SumSamples(sq);
  if (!totals.ok()) return totals.status();
  // Resolving in the final order (heaviest first) makes function indices deterministic and
  // leaves nothing to sort afterwards.
  std::vector<store::StackCount>& counts = totals->stacks;
  std::sort(counts.begin(), counts.end(),
            [](const store::StackCount& a, const store::StackCount& b) {
              return a.count != b.count ? a.count > b.count : a.stack_id < b.stack_id;
            });

  Profile profile;
  profile.hosts = std::move(totals->hosts);
  profile.stacks.reserve(counts.size());
  absl::flat_hash_map<uint64_t, uint32_t> function_index;
  // Per function: does it match focus / ignore (computed once per function).
  std::vector<uint8_t> matches_focus, matches_ignore;
  for (const auto& [stack_id, count] : counts) {
    auto frames = store_->GetStack(stack_id);
    if (!frames.ok()) {
      return absl::DataLossError(absl::StrCat("stack ", stack_id,
                                              " cannot be read: ", frames.status().message()));
    }
    ResolvedStack stack{stack_id, count, frames->truncated, {}};
    stack.frames.reserve(frames->function_ids.size());
    bool has_focus = !focus, has_ignore = false;
    for (uint64_t fid : frames->function_ids) {
      auto [it, inserted] = function_index.try_emplace(fid, profile.functions.size());
      if (inserted) {
        auto info = store_->GetFunction(fid);
        if (!info.ok()) {
          return absl::DataLossError(absl::StrCat("function ", fid,
                                                  " cannot be read: ", info.status().message()));
        }
        profile.functions.push_back({fid, info->name, info->module});
        matches_focus.push_back(focus && RE2::PartialMatch(info->name, *focus));
        matches_ignore.push_back(ignore && RE2::PartialMatch(info->name, *ignore));
      }
      stack.frames.push_back(it->second);
      has_focus |= matches_focus[it->second] != 0;
      has_ignore |= matches_ignore[it->second] != 0;
    }
    if (!has_focus || has_ignore) continue;
    profile.total += count;
    profile.stacks.push_back(std::move(stack));
  }
  return profile;
}

}  // namespace strata::server
