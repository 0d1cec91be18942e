#include "server/query/diff.h"

#include <algorithm>
#include <cmath>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"

namespace strata::server::query {
namespace {

double Share(uint64_t part, uint64_t total) {
  return total == 0 ? 0.0 : 100.0 * static_cast<double>(part) / static_cast<double>(total);
}

// Final mixer of MurmurHash3 (fmix64): spreads every input bit over the result.
uint64_t Mix(uint64_t h) {
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdULL;
  h ^= h >> 33;
  h *= 0xc4ceb93fe53a87cdULL;
  h ^= h >> 33;
  return h;
}

// Keeps the `limit` largest by `magnitude`, sorted, dropping zero changes.
template <typename T, typename F>
void KeepLargest(std::vector<T>* rows, size_t limit, F magnitude) {
  std::erase_if(*rows, [&](const T& r) { return magnitude(r) == 0; });
  auto cmp = [&](const T& a, const T& b) { return magnitude(a) > magnitude(b); };
  if (rows->size() > limit) {
    std::nth_element(rows->begin(), rows->begin() + limit, rows->end(), cmp);
    rows->resize(limit);
  }
  std::stable_sort(rows->begin(), rows->end(), cmp);
}

}  // namespace

std::vector<uint32_t> FunctionMatcher::RowsOf(const Profile& profile) {
  std::vector<uint32_t> rows(profile.functions.size());
  for (size_t i = 0; i < profile.functions.size(); ++i) {
    const ResolvedFunction& f = profile.functions[i];
    auto it = rows_.find(std::pair<std::string_view, base::ModuleIdentity>(
        f.name, base::IdentityOf(f.module)));
    if (it == rows_.end()) {
      const ResolvedFunction& kept = functions_.emplace_back(f);
      it = rows_.emplace(std::pair<std::string_view, base::ModuleIdentity>(
                             kept.name, base::IdentityOf(kept.module)),
                         static_cast<uint32_t>(functions_.size() - 1))
               .first;
    }
    rows[i] = it->second;
  }
  return rows;
}

ProfileDiff DiffProfiles(const Profile& base, const Profile& current, size_t limit) {
  ProfileDiff diff;
  diff.base_total = base.total;
  diff.total = current.total;

  // A dense key per (name, module) over both profiles: rows of the function table, and the
  // alphabet of path keys (so path keys stay short).
  FunctionMatcher matcher;
  const std::vector<uint32_t> base_ids = matcher.RowsOf(base);
  const std::vector<uint32_t> current_ids = matcher.RowsOf(current);
  // Ranked as rows of counts; only the rows returned copy their function.
  struct FunctionRow {
    uint32_t row;
    uint64_t base_self = 0, self = 0;
    uint64_t base_total = 0, total = 0;
    double self_delta_pct = 0, total_delta_pct = 0;
  };
  std::vector<FunctionRow> function_rows(matcher.functions().size());
  for (size_t i = 0; i < function_rows.size(); ++i) {
    function_rows[i].row = static_cast<uint32_t>(i);
  }

  auto add_functions = [&](const Profile& p, const std::vector<uint32_t>& ids, bool is_base) {
    for (const FunctionTotals& t : TopFunctions(p, false)) {
      FunctionRow& row = function_rows[ids[t.function]];
      (is_base ? row.base_self : row.self) += t.self;
      (is_base ? row.base_total : row.total) += t.total;
    }
  };
  add_functions(base, base_ids, true);
  add_functions(current, current_ids, false);

  // Paths are materialized (frames copied) only for the rows that are returned.
  struct PathRow {
    const Profile* profile;
    uint32_t stack;
    uint64_t base_samples = 0, samples = 0;
    double delta_pct = 0;
  };
  // A path is its truncated flag and the rows of its frames. Stacks of both profiles are
  // grouped by a hash of that sequence by sorting (sequential memory, unlike a hash table
  // of this size) and compared frame by frame within a hash group. Rows keep the order of
  // each path's first occurrence (base stacks, then current ones), which ranking ties
  // depend on.
  const size_t nb = base.stacks.size(), nc = current.stacks.size();
  auto stack_at = [&](uint64_t pos) -> const ResolvedStack& {
    return pos < nb ? base.stacks[pos] : current.stacks[pos - nb];
  };
  auto ids_at = [&](uint64_t pos) -> const std::vector<uint32_t>& {
    return pos < nb ? base_ids : current_ids;
  };
  struct Keyed {
    uint64_t hash;
    uint64_t pos;    // base stack index, or nb + current stack index
    uint64_t count;  // copied here: reading it through the stack is a cache miss
  };
  std::vector<Keyed> keyed(nb + nc);
  for (uint64_t pos = 0; pos < nb + nc; ++pos) {
    const ResolvedStack& s = stack_at(pos);
    const std::vector<uint32_t>& ids = ids_at(pos);
    uint64_t hash = s.truncated ? 0x51ed270b27u : 0x2545f4914fu;
    for (uint32_t f : s.frames) hash = Mix(hash + ids[f]);
    keyed[pos] = {hash, pos, s.count};
  }
  std::sort(keyed.begin(), keyed.end(), [](const Keyed& a, const Keyed& b) {
    return a.hash != b.hash ? a.hash < b.hash : a.pos < b.pos;
  });
  auto same_path = [&](uint64_t a, uint64_t b) {
    const ResolvedStack& sa = stack_at(a);
    const ResolvedStack& sb = stack_at(b);
    if (sa.truncated != sb.truncated || sa.frames.size() != sb.frames.size()) return false;
    const std::vector<uint32_t>& ia = ids_at(a);
    const std::vector<uint32_t>& ib = ids_at(b);
    for (size_t i = 0; i < sa.frames.size(); ++i) {
      if (ia[sa.frames[i]] != ib[sb.frames[i]]) return false;
    }
    return true;
  };
  struct FirstRow {
    uint64_t first_pos;
    uint64_t base_samples = 0, samples = 0;
  };
  std::vector<FirstRow> firsts;
  firsts.reserve(nb + nc);
  for (size_t g = 0; g < keyed.size();) {
    size_t end = g + 1;
    while (end < keyed.size() && keyed[end].hash == keyed[g].hash) ++end;
    // Distinct paths within one hash group (almost always one); positions ascend, so each
    // class's first member is the path's first occurrence.
    const size_t group_rows = firsts.size();
    for (size_t k = g; k < end; ++k) {
      const uint64_t pos = keyed[k].pos;
      size_t row = firsts.size();
      for (size_t r = group_rows; r < firsts.size(); ++r) {
        // Frames are compared only within a hash group: one pair per path in both profiles.
        if (same_path(firsts[r].first_pos, pos)) {
          row = r;
          break;
        }
      }
      if (row == firsts.size()) firsts.push_back({pos});
      (pos < nb ? firsts[row].base_samples : firsts[row].samples) += keyed[k].count;
    }
    g = end;
  }
  std::sort(firsts.begin(), firsts.end(),
            [](const FirstRow& a, const FirstRow& b) { return a.first_pos < b.first_pos; });
  std::vector<PathRow> path_rows;
  path_rows.reserve(firsts.size());
  for (const FirstRow& f : firsts) {
    const bool in_base = f.first_pos < nb;
    path_rows.push_back({in_base ? &base : &current,
                         static_cast<uint32_t>(in_base ? f.first_pos : f.first_pos - nb),
                         f.base_samples, f.samples});
  }
  for (PathRow& row : path_rows) {
    row.delta_pct = Share(row.samples, current.total) - Share(row.base_samples, base.total);
  }
  KeepLargest(&path_rows, limit, [](const PathRow& r) { return std::abs(r.delta_pct); });
  for (const PathRow& row : path_rows) {
    const ResolvedStack& s = row.profile->stacks[row.stack];
    PathChange change;
    change.truncated = s.truncated;
    change.frames.reserve(s.frames.size());
    for (uint32_t f : s.frames) change.frames.push_back(row.profile->functions[f]);
    change.base_samples = row.base_samples;
    change.samples = row.samples;
    change.delta_pct = row.delta_pct;
    diff.paths.push_back(std::move(change));
  }

  for (FunctionRow& row : function_rows) {
    row.self_delta_pct = Share(row.self, current.total) - Share(row.base_self, base.total);
    row.total_delta_pct = Share(row.total, current.total) - Share(row.base_total, base.total);
  }
  // Ties on self (e.g. callers without self samples) are broken by the total change.
  KeepLargest(&function_rows, limit, [](const FunctionRow& r) {
    return std::abs(r.self_delta_pct) * 1e6 + std::abs(r.total_delta_pct);
  });
  diff.functions.reserve(function_rows.size());
  for (const FunctionRow& r : function_rows) {
    diff.functions.push_back({matcher.functions()[r.row], r.base_self, r.self, r.base_total,
                              r.total, r.self_delta_pct, r.total_delta_pct});
  }
  return diff;
}

}  // namespace strata::server::query
