// The in-kernel filter of a per-CPU session's samples (agent/sampler; owned by PerfSampler, one
// per kPerCpu session).
//
// A per-CPU event samples whatever runs on its CPU. Without a filter, the kernel walks the
// call chain and copies the user stack (16 KiB by default) of every process it interrupts,
// the agent reads each record and drops those of processes that are no targets: the host's
// other processes pay for samples nobody keeps, and the agent parses them. This BPF program
// (BPF_PROG_TYPE_PERF_EVENT), attached to each CPU event, runs before the sample is written and
// returns 0 (the sample is not written) for a process that is not in its map of targets; for a
// target it tail-calls the sampler's sample program if one is set (Python frame capture),
// else lets the sample be written. The sampler keeps filtering in user space too, so a target
// missing from the map (the map full) loses no sample: Pass() then lets every sample through.
//
// Needs root (CAP_BPF + CAP_PERFMON) and an agent in the host's pid namespace (the program
// sees the kernel's pids of the init namespace); Create() fails otherwise and the sampler
// filters in user space as before. One thread (the agent's main loop).
#ifndef STRATA_AGENT_SAMPLER_CPU_FILTER_H_
#define STRATA_AGENT_SAMPLER_CPU_FILTER_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "agent/bpf/bpf.h"
#include "common/base/unique_fd.h"

namespace strata::agent::sampler {

class CpuSampleFilter {
 public:
  // Processes the map holds; a session with more targets passes every sample (Pass()).
  static constexpr uint32_t kMaxTargets = 16384;

  // Unavailable/PermissionDenied where the program cannot be loaded or the agent does not see
  // the kernel's pids.
  static absl::StatusOr<std::unique_ptr<CpuSampleFilter>> Create();

  // The program to attach to the session's CPU events (PERF_EVENT_IOC_SET_BPF).
  int program_fd() const { return program_.get(); }

  // Whether `pid`'s samples are written. On failure (the map full), Pass() is in force.
  absl::Status SetTarget(pid_t pid, bool sampled);
  // The program a target's sample runs next (a BPF_PROG_TYPE_PERF_EVENT program returning
  // whether the sample is written), -1 for none.
  absl::Status Chain(int program_fd);
  // Every sample is written from now on, targets or not (the user-space filter does the work).
  absl::Status Pass();
  bool passing() const { return passing_; }

  // Samples of other processes the program dropped.
  uint64_t dropped() const;
  // The program's runs and their time (with the chained program's: a tail call is part of
  // the run), while kernel.bpf_stats_enabled is set.
  bpf::ProgramRuns runs() const { return bpf::RunsOf(program_.get()).value_or(bpf::ProgramRuns{}); }

 private:
  CpuSampleFilter(base::UniqueFd targets, base::UniqueFd control, base::UniqueFd chain,
                  base::UniqueFd program)
      : targets_(std::move(targets)),
        control_(std::move(control)),
        chain_(std::move(chain)),
        program_(std::move(program)) {}

  base::UniqueFd targets_;  // hash: pid -> 1
  base::UniqueFd control_;  // array of one Control
  base::UniqueFd chain_;    // prog array of one: the sample program
  base::UniqueFd program_;
  bool passing_ = false;
};

// Whether this process sees the kernel's pids (it runs in the initial pid namespace).
bool InInitialPidNamespace();

}  // namespace strata::agent::sampler

#endif  // STRATA_AGENT_SAMPLER_CPU_FILTER_H_
