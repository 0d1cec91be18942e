#include "agent/core/interval_aggregator.h"

#include <cstring>
#include <vector>

namespace strata::agent {

bool IntervalAggregator::Add(uint32_t target_id, std::span<const encoding::EdgeId> edges,
                             uint64_t count) {
  std::string key(4 + 8 * edges.size(), '\0');
  std::memcpy(key.data(), &target_id, 4);
  std::memcpy(key.data() + 4, edges.data(), 8 * edges.size());
  counts_[key] += count;
  samples_ += count;
  return counts_.size() < max_contexts_;
}

absl::Status IntervalAggregator::EncodeInto(const encoding::Numbering& numbering,
                                            v1::SampleBatch* batch) {
  encoding::Encoder encoder(numbering);
  encoding::EncodedContext encoded;
  std::vector<encoding::EdgeId> edges;
  for (const auto& [key, count] : counts_) {
    uint32_t target_id;
    std::memcpy(&target_id, key.data(), 4);
    edges.resize((key.size() - 4) / 8);
    std::memcpy(edges.data(), key.data() + 4, 8 * edges.size());
    if (auto st = encoder.EncodeInto(edges, &encoded); !st.ok()) return st;
    auto* c = batch->add_contexts();
    c->set_target_id(target_id);
    c->set_leaf(encoded.leaf);
    for (uint64_t id : encoded.ids) c->add_ids(id);
    c->set_count(count);
  }
  counts_.clear();
  samples_ = 0;
  return absl::OkStatus();
}

}  // namespace strata::agent
