// Stacks from perf events (agent/sampler): one sampling event per online CPU (filtered to the
// targets) or one per target thread, whose samples carry the registers and a copy of the stack
// for the agent to unwind. Besides continuous profiling (session 0) it runs sampling sessions
// of their own rate over targets: the ad hoc captures, in the same scope; and, for off-CPU
// profiles, a context-switch session (kOffCpuSession) over the same targets.
#ifndef STRATA_AGENT_SOURCES_PERF_SOURCE_H_
#define STRATA_AGENT_SOURCES_PERF_SOURCE_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "common/unwind/host_arch.h"
#include "agent/sampler/perf_sampler.h"
#include "agent/sources/stack_source.h"

namespace strata::agent::sources {

// Session 0 is continuous profiling, kOffCpuSession its off-CPU side; the others are ad hoc
// captures.
inline constexpr uint32_t kContinuousSession = 0;
inline constexpr uint32_t kOffCpuSession = 0xffffffff;

struct PerfSourceOptions {
  uint32_t frequency_hz = 99;
  uint32_t stack_bytes = 16 * 1024;
  sampler::SamplingScope scope = sampler::SamplingScope::kPerThread;
  // Kernel call chains on every sample (sampler::SessionOptions::kernel_stacks).
  bool kernel_stacks = false;
  // The kernel's frame-pointer walk of user stacks on every CPU-time sample
  // (sampler::SessionOptions::user_frame_chain): Go's stacks past a systemstack switch as they
  // were at the sample. x86-64 only: Go keeps no frame pointer on MIPS64.
  bool user_frame_chain = true;
  // A context-switch session over the continuous session's targets, per thread in either
  // scope (one more descriptor per target thread).
  bool off_cpu = false;
};

class PerfSource final : public StackSource {
 public:
  // Opens the sampler with its continuous session. The probe's error when this host cannot
  // use perf events (see sampler::ProbePerfEvents).
  static absl::StatusOr<std::unique_ptr<PerfSource>> Open(const PerfSourceOptions& options);
  sampler::SamplingScope scope() const { return scope_; }

  absl::Status Attach(pid_t pid, const std::vector<pid_t>& threads) override;
  // Per thread in either scope, each ring waking the reader at every sample (see
  // sampler::PerfSampler::Wake).
  bool DeliverEachSample(pid_t pid) override;
  void Detach(pid_t pid) override;
  void Remove(pid_t pid, StackSink& sink) override;
  void ThreadStarted(pid_t pid, pid_t tid) override;
  void ThreadExited(pid_t pid, pid_t tid) override;
  int wait_fd() const override { return sampler_->wait_fd(); }
  // Notes the events whose threads exited; Drain closes them after their last samples.
  absl::Status Ready() override;
  absl::Duration max_wait() const override { return sampler_->max_wait(); }
  void Drain(StackSink& sink) override;
  uint64_t lost() const override { return sampler_->lost(); }
  sampler::SamplerStats sampler_stats() const { return sampler_->stats(); }
  // Runs `program_fd` at every CPU-time sample from now on (sampler::PerfSampler::
  // SetSampleProgram).
  void SetSampleProgram(int program_fd) { sampler_->SetSampleProgram(program_fd); }
  size_t events() const { return sampler_->attached_events(); }

  // A session of its own rate over the continuous session's threads of `pids`. Returns the
  // number of processes attached; with none attached the session is removed and the last
  // error returned.
  absl::StatusOr<size_t> StartSession(uint32_t session_id, uint32_t frequency_hz,
                                      const std::vector<pid_t>& pids);
  absl::Status SetFrequency(uint32_t session_id, uint32_t frequency_hz);
  // Delivers the buffered samples of every session to `sink`, then closes the session.
  void StopSession(uint32_t session_id, StackSink& sink);

 private:
  PerfSource(std::unique_ptr<sampler::PerfSampler> sampler, const PerfSourceOptions& options)
      : sampler_(std::move(sampler)),
        stack_bytes_(options.stack_bytes),
        scope_(options.scope),
        kernel_stacks_(options.kernel_stacks),
        user_frame_chain_(options.user_frame_chain && unwind::kHostArch == unwind::Arch::kX86_64),
        off_cpu_(options.off_cpu) {}

  // A session's options: per CPU, rings of about two seconds of a busy CPU's samples, the
  // kernel's wake-up after about one, and a one-second drain period while samples flow (see
  // perf_source.cc).
  sampler::SessionOptions SessionFor(uint32_t session_id, uint32_t frequency_hz) const;

  std::unique_ptr<sampler::PerfSampler> sampler_;
  absl::flat_hash_set<pid_t> each_sample_;  // DeliverEachSample()'s pids, until detached
  uint32_t stack_bytes_;
  sampler::SamplingScope scope_;
  bool kernel_stacks_;
  bool user_frame_chain_;
  bool off_cpu_;
};

}  // namespace strata::agent::sources

#endif  // STRATA_AGENT_SOURCES_PERF_SOURCE_H_
