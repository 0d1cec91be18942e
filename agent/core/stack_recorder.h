// The stack recorder: where every stack of every source ends. Perf samples are unwound here
// (common/unwind's incremental unwinder, one per thread, over the target's address space);
// each stack is symbolized into function nodes (kernel frames, when a sample carries its
// kernel chain, below the user frames), its calling context added to the ContextGraph and
// counted in the interval's IntervalAggregator (session 0, continuous profiling), in a capture
// session's own, or, for the context-switch session, in the off-CPU aggregator, weighted by
// the nanoseconds until the thread ran again. Owns the per-thread unwinding state, the
// per-target pc caches, the per-target unwinding counters and the aggregators; the targets
// belong to TargetDiscovery, the kernel's symbols to the recorder's owner.
//
// Python targets (a CPython 3.8-3.15 interpreter among their modules, agent/python): each
// native `_PyEval_EvalFrameDefault` frame of a sample is replaced by the Python frames it runs,
// read from the interpreter's thread state when the sample is recorded (the thread has run on
// since the sample: the read must agree with the sample's eval-loop frames, else the stack
// keeps them and is counted as python_stale). A leaf eval-loop frame in its call's prologue or
// epilogue runs none: it goes, and the read's groups are those of the frames outside it. Of
// their path prefix only the frames outside the outermost eval-loop frame are reused from the
// previous sample (the Python frames under a kept eval-loop frame may differ).
//
// HotSpot JVMs (x86-64, with a perf map naming their interpreter's code): each frame in the
// template interpreter's code is shown as the Java method it runs, its Method* read from the
// sample's stack copy and named from the JVM's memory (agent/jvm/hotspot_methods.h); of the
// path prefix, frames are reused from the last sample up to the first interpreter frame that
// now runs another method.
//
// Single-threaded: the agent's main loop. A sample of a known thread allocates nothing.
#ifndef STRATA_AGENT_CORE_STACK_RECORDER_H_
#define STRATA_AGENT_CORE_STACK_RECORDER_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"
#include "agent/core/context_graph.h"
#include "agent/core/interval_aggregator.h"
#include "agent/core/leaf_histogram.h"
#include "agent/core/targets.h"
#include "agent/jvm/hotspot_methods.h"
#include "agent/kernel/kernel_symbols.h"
#include "agent/python/interpreter.h"
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
  // Names kernel frames (borrowed; null: samples carry no kernel chains).
  const kernel::KernelSymbols* kernel_symbols = nullptr;
  // Off-CPU intervals shorter than this are neither unwound nor counted
  // (StackRecorderStats::off_cpu_short).
  uint64_t off_cpu_threshold_ns = 0;
  // Python frames in place of eval-loop frames, for targets running CPython.
  bool python_frames = true;
  // Python frames copied at each perf sample (borrowed; null: read from memory after it).
  // The recorder registers each Python thread it finds with it.
  python::FrameCapture* python_capture = nullptr;
};

struct StackRecorderStats {
  uint64_t samples = 0;
  uint64_t unwound_frames = 0;
  uint64_t truncated = 0;       // stacks whose unwinding stopped early
  uint64_t dropped = 0;         // samples of unknown processes or that failed to encode
  uint64_t frames_walked = 0;   // frames found with unwind-rule lookups
  uint64_t frames_reused = 0;   // frames taken from the thread's previous sample
  uint64_t unwind_verify_failures = 0;
  // Go stack switches (systemstack, cgo calls and callbacks) crossed onto the goroutine's or
  // the C caller's stack, and those that could not be (the stack ended there).
  uint64_t stack_crossings = 0;
  uint64_t stack_crossings_failed = 0;
  // Samples whose stack copy the kernel ended short of the stack's top (at a page not
  // resident), completed from the process's memory.
  uint64_t stacks_refilled = 0;
  uint64_t unwound_stacks = 0;  // stacks unwound in their process (part of `samples`)
  uint64_t kernel_frames = 0;   // frames from kernel chains
  uint64_t pcs_resolved = 0;    // user pcs seen first (not in the target's pc cache)
  uint64_t pcs_symbolized = 0;  // ... of those, not inside a function resolved before
  uint64_t off_cpu_switches = 0;  // switch-outs of target threads (not part of `samples`)
  uint64_t off_cpu_counted = 0;   // ... whose interval was counted
  uint64_t off_cpu_short = 0;     // ... shorter than the threshold
  uint64_t off_cpu_unpaired = 0;  // ... never followed by a switch-in (lost record, exit)
  uint64_t off_cpu_ns = 0;        // off-CPU time counted
  uint64_t python_stacks = 0;     // stacks with Python frames spliced in
  uint64_t python_frames = 0;     // ... their Python frames
  uint64_t python_stale = 0;      // Python stacks whose frames could not be used (see above):
  uint64_t python_torn = 0;       // ... the chain changed while read (or no thread state)
  uint64_t python_mismatch = 0;   // ... its groups did not match the eval-loop frames
  uint64_t python_reads = 0;      // reads of a thread's Python frames
  uint64_t python_captured = 0;   // ... from the frames copied at the sample (not delayed)
  uint64_t python_reused = 0;     // ... that took the thread's read for its previous sample
  uint64_t python_read_delay_ns = 0;  // sum over the other reads: read time - sample time
  uint64_t python_read_delay_max_ns = 0;
  uint64_t java_frames = 0;       // interpreted Java frames named by their method (not kept)
  uint64_t java_unnamed = 0;      // ... whose slot held no method that could be read
  uint64_t java_inlined = 0;      // frames of calls inlined into compiled Java methods
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
  // Off-CPU time of the interval: counts are nanoseconds until BatchBuilder scales them.
  IntervalAggregator& off_cpu() { return off_cpu_; }
  // Where continuous CPU samples' user leaf frames were, in the same interval.
  LeafHistogram& leaf_addresses() { return leaf_addresses_; }
  // Unwinding counters per target since the last call (targets gone since included).
  std::vector<v1::UnwindCounters> TakeUnwindCounts();
  bool full() const { return full_; }
  // Targets whose interpreter's frames are read (their samples are best recorded soon).
  size_t python_targets() const { return python_targets_; }
  // Looks for the target's interpreter now rather than at its first sample (so that its first
  // samples are drained as soon as the later ones, and with the capture, so that its threads
  // are registered before their first samples); true when it has one.
  bool FindInterpreter(const Target& target);
  bool HasInterpreter(pid_t pid) const;
  // CLOCK_MONOTONIC of the latest sample whose Python frames were read, or of the latest
  // interpreter found (0: none yet), and the time since.
  uint64_t python_sample_ns() const { return python_sample_ns_; }
  absl::Duration SincePythonSample() const;
  void ClearFull() { full_ = false; }
  // Aggregators of capture sessions (not 0); samples of unknown sessions are not counted.
  void AddSession(uint32_t session_id);
  void RemoveSession(uint32_t session_id);
  IntervalAggregator* session(uint32_t session_id);
  // Whether an aggregator (continuous, off-CPU or a capture's) holds samples of the target.
  bool HoldsSamplesOf(uint32_t target_id) const;

  const StackRecorderStats& stats() const { return stats_; }

 private:
  struct PathCache;
  struct Thread;
  struct OffCpuThread;
  struct TargetState;
  struct PythonTarget;
  // The Python frames read for the sample being recorded, innermost first, and where each
  // native eval-loop call's group of them ends (group g: frames [end[g-1] + 1, end[g]]; an
  // innermost call that runs none yet or any more has end[0] == SIZE_MAX, an empty group).
  struct PythonSplice {
    const python::Interpreter* interpreter = nullptr;
    const python::PythonFrame* frames = nullptr;
    const size_t* group_end = nullptr;
    size_t num_groups = 0;
  };

  unwind::IncrementalOptions IncrementalOptions() const;

  TargetState& StateOf(const Target& target);
  // A context-switch session's event: a switch-out sample starts the thread's off-CPU
  // interval, its switch-in ends and counts it.
  void OnSwitch(Target& target, TargetState& state, const sampler::RawSample& sample);
  // Unwinds a perf sample with `thread`'s unwinder and records its context (Record).
  // `counts` (optional): the target's unwinding counters, for stacks of continuous CPU
  // profiling only, so that they describe the samples its batches carry.
  const std::vector<encoding::EdgeId>* UnwindAndRecord(Target& target, TargetState& state,
                                                       std::unique_ptr<Thread>& thread,
                                                       const sampler::RawSample& sample,
                                                       v1::UnwindCounters* counts);
  // Unwinds a perf sample into frames_ with the thread's incremental unwinder (or a full
  // unwind when verification is off).
  // `thread`: the unwinding state to use (created on first use).
  unwind::UnwindResult Unwind(const Target& target, TargetState& state,
                              std::unique_ptr<Thread>& thread, const sampler::RawSample& sample,
                              PathCache** paths, size_t* outer_kept,
                              v1::UnwindCounters* counts);
  // A copy of the sample's stack in refilled_stack_, completed from the process's memory up
  // to the size requested; false when it was not short or nothing more could be read.
  bool RefillStack(const Target& target, TargetState& state, const sampler::RawSample& sample,
                   sampler::RawSample* refilled);
  // Symbolizes an unwound stack (innermost first; frames[0].pc exact, the others return
  // addresses) and adds its context to the graph.
  //
  // `cache` (optional): the thread's last recorded path; its `outer_kept` outermost frames
  // are the ones the incremental unwinder kept in place since then (SampleStats::outer_kept),
  // whose function nodes and edge IDs are taken from the cache instead of being symbolized
  // and looked up again.
  // Returns the context's edges (valid until the next call), or null when it could not be
  // added. `kernel_pcs`: the sample's kernel chain, innermost first, appended below the leaf.
  // `counts` as for UnwindAndRecord.
  // `python` (optional): Python frames to put in place of the eval-loop frames.
  const std::vector<encoding::EdgeId>* Record(const Target& target, TargetState& state,
                                              const unwind::Frame* frames, size_t num_frames,
                                              bool truncated, const uint64_t* kernel_pcs,
                                              size_t kernel_depth, PathCache* cache,
                                              size_t outer_kept, v1::UnwindCounters* counts,
                                              const PythonSplice* python = nullptr,
                                              const uint64_t* java_methods = nullptr,
                                              const uint64_t* java_bcps = nullptr);
  // The target's JVM whose interpreted frames can be named (found again when its mappings
  // changed), or null.
  jvm::HotSpotInterpreter* JavaOf(const Target& target, TargetState& state);
  // The frame of a Java method (interpreted, compiled or inlined into compiled code); nullopt
  // where `method` cannot be named. Its line from `bci`, or where it is not known
  // (jvm::kUnknownBci) from the interpreted frame's bytecode pointer `bcp` (0: none). `now_ns`:
  // CLOCK_MONOTONIC (HotSpotMethods::Find).
  std::optional<encoding::PathFrame> JavaFrameFor(jvm::HotSpotInterpreter& java, uint64_t method,
                                                  uint64_t now_ns, bool innermost, int32_t bci,
                                                  uint64_t bcp = 0);
  // The target's interpreter (found again when its mappings changed), or null.
  python::Interpreter* PythonOf(const Target& target, TargetState& state);
  // Reads the Python frames of the sample's thread for the `num_frames` unwound frames_; true
  // with *splice set when they agree with the eval-loop frames among them (while the
  // interpreter learns eval-loop parts, also when none were known: python_eval_parts.h).
  // `perf`: a perf sample (which may carry its frames, python_capture).
  bool ReadPython(python::Interpreter& interpreter, const Target& target, pid_t tid,
                  uint64_t sample_time_ns, bool perf, size_t num_frames, bool truncated,
                  PythonSplice* splice, v1::UnwindCounters* counts);
  // Registers thread `tid` (of `pid`) with the capture, or again when its thread state moved.
  void CaptureThread(python::Interpreter& interpreter, pid_t pid, pid_t tid);
  // Unregisters the threads of `pid` from the capture.
  void ForgetCapturedThreads(pid_t pid);
  encoding::PathFrame PythonFrameFor(const python::PythonFrame& frame, bool innermost);
  void Count(const Target& target, uint32_t session_id,
             const std::vector<encoding::EdgeId>& edges);
  encoding::PathFrame FrameFor(const Target& target, TargetState& state, uint64_t pc,
                               bool innermost);
  encoding::PathFrame KernelFrameFor(uint64_t pc, bool innermost);

  const StackRecorderOptions options_;
  ContextGraph* const graph_;
  TargetDiscovery* const targets_;
  absl::flat_hash_map<pid_t, std::unique_ptr<TargetState>> states_;
  IntervalAggregator aggregator_;
  IntervalAggregator off_cpu_;
  LeafHistogram leaf_addresses_;
  uint64_t leaf_module_pc_ = 0;  // module offset of the last innermost frame FrameFor resolved
  // Kernel pc (already adjusted for return addresses) -> node; shared by all targets.
  absl::flat_hash_map<uint64_t, encoding::NodeId> kernel_nodes_;
  // Counters of targets forgotten since the last TakeUnwindCounts.
  std::vector<v1::UnwindCounters> retired_counts_;
  absl::flat_hash_map<uint32_t, std::unique_ptr<IntervalAggregator>> session_aggregators_;
  bool full_ = false;
  StackRecorderStats stats_;
  std::vector<unwind::Frame> frames_;
  std::vector<uint8_t> refilled_stack_;  // sized once: options_.stack_bytes
  std::vector<encoding::PathFrame> path_;
  std::vector<encoding::EdgeId> edges_;  // Record's, for stacks without a PathCache
  size_t python_targets_ = 0;
  uint64_t python_sample_ns_ = 0;
  std::vector<uint64_t> java_methods_;              // sized once: the sample's Method*s
  std::vector<uint64_t> java_bcps_;                 // sized once: their bytecode pointers
  std::vector<python::PythonFrame> python_frames_;  // sized once: ReadPython's
  std::vector<size_t> python_group_end_;            // sized once: [0], then ReadPython's groups
  // The read python_frames_ hold (ReadPython takes it again for the thread's next sample when
  // it is recent enough). `interpreter` null: none.
  struct PythonRead {
    const python::Interpreter* interpreter = nullptr;
    pid_t tid = 0;
    uint64_t time_ns = 0;
    python::ReadOutcome outcome = python::ReadOutcome::kOk;
    size_t frames = 0;
    size_t groups = 0;
    uint64_t innermost_call = 0;  // Interpreter::innermost_call()
  };
  PythonRead last_python_read_;
  // Threads registered with the capture: tid -> its process and thread state.
  struct CapturedThread {
    pid_t pid;
    uint64_t tstate;
  };
  absl::flat_hash_map<pid_t, CapturedThread> captured_threads_;
};

}  // namespace strata::agent

#endif  // STRATA_AGENT_CORE_STACK_RECORDER_H_
