#include "agent/core/profiler.h"

#include <algorithm>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "agent/core/stack_sources.h"
#include "common/base/log.h"

namespace strata::agent {

namespace {

// "auto" | "on" | "off" as any of the options' three-way modes.
template <typename Mode>
std::optional<Mode> ParseAutoOnOff(std::string_view mode) {
  if (mode == "auto") return Mode::kAuto;
  if (mode == "on") return Mode::kOn;
  if (mode == "off") return Mode::kOff;
  return std::nullopt;
}

}  // namespace

std::optional<ProfilerOptions::Inproc> ParseInprocMode(std::string_view mode) {
  return ParseAutoOnOff<ProfilerOptions::Inproc>(mode);
}

std::optional<ProfilerOptions::Sampling> ParseSamplingMode(std::string_view mode) {
  if (mode == "auto") return ProfilerOptions::Sampling::kAuto;
  if (mode == "per-cpu") return ProfilerOptions::Sampling::kPerCpu;
  if (mode == "per-thread") return ProfilerOptions::Sampling::kPerThread;
  return std::nullopt;
}

std::optional<ProfilerOptions::KernelStacks> ParseKernelStacksMode(std::string_view mode) {
  return ParseAutoOnOff<ProfilerOptions::KernelStacks>(mode);
}

std::optional<ProfilerOptions::PythonCapture> ParsePythonCaptureMode(std::string_view mode) {
  return ParseAutoOnOff<ProfilerOptions::PythonCapture>(mode);
}

absl::StatusOr<std::unique_ptr<Profiler>> Profiler::Create(ProfilerOptions options,
                                                          ContextGraph* graph) {
  auto discovery = TargetDiscovery::Create(options);
  if (!discovery.ok()) return discovery.status();
  auto opened = OpenStackSources(options);
  if (!opened.ok()) return opened.status();
  auto profiler = std::unique_ptr<Profiler>(
      new Profiler(std::move(options), graph, std::move(*discovery), std::move(opened->perf),
                   std::move(opened->inproc), std::move(opened->kernel_symbols),
                   std::move(opened->python_capture)));
  if (auto st = profiler->InitPoll(); !st.ok()) return st;
  return profiler;
}

Profiler::Profiler(ProfilerOptions options, ContextGraph* graph,
                   std::unique_ptr<TargetDiscovery> discovery,
                   std::unique_ptr<sources::PerfSource> perf,
                   std::unique_ptr<sources::InprocSource> inproc,
                   std::unique_ptr<kernel::KernelSymbols> kernel_symbols,
                   std::unique_ptr<python::FrameCapture> python_capture)
    : options_(std::move(options)),
      discovery_(std::move(discovery)),
      perf_(std::move(perf)),
      inproc_(std::move(inproc)),
      kernel_symbols_(std::move(kernel_symbols)),
      python_capture_(std::move(python_capture)),
      recorder_({.max_frames = options_.max_frames,
                 .stack_bytes = options_.stack_bytes,
                 .unwind_verify = options_.unwind_verify,
                 .kernel_symbols = kernel_symbols_.get(),
                 .off_cpu_threshold_ns =
                     static_cast<uint64_t>(absl::ToInt64Nanoseconds(options_.off_cpu_threshold)),
                 .python_frames = options_.python_frames,
                 .python_capture = python_capture_.get()},
                graph, discovery_.get()),
      batches_(graph),
      continuous_hz_(options_.frequency_hz) {
  if (perf_ != nullptr) sources_.push_back(perf_.get());
  if (inproc_ != nullptr) sources_.push_back(inproc_.get());
}

absl::Status Profiler::InitPoll() {
  PollerOptions watch;
  if (discovery_->watches_events()) {
    events_fd_ = discovery_->events_fd();
    watch.change_fds.push_back(events_fd_);
  }
  for (sources::StackSource* source : sources_) {
    if (source->wait_fd() >= 0) watch.ready_fds.push_back(source->wait_fd());
    if (source->rescan_fd() >= 0) watch.change_fds.push_back(source->rescan_fd());
  }
  auto poller = Poller::Create(std::move(watch));
  if (!poller.ok()) return poller.status();
  poller_ = std::move(*poller);
  return absl::OkStatus();
}

Profiler::~Profiler() = default;

absl::Status Profiler::Poll(absl::Duration timeout) {
  absl::Time now = absl::Now();
  if (rescan_due_ || now >= next_rescan_) {
    if (auto st = Rescan(); !st.ok()) return st;
    now = absl::Now();
  }
  absl::Duration wait = std::min(timeout, next_rescan_ - now);
  wait = std::min(wait, discovery_->RereadNewTargets(now) - now);
  for (sources::StackSource* source : sources_) wait = std::min(wait, source->max_wait());
  if (PythonBatched()) wait = std::min(wait, PythonWait());
  absl::StatusOr<Wakeup> woke = poller_->Wait(wait);
  if (!woke.ok()) return woke.status();
  ++wakeups_;
  rescan_due_ |= woke->changed;
  for (int i = 0; i < woke->ready_count; ++i) {
    for (sources::StackSource* source : sources_) {
      if (woke->ready[i] != source->wait_fd()) continue;
      if (auto st = source->Ready(); !st.ok()) return st;
    }
  }
  // Before the drain: new targets' samples are unwound with the libraries mapped since they
  // were found (TargetDiscovery::kNewTargetRereads).
  (void)discovery_->RereadNewTargets(absl::Now());
  for (sources::StackSource* source : sources_) source->Drain(recorder_);
  discovery_->AskJvmsForPerfMaps();
  AttachPythonCapture();
  return rescan_due_ ? Rescan() : absl::OkStatus();
}

void Profiler::AttachPythonCapture() {
  // From the first Python target on: hosts without one pay nothing at their samples.
  if (python_capture_ == nullptr || capture_attached_ || perf_ == nullptr ||
      recorder_.python_targets() == 0 || python_capture_->program_fd() < 0) {
    return;
  }
  perf_->SetSampleProgram(python_capture_->program_fd());
  capture_attached_ = true;
}

bool Profiler::PythonBatched() const {
  const size_t targets = recorder_.python_targets();
  if (targets == 0) return false;
  if (!session_targets_.empty()) return true;  // captures sample Python targets in batches
  size_t each_sample = 0;
  for (pid_t pid : python_as_sampled_) each_sample += recorder_.HasInterpreter(pid);
  return targets > each_sample;
}

absl::Duration Profiler::PythonWait() {
  constexpr int kMaxBackoffPeriods = 2;
  constexpr absl::Duration kIdle = absl::Seconds(1);
  // After the sample's time, for the sample to be in the ring and the timer to be late.
  constexpr absl::Duration kLanding = absl::Microseconds(150);
  const absl::Duration period = options_.python_read_period;
  const uint64_t latest = recorder_.python_sample_ns();
  if (latest != python_sample_seen_ns_) {  // the last drain read Python frames
    python_sample_seen_ns_ = latest;
    python_backoff_ = period / 2;  // the first wait without a sample: one period
    // A thread that runs on is sampled again one sampling period after its last sample.
    const absl::Duration next = absl::Seconds(1) / std::max<uint32_t>(continuous_hz_, 1) +
                                kLanding - recorder_.SincePythonSample();
    return next > kLanding ? std::max(next, period) : period;
  }
  if (latest == 0 || recorder_.SincePythonSample() > kIdle) return absl::InfiniteDuration();
  python_backoff_ = std::min(python_backoff_ * 2, period * kMaxBackoffPeriods);
  return python_backoff_;
}

absl::Status Profiler::Rescan() {
  rescan_due_ = false;
  ++rescans_;
  RescanSources();
  auto changes = discovery_->Scan();
  if (events_fd_ >= 0 && !discovery_->watches_events()) {  // it gave up on them: /proc now
    poller_->StopWatching(events_fd_);
    events_fd_ = -1;
  }
  // With process events the next scan follows an event (or, while a process is caught
  // mid-exec, a period); without, /proc is read on a period.
  bool periodic = !discovery_->watches_events() || discovery_->has_pending();
  for (sources::StackSource* source : sources_) periodic |= source->rescan_periodically();
  next_rescan_ = periodic ? absl::Now() + options_.rescan_interval : absl::InfiniteFuture();
  if (!changes.ok()) return changes.status();
  for (const auto& p : changes->removed) RemoveTarget(p.pid);
  for (const auto& p : changes->added) {
    AddTarget(p);
    // Reading a target's mappings and symbols takes a while on a busy host, and per CPU the
    // rings fill meanwhile: drain them between targets rather than lose samples.
    if (changes->added.size() > 1) {
      for (sources::StackSource* source : sources_) source->Drain(recorder_);
    }
  }
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
  return absl::OkStatus();
}

void Profiler::RescanSources() {
  for (sources::StackSource* source : sources_) {
    std::vector<pid_t> claimed;
    if (auto st = source->Rescan(recorder_, &claimed); !st.ok()) {
      LogDebug("in-process rings: {}", st.ToString());
      continue;
    }
    for (pid_t pid : claimed) {
      Target* target = discovery_->Find(pid);
      if (target == nullptr || target->source == source) continue;
      // Started sampling itself after we found it: switch it to the source that claims it.
      if (target->source != nullptr) target->source->Detach(pid);
      recorder_.ForgetTarget(pid);
      python_as_sampled_.erase(pid);
      discovery_->SetSource(*target, source);
      LogInfo("pid {} ({}): reading its in-process sampler's ring", pid,
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
  // Before attaching: a Python target's samples are wanted one by one, unless they carry
  // their frames (then also those of an interpreter loaded later).
  if (python_capture_ != nullptr && target->source == perf_.get() && perf_ != nullptr) {
    python_as_sampled_.insert(process.pid);
    recorder_.FindInterpreter(*target);  // (registers its threads, see AttachPythonCapture)
    AttachPythonCapture();
  } else if (recorder_.FindInterpreter(*target) && target->source != nullptr &&
             target->source->DeliverEachSample(process.pid)) {
    python_as_sampled_.insert(process.pid);
  }
  absl::Status st = target->source == nullptr
                        ? absl::OkStatus()
                        : target->source->Attach(process.pid, process.threads);
  if (!st.ok()) {
    LogWarn("cannot sample pid {} ({}): {}", process.pid, process.executable, st.ToString());
    recorder_.ForgetTarget(process.pid);
    python_as_sampled_.erase(process.pid);
    return;
  }
  LogInfo("profiling pid {} ({}) as service '{}', {} threads, labels {{{}}}", process.pid,
               process.executable, process.service, process.threads.size(),
               labels::ToString(target->labels));
  discovery_->Insert(std::move(target));
}

void Profiler::RemoveTarget(pid_t pid) {
  for (sources::StackSource* source : sources_) source->Remove(pid, recorder_);
  recorder_.ForgetTarget(pid);
  python_as_sampled_.erase(pid);
  discovery_->Remove(pid);
}

absl::StatusOr<std::optional<v1::SampleBatch>> Profiler::TakeBatch(int64_t start_ms,
                                                                  int64_t end_ms,
                                                                  uint64_t sequence) {
  recorder_.ClearFull();
  // dlopen/dlclose: mapping changes of every target (TargetDiscovery::
  // RefreshMappingsPeriodically). A pc in no known module refreshes its target at once
  // (StackRecorder, TargetDiscovery::RefreshSoon).
  for (const auto& [pid, target] : discovery_->all()) {
    discovery_->RefreshMappingsPeriodically(*target);
  }
  uint64_t lost = 0;
  for (const sources::StackSource* source : sources_) lost += source->lost();
  auto batch = batches_.Interval(recorder_.continuous(), {start_ms, end_ms, sequence},
                                *discovery_, lost);
  if (!batch.ok() || !batch->has_value()) return batch;
  // Counters only of targets the batch names (the server refuses others).
  absl::flat_hash_set<uint32_t> named;
  for (const v1::Target& t : (*batch)->targets()) named.insert(t.id());
  for (v1::UnwindCounters& counts : recorder_.TakeUnwindCounts()) {
    if (named.contains(counts.target_id())) *(*batch)->add_unwind() = std::move(counts);
  }
  recorder_.leaf_addresses().TakeInto(named, &**batch);
  return batch;
}

absl::StatusOr<std::optional<v1::SampleBatch>> Profiler::TakeOffCpuBatch(int64_t start_ms,
                                                                         int64_t end_ms,
                                                                         uint64_t sequence) {
  return batches_.OffCpu(recorder_.off_cpu(), {start_ms, end_ms, sequence}, *discovery_,
                         continuous_hz_);
}

void Profiler::DropRetiredTargets() {
  discovery_->DropRetired([this](uint32_t id) { return recorder_.HoldsSamplesOf(id); });
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
  absl::Status status = perf_->SetFrequency(session_id, frequency_hz);
  if (status.ok() && session_id == sources::kContinuousSession) continuous_hz_ = frequency_hz;
  return status;
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
  ProfilerStats s;
  static_cast<StackRecorderStats&>(s) = recorder_.stats();
  s.refreshes = discovery_->refreshes();
  for (const sources::StackSource* source : sources_) s.lost += source->lost();
  if (perf_ != nullptr) {
    const sampler::SamplerStats sampling = perf_->sampler_stats();
    s.filtered = sampling.filtered + sampling.filtered_in_kernel;
    s.filtered_in_kernel = sampling.filtered_in_kernel;
    s.filter_runs = sampling.filter_runs;
    s.filter_ns = sampling.filter_ns;
    s.perf_events = perf_->events();
    s.programs_not_attached = sampling.programs_not_attached;
  }
  if (python_capture_ != nullptr) {
    s.python_capture = true;
    s.capture = python_capture_->stats();
    s.capture_runs = python_capture_->runs();
  }
  s.wakeups = wakeups_;
  s.rescans = rescans_;
  s.kernel_stacks = kernel_symbols_ != nullptr;
  s.python_targets = recorder_.python_targets();
  s.targets = discovery_->all().size();
  for (const auto& [pid, t] : discovery_->all()) {
    s.inproc_targets += inproc_ != nullptr && t->source == inproc_.get();
  }
  return s;
}

}  // namespace strata::agent
