#include "agent/core/interval_loop.h"

#include <algorithm>

#include "absl/time/clock.h"
#include "common/base/log.h"

namespace strata::agent {

IntervalLoop::IntervalLoop(absl::Duration interval, uint64_t last_sequence, Profiler* profiler,
                           Shipper* shipper, CaptureController* captures)
    : interval_(interval),
      profiler_(profiler),
      shipper_(shipper),
      captures_(captures),
      sequence_(last_sequence) {}

WindowPlan PlanWindow(absl::Time now, std::chrono::steady_clock::time_point steady_now,
                      absl::Duration interval) {
  const int64_t ms = std::max<int64_t>(1, absl::ToInt64Milliseconds(interval));
  WindowPlan plan;
  plan.end = absl::FromUnixMillis((absl::ToUnixMillis(now + kWindowSlack) / ms + 1) * ms);
  // Nanoseconds: whole milliseconds would round the wait down, waking before the end.
  plan.deadline = steady_now + absl::ToChronoNanoseconds(plan.end - now);
  return plan;
}

void IntervalLoop::Plan(absl::Time now) {
  const WindowPlan plan = PlanWindow(now, std::chrono::steady_clock::now(), interval_);
  window_end_ = plan.end;
  window_deadline_ = plan.deadline;
}

void IntervalLoop::Ship(absl::StatusOr<std::optional<v1::SampleBatch>> batch, const char* what,
                        uint64_t* batches, uint64_t* bytes) {
  if (!batch.ok()) {
    LogError("building {} batch: {}", what, batch.status().ToString());
    return;
  }
  if (!batch->has_value()) return;
  ++sequence_;
  ++*batches;
  *bytes += (*batch)->ByteSizeLong();
  shipper_->Enqueue(std::move(**batch));
}

void IntervalLoop::ShipWindow(absl::Time end) {
  // After the clock went back, the window starts no later than it ends.
  const int64_t start_ms = absl::ToUnixMillis(std::min(window_start_, end));
  const int64_t end_ms = absl::ToUnixMillis(end);
  absl::StatusOr<std::optional<v1::SampleBatch>> cpu =
      profiler_->TakeBatch(start_ms, end_ms, sequence_ + 1);
  if (cpu.ok() && cpu->has_value()) AddRequests(&**cpu);
  Ship(std::move(cpu), "cpu", &shipped_.cpu_batches, &shipped_.cpu_bytes);
  Ship(profiler_->TakeOffCpuBatch(start_ms, end_ms, sequence_ + 1), "off-CPU",
       &shipped_.off_cpu_batches, &shipped_.off_cpu_bytes);
  profiler_->DropRetiredTargets();
  window_start_ = end;
}

void IntervalLoop::AddRequests(v1::SampleBatch* batch) {
  std::vector<std::string> services;
  for (const v1::Target& t : batch->targets()) services.push_back(t.service());
  for (size_t i = 0; i < scrapers_.size(); ++i) {
    requests::RequestsScraper* scraper = scrapers_[i];
    const std::string service = requests::ServiceOfCount(scraper->source(), services);
    // Taken even when it belongs to no one service: kept for a later batch, it would count
    // this window's requests in that one's.
    const uint64_t requests = scraper->TakeRequests();
    if (requests == 0) continue;
    if (!service.empty()) {
      (*batch->mutable_requests())[service] += requests;
    } else if (services.size() > 1 && !requests_unattributed_warned_[i]) {
      requests_unattributed_warned_[i] = true;
      LogWarn("requests metric {}: this agent profiles several services, and the metric names "
              "none: its counts are dropped while they run (give SERVICE= in --requests-metric)",
              scraper->source().name);
    }
  }
}

void IntervalLoop::Run(const std::atomic<bool>& stop) {
  window_start_ = absl::Now();
  Plan(window_start_);
  while (!stop.load()) {
    // Between boundaries the profiler sleeps until samples or process changes arrive; while
    // a capture runs, its batches go out every second.
    const absl::Duration max_wait =
        captures_->running() > 0 ? absl::Milliseconds(50) : absl::InfiniteDuration();
    auto st = profiler_->Poll(std::min(
        max_wait, absl::FromChrono(window_deadline_ - std::chrono::steady_clock::now())));
    if (!st.ok()) LogWarn("sampling: {}", st.ToString());
    if (profiler_->targets_generation() != targets_generation_) {
      targets_generation_ = profiler_->targets_generation();
      shipper_->SetTargets(profiler_->targets());
    }
    const absl::Time now = absl::Now();
    captures_->Tick(now, &sequence_);
    if (now >= window_end_ || std::chrono::steady_clock::now() >= window_deadline_ ||
        profiler_->batch_full()) {
      // The window goes out below, as at a stop.
      if (captures_->running() == 0 && shipper_->NewGraphDue()) {
        new_graph_due_ = true;
        break;
      }
      ShipWindow(now);
      Plan(now);
    }
  }
  captures_->StopAll(absl::Now(), &sequence_);
  ShipWindow(absl::Now());
}

}  // namespace strata::agent
