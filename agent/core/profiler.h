// agent/core: the agent's sampling pipeline for one host, and what ships its output.
//
//   TargetDiscovery (targets.h)      which processes are profiled, their mappings
//   StackSource (agent/sources)      perf events, in-process rings: stacks of those targets
//   StackRecorder (stack_recorder.h) unwinds, symbolizes, adds to the ContextGraph, counts
//   BatchBuilder (batch_builder.h)   an interval's counts as an encoded SampleBatch
//   Profiler (this header)           builds and drives the four above: Poll, TakeBatch
//   Poller (poller.h)                the loop's one wait: sources, process changes, Wake()
//   IntervalLoop (interval_loop.h)   the agent's main loop: polls, ships batches on interval
//                                    boundaries, runs captures (CaptureController)
//   Shipper (shipper.h)              the ingest stream: graph deltas, batches, acks, spool
//
// The Profiler owns discovery, the sources and the recorder. Where perf events are
// unavailable (qemu-user, locked-down kernels) or unwanted, stacks come from processes
// running the in-process runtime (agent/runtime), read from their rings
// (ProfilerOptions::inproc). Such targets are not attached to perf; their mappings come from
// the ring's module table.
//
// Single-threaded: Poll() and TakeBatch() are called from the agent's main loop. The
// ContextGraph is shared with the Shipper (it locks internally).
#ifndef STRATA_AGENT_CORE_PROFILER_H_
#define STRATA_AGENT_CORE_PROFILER_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "agent/core/batch_builder.h"
#include "agent/core/context_graph.h"
#include "agent/core/poller.h"
#include "agent/core/sampling_sessions.h"
#include "agent/core/stack_recorder.h"
#include "agent/core/targets.h"
#include "agent/sources/inproc_source.h"
#include "agent/sources/perf_source.h"
#include "strata/v1/ingest.pb.h"

namespace strata::agent {

struct ProfilerOptions : DiscoveryOptions {
  uint32_t frequency_hz = 99;
  uint32_t stack_bytes = 16 * 1024;
  absl::Duration rescan_interval = absl::Seconds(1);
  size_t max_frames = 256;
  unwind::VerifyMode unwind_verify = unwind::VerifyMode::kFull;  // see StackRecorderOptions
  // Stacks from the in-process runtime's rings (agent/runtime):
  //   kAuto: perf events where available; a target with a ring is read from its ring instead;
  //          without perf events, only targets with a ring are sampled.
  //   kOn:   rings only (perf events are never opened).
  //   kOff:  perf events only (Create() fails without them).
  enum class Inproc { kAuto, kOn, kOff };
  Inproc inproc = Inproc::kAuto;
  std::string inproc_dir = "/dev/shm";  // where the samplers create their rings
  // What one perf event samples (agent/sampler/perf_sampler.h):
  //   kAuto:      per CPU where system-wide events are allowed, else per thread;
  //   kPerCpu:    per CPU (Create() fails where system-wide events are not allowed);
  //   kPerThread: one event per target thread (unprivileged agents, --pid on locked hosts).
  enum class Sampling { kAuto, kPerCpu, kPerThread };
  Sampling sampling = Sampling::kAuto;
  // Kernel call chains on perf samples, named from /proc/kallsyms:
  //   kAuto: where the kernel allows kernel-mode events and shows kallsyms addresses (else
  //          said once, and user stacks only);
  //   kOn:   Create() fails where it cannot; kOff: user stacks only.
  enum class KernelStacks { kAuto, kOn, kOff };
  KernelStacks kernel_stacks = KernelStacks::kAuto;
  // Off-CPU profiles: where target threads block and for how long (context-switch events);
  // Create() fails where the kernel refuses them. Intervals shorter than the threshold are
  // not counted.
  bool off_cpu = false;
  absl::Duration off_cpu_threshold = absl::Microseconds(100);
  // Python frames of CPython targets (StackRecorder), read when their samples are recorded.
  // The sooner after the sample a thread's frames are read, the fewer have changed (the rest
  // are counted as python_stale): a target whose interpreter is known when it is attached is
  // sampled per thread, each sample waking the agent (StackSource::DeliverEachSample). For
  // the others (an interpreter loaded later, a source that cannot, capture sessions), while
  // they run Python, samples are drained about one sampling period after the last Python
  // sample (when a thread that keeps running is sampled again), then every
  // python_read_period, backing off to 2 periods while none come, and after a second without
  // any only with the rest (PythonWait).
  bool python_frames = true;
  absl::Duration python_read_period = absl::Milliseconds(1);
  // Python frames copied by the kernel at each perf sample (python::FrameCapture): no wake-up
  // and no read of the target per sample, and frames exactly as sampled. kAuto: where the
  // kernel lets the agent load BPF programs (root, 5.8+), else the reads above; kOn: Create()
  // fails where it cannot.
  enum class PythonCapture { kAuto, kOn, kOff };
  PythonCapture python_capture = PythonCapture::kAuto;
  // The kernel's frame-pointer walk of user stacks with each CPU-time sample
  // (sources::PerfSourceOptions::user_frame_chain).
  bool frame_walk = true;
};

// Parses "auto" | "on" | "off".
std::optional<ProfilerOptions::Inproc> ParseInprocMode(std::string_view mode);
// Parses "per-cpu" | "per-thread" (and "auto").
std::optional<ProfilerOptions::Sampling> ParseSamplingMode(std::string_view mode);
// Parses "auto" | "on" | "off".
std::optional<ProfilerOptions::KernelStacks> ParseKernelStacksMode(std::string_view mode);
// Parses "auto" | "on" | "off".
std::optional<ProfilerOptions::PythonCapture> ParsePythonCaptureMode(std::string_view mode);

// The recorder's counters (StackRecorderStats: samples, frames, off-CPU, Python) and what the
// profiler adds around them: its sources, targets and wake-ups.
struct ProfilerStats : StackRecorderStats {
  uint64_t lost = 0;            // samples the kernel dropped
  uint64_t refreshes = 0;       // mapping refreshes (dlopen/dlclose seen)
  size_t targets = 0;
  size_t inproc_targets = 0;    // targets served by an in-process ring
  uint64_t filtered = 0;        // per-CPU samples of processes that are not targets
  uint64_t filtered_in_kernel = 0;  // ... of them dropped before the kernel wrote them
  uint64_t filter_runs = 0;         // runs of the program that drops them, and their time
  uint64_t filter_ns = 0;
  size_t perf_events = 0;       // perf events open now
  uint64_t wakeups = 0;         // Poll()s that returned with something to do or at a deadline
  uint64_t rescans = 0;         // target scans (process events or /proc)
  bool kernel_stacks = false;   // samples carry kernel chains
  size_t python_targets = 0;
  // The Python frame capture (all zero without it); its program's runs are counted while
  // kernel.bpf_stats_enabled is set.
  bool python_capture = false;
  python::CaptureStats capture;
  bpf::ProgramRuns capture_runs;
  uint64_t programs_not_attached = 0;  // perf events sampling without the capture
};

class Profiler final : public SamplingSessions {
 public:
  static absl::StatusOr<std::unique_ptr<Profiler>> Create(ProfilerOptions options,
                                                          ContextGraph* graph);
  ~Profiler() override;

  // Waits up to `timeout` for samples, process changes or Wake(), processes what came, and
  // rescans the targets when due.
  absl::Status Poll(absl::Duration timeout);
  // Ends the current (or next) Poll's wait early. Any thread; async-signal-safe.
  void Wake() const { poller_->Wake(); }
  // The descriptor Wake() writes to, for a signal handler that cannot reach the Profiler.
  int wake_fd() const { return poller_->wake_fd(); }
  // The interval's samples as a batch (nullopt when there were none). `sequence` is only
  // used when a batch is returned.
  absl::StatusOr<std::optional<v1::SampleBatch>> TakeBatch(int64_t start_ms, int64_t end_ms,
                                                           uint64_t sequence);
  // The interval's off-CPU time as a PROFILE_OFF_CPU batch (nullopt when none); call after
  // TakeBatch for the same window.
  absl::StatusOr<std::optional<v1::SampleBatch>> TakeOffCpuBatch(int64_t start_ms,
                                                                 int64_t end_ms,
                                                                 uint64_t sequence);
  // Forgets exited targets whose samples have all gone out in batches (call after a window's
  // batches are taken; a capture's batch may name them later).
  void DropRetiredTargets();
  // True when the interval aggregator reached its bound (ship an early batch).
  bool batch_full() const { return recorder_.full(); }

  ProfilerStats stats() const;
  std::vector<v1::Target> targets() const { return discovery_->targets(); }
  // Changes whenever targets() does.
  uint64_t targets_generation() const { return discovery_->generation(); }

  // SamplingSessions: ad hoc captures run on perf events only.
  absl::Status StartSession(uint32_t session_id, uint32_t frequency_hz,
                            const std::string& service, pid_t pid) override;
  absl::Status SetSessionFrequency(uint32_t session_id, uint32_t frequency_hz) override;
  absl::StatusOr<std::optional<v1::SampleBatch>> TakeSessionBatch(
      uint32_t session_id, const std::string& capture_id, int64_t start_ms, int64_t end_ms,
      uint64_t sequence, uint64_t* samples = nullptr) override;
  void StopSession(uint32_t session_id) override;
  void ReleaseSession(uint32_t session_id) override;
  size_t SessionTargets(uint32_t session_id) const override;

 private:
  Profiler(ProfilerOptions options, ContextGraph* graph,
           std::unique_ptr<TargetDiscovery> discovery, std::unique_ptr<sources::PerfSource> perf,
           std::unique_ptr<sources::InprocSource> inproc,
           std::unique_ptr<kernel::KernelSymbols> kernel_symbols,
           std::unique_ptr<python::FrameCapture> python_capture);

  // Sources first (a process with a ring is not attached to perf), then /proc: targets that
  // came and went, their threads, their mappings.
  absl::Status Rescan();
  // The poller over the sources' and the process events' descriptors.
  absl::Status InitPoll();
  void RescanSources();
  void AddTarget(const procfs::TrackedProcess& process);
  void RemoveTarget(pid_t pid);
  sources::StackSource* SourceFor(pid_t pid) const;
  // How long Poll may sleep before Python targets' samples are drained (see
  // ProfilerOptions::python_frames); infinite while none run Python.
  absl::Duration PythonWait();
  // Whether some Python target's samples come in batches (PythonWait drains them).
  bool PythonBatched() const;
  // Attaches the Python frame capture's program to the perf events once a target runs Python.
  void AttachPythonCapture();

  const ProfilerOptions options_;
  std::unique_ptr<TargetDiscovery> discovery_;
  std::unique_ptr<sources::PerfSource> perf_;      // null: no perf events (in-process only)
  std::unique_ptr<sources::InprocSource> inproc_;  // null: --inproc off
  std::vector<sources::StackSource*> sources_;     // the two above that exist, perf first
  std::unique_ptr<kernel::KernelSymbols> kernel_symbols_;  // null: no kernel stacks
  // Python frames copied at perf samples (the recorder takes them); null: not on this host.
  std::unique_ptr<python::FrameCapture> python_capture_;
  bool capture_attached_ = false;
  StackRecorder recorder_;
  BatchBuilder batches_;
  // Continuous profiling's rate (SetRate changes it): the unit of off-CPU batches.
  uint32_t continuous_hz_;
  absl::Time next_rescan_ = absl::InfinitePast();
  // Sleeps until samples, a process, thread or ring change (process events' descriptor and
  // the sources' rescan descriptors), Wake() or the loop's deadline.
  std::unique_ptr<Poller> poller_;
  bool rescan_due_ = false;
  int events_fd_ = -1;  // the process events' descriptor, while the poller watches it
  uint64_t wakeups_ = 0;
  uint64_t rescans_ = 0;
  // PythonWait's: the latest Python sample (CLOCK_MONOTONIC) seen by the last call, and the
  // wait while no later one comes.
  uint64_t python_sample_seen_ns_ = 0;
  absl::Duration python_backoff_;
  // Targets attached to each capture session.
  absl::flat_hash_map<uint32_t, size_t> session_targets_;
  // Targets whose Python frames are those of each sample: their source delivers each sample
  // as it is taken, or their samples carry the frames (python_capture_).
  absl::flat_hash_set<pid_t> python_as_sampled_;
};

}  // namespace strata::agent

#endif  // STRATA_AGENT_CORE_PROFILER_H_
