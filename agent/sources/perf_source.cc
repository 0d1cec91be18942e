#include "agent/sources/perf_source.h"

#include <unistd.h>

#include <algorithm>
#include <bit>

namespace strata::agent::sources {
namespace {
// Per-CPU rings hold about two seconds of one busy CPU's samples (four times 16 to 64), at
// most 4 MiB per CPU and session and 64 MiB over all CPUs; the reader is woken as
// PerCpuWakeupSamples says (about a second of samples at low rates, where a wake-up costs more
// than the samples it delivers; a quarter of a capped ring at high rates). While samples flow,
// rings that hold two seconds of them are drained once a second instead, all CPUs together
// (SessionOptions::drain_every_ms): a busy host wakes the agent once a second, not once per
// CPU and second.
constexpr uint32_t kDrainEveryMs = 1000;
constexpr uint32_t kMinSamplesPerWakeup = 16;
constexpr uint32_t kMaxSamplesPerWakeup = 64;
constexpr uint32_t kRingSamplesPerWakeup = 4;
constexpr size_t kMaxCpuRingBytes = 4 << 20;
constexpr size_t kMaxRingBytes = 64 << 20;
}  // namespace

absl::StatusOr<std::unique_ptr<PerfSource>> PerfSource::Open(const PerfSourceOptions& options) {
  if (absl::Status probe = sampler::ProbePerfEvents(); !probe.ok()) return probe;
  auto sampler = sampler::PerfSampler::Create();
  if (!sampler.ok()) return sampler.status();
  auto source = std::unique_ptr<PerfSource>(new PerfSource(std::move(*sampler), options));
  if (auto st = source->sampler_->AddSession(source->SessionFor(kContinuousSession,
                                                                options.frequency_hz));
      !st.ok()) {
    return st;
  }
  if (options.off_cpu) {
    if (auto st = source->sampler_->AddSession(source->SessionFor(kOffCpuSession, 0));
        !st.ok()) {
      return st;
    }
  }
  return source;
}

sampler::SessionOptions PerfSource::SessionFor(uint32_t session_id,
                                               uint32_t frequency_hz) const {
  sampler::SessionOptions session;
  session.session_id = session_id;
  session.scope = scope_;
  session.frequency_hz = frequency_hz;
  session.stack_bytes = stack_bytes_;
  session.kernel_stacks = kernel_stacks_;
  session.user_frame_chain = user_frame_chain_ && session_id != kOffCpuSession;
  if (session_id == kOffCpuSession) {
    // Per thread whatever the sampling scope: a CPU's context-switch event records every
    // switch of every process on it (thousands a second on a busy host), each with a stack
    // copy, only for the agent to drop all but the targets'. A thread blocking a thousand
    // times a second switches out as often: wake per few switches, with a ring of twice
    // that (32 pages with the default 16 KiB stacks, as a per-thread cpu-clock event's):
    // one per thread, locked memory.
    session.scope = sampler::SamplingScope::kPerThread;
    session.event = sampler::SessionEvent::kContextSwitches;
    session.frequency_hz = 1;  // unused by context-switch events
    constexpr uint32_t kSwitchesPerWakeup = 3;
    session.ring_pages = sampler::RingPagesFor(stack_bytes_, 2 * kSwitchesPerWakeup);
    session.wakeup_samples = kSwitchesPerWakeup;
    return session;
  }
  if (scope_ == sampler::SamplingScope::kPerCpu) {
    const uint32_t per_wakeup =
        std::clamp(frequency_hz / 2, kMinSamplesPerWakeup, kMaxSamplesPerWakeup);
    const size_t page_size = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    const size_t cpus = std::max<size_t>(1, sampler::OnlineCpus().value_or(std::vector<int>{0}).size());
    const size_t cap = std::min(kMaxCpuRingBytes, kMaxRingBytes / cpus);
    session.ring_pages = std::min<uint32_t>(
        sampler::RingPagesFor(stack_bytes_, kRingSamplesPerWakeup * per_wakeup),
        std::max<uint32_t>(static_cast<uint32_t>(std::bit_floor(cap / page_size)),
                           sampler::RingPagesFor(stack_bytes_, 2)));
    session.wakeup_samples =
        sampler::PerCpuWakeupSamples(session.ring_pages, stack_bytes_, frequency_hz);
    session.drain_every_ms = kDrainEveryMs;
  }
  return session;
}

absl::Status PerfSource::Attach(pid_t pid, const std::vector<pid_t>& threads) {
  const auto wake = each_sample_.contains(pid) ? sampler::PerfSampler::Wake::kEachSample
                                               : sampler::PerfSampler::Wake::kBatched;
  if (auto st = sampler_->AttachProcess(kContinuousSession, pid, threads, wake); !st.ok()) {
    each_sample_.erase(pid);
    return st;
  }
  if (!off_cpu_) return absl::OkStatus();
  return sampler_->AttachProcess(kOffCpuSession, pid, threads);
}

bool PerfSource::DeliverEachSample(pid_t pid) {
  each_sample_.insert(pid);
  return true;
}

void PerfSource::Detach(pid_t pid) {
  sampler_->DetachProcess(kContinuousSession, pid);
  sampler_->DetachProcess(kOffCpuSession, pid);
  each_sample_.erase(pid);
}

void PerfSource::Remove(pid_t pid, StackSink& sink) {
  // Samples already in the ring still count: deliver them before the events close.
  Drain(sink);
  sampler_->DetachProcess(pid);
  each_sample_.erase(pid);
}

void PerfSource::ThreadStarted(pid_t pid, pid_t tid) { (void)sampler_->AttachNewThread(pid, tid); }

void PerfSource::ThreadExited(pid_t pid, pid_t tid) { sampler_->DetachThread(pid, tid); }

absl::Status PerfSource::Ready() { return sampler_->Wait(absl::ZeroDuration()).status(); }

void PerfSource::Drain(StackSink& sink) {
  sampler_->Drain([&sink](const sampler::RawSample& s) { sink.OnSample(s); });
}

absl::StatusOr<size_t> PerfSource::StartSession(uint32_t session_id, uint32_t frequency_hz,
                                                const std::vector<pid_t>& pids) {
  if (auto st = sampler_->AddSession(SessionFor(session_id, frequency_hz)); !st.ok()) return st;
  size_t attached = 0;
  absl::Status last_error;
  for (pid_t pid : pids) {
    // The continuous session's threads are the target's live threads (per CPU: none needed).
    std::vector<pid_t> tids = sampler_->AttachedThreads(kContinuousSession, pid);
    if (auto st = sampler_->AttachProcess(session_id, pid, tids); st.ok()) {
      ++attached;
    } else {
      last_error = st;
    }
  }
  if (attached == 0) {
    (void)sampler_->RemoveSession(session_id);
    return last_error.ok() ? absl::NotFoundError("no process to sample") : last_error;
  }
  return attached;
}

absl::Status PerfSource::SetFrequency(uint32_t session_id, uint32_t frequency_hz) {
  return sampler_->SetFrequency(session_id, frequency_hz);
}

void PerfSource::StopSession(uint32_t session_id, StackSink& sink) {
  Drain(sink);
  (void)sampler_->RemoveSession(session_id);
}

}  // namespace strata::agent::sources
