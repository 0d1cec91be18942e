// Where the user leaf frames of an interval's continuous CPU samples were: (target, leaf
// function node, instruction offset in its module) -> samples. Shipped with the interval's
// batch as SampleBatch.leaf_addresses, so the server can attribute samples to source lines
// and inlined functions without a per-context address (which would split every context).
//
// Bounded by `max_entries`: addresses past it are not kept (dropped() counts their samples),
// so a leaf histogram never costs more than its bound. Add allocates only while the map grows
// to its interval's size; taking keeps the capacity for the next interval.
//
// Owned and used by the profiling thread only.
#ifndef STRATA_AGENT_CORE_LEAF_HISTOGRAM_H_
#define STRATA_AGENT_CORE_LEAF_HISTOGRAM_H_

#include <cstdint>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "common/encoding/graph.h"
#include "strata/v1/ingest.pb.h"

namespace strata::agent {

class LeafHistogram {
 public:
  explicit LeafHistogram(size_t max_entries = 1 << 16) : max_entries_(max_entries) {}

  void Add(uint32_t target_id, encoding::NodeId node, uint64_t offset) {
    const Key key{target_id, node, offset};
    auto it = counts_.find(key);
    if (it != counts_.end()) {
      ++it->second;
    } else if (counts_.size() < max_entries_) {
      counts_.emplace(key, 1);
    } else {
      ++dropped_;
    }
  }

  // Appends the counts of targets in `targets` to `batch->leaf_addresses` (sorted by target,
  // node and offset; offsets delta-encoded) and clears the histogram, other targets' too.
  void TakeInto(const absl::flat_hash_set<uint32_t>& targets, v1::SampleBatch* batch);

  size_t size() const { return counts_.size(); }
  uint64_t dropped() const { return dropped_; }

 private:
  struct Key {
    uint32_t target_id;
    encoding::NodeId node;
    uint64_t offset;
    bool operator==(const Key&) const = default;
    template <typename H>
    friend H AbslHashValue(H h, const Key& k) {
      return H::combine(std::move(h), k.target_id, k.node, k.offset);
    }
  };

  const size_t max_entries_;
  absl::flat_hash_map<Key, uint64_t> counts_;
  uint64_t dropped_ = 0;
};

}  // namespace strata::agent

#endif  // STRATA_AGENT_CORE_LEAF_HISTOGRAM_H_
