#include "agent/sources/perf_source.h"

#include <algorithm>

namespace strata::agent::sources {
namespace {
// Per-CPU rings: a quarter second of one busy CPU's samples per wake-up, within bounds that
// keep a ring between 0.5 and 4 MiB of 16 KiB stacks.
constexpr uint32_t kMinSamplesPerWakeup = 16;
constexpr uint32_t kMaxSamplesPerWakeup = 64;
}  // namespace

absl::StatusOr<std::unique_ptr<PerfSource>> PerfSource::Open(uint32_t frequency_hz,
                                                              uint32_t stack_bytes,
                                                              sampler::SamplingScope scope) {
  if (absl::Status probe = sampler::ProbePerfEvents(); !probe.ok()) return probe;
  auto sampler = sampler::PerfSampler::Create();
  if (!sampler.ok()) return sampler.status();
  auto source = std::unique_ptr<PerfSource>(new PerfSource(std::move(*sampler), stack_bytes,
                                                           scope));
  if (auto st = source->sampler_->AddSession(source->SessionFor(kContinuousSession,
                                                                frequency_hz));
      !st.ok()) {
    return st;
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
  if (scope_ == sampler::SamplingScope::kPerCpu) {
    session.ring_pages = sampler::RingPagesFor(
        stack_bytes_, std::clamp(frequency_hz / 4, kMinSamplesPerWakeup, kMaxSamplesPerWakeup));
  }
  return session;
}

absl::Status PerfSource::Attach(pid_t pid, const std::vector<pid_t>& threads) {
  return sampler_->AttachProcess(kContinuousSession, pid, threads);
}

void PerfSource::Detach(pid_t pid) { sampler_->DetachProcess(kContinuousSession, pid); }

void PerfSource::Remove(pid_t pid, StackSink& sink) {
  // Samples already in the ring still count: deliver them before the events close.
  Drain(sink);
  sampler_->DetachProcess(pid);
}

void PerfSource::ThreadStarted(pid_t pid, pid_t tid) { (void)sampler_->AttachNewThread(pid, tid); }

void PerfSource::ThreadExited(pid_t pid, pid_t tid) { sampler_->DetachThread(pid, tid); }

absl::Status PerfSource::Wait(absl::Duration timeout) { return sampler_->Wait(timeout).status(); }

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
