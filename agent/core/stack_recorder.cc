#include "agent/core/stack_recorder.h"

#include <time.h>

#include <algorithm>
#include <limits>
#include <map>
#include <optional>

#include "absl/strings/str_cat.h"
#include "agent/core/python_eval_parts.h"
#include "agent/jvm/hotspot_attach.h"
#include "agent/sources/perf_source.h"
#include "common/base/frame_kind.h"
#include "common/base/log.h"
#include "common/unwind/host_arch.h"

namespace strata::agent {
namespace {
constexpr size_t kMaxPcCacheEntries = 1 << 20;
// Entries of a kernel call chain, as the kernel's default perf_event_max_stack allows.
constexpr size_t kMaxKernelChain = 128;
// A thread's Python frames read this recently are taken again for its next sample.
constexpr uint64_t kReuseReadNs = 100'000;

uint64_t MonotonicNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000u + static_cast<uint64_t>(ts.tv_nsec);
}
}  // namespace

// A thread's last recorded stack as a path, outermost first: path[i] is frame i's (function
// node, call site) and edges[i] the edge ID into it -- the patent's cumulative context
// encoding kept per cached frame. Valid for the mappings epoch the nodes were resolved in and
// for the `truncated` the edges were added with (the outermost edge hangs off the root or the
// truncated marker). Edge IDs never change once added, so a kept prefix stays exact.
struct StackRecorder::PathCache {
  std::vector<encoding::PathFrame> path;
  std::vector<encoding::EdgeId> edges;
  uint64_t epoch = 0;
  bool truncated = false;
  // How many of the stack's outermost native frames have a path frame each: all but those
  // from the outermost compiled Java frame shown with its inlined calls on.
  size_t one_for_one = std::numeric_limits<size_t>::max();
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
  absl::flat_hash_map<pid_t, std::unique_ptr<Thread>> threads;  // by tid
  absl::flat_hash_map<pid_t, std::unique_ptr<OffCpuThread>> off_cpu;  // by tid
  // Absolute pc (already adjusted for return addresses) -> function node and module offset,
  // for the target's mappings epoch `pc_epoch`.
  struct CachedPc {
    encoding::NodeId node;
    uint64_t module_pc;
  };
  absl::flat_hash_map<uint64_t, CachedPc> pc_cache;
  // Functions of known extent resolved in epoch `pc_epoch`, by absolute start: a pc inside
  // one takes its node without being symbolized again (a hot loop's leaf is at a new address
  // in many samples). `module_base`: absolute minus module pc.
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

StackRecorder::StackRecorder(StackRecorderOptions options, ContextGraph* graph,
                             TargetDiscovery* targets)
    : options_(options), graph_(graph), targets_(targets) {
  frames_.resize(options_.max_frames);
  java_methods_.resize(options_.max_frames);
  python_frames_.resize(options_.max_frames);
  python_group_end_.resize(options_.max_frames);
}

StackRecorder::~StackRecorder() = default;

StackRecorder::TargetState& StackRecorder::StateOf(const Target& target) {
  std::unique_ptr<TargetState>& state = states_[target.pid];
  if (state == nullptr) {
    state = std::make_unique<TargetState>();
    state->counts.set_target_id(target.id);
  }
  return *state;
}

void StackRecorder::ForgetTarget(pid_t pid) {
  auto it = states_.find(pid);
  if (it == states_.end()) return;
  if (it->second->counts.stacks() > 0 || it->second->counts.lost() > 0) {
    retired_counts_.push_back(it->second->counts);
  }
  python_targets_ -= it->second->python != nullptr;
  last_python_read_ = {};  // (its interpreter goes)
  ForgetCapturedThreads(pid);
  states_.erase(it);
}

void StackRecorder::ForgetThread(pid_t pid, pid_t tid) {
  if (last_python_read_.tid == tid) last_python_read_ = {};
  if (captured_threads_.erase(tid) > 0) options_.python_capture->Forget(tid);
  if (auto it = states_.find(pid); it != states_.end()) {
    it->second->threads.erase(tid);
    if (auto off = it->second->off_cpu.find(tid); off != it->second->off_cpu.end()) {
      stats_.off_cpu_unpaired += off->second->waiting;
      it->second->off_cpu.erase(off);
    }
  }
}

std::vector<v1::UnwindCounters> StackRecorder::TakeUnwindCounts() {
  std::vector<v1::UnwindCounters> out = std::move(retired_counts_);
  retired_counts_.clear();
  for (auto& [pid, state] : states_) {
    if (state->counts.stacks() == 0 && state->counts.lost() == 0) continue;
    out.push_back(state->counts);
    const uint32_t target_id = state->counts.target_id();
    state->counts.Clear();
    state->counts.set_target_id(target_id);
  }
  return out;
}

void StackRecorder::OnSample(const sampler::RawSample& sample) {
  Target* target = targets_->Find(static_cast<pid_t>(sample.pid));
  if (target == nullptr) {
    ++stats_.dropped;
    return;
  }
  TargetState& state = StateOf(*target);
  if (sample.session_id == sources::kOffCpuSession) {
    OnSwitch(*target, state, sample);
    return;
  }
  if (sample.kind != sampler::RawEventKind::kSample) return;
  ++stats_.samples;
  const bool continuous = sample.session_id == sources::kContinuousSession;
  const std::vector<encoding::EdgeId>* edges =
      UnwindAndRecord(*target, state, state.threads[static_cast<pid_t>(sample.tid)], sample,
                      continuous ? &state.counts : nullptr);
  if (edges != nullptr) Count(*target, sample.session_id, *edges);
}

const std::vector<encoding::EdgeId>* StackRecorder::UnwindAndRecord(
    Target& target, TargetState& state, std::unique_ptr<Thread>& thread,
    const sampler::RawSample& sample, v1::UnwindCounters* counts) {
  PathCache* paths = nullptr;
  size_t outer_kept = 0;
  unwind::UnwindResult result =
      Unwind(target, state, thread, sample, &paths, &outer_kept, counts);
  if (result.num_frames == 0) {
    frames_[0] = {sample.pc, sample.sp, 0};
    result.num_frames = 1;
  }
  if (result.stop == unwind::StopReason::kNoModule) targets_->RefreshSoon(target);
  const bool truncated = result.stop != unwind::StopReason::kOutermost;
  // Off-CPU stacks are recorded at the switch-in, long after the switch-out they show: the
  // thread's Python frames are not those of the sample any more.
  PythonSplice splice;
  const PythonSplice* python = nullptr;
  if (options_.python_frames && sample.session_id != sources::kOffCpuSession) {
    if (python::Interpreter* interpreter = PythonOf(target, state);
        interpreter != nullptr &&
        ReadPython(*interpreter, target, static_cast<pid_t>(sample.tid), sample.time_ns,
                   /*perf=*/true, result.num_frames, truncated, &splice, counts)) {
      python = &splice;
    }
  }
  const uint64_t* java_methods = nullptr;
  if (const jvm::HotSpotInterpreter* java = JavaOf(target, state);
      java != nullptr && java->MethodsOf({frames_.data(), result.num_frames}, sample.sp,
                                         {sample.stack, sample.stack_size},
                                         java_methods_.data())) {
    java_methods = java_methods_.data();
  }
  return Record(target, state, frames_.data(), result.num_frames, truncated, sample.kernel_pcs,
                sample.kernel_depth, paths, outer_kept, counts, python, java_methods);
}

jvm::HotSpotInterpreter* StackRecorder::JavaOf(const Target& target, TargetState& state) {
  if (!target.jvm || unwind::kHostArch != unwind::Arch::kX86_64) return nullptr;
  if (state.java_epoch == target.maps_epoch) return state.java.get();
  state.java_epoch = target.maps_epoch;
  const symbols::Module* libjvm = nullptr;
  int64_t bias = 0;
  target.space->ForEachModule([&](const symbols::Module& m, int64_t module_bias) {
    if (libjvm == nullptr && m.elf != nullptr && jvm::IsLibJvm(m.path)) {
      libjvm = &m;
      bias = module_bias;
    }
  });
  if (libjvm == nullptr) {
    state.java.reset();
    state.java_bias.reset();
    return nullptr;
  }
  if (state.java_bias != bias) {  // the first JVM seen here, or another one
    state.java_bias = bias;
    absl::StatusOr<std::unique_ptr<jvm::HotSpotInterpreter>> attached =
        jvm::HotSpotInterpreter::Attach(target.pid, *libjvm->elf, bias);
    if (!attached.ok()) {
      LogInfo("pid {}: interpreted Java frames not named: {}", target.pid,
              attached.status().ToString());
    } else if (!(*attached)->scopes_status().ok()) {
      LogInfo("pid {}: calls inlined into compiled Java code not shown: {}", target.pid,
              (*attached)->scopes_status().ToString());
    }
    state.java = attached.ok() ? *std::move(attached) : nullptr;
  }
  return state.java.get();
}

std::optional<encoding::PathFrame> StackRecorder::JavaFrameFor(jvm::HotSpotInterpreter& java,
                                                               uint64_t method, uint64_t now_ns,
                                                               bool innermost) {
  const jvm::HotSpotMethods::Method* m = java.methods().Find(method, now_ns);
  if (m == nullptr) return std::nullopt;
  if (m->owner_id == 0) {
    FunctionRecord record;
    record.name = m->name;
    record.module = java.module();
    m->owner_id = graph_->NodeFor(record);
  }
  if (innermost) leaf_module_pc_ = 0;
  return encoding::PathFrame{m->owner_id, 0};
}

python::Interpreter* StackRecorder::PythonOf(const Target& target, TargetState& state) {
  if (state.python_epoch == target.maps_epoch) {
    return state.python != nullptr ? state.python->interpreter.get() : nullptr;
  }
  // The mappings changed (or were never looked at): which module holds an interpreter.
  state.python_epoch = target.maps_epoch;
  std::optional<python::InterpreterModule> found;
  int64_t bias = 0;
  std::string path;
  absl::Status unsupported;
  if (target.space != nullptr) {
    target.space->ForEachModule([&](const symbols::Module& m, int64_t module_bias) {
      if (found.has_value() || m.elf == nullptr) return;
      absl::StatusOr<python::InterpreterModule> inspected =
          python::InspectModule(*m.elf, m.symbols, m.path);
      if (inspected.ok()) {
        found = *inspected;
        bias = module_bias;
        path = m.path;
      } else if (inspected.status().code() != absl::StatusCode::kNotFound) {
        unsupported = inspected.status();
      }
    });
  }
  if (!unsupported.ok() && !found.has_value()) {
    LogInfo("pid {}: no Python frames: {}", target.pid, unsupported.ToString());
  }
  const uint64_t runtime = found.has_value() ? found->runtime_vaddr + bias : 0;
  if (state.python != nullptr && state.python->runtime == runtime) {
    return state.python->interpreter.get();  // the same interpreter: keep its caches
  }
  python_targets_ -= state.python != nullptr;
  last_python_read_ = {};
  ForgetCapturedThreads(target.pid);
  state.python.reset();
  if (!found.has_value()) return nullptr;
  absl::StatusOr<std::unique_ptr<python::Interpreter>> attached =
      python::Interpreter::Attach(target.pid, *found, bias);
  if (!attached.ok()) {
    LogWarn("pid {} ({}): no Python frames: {}", target.pid, path,
                 attached.status().ToString());
    return nullptr;
  }
  LogInfo("pid {}: Python frames of CPython {}.{} ({})", target.pid, found->major,
               found->minor, path);
  // Its samples are expected from now on (Profiler::PythonWait).
  python_sample_ns_ = std::max(python_sample_ns_, MonotonicNs());
  state.python = std::make_unique<PythonTarget>();
  state.python->interpreter = std::move(*attached);
  state.python->runtime = runtime;
  ++python_targets_;
  return state.python->interpreter.get();
}

bool StackRecorder::FindInterpreter(const Target& target) {
  if (!options_.python_frames) return false;
  python::Interpreter* interpreter = PythonOf(target, StateOf(target));
  if (interpreter == nullptr) return false;
  // Its threads' samples carry their frames from the first on.
  if (options_.python_capture != nullptr) {
    for (pid_t tid : interpreter->ThreadIds()) CaptureThread(*interpreter, target.pid, tid);
  }
  return true;
}

bool StackRecorder::HasInterpreter(pid_t pid) const {
  auto it = states_.find(pid);
  return it != states_.end() && it->second->python != nullptr;
}

absl::Duration StackRecorder::SincePythonSample() const {
  const uint64_t now = MonotonicNs();
  const uint64_t since = now > python_sample_ns_ ? now - python_sample_ns_ : 0;
  return absl::Nanoseconds(static_cast<int64_t>(since));
}

void StackRecorder::CaptureThread(python::Interpreter& interpreter, pid_t pid, pid_t tid) {
  std::optional<python::CaptureThread> thread = interpreter.CaptureThreadOf(tid);
  if (!thread.has_value()) return;
  auto [it, added] = captured_threads_.try_emplace(tid, CapturedThread{pid, 0});
  if (!added && it->second.tstate == thread->tstate) return;
  it->second = {pid, thread->tstate};
  if (absl::Status st = options_.python_capture->Register(tid, *thread); !st.ok()) {
    LogDebug("pid {} tid {}: Python frames not copied at the sample: {}", pid, tid,
             st.ToString());
  }
}

void StackRecorder::ForgetCapturedThreads(pid_t pid) {
  for (auto it = captured_threads_.begin(); it != captured_threads_.end();) {
    if (it->second.pid != pid) {
      ++it;
      continue;
    }
    options_.python_capture->Forget(it->first);
    captured_threads_.erase(it++);
  }
}

bool StackRecorder::ReadPython(python::Interpreter& interpreter, const Target& target, pid_t tid,
                               uint64_t sample_time_ns, bool perf, size_t num_frames,
                               bool truncated, PythonSplice* splice,
                               v1::UnwindCounters* counts) {
  const auto count_evals = [&] {
    size_t n = 0;
    for (size_t i = 0; i < num_frames; ++i) {
      n += interpreter.InEvalLoop(i == 0 ? frames_[i].pc : frames_[i].pc - 1);
    }
    return n;
  };
  size_t evals = count_evals();
  const bool learning = interpreter.learns_eval_parts() && target.space != nullptr;
  python::FrameCapture* capture = perf ? options_.python_capture : nullptr;
  const python::FrameSnapshot* snapshot =
      capture != nullptr ? capture->Find(tid, sample_time_ns) : nullptr;
  // No eval-loop frame: the thread ran no Python code when sampled, unless the eval loop has
  // parts not known yet.
  if (evals == 0 && !learning) return false;
  ++stats_.python_reads;
  const uint64_t now = MonotonicNs();
  python_sample_ns_ = std::max(python_sample_ns_, sample_time_ns);
  PythonRead& last = last_python_read_;
  bool reused = false;  // the last sample's read: its entry frames are no new evidence
  if (snapshot != nullptr) {
    ++stats_.python_captured;
    last = {&interpreter, tid, now, python::ReadOutcome::kOk, 0, 0};
    last.outcome = interpreter.ReadSnapshot(*snapshot, python_frames_, &last.frames);
  } else {
    const uint64_t delay = now > sample_time_ns ? now - sample_time_ns : 0;
    stats_.python_read_delay_ns += delay;
    stats_.python_read_delay_max_ns = std::max(stats_.python_read_delay_max_ns, delay);
    // Samples of one thread drained one after the other take the same read: it would find
    // the same frames (the thread ran for microseconds since).
    if (last.interpreter == &interpreter && last.tid == tid &&
        now - last.time_ns < kReuseReadNs) {
      ++stats_.python_reused;
      reused = true;
    } else {
      last = {&interpreter, tid, now, python::ReadOutcome::kOk, 0, 0};
      last.outcome = interpreter.ReadStack(tid, python_frames_, &last.frames);
      // Its thread state is known now: its next samples carry their frames.
      if (capture != nullptr) CaptureThread(interpreter, target.pid, tid);
    }
  }
  if (last.outcome == python::ReadOutcome::kOk && last.groups == 0) {
    for (size_t i = 0; i < last.frames; ++i) {
      if (python_frames_[i].entry) python_group_end_[last.groups++] = i;
    }
  }
  const python::ReadOutcome outcome = last.outcome;
  const size_t groups = last.groups;
  if (learning && (evals == 0 || groups > evals)) {  // a read that looks for parts: bounded
    interpreter.CountLearningRead();
    if (outcome == python::ReadOutcome::kOk && groups > evals && !reused &&
        LearnEvalParts(interpreter, *target.space, {frames_.data(), num_frames}) > 0) {
      evals = count_evals();
    }
  }
  if (evals == 0) return false;
  // One group of Python frames per eval-loop frame (the outermost groups may lie beyond a
  // truncated native stack). Anything else: the thread ran on between sample and read.
  if (outcome != python::ReadOutcome::kOk || groups < evals || (!truncated && groups > evals)) {
    ++stats_.python_stale;
    ++(outcome == python::ReadOutcome::kOk ? stats_.python_mismatch : stats_.python_torn);
    if (counts != nullptr) counts->set_python_stale(counts->python_stale() + 1);
    return false;
  }
  const size_t spliced = python_group_end_[evals - 1] + 1;
  ++stats_.python_stacks;
  stats_.python_frames += spliced;
  if (counts != nullptr) counts->set_python_frames(counts->python_frames() + spliced);
  *splice = {&interpreter, python_frames_.data(), python_group_end_.data(), evals};
  return true;
}

encoding::PathFrame StackRecorder::PythonFrameFor(const python::PythonFrame& frame,
                                                  bool innermost) {
  const python::CodeInfo& code = *frame.code;
  if (code.owner_id == 0) {
    FunctionRecord record;
    record.name = code.name;
    record.module = base::PythonModuleName(code.filename);
    record.start_offset = static_cast<uint64_t>(std::max(code.first_line, 0));
    code.owner_id = graph_->NodeFor(record);
  }
  // The line stands for the address: a leaf's line is its leaf address, a caller's call site
  // is line + 1 (like a return address, one past the call; 0: no line).
  const uint64_t line = static_cast<uint64_t>(std::max(frame.line, 0));
  if (innermost) leaf_module_pc_ = line;
  return {code.owner_id, innermost || line == 0 ? 0 : line + 1};
}

void StackRecorder::OnSwitch(Target& target, TargetState& state,
                             const sampler::RawSample& sample) {
  const pid_t tid = static_cast<pid_t>(sample.tid);
  if (sample.kind == sampler::RawEventKind::kSwitchIn) {
    auto it = state.off_cpu.find(tid);
    if (it == state.off_cpu.end() || !it->second->waiting) return;
    OffCpuThread& thread = *it->second;
    thread.waiting = false;
    const uint64_t ns = sample.time_ns > thread.out.time_ns ? sample.time_ns - thread.out.time_ns : 0;
    if (ns < options_.off_cpu_threshold_ns || ns == 0) {
      ++stats_.off_cpu_short;  // never unwound
      return;
    }
    // Now that the interval counts, the switch-out's copy is unwound, with the thread's
    // off-CPU unwinder (a thread blocking in the same place keeps its outer frames).
    sampler::RawSample out = thread.out;
    out.stack = thread.stack.data();
    out.kernel_pcs = thread.kernel_pcs.data();
    const std::vector<encoding::EdgeId>* edges =
        UnwindAndRecord(target, state, thread.thread, out, /*counts=*/nullptr);
    if (edges == nullptr) return;
    ++stats_.off_cpu_counted;
    stats_.off_cpu_ns += ns;
    if (!off_cpu_.Add(target.id, *edges, ns)) full_ = true;
    return;
  }
  ++stats_.off_cpu_switches;
  std::unique_ptr<OffCpuThread>& slot = state.off_cpu[tid];
  if (slot == nullptr) {
    slot = std::make_unique<OffCpuThread>(IncrementalOptions(), options_.max_frames,
                                          options_.stack_bytes);
  }
  stats_.off_cpu_unpaired += slot->waiting;
  // Kept until the switch-in says how long the thread was off CPU: an interval under the
  // threshold costs this copy of the stack's used bytes, not an unwind.
  slot->out = sample;
  slot->out.stack = nullptr;
  slot->out.kernel_pcs = nullptr;
  slot->out.user_pcs = nullptr;  // switch sessions have none
  slot->out.user_depth = 0;
  slot->stack.assign(sample.stack, sample.stack + sample.stack_size);
  slot->kernel_pcs.assign(sample.kernel_pcs, sample.kernel_pcs + sample.kernel_depth);
  slot->waiting = true;
}

unwind::IncrementalOptions StackRecorder::IncrementalOptions() const {
  unwind::IncrementalOptions options;
  options.unwind.arch = unwind::kHostArch;
  options.unwind.max_frames = options_.max_frames;
  options.verify = options_.unwind_verify;
  return options;
}

unwind::UnwindResult StackRecorder::Unwind(const Target& target, TargetState& state,
                                           std::unique_ptr<Thread>& thread,
                                           const sampler::RawSample& sample,
                                           PathCache** paths, size_t* outer_kept,
                                           v1::UnwindCounters* counts) {
  unwind::Registers regs{sample.pc, sample.sp, sample.fp, sample.ra, sample.g};
  unwind::StackSnapshot stack{sample.sp, sample.stack, sample.stack_size, sample.user_pcs,
                              sample.user_depth};
  if (thread == nullptr) thread = std::make_unique<Thread>(IncrementalOptions(), options_.max_frames);
  // A copy shorter than requested ended at the top of the thread's stack.
  const bool stack_end_known = sample.stack_size < options_.stack_bytes;
  unwind::SampleStats unwind_stats;
  unwind::UnwindResult result =
      thread->unwinder.Unwind({regs, stack, target.maps_epoch, stack_end_known}, *target.space,
                              frames_.data(), frames_.size(), &unwind_stats);
  *paths = options_.unwind_verify == unwind::VerifyMode::kOff ? nullptr : &thread->paths;
  *outer_kept = unwind_stats.outer_kept;
  stats_.frames_walked += unwind_stats.frames_unwound;
  stats_.frames_reused += unwind_stats.frames_reused;
  stats_.unwind_verify_failures += unwind_stats.verify_failed;
  stats_.stack_crossings += result.stack_crossings;
  stats_.stack_crossings_failed += result.crossings_failed;
  if (counts != nullptr) {
    counts->set_verify_failures(counts->verify_failures() + unwind_stats.verify_failed);
    counts->set_jit_frames_cfi(counts->jit_frames_cfi() + unwind_stats.jit_frames_cfi);
    counts->set_jit_frames_fp(counts->jit_frames_fp() + unwind_stats.jit_frames_fp);
  }
  return result;
}

void StackRecorder::OnStack(sources::StackSource& from, const sources::UnwoundStack& stack) {
  Target* target = targets_->Find(stack.pid);
  if (target == nullptr || stack.num_frames == 0) {
    ++stats_.dropped;
    return;
  }
  // The source claimed the process in this drain's rescan, before the target switched.
  if (target->source != &from) targets_->SetSource(*target, &from);
  ++stats_.samples;
  ++stats_.unwound_stacks;
  const size_t n = std::min(stack.num_frames, frames_.size());
  for (size_t i = 0; i < n; ++i) frames_[i] = {stack.pcs[i], 0, 0};
  // A pc outside the modules we know: the target mapped a library since the last rescan.
  if (stack.stopped_outside_modules) targets_->RefreshSoon(*target);
  TargetState& state = StateOf(*target);
  const bool truncated = stack.truncated || n < stack.num_frames;
  // The ring says which thread and when: its Python frames are read now, as for perf samples.
  PythonSplice splice;
  const PythonSplice* python = nullptr;
  if (options_.python_frames && stack.tid > 0) {
    if (python::Interpreter* interpreter = PythonOf(*target, state);
        interpreter != nullptr &&
        ReadPython(*interpreter, *target, stack.tid, stack.time_ns, /*perf=*/false, n,
                   truncated, &splice, &state.counts)) {
      python = &splice;
    }
  }
  const std::vector<encoding::EdgeId>* edges =
      Record(*target, state, frames_.data(), n, truncated, /*kernel_pcs=*/nullptr,
             /*kernel_depth=*/0, /*cache=*/nullptr, /*outer_kept=*/0, &state.counts, python);
  if (edges != nullptr) Count(*target, sources::kContinuousSession, *edges);
}

encoding::PathFrame StackRecorder::FrameFor(const Target& target, TargetState& state,
                                            uint64_t pc, bool innermost) {
  // A return address points after the call; look up the call itself so a call that is the
  // last instruction of a function is attributed to that function.
  const uint64_t lookup = innermost ? pc : pc - 1;
  auto it = state.pc_cache.find(lookup);
  if (it == state.pc_cache.end()) {
    ++stats_.pcs_resolved;
    if (auto f = state.functions.upper_bound(lookup); f != state.functions.begin()) {
      --f;
      if (lookup < f->second.end) {
        if (state.pc_cache.size() >= kMaxPcCacheEntries) state.pc_cache.clear();
        it = state.pc_cache
                 .emplace(lookup, TargetState::CachedPc{f->second.node,
                                                        lookup - f->second.module_base})
                 .first;
      }
    }
  }
  if (it == state.pc_cache.end()) {
    ++stats_.pcs_symbolized;
    symbols::SymbolizedPc sym = target.space->Symbolize(lookup);
    FunctionRecord record;
    if (sym.module_path.empty()) {
      record.name = "[unknown]";
    } else {
      record.name = sym.function_name;
      record.module = sym.module_path;
      record.build_id = sym.build_id;
      record.start_offset = sym.known_function ? sym.function_start : sym.module_pc;
    }
    // The interpreter's code, where the JVM's perf map names it (its extent is the entry's).
    symbols::PerfMap::Symbol entry;
    if (state.java != nullptr && sym.known_function && sym.function_name == "Interpreter" &&
        base::FrameKindOf(sym.module_path) == base::FrameKind::kJit &&
        target.space->perf_map() != nullptr && target.space->perf_map()->Lookup(lookup, &entry)) {
      state.java->SetCode(entry.start, entry.end, sym.module_path);
    }
    if (state.pc_cache.size() >= kMaxPcCacheEntries) state.pc_cache.clear();
    it = state.pc_cache
             .emplace(lookup, TargetState::CachedPc{graph_->NodeFor(record), sym.module_pc})
             .first;
    if (sym.known_function && sym.function_end > sym.module_pc && sym.module_pc <= lookup &&
        state.functions.size() < kMaxPcCacheEntries) {
      const uint64_t base = lookup - sym.module_pc;
      state.functions[sym.function_start + base] = {sym.function_end + base, it->second.node,
                                                    base};
    }
  }
  if (innermost) leaf_module_pc_ = it->second.module_pc;
  return {it->second.node, innermost ? 0 : it->second.module_pc + 1};
}

encoding::PathFrame StackRecorder::KernelFrameFor(uint64_t pc, bool innermost) {
  const uint64_t lookup = innermost ? pc : pc - 1;
  auto it = kernel_nodes_.find(lookup);
  if (it == kernel_nodes_.end()) {
    FunctionRecord record;
    kernel::KernelSymbol sym;
    if (options_.kernel_symbols != nullptr && options_.kernel_symbols->Lookup(lookup, &sym)) {
      record.name = std::string(sym.name);
      record.module = base::KernelModuleName(sym.module);
      record.start_offset = sym.offset;
    } else {
      record.module = std::string(base::kKernelModule);
      record.name = absl::StrCat(record.module, "+0x", absl::Hex(lookup));
      record.start_offset = lookup;
    }
    if (kernel_nodes_.size() >= kMaxPcCacheEntries) kernel_nodes_.clear();
    it = kernel_nodes_.emplace(lookup, graph_->NodeFor(record)).first;
  }
  return {it->second, innermost ? 0 : pc};
}

const std::vector<encoding::EdgeId>* StackRecorder::Record(
    const Target& target, TargetState& state, const unwind::Frame* frames, size_t num_frames,
    bool truncated, const uint64_t* kernel_pcs, size_t kernel_depth, PathCache* cache,
    size_t outer_kept, v1::UnwindCounters* counts, const PythonSplice* python,
    const uint64_t* java_methods) {
  stats_.unwound_frames += num_frames;
  stats_.truncated += truncated;
  stats_.kernel_frames += kernel_depth;
  if (counts != nullptr) {
    counts->set_stacks(counts->stacks() + 1);
    counts->set_truncated(counts->truncated() + truncated);
  }
  if (state.pc_epoch != target.maps_epoch) {  // resolved against mappings since replaced
    state.pc_cache.clear();
    state.functions.clear();
    state.pc_epoch = target.maps_epoch;
  }
  std::vector<encoding::PathFrame>& path = cache != nullptr ? cache->path : path_;
  std::vector<encoding::EdgeId>& edges = cache != nullptr ? cache->edges : edges_;
  // Frames kept from the thread's last stack keep their path frames and edge IDs. Never that
  // stack's leaf: its node was resolved from an exact pc, not from a return address.
  // In a Python target only those outside the outermost eval-loop frame: the Python frames
  // under kept eval-loop frames may have changed, and path frames stand for native frames one
  // for one only up to there (in the last stack too: the kept frames are the same).
  // The scopes of the JVM's compiled code, where its layout and perf map are known.
  jvm::HotSpotScopes* java_scopes = nullptr;
  const symbols::PerfMap* perf_map = target.space != nullptr ? target.space->perf_map() : nullptr;
  if (state.java != nullptr && state.java->code_known() && perf_map != nullptr) {
    java_scopes = state.java->scopes();
  }
  // The clock interpreted methods' names and compiled methods' scopes are checked again by,
  // read once per stack.
  const uint64_t java_now = java_methods != nullptr || java_scopes != nullptr ? MonotonicNs() : 0;
  size_t keep = 0;
  if (cache != nullptr && !path.empty() && cache->epoch == target.maps_epoch &&
      cache->truncated == truncated) {
    keep = std::min({outer_kept, path.size() - 1, edges.size(), num_frames - 1,
                     cache->one_for_one});
    if (state.python != nullptr) {
      const python::Interpreter& interpreter = *state.python->interpreter;
      size_t outside = 0;
      while (outside < keep && !interpreter.InEvalLoop(frames[num_frames - 1 - outside].pc - 1)) {
        ++outside;
      }
      keep = outside;
    }
    // So in a JVM, up to the first interpreter frame not running the method it ran in the last
    // stack: the method is not in the frame's return address.
    if (jvm::HotSpotInterpreter* java = state.java.get(); java != nullptr && java->code_known()) {
      size_t outside = 0;
      for (; outside < keep; ++outside) {
        const size_t f = num_frames - 1 - outside;
        if (!java->Contains(frames[f].pc - 1)) continue;
        const jvm::HotSpotMethods::Method* m =
            java_methods == nullptr || java_methods[f] == 0
                ? nullptr
                : java->methods().Find(java_methods[f], java_now);
        if (m == nullptr || m->owner_id != path[outside].function) break;
      }
      keep = outside;
    }
  }
  // Of a Python stack's frames inward of the kept ones, those the same as the last stack's
  // keep their edges too: the thread mostly runs the same calls. The new frames overwrite
  // the last stack's in place, compared as they go.
  bool same = cache != nullptr && (python != nullptr || java_methods != nullptr) && keep > 0;
  size_t at = keep, same_until = keep;
  auto put = [&](const encoding::PathFrame& f) {
    if (at < path.size()) {
      same = same && at < edges.size() && path[at] == f;
      if (same) same_until = at + 1;
      path[at] = f;
    } else {
      same = false;
      path.push_back(f);
    }
    ++at;
  };
  // Eval-loop frames met so far count down from the outermost: the g-th from the leaf runs
  // group g of the Python frames, whose frames go in outermost first.
  size_t evals_left = python != nullptr ? python->num_groups : 0;
  size_t one_for_one = std::numeric_limits<size_t>::max();
  for (size_t i = num_frames - keep; i-- > 0;) {
    if (evals_left > 0 &&
        python->interpreter->InEvalLoop(i == 0 ? frames[i].pc : frames[i].pc - 1)) {
      const size_t g = --evals_left;
      const size_t first = g == 0 ? 0 : python->group_end[g - 1] + 1;
      for (size_t j = python->group_end[g] + 1; j-- > first;) {
        put(PythonFrameFor(python->frames[j], i == 0 && j == 0));
      }
      continue;
    }
    if (java_methods != nullptr && java_methods[i] != 0) {
      if (auto f = JavaFrameFor(*state.java, java_methods[i], java_now, i == 0)) {
        ++stats_.java_frames;
        put(*f);
        continue;
      }
      ++stats_.java_unnamed;
    }
    // A compiled Java method's frame: a frame for each scope at its pc, outermost first (the
    // method's own, then the calls inlined into it), where any were inlined and all are named.
    if (java_scopes != nullptr) {
      const std::span<const uint64_t> scopes =
          java_scopes->At(frames[i].pc, /*return_address=*/i != 0, java_now, *perf_map);
      std::array<encoding::PathFrame, jvm::HotSpotScopes::kMaxScopes> named;
      size_t n = 0;
      for (; scopes.size() > 1 && n < scopes.size(); ++n) {
        const std::optional<encoding::PathFrame> f =
            JavaFrameFor(*state.java, scopes[n], java_now, i == 0 && n == 0);
        if (!f.has_value()) break;
        named[n] = *f;
      }
      if (n > 1 && n == scopes.size()) {
        for (size_t j = n; j-- > 0;) put(named[j]);
        stats_.java_inlined += n - 1;
        one_for_one = std::min(one_for_one, num_frames - 1 - i);
        continue;
      }
    }
    put(FrameFor(target, state, frames[i].pc, i == 0));
  }
  const size_t user_leaf = at - 1;
  // The kernel's frames run below the user leaf (a system call, a fault, an interrupt).
  for (size_t k = kernel_depth; k-- > 0;) put(KernelFrameFor(kernel_pcs[k], k == 0));
  path.resize(at);
  keep = same_until;
  if (cache != nullptr) {
    cache->epoch = target.maps_epoch;
    cache->truncated = truncated;
    cache->one_for_one = one_for_one;
  }
  if (!graph_->ExtendPath(path, truncated, keep, &edges).ok()) {
    path.clear();  // nothing of it is reusable
    ++stats_.dropped;
    if (counts != nullptr) counts->set_lost(counts->lost() + 1);
    return nullptr;
  }
  // Continuous CPU stacks only, like `counts`: the leaf lines of the batches' samples. The
  // user leaf is resolved afresh for every stack (never kept), so leaf_module_pc_ is its own.
  if (counts != nullptr && num_frames > 0 && leaf_module_pc_ != 0) {
    leaf_addresses_.Add(target.id, path[user_leaf].function, leaf_module_pc_);
  }
  return &edges;
}

void StackRecorder::Count(const Target& target, uint32_t session_id,
                          const std::vector<encoding::EdgeId>& edges) {
  if (session_id != sources::kContinuousSession) {
    if (IntervalAggregator* aggregator = session(session_id)) aggregator->Add(target.id, edges, 1);
    return;
  }
  if (!aggregator_.Add(target.id, edges, 1)) full_ = true;
}

void StackRecorder::AddSession(uint32_t session_id) {
  session_aggregators_[session_id] = std::make_unique<IntervalAggregator>();
}

void StackRecorder::RemoveSession(uint32_t session_id) { session_aggregators_.erase(session_id); }

IntervalAggregator* StackRecorder::session(uint32_t session_id) {
  auto it = session_aggregators_.find(session_id);
  return it == session_aggregators_.end() ? nullptr : it->second.get();
}

}  // namespace strata::agent
