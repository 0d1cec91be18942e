#include "server/query/diff.h"

#include <algorithm>
#include <cmath>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"

namespace strata::server {
namespace {

double Share(uint64_t part, uint64_t total) {
  return total == 0 ? 0.0 : 100.0 * static_cast<double>(part) / static_cast<double>(total);
}

std::string FunctionKey(const ResolvedFunction& f) {
  std::string key = f.name;
  key.push_back('\0');
  key += f.module;
  return key;
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

// A stack of a profile seen through that profile's function rows (`ids`, shared by both
// profiles of a diff), with the hash of its path.
struct PathRef {
  const ResolvedStack* stack;
  const std::vector<uint32_t>* ids;
  uint64_t hash;
};
struct PathRefHash {
  size_t operator()(const PathRef& r) const { return r.hash; }
};
struct PathRefEq {
  bool operator()(const PathRef& a, const PathRef& b) const {
    if (a.hash != b.hash || a.stack->truncated != b.stack->truncated ||
        a.stack->frames.size() != b.stack->frames.size()) {
      return false;
    }
    for (size_t i = 0; i < a.stack->frames.size(); ++i) {
      if ((*a.ids)[a.stack->frames[i]] != (*b.ids)[b.stack->frames[i]]) return false;
    }
    return true;
  }
};

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

ProfileDiff DiffProfiles(const Profile& base, const Profile& current, size_t limit) {
  ProfileDiff diff;
  diff.base_total = base.total;
  diff.total = current.total;

  // A dense key per (name, module) over both profiles: rows of the function table, and the
  // alphabet of path keys (so path keys stay short).
  absl::flat_hash_map<std::string, uint32_t> function_row;
  auto global_ids = [&](const Profile& p) {
    std::vector<uint32_t> ids(p.functions.size());
    for (size_t i = 0; i < p.functions.size(); ++i) {
      auto [it, inserted] = function_row.try_emplace(FunctionKey(p.functions[i]),
                                                     diff.functions.size());
      if (inserted) diff.functions.push_back({p.functions[i]});
      ids[i] = it->second;
    }
    return ids;
  };
  const std::vector<uint32_t> base_ids = global_ids(base);
  const std::vector<uint32_t> current_ids = global_ids(current);

  auto add_functions = [&](const Profile& p, const std::vector<uint32_t>& ids, bool is_base) {
    for (const FunctionTotals& t : TopFunctions(p, false)) {
      FunctionChange& row = diff.functions[ids[t.function]];
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
  std::vector<PathRow> path_rows;
  // A path is its truncated flag and the rows of its frames. The table is keyed by a hash of
  // that sequence and compares frame by frame on a hash match, so no key is materialized.
  absl::flat_hash_map<PathRef, size_t, PathRefHash, PathRefEq> path_row;
  auto add_paths = [&](const Profile& p, const std::vector<uint32_t>& ids, bool is_base) {
    path_row.reserve(path_row.size() + p.stacks.size());
    for (uint32_t i = 0; i < p.stacks.size(); ++i) {
      const ResolvedStack& s = p.stacks[i];
      uint64_t hash = s.truncated ? 0x51ed270b27u : 0x2545f4914fu;
      for (uint32_t f : s.frames) hash = Mix(hash + ids[f]);
      auto [it, inserted] = path_row.try_emplace(PathRef{&s, &ids, hash}, path_rows.size());
      if (inserted) path_rows.push_back({&p, i});
      (is_base ? path_rows[it->second].base_samples : path_rows[it->second].samples) += s.count;
    }
  };
  add_paths(base, base_ids, true);
  add_paths(current, current_ids, false);
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

  for (FunctionChange& row : diff.functions) {
    row.self_delta_pct = Share(row.self, current.total) - Share(row.base_self, base.total);
    row.total_delta_pct = Share(row.total, current.total) - Share(row.base_total, base.total);
  }
  // Ties on self (e.g. callers without self samples) are broken by the total change.
  KeepLargest(&diff.functions, limit, [](const FunctionChange& r) {
    return std::abs(r.self_delta_pct) * 1e6 + std::abs(r.total_delta_pct);
  });
  return diff;
}

}  // namespace strata::server
