// The batch builder: turns an aggregator's counts into an encoded v1::SampleBatch against the
// graph's current numbering, with the targets the batch names (current ones, and those gone
// whose samples may still be in an aggregator) and the samples lost since then.
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

// Off-CPU nanoseconds in sampling periods of `frequency_hz`: the whole periods, plus one more
// when `random` (uniform below 1e9) falls under the fraction's share of 1e9; at most 2^32 - 1.
uint64_t OffCpuPeriods(uint64_t ns, uint32_t frequency_hz, uint64_t random);

class BatchBuilder {
 public:
  explicit BatchBuilder(ContextGraph* graph) : graph_(graph) {}

  // Continuous profiling's interval (nullopt when it has no samples; the aggregator is
  // cleared otherwise). `lost_total`: samples lost since the agent started.
  absl::StatusOr<std::optional<v1::SampleBatch>> Interval(IntervalAggregator& aggregator,
                                                          const BatchWindow& window,
                                                          const TargetDiscovery& targets,
                                                          uint64_t lost_total);
  // The interval's off-CPU time (nanoseconds per context in `aggregator`) as a PROFILE_OFF_CPU
  // batch in sampling periods of `frequency_hz`: t ns count t * f / 1e9 samples, rounded up or
  // down at random in proportion to the fraction, so that sums stay unbiased however short
  // each context's time (nullopt when nothing rounds to a sample; the aggregator is cleared).
  absl::StatusOr<std::optional<v1::SampleBatch>> OffCpu(IntervalAggregator& aggregator,
                                                        const BatchWindow& window,
                                                        const TargetDiscovery& targets,
                                                        uint32_t frequency_hz);
  // A capture's samples since its last batch, tagged with `capture_id`.
  absl::StatusOr<std::optional<v1::SampleBatch>> Capture(IntervalAggregator& aggregator,
                                                         const BatchWindow& window,
                                                         const TargetDiscovery& targets,
                                                         const std::string& capture_id);

 private:
  // The batch's header, and its targets: the current and the retired ones.
  static v1::SampleBatch Start(const BatchWindow& window, uint64_t epoch,
                               const TargetDiscovery& targets);

  ContextGraph* const graph_;
  uint64_t lost_reported_ = 0;
  uint64_t rounding_state_ = 0x9e3779b97f4a7c15ull;  // splitmix64, for OffCpu's rounding
};

}  // namespace strata::agent

#endif  // STRATA_AGENT_CORE_BATCH_BUILDER_H_
