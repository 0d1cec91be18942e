// Per-interval aggregation of the agent's samples: (target, calling context as edge IDs) ->
// count, encoded once per distinct context when the interval is shipped (dynamic PCCE against
// the graph's epoch at that moment). Memory is bounded by `max_contexts`: when Add() reports
// the bound, the owner ships an early batch.
//
// Owned and used by the profiling thread only.
#ifndef STRATA_AGENT_CORE_INTERVAL_AGGREGATOR_H_
#define STRATA_AGENT_CORE_INTERVAL_AGGREGATOR_H_

#include <cstdint>
#include <span>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "common/encoding/numbering.h"
#include "strata/v1/ingest.pb.h"

namespace strata::agent {

class IntervalAggregator {
 public:
  explicit IntervalAggregator(size_t max_contexts = 1 << 16) : max_contexts_(max_contexts) {}

  // Adds `count` samples of the context. Returns false when the aggregator holds
  // `max_contexts` distinct contexts afterwards (ship now).
  bool Add(uint32_t target_id, std::span<const encoding::EdgeId> edges, uint64_t count);

  size_t distinct_contexts() const { return counts_.size(); }
  uint64_t samples() const { return samples_; }
  bool empty() const { return counts_.empty(); }

  // Encodes every context against `numbering` into `batch->contexts` and clears the
  // aggregator. Contexts whose edges lie beyond the numbering's epoch are an internal error.
  absl::Status EncodeInto(const encoding::Numbering& numbering, v1::SampleBatch* batch);

 private:
  size_t max_contexts_;
  // Key: target ID (4 bytes) followed by the edge IDs (8 bytes each), native byte order.
  absl::flat_hash_map<std::string, uint64_t> counts_;
  uint64_t samples_ = 0;
};

}  // namespace strata::agent

#endif  // STRATA_AGENT_CORE_INTERVAL_AGGREGATOR_H_
