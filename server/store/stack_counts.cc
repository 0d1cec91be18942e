#include "server/store/stack_counts.h"

#include <algorithm>

#include "common/base/parallel_sort.h"
#include "common/base/saturating.h"

namespace strata::server::store {

void SortHeavierFirst(std::vector<StackCount>* stacks) {
  // A lambda, not the function's address: the comparison is inlined.
  auto heavier_first = [](const StackCount& a, const StackCount& b) {
    return HeavierFirst(a, b);
  };
  base::SortOnTwoThreads(stacks->begin(), stacks->end(), heavier_first);
}

std::vector<StackCount> AddToSorted(const std::vector<StackCount>& sorted,
                                    const absl::flat_hash_map<uint64_t, uint64_t>& extra) {
  if (extra.empty()) return sorted;
  // The entries whose count changes leave their place; with the new stacks they are sorted
  // and merged back in.
  absl::flat_hash_map<uint64_t, uint64_t> rest = extra;  // not found in `sorted` yet
  std::vector<StackCount> changed;
  changed.reserve(extra.size());
  std::vector<uint8_t> moved(sorted.size(), 0);
  for (size_t i = 0; i < sorted.size() && !rest.empty(); ++i) {
    auto it = rest.find(sorted[i].stack_id);
    if (it == rest.end()) continue;
    moved[i] = 1;
    changed.push_back({sorted[i].stack_id, base::SaturatingAdd(sorted[i].count, it->second)});
    rest.erase(it);
  }
  for (const auto& [stack_id, count] : rest) changed.push_back({stack_id, count});
  std::sort(changed.begin(), changed.end(),
            [](const StackCount& a, const StackCount& b) { return HeavierFirst(a, b); });
  std::vector<StackCount> out;
  out.reserve(sorted.size() + extra.size());
  size_t j = 0;
  for (size_t i = 0; i < sorted.size(); ++i) {
    if (moved[i]) continue;
    while (j < changed.size() && HeavierFirst(changed[j], sorted[i])) out.push_back(changed[j++]);
    out.push_back(sorted[i]);
  }
  out.insert(out.end(), changed.begin() + j, changed.end());
  return out;
}

}  // namespace strata::server::store
