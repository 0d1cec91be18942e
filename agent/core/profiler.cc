#include "agent/core/profiler.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/unwind/host_arch.h"
#include "spdlog/spdlog.h"

namespace strata::agent {

std::optional<ProfilerOptions::Inproc> ParseInprocMode(std::string_view mode) {
  if (mode == "auto") return ProfilerOptions::Inproc::kAuto;
  if (mode == "on") return ProfilerOptions::Inproc::kOn;
  if (mode == "off") return ProfilerOptions::Inproc::kOff;
  return std::nullopt;
}

absl::StatusOr<std::unique_ptr<Profiler>> Profiler::Create(ProfilerOptions options,
                                                          ContextGraph* graph) {
  auto discovery = TargetDiscovery::Create(options);
  if (!discovery.ok()) return discovery.status();
  std::unique_ptr<sources::PerfSource> perf;
  if (options.inproc != ProfilerOptions::Inproc::kOn) {
    if (absl::Status probe = sampler::ProbePerfEvents(); probe.ok()) {
      auto opened = sources::PerfSource::Open(options.frequency_hz, options.stack_bytes);
      if (!opened.ok()) return opened.status();
      perf = std::move(*opened);
    } else if (options.inproc == ProfilerOptions::Inproc::kOff) {
      return probe;
    } else {
      spdlog::warn("perf events unavailable ({}); sampling only processes that run the "
                   "in-process sampler (rings in {})",
                   probe.ToString(), options.inproc_dir);
    }
  }
  std::unique_ptr<sources::InprocSource> rings;
  if (options.inproc != ProfilerOptions::Inproc::kOff) {
    sources::InprocSourceOptions ring_options;
    ring_options.dir = options.inproc_dir;
    ring_options.arch = static_cast<uint32_t>(unwind::kHostArch);
    rings = std::make_unique<sources::InprocSource>(std::move(ring_options));
  }
  return std::unique_ptr<Profiler>(new Profiler(std::move(options), graph,
                                                std::move(*discovery), std::move(perf),
                                                std::move(rings)));
}

Profiler::Profiler(ProfilerOptions options, ContextGraph* graph,
                   std::unique_ptr<TargetDiscovery> discovery,
                   std::unique_ptr<sources::PerfSource> perf,
                   std::unique_ptr<sources::InprocSource> inproc)
    : options_(std::move(options)),
      discovery_(std::move(discovery)),
      perf_(std::move(perf)),
      inproc_(std::move(inproc)),
      recorder_({.max_frames = options_.max_frames,
                 .stack_bytes = options_.stack_bytes,
                 .unwind_verify = options_.unwind_verify},
                graph, discovery_.get()),
      batches_(graph) {
  if (perf_ != nullptr) sources_.push_back(perf_.get());
  if (inproc_ != nullptr) sources_.push_back(inproc_.get());
}

Profiler::~Profiler() = default;

absl::Status Profiler::Poll(absl::Duration timeout) {
  if (absl::Now() >= next_rescan_) {
    if (auto st = Rescan(); !st.ok()) return st;
    next_rescan_ = absl::Now() + options_.rescan_interval;
  }
  absl::Duration wait = std::min(timeout, next_rescan_ - absl::Now());
  sources::StackSource* waitable = nullptr;
  for (sources::StackSource* source : sources_) {
    wait = std::min(wait, source->max_wait());
    if (source->waitable() && waitable == nullptr) waitable = source;
  }
  if (waitable != nullptr) {
    if (auto st = waitable->Wait(wait); !st.ok()) return st;
  } else if (wait > absl::ZeroDuration()) {
    absl::SleepFor(wait);
  }
  for (sources::StackSource* source : sources_) source->Drain(recorder_);
  return absl::OkStatus();
}

absl::Status Profiler::Rescan() {
  RescanSources();
  auto changes = discovery_->Scan();
  if (!changes.ok()) return changes.status();
  for (const auto& p : changes->removed) RemoveTarget(p.pid);
  for (const auto& p : changes->added) AddTarget(p);
  for (const auto& t : changes->threads_added) {
    const Target* target = discovery_->Find(t.pid);
    if (target != nullptr && target->source != nullptr) {
      target->source->ThreadStarted(t.pid, t.tid);
    }
  }
  for (const auto& t : changes->threads_removed) {
    for (sources::StackSource* source : sources_) source->ThreadExited(t.pid, t.tid);
    recorder_.ForgetThread(t.pid, t.tid);
  }
  // dlopen/dlclose: pick up mapping changes of every target once per rescan.
  for (const auto& [pid, target] : discovery_->all()) discovery_->RefreshMappings(*target);
  return absl::OkStatus();
}

void Profiler::RescanSources() {
  for (sources::StackSource* source : sources_) {
    std::vector<pid_t> claimed;
    if (auto st = source->Rescan(recorder_, &claimed); !st.ok()) {
      spdlog::debug("in-process rings: {}", st.ToString());
      continue;
    }
    for (pid_t pid : claimed) {
      Target* target = discovery_->Find(pid);
      if (target == nullptr || target->source == source) continue;
      // Started sampling itself after we found it: switch it to the source that claims it.
      if (target->source != nullptr) target->source->Detach(pid);
      recorder_.ForgetTarget(pid);
      discovery_->SetSource(*target, source);
      spdlog::info("pid {} ({}): reading its in-process sampler's ring", pid,
                   target->executable);
    }
  }
}

sources::StackSource* Profiler::SourceFor(pid_t pid) const {
  for (sources::StackSource* source : sources_) {
    if (source->Claims(pid)) return source;
  }
  return perf_.get();
}

void Profiler::AddTarget(const procfs::TrackedProcess& process) {
  std::unique_ptr<Target> target = discovery_->NewTarget(process, SourceFor(process.pid));
  absl::Status st = target->source == nullptr
                        ? absl::OkStatus()
                        : target->source->Attach(process.pid, process.threads);
  if (!st.ok()) {
    spdlog::warn("cannot sample pid {} ({}): {}", process.pid, process.executable, st.ToString());
    return;
  }
  spdlog::info("profiling pid {} ({}) as service '{}', {} threads, labels {{{}}}", process.pid,
               process.executable, process.service, process.threads.size(),
               labels::ToString(target->labels));
  discovery_->Insert(std::move(target));
}

void Profiler::RemoveTarget(pid_t pid) {
  for (sources::StackSource* source : sources_) source->Remove(pid, recorder_);
  recorder_.ForgetTarget(pid);
  discovery_->Remove(pid);
}

absl::StatusOr<std::optional<v1::SampleBatch>> Profiler::TakeBatch(int64_t start_ms,
                                                                  int64_t end_ms,
                                                                  uint64_t sequence) {
  recorder_.ClearFull();
  uint64_t lost = 0;
  for (const sources::StackSource* source : sources_) lost += source->lost();
  return batches_.Interval(recorder_.continuous(), {start_ms, end_ms, sequence}, *discovery_,
                           lost);
}

absl::Status Profiler::StartSession(uint32_t session_id, uint32_t frequency_hz,
                                    const std::string& service, pid_t pid) {
  if (session_id == sources::kContinuousSession) {
    return absl::InvalidArgumentError("session 0 is continuous profiling");
  }
  if (perf_ == nullptr) {
    return absl::FailedPreconditionError("ad hoc captures need perf events (this agent reads "
                                         "in-process sampler rings only)");
  }
  std::vector<pid_t> matching;
  for (const auto& [tpid, t] : discovery_->all()) {
    if ((service.empty() || t->service == service) && (pid == 0 || tpid == pid)) {
      matching.push_back(tpid);
    }
  }
  if (matching.empty()) {
    return absl::NotFoundError(absl::StrCat("this agent profiles no process",
                                            service.empty() ? "" : " of service '", service,
                                            service.empty() ? "" : "'",
                                            pid == 0 ? "" : absl::StrCat(" with pid ", pid)));
  }
  auto attached = perf_->StartSession(session_id, frequency_hz, matching);
  if (!attached.ok()) return attached.status();
  recorder_.AddSession(session_id);
  session_targets_[session_id] = *attached;
  return absl::OkStatus();
}

absl::Status Profiler::SetSessionFrequency(uint32_t session_id, uint32_t frequency_hz) {
  if (perf_ == nullptr) return absl::FailedPreconditionError("no perf events");
  return perf_->SetFrequency(session_id, frequency_hz);
}

absl::StatusOr<std::optional<v1::SampleBatch>> Profiler::TakeSessionBatch(
    uint32_t session_id, const std::string& capture_id, int64_t start_ms, int64_t end_ms,
    uint64_t sequence, uint64_t* samples) {
  if (samples != nullptr) *samples = 0;
  IntervalAggregator* aggregator = recorder_.session(session_id);
  if (aggregator == nullptr || aggregator->empty()) return std::nullopt;
  if (samples != nullptr) *samples = aggregator->samples();
  return batches_.Capture(*aggregator, {start_ms, end_ms, sequence}, *discovery_, capture_id);
}

void Profiler::StopSession(uint32_t session_id) {
  if (perf_ != nullptr) perf_->StopSession(session_id, recorder_);
  session_targets_.erase(session_id);
}

void Profiler::ReleaseSession(uint32_t session_id) { recorder_.RemoveSession(session_id); }

size_t Profiler::SessionTargets(uint32_t session_id) const {
  auto it = session_targets_.find(session_id);
  return it == session_targets_.end() ? 0 : it->second;
}

ProfilerStats Profiler::stats() const {
  const StackRecorderStats& r = recorder_.stats();
  ProfilerStats s;
  s.samples = r.samples;
  s.unwound_frames = r.unwound_frames;
  s.truncated = r.truncated;
  s.dropped = r.dropped;
  s.frames_walked = r.frames_walked;
  s.frames_reused = r.frames_reused;
  s.unwind_verify_failures = r.unwind_verify_failures;
  s.inproc_stacks = r.unwound_stacks;
  s.refreshes = discovery_->refreshes();
  for (const sources::StackSource* source : sources_) s.lost += source->lost();
  s.targets = discovery_->all().size();
  for (const auto& [pid, t] : discovery_->all()) {
    s.inproc_targets += inproc_ != nullptr && t->source == inproc_.get();
  }
  return s;
}

}  // namespace strata::agent
