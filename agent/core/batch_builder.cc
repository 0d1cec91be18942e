#include "agent/core/batch_builder.h"

#include <algorithm>
#include <utility>

namespace strata::agent {

uint64_t OffCpuPeriods(uint64_t ns, uint32_t frequency_hz, uint64_t random) {
  const unsigned __int128 scaled = static_cast<unsigned __int128>(ns) * frequency_hz;
  uint64_t whole = static_cast<uint64_t>(scaled / 1'000'000'000u);
  const uint64_t fraction = static_cast<uint64_t>(scaled % 1'000'000'000u);
  if (random < fraction) ++whole;
  return std::min<uint64_t>(whole, UINT32_MAX);
}

v1::SampleBatch BatchBuilder::Start(const BatchWindow& window, uint64_t epoch,
                                    const TargetDiscovery& targets) {
  v1::SampleBatch batch;
  batch.set_sequence(window.sequence);
  batch.set_epoch(epoch);
  batch.set_start_ms(window.start_ms);
  batch.set_end_ms(window.end_ms);
  for (v1::Target& t : targets.targets()) *batch.add_targets() = std::move(t);
  for (const v1::Target& t : targets.retired()) *batch.add_targets() = t;
  return batch;
}

absl::StatusOr<std::optional<v1::SampleBatch>> BatchBuilder::Interval(
    IntervalAggregator& aggregator, const BatchWindow& window, const TargetDiscovery& targets,
    uint64_t lost_total) {
  if (aggregator.empty()) return std::nullopt;
  auto numbering = graph_->CurrentNumbering();
  if (!numbering.ok()) return numbering.status();
  v1::SampleBatch batch = Start(window, (*numbering)->epoch(), targets);
  batch.set_lost_samples(lost_total - lost_reported_);
  lost_reported_ = lost_total;
  if (auto st = aggregator.EncodeInto(**numbering, &batch); !st.ok()) return st;
  return batch;
}

absl::StatusOr<std::optional<v1::SampleBatch>> BatchBuilder::OffCpu(
    IntervalAggregator& aggregator, const BatchWindow& window, const TargetDiscovery& targets,
    uint32_t frequency_hz) {
  if (aggregator.empty()) return std::nullopt;
  auto numbering = graph_->CurrentNumbering();
  if (!numbering.ok()) return numbering.status();
  v1::SampleBatch batch = Start(window, (*numbering)->epoch(), targets);
  batch.set_profile(v1::PROFILE_OFF_CPU);
  auto next_random = [this] {
    uint64_t z = (rounding_state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  };
  auto periods = [&](uint64_t ns) {
    return OffCpuPeriods(ns, frequency_hz, next_random() % 1'000'000'000u);
  };
  absl::StatusOr<size_t> encoded = aggregator.EncodeScaledInto(**numbering, &batch, periods);
  if (!encoded.ok()) return encoded.status();
  if (*encoded == 0) return std::nullopt;
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
