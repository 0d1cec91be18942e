// The agent's main loop: polls the Profiler, hands the shipper the current targets, lets the
// CaptureController run captures, and ships continuous profiling's batch at every interval
// boundary (or early, when the interval's aggregator is full). Borrows all three; owns the
// window and the batch sequence numbers.
//
// Boundaries follow the wall clock (multiples of the interval, so agents' windows line up);
// the wait for one follows the monotonic clock: a wall clock stepped back an hour must not
// hold an hour of samples in the agent (one stepped forward ships at once).
#ifndef STRATA_AGENT_CORE_INTERVAL_LOOP_H_
#define STRATA_AGENT_CORE_INTERVAL_LOOP_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <vector>

#include "absl/time/time.h"
#include "agent/core/capture_controller.h"
#include "agent/core/profiler.h"
#include "agent/core/shipper.h"
#include "agent/requests/requests_metric.h"

namespace strata::agent {

// What the loop shipped, by profile type: batches and their encoded bytes.
struct ShippedBatches {
  uint64_t cpu_batches = 0;
  uint64_t cpu_bytes = 0;
  uint64_t off_cpu_batches = 0;
  uint64_t off_cpu_bytes = 0;
};

// Where the window that is open at `now` ends, and when, on the monotonic clock read at the
// same moment, to wait until. The end is the first multiple of `interval` (since the epoch) at
// least kWindowSlack after `now`: a loop woken a hair before a boundary (the two clocks drift
// apart by parts per million) ships that window and waits for the next boundary, instead of
// planning the same one again and spinning until the wall clock passes it. The deadline is
// never earlier than the end.
struct WindowPlan {
  absl::Time end;
  std::chrono::steady_clock::time_point deadline;
};
inline constexpr absl::Duration kWindowSlack = absl::Milliseconds(2);
WindowPlan PlanWindow(absl::Time now, std::chrono::steady_clock::time_point steady_now,
                      absl::Duration interval);

class IntervalLoop {
 public:
  // `last_sequence`: the last batch sequence number used (a resumed agent numbers on).
  IntervalLoop(absl::Duration interval, uint64_t last_sequence, Profiler* profiler,
               Shipper* shipper, CaptureController* captures);

  // Runs until `stop` is set, or until the agent should start a new call graph
  // (Shipper::NewGraphDue, checked at window boundaries while no capture runs; then
  // new_graph_due()), then ends the captures and ships the last window.
  void Run(const std::atomic<bool>& stop);
  // Run ended for a new call graph: the caller restarts the agent, whose empty spool then
  // starts a new incarnation.
  bool new_graph_due() const { return new_graph_due_; }

  const ShippedBatches& shipped() const { return shipped_; }
  // Ships what `scraper` (borrowed) counted with each CPU batch, under its service (or the
  // one service of the batch's targets). Before Run.
  void AddRequestsScraper(requests::RequestsScraper* scraper) {
    scrapers_.push_back(scraper);
    requests_unattributed_warned_.push_back(false);
  }

 private:
  void Plan(absl::Time now);
  void ShipWindow(absl::Time end);
  // The scrapers' counts since the previous batch, into `batch`.
  void AddRequests(v1::SampleBatch* batch);
  // Enqueues a built batch under the next sequence number and counts it.
  void Ship(absl::StatusOr<std::optional<v1::SampleBatch>> batch, const char* what,
            uint64_t* batches, uint64_t* bytes);

  const absl::Duration interval_;
  Profiler* const profiler_;
  Shipper* const shipper_;
  CaptureController* const captures_;
  uint64_t sequence_;
  absl::Time window_start_;
  absl::Time window_end_;
  std::chrono::steady_clock::time_point window_deadline_;
  uint64_t targets_generation_ = ~uint64_t{0};  // of the targets last handed to the shipper
  ShippedBatches shipped_;
  bool new_graph_due_ = false;
  std::vector<requests::RequestsScraper*> scrapers_;
  std::vector<bool> requests_unattributed_warned_;  // per scraper: said once
};

}  // namespace strata::agent

#endif  // STRATA_AGENT_CORE_INTERVAL_LOOP_H_
