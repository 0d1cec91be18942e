// Per-interval aggregation of the agent's samples: (target, calling context as edge IDs) ->
// count, encoded once per distinct context when the interval is shipped (dynamic PCCE against
// the graph's epoch at that moment) and packed into SampleBatch.packed_contexts.
//
// Counting runs on the bounded sorted hash table (common/table/sorted_table.h): its key is a
// 64-bit hash of (target, edge path); the path itself is kept once in a side store (an arena
// of edge IDs plus a hash -> record index). Every Add compares the stored path, so two
// contexts whose hashes collide never share a count: the later one takes the next free key
// (hash + 1, + 2, ...). Memory is bounded by `max_contexts` and `max_path_edges`; when either
// bound is reached Add() returns false and the owner ships an early batch. The table starts
// small and doubles as an interval's distinct contexts need it (kept for later intervals):
// each Add touches one random slot of it, and a table of the bound's size (2 MB) costs a
// cache and TLB miss per sample and a walk of every slot per shipment. Adds that arrive
// after that and before the owner ships (at most one sampler drain) go to a small spill map,
// so no sample is ever dropped: the counts shipped always sum to the counts added.
//
// Owned and used by the profiling thread only.
#ifndef STRATA_AGENT_CORE_INTERVAL_AGGREGATOR_H_
#define STRATA_AGENT_CORE_INTERVAL_AGGREGATOR_H_

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/encoding/numbering.h"
#include "common/table/sorted_table.h"
#include "strata/v1/ingest.pb.h"

namespace strata::agent {

struct IntervalAggregatorOptions {
  // Distinct contexts per batch (the table's max_entries).
  size_t max_contexts = 1 << 16;
  // Edge IDs kept for those contexts' paths; 0 = 64 per context.
  size_t max_path_edges = 0;
  // Context hash; tests inject a colliding one. Empty = absl::Hash of (target, edges).
  std::function<uint64_t(uint32_t target_id, std::span<const encoding::EdgeId> edges)> hash =
      nullptr;
};

class IntervalAggregator {
 public:
  explicit IntervalAggregator(size_t max_contexts = 1 << 16);
  explicit IntervalAggregator(IntervalAggregatorOptions options);

  // Adds `count` samples of the context (always counted). Returns false when a bound is
  // reached (ship now).
  bool Add(uint32_t target_id, std::span<const encoding::EdgeId> edges, uint64_t count);

  size_t distinct_contexts() const { return records_.size() + spill_.size(); }
  uint64_t samples() const { return samples_; }
  bool empty() const { return samples_ == 0; }
  // True once a bound was reached in this interval.
  bool full() const { return full_; }
  // Whether any context counted since the last encode is of `target_id`.
  bool References(uint32_t target_id) const;
  // Contexts that took a key other than their hash (hash collisions), since construction.
  uint64_t collisions() const { return collisions_; }
  table::TableStats table_stats() const { return table_.stats(); }

  // Encodes every context against `numbering` into `batch->packed_contexts` and clears the
  // aggregator. Contexts whose edges lie beyond the numbering's epoch are an internal error
  // (the aggregator is left unchanged).
  absl::Status EncodeInto(const encoding::Numbering& numbering, v1::SampleBatch* batch);
  // EncodeInto with every count replaced by `scale(count)`; contexts it maps to 0 are left
  // out. Returns the number of contexts encoded.
  absl::StatusOr<size_t> EncodeScaledInto(const encoding::Numbering& numbering,
                                          v1::SampleBatch* batch,
                                          absl::FunctionRef<uint64_t(uint64_t)> scale);

 private:
  struct Record {
    uint32_t target_id;
    uint32_t num_edges;
    size_t offset;  // into edges_
  };
  std::span<const encoding::EdgeId> PathOf(const Record& r) const {
    return {edges_.data() + r.offset, r.num_edges};
  }
  void Clear();
  // Doubles the table, up to max_contexts. False at the bound (or if the table refuses).
  bool GrowTable();

  IntervalAggregatorOptions options_;
  table::SortedTable<uint64_t> table_;
  // Side store: key -> index into records_ (for keys in table_), and the paths.
  absl::flat_hash_map<uint64_t, uint32_t> key_index_;
  std::vector<Record> records_;
  std::vector<encoding::EdgeId> edges_;
  // Contexts added after a bound was reached. Key: target ID (4 bytes) then the edge IDs.
  absl::flat_hash_map<std::string, uint64_t> spill_;
  uint64_t samples_ = 0;
  uint64_t collisions_ = 0;
  bool full_ = false;
};

}  // namespace strata::agent

#endif  // STRATA_AGENT_CORE_INTERVAL_AGGREGATOR_H_
