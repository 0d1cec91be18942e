// The Python and Java frames of StackRecorder: which interpreter or JVM a target runs, and
// the frames read from them for a stack.
#include <algorithm>
#include <optional>
#include <string>

#include "agent/core/python_eval_parts.h"
#include "agent/core/stack_recorder.h"
#include "agent/core/stack_recorder_state.h"
#include "agent/jvm/hotspot_attach.h"
#include "common/base/frame_kind.h"
#include "common/base/log.h"
#include "common/unwind/host_arch.h"

namespace strata::agent {

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
                                                               bool innermost, int32_t bci,
                                                               uint64_t bcp) {
  const jvm::HotSpotMethods::Method* m = java.methods().Find(method, now_ns);
  if (m == nullptr) return std::nullopt;
  const bool lines = java.methods().lines();
  if (m->owner_id == 0) {
    FunctionRecord record;
    record.name = m->name;
    // Where the JVM publishes lines, its methods' offsets are lines (the module says so), as
    // Python's; else they are named in the perf map's module, as their compiled code.
    record.module = lines ? base::JavaModuleName(m->file) : java.module();
    if (lines) record.start_offset = static_cast<uint64_t>(m->lines.first_line());
    m->owner_id = graph_->NodeFor(record);
  }
  if (bci == jvm::kUnknownBci && bcp != 0) bci = m->BciOf(bcp).value_or(jvm::kUnknownBci);
  const uint64_t line = lines ? static_cast<uint64_t>(std::max(m->lines.LineAt(bci), 0)) : 0;
  // As a Python frame's: a leaf's line is its leaf address, a caller's call site line + 1.
  if (innermost) leaf_module_pc_ = line;
  return encoding::PathFrame{m->owner_id, innermost || line == 0 ? 0 : line + 1};
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
    last.innermost_call = interpreter.innermost_call();
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
      last.innermost_call = interpreter.innermost_call();
      // Its thread state is known now: its next samples carry their frames.
      if (capture != nullptr) CaptureThread(interpreter, target.pid, tid);
    }
  }
  // Group g's end at python_group_end_[g + 1]: [0] is that of a group of no frames.
  python_group_end_[0] = SIZE_MAX;
  if (last.outcome == python::ReadOutcome::kOk && last.groups == 0) {
    for (size_t i = 0; i < last.frames && last.groups + 1 < python_group_end_.size(); ++i) {
      if (python_frames_[i].entry) python_group_end_[++last.groups] = i;
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
  // A leaf in the eval loop whose call's state (Interpreter::innermost_call) lies outside its
  // stack frame is in that call's prologue or epilogue: it runs no Python frames, and the
  // innermost group is its caller's. Its group is empty (the leaf frame is not shown). Stacks
  // the target unwound itself carry no stack pointers: not known there.
  const uint64_t call = last.innermost_call;
  const bool idle_leaf = outcome == python::ReadOutcome::kOk && call != 0 && num_frames > 1 &&
                         frames_[0].sp < frames_[1].sp && interpreter.InEvalLoop(frames_[0].pc) &&
                         (call < frames_[0].sp || call >= frames_[1].sp);
  const size_t running = evals - idle_leaf;
  // One group of Python frames per eval-loop frame that runs any (the outermost groups may lie
  // beyond a truncated native stack). Anything else: the thread ran on between sample and read.
  if (outcome != python::ReadOutcome::kOk || groups < running ||
      (!truncated && groups > running)) {
    ++stats_.python_stale;
    ++(outcome == python::ReadOutcome::kOk ? stats_.python_mismatch : stats_.python_torn);
    if (counts != nullptr) counts->set_python_stale(counts->python_stale() + 1);
    return false;
  }
  const size_t* group_end = python_group_end_.data() + (idle_leaf ? 0 : 1);
  const size_t spliced = group_end[evals - 1] + 1;  // (0 for an empty group)
  // No frame of the stack is its leaf's own (its leaf address would be the last stack's).
  if (idle_leaf) leaf_module_pc_ = 0;
  ++stats_.python_stacks;
  stats_.python_frames += spliced;
  if (counts != nullptr) counts->set_python_frames(counts->python_frames() + spliced);
  *splice = {&interpreter, python_frames_.data(), group_end, evals};
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

}  // namespace strata::agent
