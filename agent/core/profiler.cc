#include "agent/core/profiler.h"

#include <algorithm>

#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "agent/core/target_labels.h"
#include "agent/inproc/inproc_source.h"
#include "agent/procfs/procfs.h"
#include "spdlog/spdlog.h"

namespace strata::agent {

namespace {
constexpr uint32_t kContinuousSession = 0;
constexpr size_t kMaxPcCacheEntries = 1 << 20;
}  // namespace

// A thread's last recorded stack as a path, outermost first: path[i] is frame i's (function
// node, call site) and edges[i] the edge ID into it -- the patent's cumulative context
// encoding kept per cached frame. Valid for the mappings epoch the nodes were resolved in and
// for the `truncated` the edges were added with (the outermost edge hangs off the root or the
// truncated marker). Edge IDs never change once added, so a kept prefix stays exact.
struct Profiler::PathCache {
  std::vector<encoding::PathFrame> path;
  std::vector<encoding::EdgeId> edges;
  uint64_t epoch = 0;
  bool truncated = false;
};

struct Profiler::Target {
  uint32_t id = 0;
  pid_t pid = 0;
  std::string service;
  std::string executable;
  labels::LabelSet labels;  // computed once, when the process became a target
  std::unique_ptr<symbols::ProcessAddressSpace> space;
  size_t maps_hash = 0;
  // Bumped on every mapping change: the threads' incremental unwinders drop their caches.
  uint64_t maps_epoch = 0;
  // Per-thread state of continuous unwinding: the incremental unwinder (previous sample's
  // frames) and the path recorded for them. Both arrays are sized once, so a sample of a
  // known thread allocates nothing here.
  struct Thread {
    Thread(const unwind::IncrementalOptions& options, size_t max_frames) : unwinder(options) {
      paths.path.reserve(max_frames);
      paths.edges.reserve(max_frames);
    }
    unwind::IncrementalUnwinder unwinder;
    PathCache paths;
  };
  absl::flat_hash_map<pid_t, std::unique_ptr<Thread>> threads;  // by tid
  absl::Time last_refresh = absl::InfinitePast();
  // Absolute pc (already adjusted for return addresses) -> function node and module offset.
  struct CachedPc {
    encoding::NodeId node;
    uint64_t module_pc;
  };
  absl::flat_hash_map<uint64_t, CachedPc> pc_cache;
  bool inproc = false;  // stacks come from its in-process ring (mappings too)
};

absl::StatusOr<procfs::ServiceMatcher> MakeTargetMatcher(const ProfilerOptions& options) {
  return procfs::ServiceMatcher::Create(options.service_rules,
                                        /*use_env_var=*/!options.service_rules.empty());
}

absl::StatusOr<std::unique_ptr<Profiler>> Profiler::Create(ProfilerOptions options,
                                                          ContextGraph* graph) {
  auto matcher = MakeTargetMatcher(options);
  if (!matcher.ok()) return matcher.status();
  // An explicit pid is named like a discovered process (a matching --service rule, or its
  // STRATA_SERVICE when there are rules), else by its STRATA_SERVICE or executable name.
  std::vector<std::pair<pid_t, std::string>> pinned;
  for (pid_t pid : options.pids) {
    auto exe = procfs::ReadExecutable(pid);
    if (!exe.ok()) {
      return absl::NotFoundError(absl::StrCat("--pid ", pid, ": no such process (",
                                              exe.status().message(), ")"));
    }
    auto env = procfs::ReadEnvironValue(pid, procfs::kServiceEnvVar);
    procfs::ProcessIdentity identity{*exe, procfs::ReadCommandLine(pid).value_or(std::vector<std::string>()),
                                     env.ok() ? *env : std::nullopt};
    std::optional<std::string> service = matcher->Match(identity);
    if (!service) {
      service = identity.env_service ? *identity.env_service
                                     : std::string(procfs::ExecutableBasename(*exe));
    }
    pinned.emplace_back(pid, *std::move(service));
  }
  procfs::ProcessTracker tracker(std::move(*matcher), {});
  for (auto& [pid, service] : pinned) tracker.Track(pid, std::move(service));
  std::unique_ptr<sampler::PerfSampler> perf;
  if (options.inproc != ProfilerOptions::Inproc::kOn) {
    absl::Status probe = sampler::ProbePerfEvents();
    if (probe.ok()) {
      auto sampler = sampler::PerfSampler::Create();
      if (!sampler.ok()) return sampler.status();
      sampler::SessionOptions session;
      session.session_id = kContinuousSession;
      session.frequency_hz = options.frequency_hz;
      session.stack_bytes = options.stack_bytes;
      if (auto st = (*sampler)->AddSession(session); !st.ok()) return st;
      perf = std::move(*sampler);
    } else if (options.inproc == ProfilerOptions::Inproc::kOff) {
      return probe;
    } else {
      spdlog::warn("perf events unavailable ({}); sampling only processes that run the "
                   "in-process sampler (rings in {})",
                   probe.ToString(), options.inproc_dir);
    }
  }
  std::unique_ptr<inproc::InprocSource> rings;
  if (options.inproc != ProfilerOptions::Inproc::kOff) {
    inproc::InprocSourceOptions ring_options;
    ring_options.dir = options.inproc_dir;
    ring_options.arch = static_cast<uint32_t>(kHostArch);
    rings = std::make_unique<inproc::InprocSource>(std::move(ring_options));
  }
  auto profiler = std::unique_ptr<Profiler>(
      new Profiler(std::move(options), graph, std::move(tracker), std::move(perf)));
  profiler->inproc_ = std::move(rings);
  return profiler;
}

Profiler::Profiler(ProfilerOptions options, ContextGraph* graph, procfs::ProcessTracker tracker,
                   std::unique_ptr<sampler::PerfSampler> sampler)
    : options_(std::move(options)),
      graph_(graph),
      tracker_(std::move(tracker)),
      sampler_(std::move(sampler)) {
  frames_.resize(options_.max_frames);
}

Profiler::~Profiler() = default;

absl::Status Profiler::Poll(absl::Duration timeout) {
  if (absl::Now() >= next_rescan_) {
    // Rings first: a new target with a ring is not attached to perf.
    if (inproc_ != nullptr) RescanInproc();
    if (auto st = Rescan(); !st.ok()) return st;
    next_rescan_ = absl::Now() + options_.rescan_interval;
  }
  absl::Duration wait = std::min(timeout, next_rescan_ - absl::Now());
  // Rings have no wake-up: look at them at least every 100 ms.
  if (inproc_ != nullptr) wait = std::min(wait, absl::Milliseconds(100));
  if (sampler_ != nullptr) {
    auto ready = sampler_->Wait(wait);
    if (!ready.ok()) return ready.status();
    sampler_->Drain([this](const sampler::RawSample& s) { HandleSample(s); });
  } else if (wait > absl::ZeroDuration()) {
    absl::SleepFor(wait);
  }
  if (inproc_ != nullptr) DrainInproc();
  return absl::OkStatus();
}

absl::Status Profiler::Rescan() {
  auto changes = tracker_.Rescan();
  if (!changes.ok()) return changes.status();
  for (const auto& p : changes->removed) RemoveTarget(p.pid);
  for (const auto& p : changes->added) AddTarget(p);
  for (const auto& t : changes->threads_added) {
    if (sampler_ != nullptr && targets_.contains(t.pid) && !InprocServes(t.pid)) {
      (void)sampler_->AttachNewThread(t.pid, t.tid);
    }
  }
  for (const auto& t : changes->threads_removed) {
    if (sampler_ != nullptr) sampler_->DetachThread(t.pid, t.tid);
    // A later thread may reuse the tid: never splice its stack onto this one's frames.
    if (auto it = targets_.find(t.pid); it != targets_.end()) it->second->threads.erase(t.tid);
  }
  // dlopen/dlclose: pick up mapping changes of every target once per rescan.
  for (auto& [pid, target] : targets_) RefreshMappings(*target);
  return absl::OkStatus();
}

void Profiler::AddTarget(const procfs::TrackedProcess& process) {
  auto target = std::make_unique<Target>();
  target->id = next_target_id_++;
  target->pid = process.pid;
  target->service = process.service;
  target->executable = process.executable;
  std::vector<std::string> label_warnings;
  target->labels = TargetLabels(process, &label_warnings);
  for (const std::string& w : label_warnings) {
    spdlog::warn("pid {} ({}): {}", process.pid, process.executable, w);
  }
  target->space = std::make_unique<symbols::ProcessAddressSpace>(process.pid, &modules_);
  target->inproc = InprocServes(process.pid);
  RefreshMappings(*target);
  auto st = target->inproc || sampler_ == nullptr
                ? absl::OkStatus()
                : sampler_->AttachProcess(kContinuousSession, process.pid, process.threads);
  if (!st.ok()) {
    spdlog::warn("cannot sample pid {} ({}): {}", process.pid, process.executable, st.ToString());
    return;
  }
  spdlog::info("profiling pid {} ({}) as service '{}', {} threads, labels {{{}}}", process.pid,
               process.executable, process.service, process.threads.size(),
               labels::ToString(target->labels));
  targets_[process.pid] = std::move(target);
}

void Profiler::RemoveTarget(pid_t pid) {
  // Samples already in the ring still count: drain them before the events close.
  if (sampler_ != nullptr) {
    sampler_->Drain([this](const sampler::RawSample& s) { HandleSample(s); });
    sampler_->DetachProcess(pid);
  }
  auto it = targets_.find(pid);
  if (it == targets_.end()) return;
  v1::Target retired;
  retired.set_id(it->second->id);
  retired.set_service(it->second->service);
  retired.set_pid(static_cast<uint32_t>(pid));
  retired.set_executable(it->second->executable);
  for (const auto& [k, v] : it->second->labels) (*retired.mutable_labels())[k] = v;
  retired_targets_.push_back(std::move(retired));
  targets_.erase(it);
  spdlog::info("pid {} exited or changed; no longer profiled", pid);
}

bool Profiler::RefreshMappings(Target& target) {
  // In-process targets: under qemu-user /proc/PID/maps shows the emulator's mappings, so the
  // ring's copy of the guest's is used instead.
  std::vector<symbols::MappingInfo> maps;
  size_t hash = 0;
  if (target.inproc) {
    uint64_t generation = 0;
    auto ring_maps = inproc_->Mappings(target.pid, &generation);
    if (!ring_maps.ok()) return false;
    maps = std::move(*ring_maps);
    hash = absl::HashOf(generation);
  } else {
    auto proc_maps = symbols::ReadProcMaps(target.pid);
    if (!proc_maps.ok()) return false;
    maps = std::move(*proc_maps);
  }
  for (const auto& m : maps) {
    if (!target.inproc && !m.exec) continue;
    hash = absl::HashOf(hash, m.start, m.end, m.offset, m.inode, m.path);
  }
  if (hash == target.maps_hash && target.space->num_modules() > 0) return false;
  target.maps_hash = hash;
  ++target.maps_epoch;
  target.last_refresh = absl::Now();
  target.pc_cache.clear();
  if (auto st = target.space->Refresh(maps); !st.ok()) {
    spdlog::warn("pid {}: {}", target.pid, st.ToString());
  }
  ++stats_.refreshes;
  return true;
}

encoding::PathFrame Profiler::FrameFor(Target& target, uint64_t pc, bool innermost) {
  // A return address points after the call; look up the call itself so a call that is the
  // last instruction of a function is attributed to that function.
  const uint64_t lookup = innermost ? pc : pc - 1;
  auto it = target.pc_cache.find(lookup);
  if (it == target.pc_cache.end()) {
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
    if (target.pc_cache.size() >= kMaxPcCacheEntries) target.pc_cache.clear();
    it = target.pc_cache.emplace(lookup, Target::CachedPc{graph_->NodeFor(record), sym.module_pc})
             .first;
  }
  return {it->second.node, innermost ? 0 : it->second.module_pc + 1};
}

void Profiler::HandleSample(const sampler::RawSample& sample) {
  auto it = targets_.find(static_cast<pid_t>(sample.pid));
  if (it == targets_.end()) {
    ++stats_.dropped;
    return;
  }
  Target& target = *it->second;
  ++stats_.samples;

  unwind::IncrementalOptions options;
  options.unwind.arch = kHostArch;
  options.unwind.max_frames = options_.max_frames;
  options.verify = options_.unwind_verify;
  unwind::Registers regs{sample.pc, sample.sp, sample.fp, sample.ra};
  unwind::StackSnapshot stack{sample.sp, sample.stack, sample.stack_size};
  unwind::UnwindResult result;
  PathCache* paths = nullptr;
  size_t outer_kept = 0;
  if (options.verify == unwind::VerifyMode::kOff) {
    result = unwind::Unwind(options.unwind, regs, stack, *target.space, frames_.data(),
                            frames_.size());
    stats_.frames_walked += result.num_frames;
  } else {
    std::unique_ptr<Target::Thread>& thread = target.threads[static_cast<pid_t>(sample.tid)];
    if (thread == nullptr) {
      thread = std::make_unique<Target::Thread>(options, options_.max_frames);
    }
    // A copy shorter than requested ended at the top of the thread's stack.
    const bool stack_end_known = sample.stack_size < options_.stack_bytes;
    unwind::SampleStats unwind_stats;
    result = thread->unwinder.Unwind({regs, stack, target.maps_epoch, stack_end_known},
                                     *target.space, frames_.data(), frames_.size(),
                                     &unwind_stats);
    paths = &thread->paths;
    outer_kept = unwind_stats.outer_kept;
    stats_.frames_walked += unwind_stats.frames_unwound;
    stats_.frames_reused += unwind_stats.frames_reused;
    stats_.unwind_verify_failures += unwind_stats.verify_failed;
  }
  if (result.num_frames == 0) {
    frames_[0] = {sample.pc, sample.sp, 0};
    result.num_frames = 1;
  }
  // A pc in no known module usually means a library was just mapped: refresh (at most once a
  // second per process) so the next samples resolve.
  if (result.stop == unwind::StopReason::kNoModule &&
      absl::Now() - target.last_refresh > absl::Seconds(1)) {
    RefreshMappings(target);
  }
  RecordStack(target, frames_.data(), result.num_frames,
              result.stop != unwind::StopReason::kOutermost, sample.session_id, paths,
              outer_kept);
}

void Profiler::RecordStack(Target& target, const unwind::Frame* frames, size_t num_frames,
                           bool truncated, uint32_t session_id, PathCache* cache,
                           size_t outer_kept) {
  stats_.unwound_frames += num_frames;
  stats_.truncated += truncated;
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
    path.push_back(FrameFor(target, frames[i].pc, i == 0));
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
    auto it = session_aggregators_.find(session_id);
    if (it != session_aggregators_.end()) it->second->Add(target.id, edges, 1);
    return;
  }
  if (!aggregator_.Add(target.id, edges, 1)) batch_full_ = true;
}

absl::StatusOr<std::optional<v1::SampleBatch>> Profiler::TakeBatch(int64_t start_ms,
                                                                  int64_t end_ms,
                                                                  uint64_t sequence) {
  batch_full_ = false;
  const uint64_t lost = LostSamples();
  if (aggregator_.empty()) return std::nullopt;
  auto numbering = graph_->CurrentNumbering();
  if (!numbering.ok()) return numbering.status();
  v1::SampleBatch batch;
  batch.set_sequence(sequence);
  batch.set_epoch((*numbering)->epoch());
  batch.set_start_ms(start_ms);
  batch.set_end_ms(end_ms);
  batch.set_lost_samples(lost - lost_reported_);
  lost_reported_ = lost;
  for (const v1::Target& t : targets()) *batch.add_targets() = t;
  for (v1::Target& t : retired_targets_) *batch.add_targets() = std::move(t);
  retired_targets_.clear();
  if (auto st = aggregator_.EncodeInto(**numbering, &batch); !st.ok()) return st;
  return batch;
}

absl::Status Profiler::StartSession(uint32_t session_id, uint32_t frequency_hz,
                                    const std::string& service, pid_t pid) {
  if (session_id == kContinuousSession) {
    return absl::InvalidArgumentError("session 0 is continuous profiling");
  }
  if (sampler_ == nullptr) {
    return absl::FailedPreconditionError("ad hoc captures need perf events (this agent reads "
                                         "in-process sampler rings only)");
  }
  std::vector<const Target*> matching;
  for (const auto& [tpid, t] : targets_) {
    if ((service.empty() || t->service == service) && (pid == 0 || tpid == pid)) {
      matching.push_back(t.get());
    }
  }
  if (matching.empty()) {
    return absl::NotFoundError(absl::StrCat("this agent profiles no process",
                                            service.empty() ? "" : " of service '", service,
                                            service.empty() ? "" : "'",
                                            pid == 0 ? "" : absl::StrCat(" with pid ", pid)));
  }
  sampler::SessionOptions session;
  session.session_id = session_id;
  session.frequency_hz = frequency_hz;
  session.stack_bytes = options_.stack_bytes;
  if (auto st = sampler_->AddSession(session); !st.ok()) return st;
  size_t attached = 0;
  absl::Status last_error;
  for (const Target* t : matching) {
    // The continuous session's threads are the target's live threads.
    std::vector<pid_t> tids = sampler_->AttachedThreads(kContinuousSession, t->pid);
    if (auto st = sampler_->AttachProcess(session_id, t->pid, tids); st.ok()) {
      ++attached;
    } else {
      last_error = st;
    }
  }
  if (attached == 0) {
    (void)sampler_->RemoveSession(session_id);
    return last_error;
  }
  session_aggregators_[session_id] = std::make_unique<IntervalAggregator>();
  session_targets_[session_id] = attached;
  return absl::OkStatus();
}

absl::Status Profiler::SetSessionFrequency(uint32_t session_id, uint32_t frequency_hz) {
  if (sampler_ == nullptr) return absl::FailedPreconditionError("no perf events");
  return sampler_->SetFrequency(session_id, frequency_hz);
}

absl::StatusOr<std::optional<v1::SampleBatch>> Profiler::TakeSessionBatch(
    uint32_t session_id, const std::string& capture_id, int64_t start_ms, int64_t end_ms,
    uint64_t sequence, uint64_t* samples) {
  if (samples != nullptr) *samples = 0;
  auto it = session_aggregators_.find(session_id);
  if (it == session_aggregators_.end() || it->second->empty()) return std::nullopt;
  auto numbering = graph_->CurrentNumbering();
  if (!numbering.ok()) return numbering.status();
  if (samples != nullptr) *samples = it->second->samples();
  v1::SampleBatch batch;
  batch.set_sequence(sequence);
  batch.set_epoch((*numbering)->epoch());
  batch.set_start_ms(start_ms);
  batch.set_end_ms(end_ms);
  batch.set_capture_id(capture_id);
  for (const v1::Target& t : targets()) *batch.add_targets() = t;
  if (auto st = it->second->EncodeInto(**numbering, &batch); !st.ok()) return st;
  return batch;
}

void Profiler::StopSession(uint32_t session_id) {
  if (sampler_ != nullptr) {
    sampler_->Drain([this](const sampler::RawSample& s) { HandleSample(s); });
    (void)sampler_->RemoveSession(session_id);
  }
  session_targets_.erase(session_id);
}

void Profiler::ReleaseSession(uint32_t session_id) { session_aggregators_.erase(session_id); }

size_t Profiler::SessionTargets(uint32_t session_id) const {
  auto it = session_targets_.find(session_id);
  return it == session_targets_.end() ? 0 : it->second;
}

std::optional<ProfilerOptions::Inproc> ParseInprocMode(std::string_view mode) {
  if (mode == "auto") return ProfilerOptions::Inproc::kAuto;
  if (mode == "on") return ProfilerOptions::Inproc::kOn;
  if (mode == "off") return ProfilerOptions::Inproc::kOff;
  return std::nullopt;
}

bool Profiler::InprocServes(pid_t pid) const { return inproc_ != nullptr && inproc_->Has(pid); }

void Profiler::RescanInproc() {
  // An exited process's ring is closed by the rescan: take its last stacks first.
  DrainInproc();
  std::vector<pid_t> added;
  if (auto st = inproc_->Rescan(&added); !st.ok()) {
    spdlog::debug("in-process rings: {}", st.ToString());
    return;
  }
  for (pid_t pid : added) {
    auto it = targets_.find(pid);
    if (it == targets_.end() || it->second->inproc) continue;
    // Started sampling itself after we found it: switch it from perf to its ring.
    Target& target = *it->second;
    if (sampler_ != nullptr) sampler_->DetachProcess(kContinuousSession, pid);
    target.threads.clear();
    target.inproc = true;
    target.maps_hash = 0;
    RefreshMappings(target);
    spdlog::info("pid {} ({}): reading its in-process sampler's ring", pid, target.executable);
  }
}

void Profiler::DrainInproc() {
  inproc_->Drain([this](const inproc::RingStack& s) { HandleInprocStack(s); });
}

void Profiler::HandleInprocStack(const inproc::RingStack& stack) {
  auto it = targets_.find(stack.pid);
  if (it == targets_.end() || stack.num_frames == 0) {
    ++stats_.dropped;
    return;
  }
  Target& target = *it->second;
  if (!target.inproc) {  // ring opened by this drain's rescan before the target switched
    target.inproc = true;
    target.maps_hash = 0;
    RefreshMappings(target);
  }
  ++stats_.samples;
  ++stats_.inproc_stacks;
  const size_t n = std::min(stack.num_frames, frames_.size());
  for (size_t i = 0; i < n; ++i) frames_[i] = {stack.pcs[i], 0, 0};
  // A pc outside the modules we know: the target mapped a library since the last rescan.
  if (stack.stop == static_cast<uint8_t>(unwind::StopReason::kNoModule) &&
      absl::Now() - target.last_refresh > absl::Seconds(1)) {
    RefreshMappings(target);
  }
  RecordStack(target, frames_.data(), n, stack.truncated || n < stack.num_frames,
              kContinuousSession);
}

uint64_t Profiler::LostSamples() const {
  uint64_t lost = sampler_ != nullptr ? sampler_->stats().lost : 0;
  if (inproc_ != nullptr) lost += inproc_->stats().lost;
  return lost;
}

std::vector<v1::Target> Profiler::targets() const {
  std::vector<v1::Target> out;
  for (const auto& [pid, t] : targets_) {
    v1::Target target;
    target.set_id(t->id);
    target.set_service(t->service);
    target.set_pid(static_cast<uint32_t>(pid));
    target.set_executable(t->executable);
    for (const auto& [k, v] : t->labels) (*target.mutable_labels())[k] = v;
    out.push_back(std::move(target));
  }
  return out;
}

ProfilerStats Profiler::stats() const {
  ProfilerStats s = stats_;
  s.lost = LostSamples();
  s.targets = targets_.size();
  for (const auto& [pid, t] : targets_) s.inproc_targets += t->inproc;
  return s;
}

}  // namespace strata::agent
