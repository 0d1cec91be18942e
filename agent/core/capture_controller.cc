#include "agent/core/capture_controller.h"

#include <time.h>

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "common/base/log.h"

namespace strata::agent {
namespace {

int64_t ProcessCpuNs() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

}  // namespace

CaptureController::CaptureController(SamplingSessions* sessions,
                                     CaptureControllerOptions options, Sink sink)
    : sessions_(sessions), options_(options), sink_(std::move(sink)) {}

void CaptureController::HandleMessage(const v1::ServerMessage& message) {
  absl::MutexLock lock(&mu_);
  inbox_.push_back(message);
}

void CaptureController::Tick(absl::Time now, uint64_t* sequence) {
  std::deque<v1::ServerMessage> messages;
  {
    absl::MutexLock lock(&mu_);
    messages.swap(inbox_);
  }
  for (const v1::ServerMessage& m : messages) {
    switch (m.kind_case()) {
      case v1::ServerMessage::kStartCapture:
        Start(m.start_capture(), now);
        break;
      case v1::ServerMessage::kStopCapture:
        Finish(m.stop_capture().capture_id(), now, sequence, "stopped by the server");
        break;
      case v1::ServerMessage::kSetRate: {
        const uint32_t hz = std::clamp<uint32_t>(m.set_rate().frequency_hz(), 1,
                                                 options_.max_frequency_hz);
        // Session 0 is continuous profiling.
        if (auto st = sessions_->SetSessionFrequency(0, hz); !st.ok()) {
          LogWarn("set rate {} Hz: {}", hz, st.ToString());
        } else {
          LogInfo("continuous profiling rate set to {} Hz by the server", hz);
        }
        break;
      }
      default:
        break;
    }
  }
  if (captures_.empty()) return;

  EnforceBudget(now);

  std::vector<std::string> ended;
  for (auto& [id, c] : captures_) {
    if (now >= c.ends) ended.push_back(id);
  }
  for (const auto& id : ended) Finish(id, now, sequence, "");

  if (now >= next_ship_) {
    for (auto& [id, c] : captures_) Ship(c, now, sequence, false, "");
    next_ship_ = now + options_.ship_interval;
  }
}

void CaptureController::StopAll(absl::Time now, uint64_t* sequence) {
  std::vector<std::string> ids;
  for (const auto& [id, c] : captures_) ids.push_back(id);
  for (const auto& id : ids) Finish(id, now, sequence, "the agent is shutting down");
}

void CaptureController::Start(const v1::StartCapture& start, absl::Time now) {
  auto fail = [&](const std::string& error) {
    LogWarn("capture {}: {}", start.capture_id(), error);
    v1::CaptureStatus status;
    status.set_capture_id(start.capture_id());
    status.set_finished(true);
    status.set_error(error);
    sink_.send_status(std::move(status));
  };
  if (start.capture_id().empty()) return fail("StartCapture without a capture ID");
  if (captures_.contains(start.capture_id())) return;  // repeated message
  if (start.frequency_hz() == 0 || start.duration_ms() == 0) {
    return fail("StartCapture needs a frequency and a duration");
  }
  const uint32_t hz = std::min(start.frequency_hz(), options_.max_frequency_hz);
  const uint32_t session_id = next_session_id_++;
  if (next_session_id_ == 0) next_session_id_ = 1;  // 0 is continuous profiling
  auto st = sessions_->StartSession(session_id, hz, start.service(),
                                    static_cast<pid_t>(start.pid()));
  if (!st.ok()) return fail(std::string(st.message()));

  Capture c;
  c.capture_id = start.capture_id();
  c.session_id = session_id;
  c.requested_hz = hz;
  c.current_hz = hz;
  c.ends = now + absl::Milliseconds(start.duration_ms());
  c.window_start = now;
  LogInfo("capture {} started: session {}, {} target(s), {} Hz for {} ms", c.capture_id,
               session_id, sessions_->SessionTargets(session_id), hz, start.duration_ms());
  if (captures_.empty()) {
    // Budget accounting starts with the first capture.
    budget_wall_ = now;
    budget_cpu_ns_ = ProcessCpuNs();
    next_ship_ = now + options_.ship_interval;
  }
  v1::CaptureStatus status;
  status.set_capture_id(c.capture_id);
  status.set_effective_frequency_hz(hz);
  sink_.send_status(std::move(status));
  captures_.emplace(c.capture_id, std::move(c));
}

void CaptureController::Ship(Capture& c, absl::Time now, uint64_t* sequence, bool finished,
                             const std::string& error) {
  uint64_t samples = 0;
  auto batch = sessions_->TakeSessionBatch(c.session_id, c.capture_id,
                                           absl::ToUnixMillis(c.window_start),
                                           absl::ToUnixMillis(now), *sequence + 1, &samples);
  c.window_start = now;
  if (!batch.ok()) {
    LogError("capture {}: building batch: {}", c.capture_id, batch.status().ToString());
  } else if (batch->has_value()) {
    ++*sequence;
    c.samples += samples;
    sink_.enqueue(std::move(**batch));
  }
  v1::CaptureStatus status;
  status.set_capture_id(c.capture_id);
  status.set_samples(c.samples);
  status.set_effective_frequency_hz(c.current_hz);
  status.set_finished(finished);
  status.set_error(error);
  sink_.send_status(std::move(status));
}

void CaptureController::Finish(const std::string& capture_id, absl::Time now, uint64_t* sequence,
                               const std::string& why) {
  auto it = captures_.find(capture_id);
  if (it == captures_.end()) return;
  Capture& c = it->second;
  // Samples still in the rings belong to the capture: drain them before the last batch.
  sessions_->StopSession(c.session_id);
  // A stop requested by the server is not an error of the capture; shutdown is.
  const bool failed = why == "the agent is shutting down";
  Ship(c, now, sequence, true, failed ? why : "");
  sessions_->ReleaseSession(c.session_id);
  LogInfo("capture {} {}: {} samples, last rate {} Hz (requested {} Hz)", capture_id,
               why.empty() ? "finished" : why, c.samples, c.current_hz, c.requested_hz);
  captures_.erase(it);
}

void CaptureController::EnforceBudget(absl::Time now) {
  if (now - budget_wall_ < options_.budget_interval) return;
  const int64_t cpu_ns = ProcessCpuNs();
  const double wall_ns = absl::ToDoubleNanoseconds(now - budget_wall_);
  const double usage = static_cast<double>(cpu_ns - budget_cpu_ns_) / wall_ns;
  budget_wall_ = now;
  budget_cpu_ns_ = cpu_ns;
  const double budget = options_.cpu_budget;
  for (auto& [id, c] : captures_) {
    uint32_t hz = c.current_hz;
    if (usage > budget) {
      // Proportional cut with a margin; the sampling cost is roughly linear in the rate.
      hz = static_cast<uint32_t>(std::floor(c.current_hz * budget / usage * 0.9));
      hz = std::max<uint32_t>(1, std::min(hz, c.current_hz > 1 ? c.current_hz - 1 : 1));
    } else if (usage < budget * 0.6 && c.current_hz < c.requested_hz) {
      hz = std::min<uint32_t>(c.requested_hz, c.current_hz + c.current_hz / 4 + 1);
    }
    if (hz == c.current_hz) continue;
    if (auto st = sessions_->SetSessionFrequency(c.session_id, hz); !st.ok()) {
      LogWarn("capture {}: cannot set {} Hz: {}", id, hz, st.ToString());
      continue;
    }
    LogInfo("capture {}: agent CPU {:.2f} % of a core (budget {:.2f} %): {} Hz -> {} Hz", id,
                 usage * 100, budget * 100, c.current_hz, hz);
    c.current_hz = hz;
  }
}

}  // namespace strata::agent
