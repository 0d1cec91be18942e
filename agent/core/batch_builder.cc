#include "agent/core/batch_builder.h"

namespace strata::agent {

v1::SampleBatch BatchBuilder::Start(const BatchWindow& window, uint64_t epoch,
                                    const TargetDiscovery& targets) {
  v1::SampleBatch batch;
  batch.set_sequence(window.sequence);
  batch.set_epoch(epoch);
  batch.set_start_ms(window.start_ms);
  batch.set_end_ms(window.end_ms);
  for (const v1::Target& t : targets.targets()) *batch.add_targets() = t;
  return batch;
}

absl::StatusOr<std::optional<v1::SampleBatch>> BatchBuilder::Interval(
    IntervalAggregator& aggregator, const BatchWindow& window, TargetDiscovery& targets,
    uint64_t lost_total) {
  if (aggregator.empty()) return std::nullopt;
  auto numbering = graph_->CurrentNumbering();
  if (!numbering.ok()) return numbering.status();
  v1::SampleBatch batch = Start(window, (*numbering)->epoch(), targets);
  batch.set_lost_samples(lost_total - lost_reported_);
  lost_reported_ = lost_total;
  for (v1::Target& t : targets.TakeRetired()) *batch.add_targets() = std::move(t);
  if (auto st = aggregator.EncodeInto(**numbering, &batch); !st.ok()) return st;
  return batch;
}

absl::StatusOr<std::optional<v1::SampleBatch>> BatchBuilder::Capture(
    IntervalAggregator& aggregator, const BatchWindow& window, const TargetDiscovery& targets,
    const std::string& capture_id) {
  if (aggregator.empty()) return std::nullopt;
  auto numbering = graph_->CurrentNumbering();
  if (!numbering.ok()) return numbering.status();
  v1::SampleBatch batch = Start(window, (*numbering)->epoch(), targets);
  batch.set_capture_id(capture_id);
  if (auto st = aggregator.EncodeInto(**numbering, &batch); !st.ok()) return st;
  return batch;
}

}  // namespace strata::agent
