// Sampling sessions besides continuous profiling (ad hoc captures), each with its own rate and
// aggregator: what the CaptureController drives. Implemented by the Profiler; all calls on
// the agent's main loop thread.
#ifndef STRATA_AGENT_CORE_SAMPLING_SESSIONS_H_
#define STRATA_AGENT_CORE_SAMPLING_SESSIONS_H_

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "strata/v1/ingest.pb.h"

namespace strata::agent {

class SamplingSessions {
 public:
  virtual ~SamplingSessions() = default;

  // Starts session `session_id` (not 0) on the current targets of `service` (empty: any) and
  // `pid` (0: any); threads those processes start later join it (new processes do not).
  // NotFound when no target matches; the sampler's errors otherwise (nothing is left open).
  virtual absl::Status StartSession(uint32_t session_id, uint32_t frequency_hz,
                                    const std::string& service, pid_t pid) = 0;
  // Session 0 is continuous profiling.
  virtual absl::Status SetSessionFrequency(uint32_t session_id, uint32_t frequency_hz) = 0;
  // The session's samples since the last call, as a batch tagged with `capture_id`; nullopt
  // when there were none. `samples` (optional) receives their number.
  virtual absl::StatusOr<std::optional<v1::SampleBatch>> TakeSessionBatch(
      uint32_t session_id, const std::string& capture_id, int64_t start_ms, int64_t end_ms,
      uint64_t sequence, uint64_t* samples) = 0;
  // Delivers the session's buffered samples and closes its events; its aggregator stays for
  // one last TakeSessionBatch() and is dropped by ReleaseSession().
  virtual void StopSession(uint32_t session_id) = 0;
  virtual void ReleaseSession(uint32_t session_id) = 0;
  // Targets sampled by the session.
  virtual size_t SessionTargets(uint32_t session_id) const = 0;
};

}  // namespace strata::agent

#endif  // STRATA_AGENT_CORE_SAMPLING_SESSIONS_H_
