// The batch builder: turns an aggregator's counts into an encoded v1::SampleBatch against the
// graph's current numbering, with the targets the batch names (current ones, and for
// continuous profiling those gone since the last batch) and the samples lost since then.
// Borrows the graph, the aggregators and the targets; owns only the lost-samples mark.
#ifndef STRATA_AGENT_CORE_BATCH_BUILDER_H_
#define STRATA_AGENT_CORE_BATCH_BUILDER_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "agent/core/context_graph.h"
#include "agent/core/interval_aggregator.h"
#include "agent/core/targets.h"
#include "strata/v1/ingest.pb.h"

namespace strata::agent {

struct BatchWindow {
  int64_t start_ms = 0;
  int64_t end_ms = 0;
  uint64_t sequence = 0;  // only used when a batch is returned
};

class BatchBuilder {
 public:
  explicit BatchBuilder(ContextGraph* graph) : graph_(graph) {}

  // Continuous profiling's interval (nullopt when it has no samples; the aggregator is
  // cleared otherwise). `lost_total`: samples lost since the agent started.
  absl::StatusOr<std::optional<v1::SampleBatch>> Interval(IntervalAggregator& aggregator,
                                                          const BatchWindow& window,
                                                          TargetDiscovery& targets,
                                                          uint64_t lost_total);
  // A capture's samples since its last batch, tagged with `capture_id`.
  absl::StatusOr<std::optional<v1::SampleBatch>> Capture(IntervalAggregator& aggregator,
                                                         const BatchWindow& window,
                                                         const TargetDiscovery& targets,
                                                         const std::string& capture_id);

 private:
  // The batch's header and current targets.
  static v1::SampleBatch Start(const BatchWindow& window, uint64_t epoch,
                               const TargetDiscovery& targets);

  ContextGraph* const graph_;
  uint64_t lost_reported_ = 0;
};

}  // namespace strata::agent

#endif  // STRATA_AGENT_CORE_BATCH_BUILDER_H_
