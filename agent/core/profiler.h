// The agent's sampling pipeline for one host: finds target processes (ProcessTracker), samples
// their threads (PerfSampler), unwinds every sample from its registers and stack copy
// (common/unwind over each process's ProcessAddressSpace), symbolizes frames into function
// nodes, adds each calling context to the ContextGraph and counts it in the interval's
// IntervalAggregator. TakeBatch() turns the interval into an encoded SampleBatch.
//
// Where perf events are unavailable (qemu-user, locked-down kernels) or unwanted, stacks come
// from processes running the in-process sampler (agent/inproc: libstrata_inproc.so or a
// program linked with it), read from their shared-memory rings (ProfilerOptions::inproc).
// Such targets are not attached to perf; their mappings come from the ring's module table.
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
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "agent/core/context_graph.h"
#include "agent/core/interval_aggregator.h"
#include "agent/procfs/process_tracker.h"
#include "agent/procfs/service_matcher.h"
#include "agent/sampler/perf_sampler.h"
#include "agent/symbols/module_cache.h"
#include "agent/symbols/process_address_space.h"
#include "common/unwind/incremental.h"
#include "common/unwind/unwinder.h"
#include "strata/v1/ingest.pb.h"

namespace strata::inproc {
class InprocSource;
struct RingStack;
}  // namespace strata::inproc

namespace strata::agent {

// The architecture this agent binary samples (the host's): chosen here, once.
#if defined(__x86_64__)
inline constexpr unwind::Arch kHostArch = unwind::Arch::kX86_64;
#elif defined(__mips__) && defined(__MIPSEL__)
inline constexpr unwind::Arch kHostArch = unwind::Arch::kMips64El;
#elif defined(__mips__)
inline constexpr unwind::Arch kHostArch = unwind::Arch::kMips64Be;
#else
#error "strata-agent: unsupported architecture (x86-64 and MIPS64 are supported)"
#endif

struct ProfilerOptions {
  uint32_t frequency_hz = 99;
  uint32_t stack_bytes = 16 * 1024;
  // Discovery: processes matching a rule, and processes that name themselves with
  // STRATA_SERVICE. Without rules nothing is discovered: only `pids` are profiled.
  std::vector<procfs::ServiceRule> service_rules;
  std::vector<pid_t> pids;  // explicit targets (service: STRATA_SERVICE or executable name)
  absl::Duration rescan_interval = absl::Seconds(1);
  size_t max_frames = 256;
  // Per-thread incremental unwinding (common/unwind/incremental.h). kFull (default) re-derives
  // every reused frame from the new stack bytes, so stacks equal a full unwind; kBoundary
  // checks only the splice element; kOff unwinds every sample fully.
  unwind::VerifyMode unwind_verify = unwind::VerifyMode::kFull;
  // Stacks from the in-process sampler's rings (agent/inproc):
  //   kAuto: perf events where available; a target with a ring is read from its ring instead;
  //          without perf events, only targets with a ring are sampled.
  //   kOn:   rings only (perf events are never opened).
  //   kOff:  perf events only (Create() fails without them).
  enum class Inproc { kAuto, kOn, kOff };
  Inproc inproc = Inproc::kAuto;
  std::string inproc_dir = "/dev/shm";  // where the samplers create their rings
};

// The matcher that decides which processes besides `pids` the agent profiles. STRATA_SERVICE
// makes a process a target only when the agent discovers processes (it has service rules):
// an agent given only --pid profiles exactly those processes, not every process on the host
// that happens to name itself.
absl::StatusOr<procfs::ServiceMatcher> MakeTargetMatcher(const ProfilerOptions& options);

// Parses "auto" | "on" | "off".
std::optional<ProfilerOptions::Inproc> ParseInprocMode(std::string_view mode);

struct ProfilerStats {
  uint64_t samples = 0;
  uint64_t unwound_frames = 0;
  uint64_t truncated = 0;       // stacks whose unwinding stopped early
  uint64_t dropped = 0;         // samples of unknown processes or that failed to encode
  uint64_t lost = 0;            // samples the kernel dropped
  uint64_t refreshes = 0;       // mapping refreshes (dlopen/dlclose seen)
  uint64_t frames_walked = 0;   // frames found with unwind-rule lookups
  uint64_t frames_reused = 0;   // frames taken from the thread's previous sample
  uint64_t unwind_verify_failures = 0;
  size_t targets = 0;
  uint64_t inproc_stacks = 0;   // stacks read from in-process rings (part of `samples`)
  size_t inproc_targets = 0;    // targets served by an in-process ring
};

class Profiler {
 public:
  static absl::StatusOr<std::unique_ptr<Profiler>> Create(ProfilerOptions options,
                                                          ContextGraph* graph);
  ~Profiler();

  // Waits up to `timeout` for samples, processes them, and rescans /proc when due.
  absl::Status Poll(absl::Duration timeout);
  // The interval's samples as a batch (nullopt when there were none). `sequence` is only
  // used when a batch is returned.
  absl::StatusOr<std::optional<v1::SampleBatch>> TakeBatch(int64_t start_ms, int64_t end_ms,
                                                           uint64_t sequence);
  // True when the interval aggregator reached its bound (ship an early batch).
  bool batch_full() const { return batch_full_; }

  ProfilerStats stats() const;
  std::vector<v1::Target> targets() const;

  // Sampling sessions besides continuous profiling (ad hoc captures), each with its own rate
  // and aggregator. Same thread as Poll().
  //
  // Starts session `session_id` (not 0) on the current targets of `service` (empty: any) and
  // `pid` (0: any); threads those processes start later join it (new processes do not). NotFound when no target matches;
  // the sampler's errors otherwise (nothing is left open).
  absl::Status StartSession(uint32_t session_id, uint32_t frequency_hz, const std::string& service,
                            pid_t pid);
  absl::Status SetSessionFrequency(uint32_t session_id, uint32_t frequency_hz);
  // The session's samples since the last call, as a batch tagged with `capture_id`; nullopt
  // when there were none. `samples` (optional) receives their number.
  absl::StatusOr<std::optional<v1::SampleBatch>> TakeSessionBatch(uint32_t session_id,
                                                                  const std::string& capture_id,
                                                                  int64_t start_ms,
                                                                  int64_t end_ms,
                                                                  uint64_t sequence,
                                                                  uint64_t* samples = nullptr);
  // Delivers the session's buffered samples and closes its events; its aggregator stays for
  // one last TakeSessionBatch() and is dropped by ReleaseSession().
  void StopSession(uint32_t session_id);
  void ReleaseSession(uint32_t session_id);
  // Targets sampled by the session.
  size_t SessionTargets(uint32_t session_id) const;

 private:
  struct Target;
  struct PathCache;
  Profiler(ProfilerOptions options, ContextGraph* graph, procfs::ProcessTracker tracker,
           std::unique_ptr<sampler::PerfSampler> sampler);

  absl::Status Rescan();
  void AddTarget(const procfs::TrackedProcess& process);
  void RemoveTarget(pid_t pid);
  void HandleSample(const sampler::RawSample& sample);
  // Symbolizes an unwound stack (innermost first; frames[0].pc exact, the others return
  // addresses), adds its context to the graph and counts it. Every stack source ends here:
  // perf samples unwound by the agent and stacks unwound in-process (agent/inproc).
  // `session_id` 0 is continuous profiling; other sessions (ad hoc captures) count into
  // their own aggregator in session_aggregators_.
  //
  // `cache` (optional): the thread's last recorded path; its `outer_kept` outermost frames
  // are the ones the incremental unwinder kept in place since then (SampleStats::outer_kept),
  // whose function nodes and edge IDs are taken from the cache instead of being symbolized
  // and looked up again.
  void RecordStack(Target& target, const unwind::Frame* frames, size_t num_frames,
                   bool truncated, uint32_t session_id = 0, PathCache* cache = nullptr,
                   size_t outer_kept = 0);
  // Refreshes the target's mappings (from /proc, or from its in-process ring) if they
  // changed; true when they did.
  bool RefreshMappings(Target& target);
  encoding::PathFrame FrameFor(Target& target, uint64_t pc, bool innermost);

  // In-process rings (null inproc_: off). RescanInproc opens new rings (switching their
  // targets off perf) and closes those of exited processes; DrainInproc records every stack
  // published so far.
  void RescanInproc();
  void DrainInproc();
  void HandleInprocStack(const inproc::RingStack& stack);
  bool InprocServes(pid_t pid) const;
  // Samples dropped by the kernel (perf) or on full in-process rings.
  uint64_t LostSamples() const;

  ProfilerOptions options_;
  ContextGraph* graph_;
  procfs::ProcessTracker tracker_;
  std::unique_ptr<sampler::PerfSampler> sampler_;  // null: no perf events (in-process only)
  std::unique_ptr<inproc::InprocSource> inproc_;   // null: --inproc off
  symbols::ModuleCache modules_;
  absl::flat_hash_map<pid_t, std::unique_ptr<Target>> targets_;
  // Targets gone since the last batch: their samples still name them.
  std::vector<v1::Target> retired_targets_;
  uint32_t next_target_id_ = 1;
  absl::Time next_rescan_ = absl::InfinitePast();
  IntervalAggregator aggregator_;
  // Aggregators of sampling sessions other than continuous profiling, by session ID.
  absl::flat_hash_map<uint32_t, std::unique_ptr<IntervalAggregator>> session_aggregators_;
  // Targets attached to each of those sessions.
  absl::flat_hash_map<uint32_t, size_t> session_targets_;
  bool batch_full_ = false;
  ProfilerStats stats_;
  uint64_t lost_reported_ = 0;
  std::vector<unwind::Frame> frames_;
  std::vector<encoding::PathFrame> path_;
  std::vector<encoding::EdgeId> edges_;  // RecordStack's, for stacks without a PathCache
};

}  // namespace strata::agent

#endif  // STRATA_AGENT_CORE_PROFILER_H_
