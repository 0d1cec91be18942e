#include "agent/core/stack_recorder.h"

#include <algorithm>

#include "common/unwind/host_arch.h"

namespace strata::agent {
namespace {
constexpr size_t kMaxPcCacheEntries = 1 << 20;
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

struct StackRecorder::TargetState {
  absl::flat_hash_map<pid_t, std::unique_ptr<Thread>> threads;  // by tid
  // Absolute pc (already adjusted for return addresses) -> function node and module offset,
  // for the target's mappings epoch `pc_epoch`.
  struct CachedPc {
    encoding::NodeId node;
    uint64_t module_pc;
  };
  absl::flat_hash_map<uint64_t, CachedPc> pc_cache;
  uint64_t pc_epoch = 0;
};

StackRecorder::StackRecorder(StackRecorderOptions options, ContextGraph* graph,
                             TargetDiscovery* targets)
    : options_(options), graph_(graph), targets_(targets) {
  frames_.resize(options_.max_frames);
}

StackRecorder::~StackRecorder() = default;

StackRecorder::TargetState& StackRecorder::StateOf(const Target& target) {
  std::unique_ptr<TargetState>& state = states_[target.pid];
  if (state == nullptr) state = std::make_unique<TargetState>();
  return *state;
}

void StackRecorder::ForgetTarget(pid_t pid) { states_.erase(pid); }

void StackRecorder::ForgetThread(pid_t pid, pid_t tid) {
  if (auto it = states_.find(pid); it != states_.end()) it->second->threads.erase(tid);
}

void StackRecorder::OnSample(const sampler::RawSample& sample) {
  Target* target = targets_->Find(static_cast<pid_t>(sample.pid));
  if (target == nullptr) {
    ++stats_.dropped;
    return;
  }
  ++stats_.samples;
  TargetState& state = StateOf(*target);
  PathCache* paths = nullptr;
  size_t outer_kept = 0;
  unwind::UnwindResult result = Unwind(*target, state, sample, &paths, &outer_kept);
  if (result.num_frames == 0) {
    frames_[0] = {sample.pc, sample.sp, 0};
    result.num_frames = 1;
  }
  if (result.stop == unwind::StopReason::kNoModule) targets_->RefreshSoon(*target);
  Record(*target, state, frames_.data(), result.num_frames,
         result.stop != unwind::StopReason::kOutermost, sample.session_id, paths, outer_kept);
}

unwind::UnwindResult StackRecorder::Unwind(const Target& target, TargetState& state,
                                           const sampler::RawSample& sample,
                                           PathCache** paths, size_t* outer_kept) {
  unwind::Registers regs{sample.pc, sample.sp, sample.fp, sample.ra};
  unwind::StackSnapshot stack{sample.sp, sample.stack, sample.stack_size};
  std::unique_ptr<Thread>& thread = state.threads[static_cast<pid_t>(sample.tid)];
  if (thread == nullptr) {
    unwind::IncrementalOptions options;
    options.unwind.arch = unwind::kHostArch;
    options.unwind.max_frames = options_.max_frames;
    options.verify = options_.unwind_verify;
    thread = std::make_unique<Thread>(options, options_.max_frames);
  }
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
  Record(*target, StateOf(*target), frames_.data(), n, stack.truncated || n < stack.num_frames,
         /*session_id=*/0, /*cache=*/nullptr, /*outer_kept=*/0);
}

encoding::PathFrame StackRecorder::FrameFor(const Target& target, TargetState& state,
                                            uint64_t pc, bool innermost) {
  // A return address points after the call; look up the call itself so a call that is the
  // last instruction of a function is attributed to that function.
  const uint64_t lookup = innermost ? pc : pc - 1;
  auto it = state.pc_cache.find(lookup);
  if (it == state.pc_cache.end()) {
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
    if (state.pc_cache.size() >= kMaxPcCacheEntries) state.pc_cache.clear();
    it = state.pc_cache
             .emplace(lookup, TargetState::CachedPc{graph_->NodeFor(record), sym.module_pc})
             .first;
  }
  return {it->second.node, innermost ? 0 : it->second.module_pc + 1};
}

void StackRecorder::Record(const Target& target, TargetState& state, const unwind::Frame* frames,
                           size_t num_frames, bool truncated, uint32_t session_id,
                           PathCache* cache, size_t outer_kept) {
  stats_.unwound_frames += num_frames;
  stats_.truncated += truncated;
  if (state.pc_epoch != target.maps_epoch) {  // resolved against mappings since replaced
    state.pc_cache.clear();
    state.pc_epoch = target.maps_epoch;
  }
  std::vector<encoding::PathFrame>& path = cache != nullptr ? cache->path : path_;
  std::vector<encoding::EdgeId>& edges = cache != nullptr ? cache->edges : edges_;
  // Frames kept from the thread's last stack keep their path frames and edge IDs. Never that
  // stack's leaf: its node was resolved from an exact pc, not from a return address.
  size_t keep = 0;
  if (cache != nullptr && !path.empty() && cache->epoch == target.maps_epoch &&
      cache->truncated == truncated) {
    keep = std::min({outer_kept, path.size() - 1, edges.size(), num_frames - 1});
  }
  path.resize(keep);
  for (size_t i = num_frames - keep; i-- > 0;) {
    path.push_back(FrameFor(target, state, frames[i].pc, i == 0));
  }
  if (cache != nullptr) {
    cache->epoch = target.maps_epoch;
    cache->truncated = truncated;
  }
  if (!graph_->ExtendPath(path, truncated, keep, &edges).ok()) {
    path.clear();  // nothing of it is reusable
    ++stats_.dropped;
    return;
  }
  if (session_id != 0) {
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
