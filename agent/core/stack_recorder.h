// The stack recorder: where every stack of every source ends. Perf samples are unwound here
// (common/unwind's incremental unwinder, one per thread, over the target's address space);
// each stack is symbolized into function nodes, its calling context added to the
// ContextGraph and counted in the interval's IntervalAggregator (session 0, continuous
// profiling) or in a capture session's own. Owns the per-thread unwinding state, the
// per-target pc caches and the aggregators; the targets belong to TargetDiscovery.
//
// Single-threaded: the agent's main loop. A sample of a known thread allocates nothing.
#ifndef STRATA_AGENT_CORE_STACK_RECORDER_H_
#define STRATA_AGENT_CORE_STACK_RECORDER_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "agent/core/context_graph.h"
#include "agent/core/interval_aggregator.h"
#include "agent/core/targets.h"
#include "agent/sources/stack_source.h"
#include "common/unwind/incremental.h"
#include "common/unwind/unwinder.h"

namespace strata::agent {

struct StackRecorderOptions {
  size_t max_frames = 256;
  uint32_t stack_bytes = 16 * 1024;  // requested per perf sample
  // Per-thread incremental unwinding (common/unwind/incremental.h). kFull re-derives every
  // reused frame from the new stack bytes, so stacks equal a full unwind; kBoundary checks
  // only the splice element; kOff unwinds every sample fully.
  unwind::VerifyMode unwind_verify = unwind::VerifyMode::kFull;
};

struct StackRecorderStats {
  uint64_t samples = 0;
  uint64_t unwound_frames = 0;
  uint64_t truncated = 0;       // stacks whose unwinding stopped early
  uint64_t dropped = 0;         // samples of unknown processes or that failed to encode
  uint64_t frames_walked = 0;   // frames found with unwind-rule lookups
  uint64_t frames_reused = 0;   // frames taken from the thread's previous sample
  uint64_t unwind_verify_failures = 0;
  uint64_t unwound_stacks = 0;  // stacks unwound in their process (part of `samples`)
};

class StackRecorder final : public sources::StackSink {
 public:
  // `graph` and `targets` are borrowed.
  StackRecorder(StackRecorderOptions options, ContextGraph* graph, TargetDiscovery* targets);
  ~StackRecorder() override;

  void OnSample(const sampler::RawSample& sample) override;
  void OnStack(sources::StackSource& from, const sources::UnwoundStack& stack) override;

  // The target exited or moved to another source: its threads' state goes.
  void ForgetTarget(pid_t pid);
  // A later thread may reuse the tid: never splice its stack onto this one's frames.
  void ForgetThread(pid_t pid, pid_t tid);

  // Continuous profiling's aggregator; full() once it reached its bound (ship early).
  IntervalAggregator& continuous() { return aggregator_; }
  bool full() const { return full_; }
  void ClearFull() { full_ = false; }
  // Aggregators of capture sessions (not 0); samples of unknown sessions are not counted.
  void AddSession(uint32_t session_id);
  void RemoveSession(uint32_t session_id);
  IntervalAggregator* session(uint32_t session_id);

  const StackRecorderStats& stats() const { return stats_; }

 private:
  struct PathCache;
  struct Thread;
  struct TargetState;

  TargetState& StateOf(const Target& target);
  // Unwinds a perf sample into frames_ with the thread's incremental unwinder (or a full
  // unwind when verification is off).
  unwind::UnwindResult Unwind(const Target& target, TargetState& state,
                              const sampler::RawSample& sample, PathCache** paths,
                              size_t* outer_kept);
  // Symbolizes an unwound stack (innermost first; frames[0].pc exact, the others return
  // addresses), adds its context to the graph and counts it in session `session_id`.
  //
  // `cache` (optional): the thread's last recorded path; its `outer_kept` outermost frames
  // are the ones the incremental unwinder kept in place since then (SampleStats::outer_kept),
  // whose function nodes and edge IDs are taken from the cache instead of being symbolized
  // and looked up again.
  void Record(const Target& target, TargetState& state, const unwind::Frame* frames,
              size_t num_frames, bool truncated, uint32_t session_id, PathCache* cache,
              size_t outer_kept);
  encoding::PathFrame FrameFor(const Target& target, TargetState& state, uint64_t pc,
                               bool innermost);

  const StackRecorderOptions options_;
  ContextGraph* const graph_;
  TargetDiscovery* const targets_;
  absl::flat_hash_map<pid_t, std::unique_ptr<TargetState>> states_;
  IntervalAggregator aggregator_;
  absl::flat_hash_map<uint32_t, std::unique_ptr<IntervalAggregator>> session_aggregators_;
  bool full_ = false;
  StackRecorderStats stats_;
  std::vector<unwind::Frame> frames_;
  std::vector<encoding::PathFrame> path_;
  std::vector<encoding::EdgeId> edges_;  // Record's, for stacks without a PathCache
};

}  // namespace strata::agent

#endif  // STRATA_AGENT_CORE_STACK_RECORDER_H_
