#include "agent/core/stack_recorder.h"

#include <algorithm>
#include <cstring>
#include <optional>

#include "absl/strings/str_cat.h"
#include "agent/core/stack_recorder_state.h"
#include "agent/jvm/hotspot_scopes.h"
#include "agent/sources/perf_source.h"
#include "common/base/frame_kind.h"
#include "common/unwind/host_arch.h"

namespace strata::agent {

StackRecorder::StackRecorder(StackRecorderOptions options, ContextGraph* graph,
                             TargetDiscovery* targets)
    : options_(options), graph_(graph), targets_(targets) {
  frames_.resize(options_.max_frames);
  refilled_stack_.resize(options_.stack_bytes);
  java_methods_.resize(options_.max_frames);
  java_bcps_.resize(options_.max_frames);
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
  const uint64_t unnamed_jit_pcs = target.space->unnamed_jit_pcs();
  unwind::UnwindResult result =
      Unwind(target, state, thread, sample, &paths, &outer_kept, counts);
  // A library mapped since the mappings were read: read them again, and unwind again when
  // they changed (the sample was taken with the library there).
  if (result.stop == unwind::StopReason::kNoModule && targets_->RefreshSoon(target)) {
    result = Unwind(target, state, thread, sample, &paths, &outer_kept, counts);
  }
  // Likewise JIT code compiled since its perf map was read (a JVM asked for a new map, which
  // JvmPerfMaps does when such code is met): its frame's layout comes with its entry.
  if (result.stop != unwind::StopReason::kOutermost &&
      result.stop != unwind::StopReason::kMaxFrames &&
      target.space->unnamed_jit_pcs() != unnamed_jit_pcs && target.space->ReadPerfMapAgain()) {
    result = Unwind(target, state, thread, sample, &paths, &outer_kept, counts);
  }
  // The kernel copies no stack page that is not resident (swapped out, say), so the copy can
  // end below the stack's top and the walk run off it. A page that cold holds frames the
  // thread has not returned into since: read from the process, they are the sample's.
  sampler::RawSample refilled;
  const sampler::RawSample* unwound = &sample;
  if (result.stop == unwind::StopReason::kStackOutOfRange &&
      RefillStack(target, state, sample, &refilled)) {
    result = Unwind(target, state, thread, refilled, &paths, &outer_kept, counts);
    unwound = &refilled;
  }
  if (result.num_frames == 0) {
    frames_[0] = {sample.pc, sample.sp, 0};
    result.num_frames = 1;
  }
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
                                         {unwound->stack, unwound->stack_size},
                                         java_methods_.data(), java_bcps_.data())) {
    java_methods = java_methods_.data();
    // An interpreted leaf's frame holds the bytecode pointer of its last call; the register
    // holds where it is (checked against its method's bytecodes before it is used).
    java_bcps_[0] = sample.bcp;
  }
  return Record(target, state, frames_.data(), result.num_frames, truncated, sample.kernel_pcs,
                sample.kernel_depth, paths, outer_kept, counts, python, java_methods,
                java_bcps_.data());
}

bool StackRecorder::RefillStack(const Target& target, TargetState& state,
                                const sampler::RawSample& sample, sampler::RawSample* refilled) {
  // Not for off-CPU stacks: the thread has run since their switch-out.
  if (sample.session_id == sources::kOffCpuSession || sample.stack_size >= options_.stack_bytes) {
    return false;
  }
  if (state.memory == nullptr) state.memory = std::make_unique<python::RemoteMemory>(target.pid);
  const size_t more =
      state.memory->ReadPrefix(sample.sp + sample.stack_size,
                               refilled_stack_.data() + sample.stack_size,
                               options_.stack_bytes - sample.stack_size);
  if (more < sizeof(uint64_t)) return false;  // the copy did end at the top
  std::memcpy(refilled_stack_.data(), sample.stack, sample.stack_size);
  *refilled = sample;
  refilled->stack = refilled_stack_.data();
  refilled->stack_size += more;
  ++stats_.stacks_refilled;
  return true;
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
  // JIT code the perf map names since it was last read brings its frames' layouts: frames
  // stepped without them (by the frame-pointer row) are not reused.
  const uint64_t epoch = target.maps_epoch + target.space->perf_map_generation();
  unwind::UnwindResult result =
      thread->unwinder.Unwind({regs, stack, epoch, stack_end_known}, *target.space,
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
    const uint64_t* java_methods, const uint64_t* java_bcps) {
  stats_.unwound_frames += num_frames;
  stats_.truncated += truncated;
  stats_.kernel_frames += kernel_depth;
  if (counts != nullptr) {
    counts->set_stacks(counts->stacks() + 1);
    counts->set_truncated(counts->truncated() + truncated);
  }
  // What names were resolved against: the mappings, and the perf map (read again within a
  // stack for code newer than its last read, the mappings unchanged). Both only grow.
  const uint64_t names_epoch =
      target.maps_epoch + (target.space != nullptr ? target.space->perf_map_generation() : 0);
  if (state.pc_epoch != names_epoch) {  // resolved against mappings or names since replaced
    state.pc_cache.clear();
    state.functions.clear();
    state.pc_epoch = names_epoch;
  }
  std::vector<encoding::PathFrame>& path = cache != nullptr ? cache->path : path_;
  std::vector<encoding::EdgeId>& edges = cache != nullptr ? cache->edges : edges_;
  // Frames kept from the thread's last stack keep their path frames and edge IDs. Never that
  // stack's leaf: its node was resolved from an exact pc, not from a return address.
  // In a Python target only those outside the outermost eval-loop frame: the Python frames
  // under kept eval-loop frames may have changed, and path frames stand for native frames one
  // for one only up to there (in the last stack too: the kept frames are the same).
  // The scopes of the JVM's compiled code, where its layout and perf map are known (its
  // frames named in the map's module, as the map names the code).
  jvm::HotSpotScopes* java_scopes = nullptr;
  const symbols::PerfMap* perf_map = target.space != nullptr ? target.space->perf_map() : nullptr;
  if (state.java != nullptr && state.java->scopes() != nullptr && perf_map != nullptr) {
    if (state.java->module().empty()) state.java->SetModule(target.space->perf_map_module());
    java_scopes = state.java->scopes();
  }
  // Code newer than the map's last read is looked up after the map is read again, as its
  // frame would be named (FrameFor): else that frame would be named from the map, as code.
  const auto lookup_jit = [&target](uint64_t pc, symbols::PerfMap::Symbol* out) {
    return target.space->PerfMapEntryAt(pc, out);
  };
  // The clock interpreted methods' names and compiled methods' scopes are checked again by,
  // read once per stack.
  const uint64_t java_now = java_methods != nullptr || java_scopes != nullptr ? MonotonicNs() : 0;
  // Native frames kept, and how many path frames they have.
  size_t keep = 0;
  auto path_end = [&](size_t native) -> size_t {
    return native == 0 ? 0 : cache->ends[native - 1];
  };
  if (cache != nullptr && !path.empty() && cache->epoch == names_epoch &&
      cache->truncated == truncated) {
    keep = std::min({outer_kept, num_frames - 1, cache->ends.size()});
    while (keep > 0 && path_end(keep) > std::min(path.size() - 1, edges.size())) --keep;
    if (state.python != nullptr) {
      const python::Interpreter& interpreter = *state.python->interpreter;
      size_t outside = 0;
      while (outside < keep && !interpreter.InEvalLoop(frames[num_frames - 1 - outside].pc - 1)) {
        ++outside;
      }
      keep = outside;
    }
    // So in a JVM, up to the first interpreter frame not running the method and line it ran in
    // the last stack: neither is in the frame's return address.
    if (jvm::HotSpotInterpreter* java = state.java.get(); java != nullptr && java->code_known()) {
      size_t outside = 0;
      for (; outside < keep; ++outside) {
        const size_t f = num_frames - 1 - outside;
        if (!java->Contains(frames[f].pc - 1)) continue;
        const std::optional<encoding::PathFrame> now =
            java_methods == nullptr || java_methods[f] == 0
                ? std::nullopt
                : JavaFrameFor(*java, java_methods[f], java_now, false, jvm::kUnknownBci,
                               java_bcps[f]);
        if (!now.has_value() || *now != path[path_end(outside)]) break;
      }
      keep = outside;
    }
  }
  // Of a Python or Java stack's frames inward of the kept ones, those the same as the last
  // stack's keep their edges too: the thread mostly runs the same calls. The new frames
  // overwrite the last stack's in place, compared as they go.
  bool same = cache != nullptr &&
              (python != nullptr || java_methods != nullptr || java_scopes != nullptr) && keep > 0;
  const size_t kept_path = keep > 0 ? path_end(keep) : 0;
  size_t at = kept_path, same_until = kept_path;
  if (cache != nullptr) cache->ends.resize(num_frames);
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
  for (size_t i = num_frames - keep; i-- > 0;) {
    // The frame outward of this one ends where this one's path frames begin.
    if (cache != nullptr && i + 1 < num_frames) {
      cache->ends[num_frames - 2 - i] = static_cast<uint32_t>(at);
    }
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
      if (auto f = JavaFrameFor(*state.java, java_methods[i], java_now, i == 0, jvm::kUnknownBci,
                                java_bcps[i])) {
        ++stats_.java_frames;
        put(*f);
        continue;
      }
      ++stats_.java_unnamed;
    }
    // A compiled Java method's frame: a frame for each scope at its pc, outermost first (the
    // method's own, then the calls inlined into it), where all are named.
    if (java_scopes != nullptr) {
      const std::span<const jvm::JavaScope> scopes =
          java_scopes->At(frames[i].pc, /*return_address=*/i != 0, java_now, lookup_jit);
      std::array<encoding::PathFrame, jvm::HotSpotScopes::kMaxScopes> named;
      size_t n = 0;
      for (; n < scopes.size(); ++n) {
        const std::optional<encoding::PathFrame> f = JavaFrameFor(
            *state.java, scopes[n].method, java_now, i == 0 && n == 0, scopes[n].bci);
        if (!f.has_value()) break;
        named[n] = *f;
      }
      if (n > 0 && n == scopes.size()) {
        for (size_t j = n; j-- > 0;) put(named[j]);
        stats_.java_inlined += n - 1;
        continue;
      }
    }
    put(FrameFor(target, state, frames[i].pc, i == 0));
  }
  if (cache != nullptr && num_frames > 0) cache->ends[num_frames - 1] = static_cast<uint32_t>(at);
  const size_t user_leaf = at - 1;
  // The kernel's frames run below the user leaf (a system call, a fault, an interrupt).
  for (size_t k = kernel_depth; k-- > 0;) put(KernelFrameFor(kernel_pcs[k], k == 0));
  path.resize(at);
  keep = same_until;
  if (cache != nullptr) {
    cache->epoch = names_epoch;
    cache->truncated = truncated;
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

bool StackRecorder::HoldsSamplesOf(uint32_t target_id) const {
  if (aggregator_.References(target_id) || off_cpu_.References(target_id)) return true;
  for (const auto& [id, aggregator] : session_aggregators_) {
    if (aggregator->References(target_id)) return true;
  }
  return false;
}

IntervalAggregator* StackRecorder::session(uint32_t session_id) {
  auto it = session_aggregators_.find(session_id);
  return it == session_aggregators_.end() ? nullptr : it->second.get();
}

}  // namespace strata::agent
