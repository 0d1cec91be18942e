#include "agent/core/leaf_histogram.h"

#include <algorithm>
#include <tuple>
#include <vector>

namespace strata::agent {

void LeafHistogram::TakeInto(const absl::flat_hash_set<uint32_t>& targets,
                             v1::SampleBatch* batch) {
  std::vector<std::pair<Key, uint64_t>> sorted;
  sorted.reserve(counts_.size());
  for (const auto& [key, count] : counts_) {
    if (targets.contains(key.target_id)) sorted.emplace_back(key, count);
  }
  // Erasing one by one keeps the table's capacity (clear() would give it back).
  for (auto it = counts_.begin(); it != counts_.end();) counts_.erase(it++);
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) {
    return std::tie(a.first.target_id, a.first.node, a.first.offset) <
           std::tie(b.first.target_id, b.first.node, b.first.offset);
  });
  v1::LeafAddresses* entry = nullptr;
  uint64_t previous = 0;
  for (const auto& [key, count] : sorted) {
    if (entry == nullptr || entry->target_id() != key.target_id || entry->node() != key.node) {
      entry = batch->add_leaf_addresses();
      entry->set_target_id(key.target_id);
      entry->set_node(key.node);
      previous = 0;
    }
    entry->add_offset_deltas(key.offset - previous);
    entry->add_counts(count);
    previous = key.offset;
  }
}

}  // namespace strata::agent
