// The stack recorder's state per thread and per target, and the limits its caches keep to:
// shared by its source files (stack_recorder.cc: unwinding and recording;
// stack_recorder_interpreters.cc: the Python and Java frames read from interpreters). Internal
// to StackRecorder; owned by it.
#ifndef STRATA_AGENT_CORE_STACK_RECORDER_STATE_H_
#define STRATA_AGENT_CORE_STACK_RECORDER_STATE_H_

#include <time.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "agent/core/stack_recorder.h"

namespace strata::agent {

inline constexpr size_t kMaxPcCacheEntries = 1 << 20;
// Entries of a kernel call chain, as the kernel's default perf_event_max_stack allows.
inline constexpr size_t kMaxKernelChain = 128;
// A thread's Python frames read this recently are taken again for its next sample.
inline constexpr uint64_t kReuseReadNs = 100'000;

inline uint64_t MonotonicNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000u + static_cast<uint64_t>(ts.tv_nsec);
}

// A thread's last recorded stack as a path, outermost first: path[i] is frame i's (function
// node, call site) and edges[i] the edge ID into it -- the patent's cumulative context
// encoding kept per cached frame. Valid for the names epoch (the mappings' epoch plus the perf
// map's generation) the nodes were resolved in and for the `truncated` the edges were added
// with (the outermost edge hangs off the root or the truncated marker). Edge IDs never change
// once added, so a kept prefix stays exact.
struct StackRecorder::PathCache {
  std::vector<encoding::PathFrame> path;
  std::vector<encoding::EdgeId> edges;
  uint64_t epoch = 0;
  bool truncated = false;
  // Where each native frame's path frames end, outermost first: ends[k] is the path's size
  // after the k-th frame from the outside (a Python eval-loop frame or a compiled Java frame
  // with inlined calls has several path frames, others one).
  std::vector<uint32_t> ends;
};

// Per-thread state of continuous unwinding: the incremental unwinder (previous sample's
// frames) and the path recorded for them. Both arrays are sized once, so a sample of a known
// thread allocates nothing here. Without verification nothing is kept from one sample to the
// next, so the path arrays stay empty and Record uses its shared ones.
struct StackRecorder::Thread {
  Thread(const unwind::IncrementalOptions& options, size_t max_frames) : unwinder(options) {
    if (options.verify == unwind::VerifyMode::kOff) return;
    paths.path.reserve(max_frames);
    paths.edges.reserve(max_frames);
    paths.ends.reserve(max_frames);
  }
  unwind::IncrementalUnwinder unwinder;
  PathCache paths;
};

// A thread's off-CPU side: its own unwinder (a thread that blocks in the same place keeps its
// outer frames from one switch to the next) and a copy of its last switch-out (registers,
// used stack bytes, kernel chain), unwound only once the switch-in shows the interval counts.
// The copies are sized once.
struct StackRecorder::OffCpuThread {
  OffCpuThread(const unwind::IncrementalOptions& options, size_t max_frames, size_t stack_bytes)
      : thread(std::make_unique<Thread>(options, max_frames)) {
    stack.reserve(stack_bytes);
    kernel_pcs.reserve(kMaxKernelChain);
  }
  std::unique_ptr<Thread> thread;
  sampler::RawSample out;  // stack and kernel_pcs point into the copies below when used
  std::vector<uint8_t> stack;
  std::vector<uint64_t> kernel_pcs;
  bool waiting = false;
};

struct StackRecorder::TargetState {
  // Of continuous CPU stacks (what the batches' samples are) since the last TakeUnwindCounts;
  // target_id set.
  v1::UnwindCounters counts;
  // Its memory, for stacks the kernel copied short (made at the first).
  std::unique_ptr<python::RemoteMemory> memory;
  absl::flat_hash_map<pid_t, std::unique_ptr<Thread>> threads;  // by tid
  absl::flat_hash_map<pid_t, std::unique_ptr<OffCpuThread>> off_cpu;  // by tid
  // Absolute pc (already adjusted for return addresses) -> function node and module offset,
  // for the names epoch `pc_epoch` (the mappings' epoch plus the perf map's generation).
  struct CachedPc {
    encoding::NodeId node;
    uint64_t module_pc;
  };
  absl::flat_hash_map<uint64_t, CachedPc> pc_cache;
  // Functions of known extent resolved in names epoch `pc_epoch`, by absolute start: a pc
  // inside one takes its node without being symbolized again (a hot loop's leaf is at a new
  // address in many samples). `module_base`: absolute minus module pc.
  struct CachedFunction {
    uint64_t end;  // absolute, exclusive
    encoding::NodeId node;
    uint64_t module_base;
  };
  std::map<uint64_t, CachedFunction> functions;
  uint64_t pc_epoch = 0;
  // The interpreter found in the mappings of epoch `python_epoch` (null: none).
  std::unique_ptr<PythonTarget> python;
  std::optional<uint64_t> python_epoch;
  // The JVM found in the mappings of epoch `java_epoch` (null: none, or its tables could not
  // be read), and where its libjvm.so was loaded (its tables are read once per JVM).
  std::unique_ptr<jvm::HotSpotInterpreter> java;
  std::optional<uint64_t> java_epoch;
  std::optional<int64_t> java_bias;
};

struct StackRecorder::PythonTarget {
  std::unique_ptr<python::Interpreter> interpreter;
  uint64_t runtime = 0;  // absolute address of its _PyRuntime
};

}  // namespace strata::agent

#endif  // STRATA_AGENT_CORE_STACK_RECORDER_STATE_H_
