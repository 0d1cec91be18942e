// Ad hoc captures on the agent: turns the server's StartCapture / StopCapture / SetRate control
// messages into sampling sessions (SamplingSessions, the Profiler's), ships each capture's
// samples as SampleBatch batches tagged with its capture ID about once a second, reports
// CaptureStatus progress, and enforces the agent's CPU budget for captures.
//
// CPU budget. Once a second the controller reads the agent's own CPU time
// (CLOCK_PROCESS_CPUTIME_ID: all of the agent's threads, continuous profiling, unwinding and
// shipping included) and divides it by the wall time. While a capture runs and the agent uses
// more than the budget, every capture session's rate is scaled down in proportion (never below
// 1 Hz); while it stays well under the budget the rate climbs back towards the requested one.
// The rate in force is reported as CaptureStatus.effective_frequency_hz. Continuous profiling
// keeps its own rate: captures are the optional load that gives way.
//
// Nothing here depends on the architecture: x86-64 and MIPS64 agents receive the same control
// messages over the same ingest stream.
//
// Thread model: HandleMessage() is called on the shipper's thread and only queues;
// everything else runs on the agent's main loop thread (the one that owns the sessions).
#ifndef STRATA_AGENT_CORE_CAPTURE_CONTROLLER_H_
#define STRATA_AGENT_CORE_CAPTURE_CONTROLLER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <string>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/core/sampling_sessions.h"
#include "strata/v1/ingest.pb.h"

namespace strata::agent {

struct CaptureControllerOptions {
  // Fraction of one core the agent may use while captures run (0.05 = 5 %).
  double cpu_budget = 0.05;
  absl::Duration ship_interval = absl::Seconds(1);
  absl::Duration budget_interval = absl::Seconds(1);
  uint32_t max_frequency_hz = 10'000;
};

class CaptureController {
 public:
  // Where batches and statuses go (the Shipper, in the agent).
  struct Sink {
    std::function<void(v1::SampleBatch)> enqueue;
    std::function<void(v1::CaptureStatus)> send_status;
  };

  // `sessions` is borrowed and must outlive the controller.
  CaptureController(SamplingSessions* sessions, CaptureControllerOptions options, Sink sink);

  // Any thread: queues a control message for the next Tick().
  void HandleMessage(const v1::ServerMessage& message);

  // Main loop, after every Poll: applies queued messages, ships due capture batches, adjusts
  // rates against the CPU budget and ends captures whose duration passed. `sequence` is the
  // agent's batch sequence number (last used); it is advanced for every batch shipped.
  void Tick(absl::Time now, uint64_t* sequence);

  // Ends every running capture (agent shutdown), shipping what was sampled.
  void StopAll(absl::Time now, uint64_t* sequence);

  size_t running() const { return captures_.size(); }

 private:
  struct Capture {
    std::string capture_id;
    uint32_t session_id = 0;
    uint32_t requested_hz = 0;
    uint32_t current_hz = 0;
    absl::Time ends;
    absl::Time window_start;
    uint64_t samples = 0;  // shipped so far
  };

  void Start(const v1::StartCapture& start, absl::Time now);
  // Ships the capture's samples since the last batch; `finished` also ends its session.
  void Ship(Capture& capture, absl::Time now, uint64_t* sequence, bool finished,
            const std::string& error);
  void Finish(const std::string& capture_id, absl::Time now, uint64_t* sequence,
              const std::string& why);
  void EnforceBudget(absl::Time now);

  SamplingSessions* const sessions_;
  const CaptureControllerOptions options_;
  const Sink sink_;

  absl::Mutex mu_;
  std::deque<v1::ServerMessage> inbox_ ABSL_GUARDED_BY(mu_);

  std::map<std::string, Capture> captures_;
  uint32_t next_session_id_ = 1;
  absl::Time next_ship_ = absl::InfinitePast();
  absl::Time budget_wall_ = absl::InfinitePast();
  int64_t budget_cpu_ns_ = 0;
};

}  // namespace strata::agent

#endif  // STRATA_AGENT_CORE_CAPTURE_CONTROLLER_H_
