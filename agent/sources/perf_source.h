// Stacks from perf events (agent/sampler): one sampling event per target thread, whose
// samples carry the registers and a copy of the stack for the agent to unwind. Besides
// continuous profiling (session 0) it runs sampling sessions of their own rate over targets'
// threads: the ad hoc captures.
#ifndef STRATA_AGENT_SOURCES_PERF_SOURCE_H_
#define STRATA_AGENT_SOURCES_PERF_SOURCE_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/sampler/perf_sampler.h"
#include "agent/sources/stack_source.h"

namespace strata::agent::sources {

// Session 0 is continuous profiling; the others are ad hoc captures.
inline constexpr uint32_t kContinuousSession = 0;

class PerfSource final : public StackSource {
 public:
  // Opens the sampler with its continuous session. The probe's error when this host cannot
  // use perf events (see sampler::ProbePerfEvents).
  static absl::StatusOr<std::unique_ptr<PerfSource>> Open(uint32_t frequency_hz,
                                                          uint32_t stack_bytes);

  absl::Status Attach(pid_t pid, const std::vector<pid_t>& threads) override;
  void Detach(pid_t pid) override;
  void Remove(pid_t pid, StackSink& sink) override;
  void ThreadStarted(pid_t pid, pid_t tid) override;
  void ThreadExited(pid_t pid, pid_t tid) override;
  bool waitable() const override { return true; }
  absl::Status Wait(absl::Duration timeout) override;
  void Drain(StackSink& sink) override;
  uint64_t lost() const override { return sampler_->stats().lost; }

  // A session of its own rate over the continuous session's threads of `pids`. Returns the
  // number of processes attached; with none attached the session is removed and the last
  // error returned.
  absl::StatusOr<size_t> StartSession(uint32_t session_id, uint32_t frequency_hz,
                                      const std::vector<pid_t>& pids);
  absl::Status SetFrequency(uint32_t session_id, uint32_t frequency_hz);
  // Delivers the buffered samples of every session to `sink`, then closes the session.
  void StopSession(uint32_t session_id, StackSink& sink);

 private:
  PerfSource(std::unique_ptr<sampler::PerfSampler> sampler, uint32_t stack_bytes)
      : sampler_(std::move(sampler)), stack_bytes_(stack_bytes) {}

  std::unique_ptr<sampler::PerfSampler> sampler_;
  uint32_t stack_bytes_;
};

}  // namespace strata::agent::sources

#endif  // STRATA_AGENT_SOURCES_PERF_SOURCE_H_
