#include "agent/core/stack_sources.h"

#include "absl/strings/str_cat.h"
#include "common/base/log.h"
#include "common/unwind/host_arch.h"

namespace strata::agent {
namespace {

// The scope of the agent's perf events: per CPU unless told otherwise or not allowed.
absl::StatusOr<sampler::SamplingScope> ChooseScope(ProfilerOptions::Sampling sampling) {
  if (sampling == ProfilerOptions::Sampling::kPerThread) return sampler::SamplingScope::kPerThread;
  absl::Status probe = sampler::ProbePerCpuEvents();
  if (probe.ok()) {
    if (absl::Status filter = sampler::ProbeCpuFilter(); filter.ok()) {
      LogInfo("sampling per CPU: other processes' samples dropped in the kernel");
    } else {
      LogInfo("sampling per CPU: other processes' samples dropped by the agent ({})",
              filter.ToString());
    }
    return sampler::SamplingScope::kPerCpu;
  }
  if (sampling == ProfilerOptions::Sampling::kPerCpu) return probe;
  LogInfo("sampling per thread: system-wide perf events are not allowed here ({})",
               probe.ToString());
  return sampler::SamplingScope::kPerThread;
}

// The kernel's symbols when samples may carry kernel chains in `scope`, else null (and why,
// once, unless kernel stacks were asked for: then the error).
absl::StatusOr<std::unique_ptr<kernel::KernelSymbols>> KernelSymbolsFor(
    ProfilerOptions::KernelStacks mode, sampler::SamplingScope scope) {
  if (mode == ProfilerOptions::KernelStacks::kOff) return nullptr;
  absl::Status status = sampler::ProbeKernelEvents(scope, sampler::SessionEvent::kCpuClock);
  absl::StatusOr<std::unique_ptr<kernel::KernelSymbols>> symbols =
      status.ok() ? kernel::KernelSymbols::Load() : status;
  if (symbols.ok()) {
    LogInfo("kernel stacks on: {} kernel text symbols", (*symbols)->size());
    return symbols;
  }
  if (mode == ProfilerOptions::KernelStacks::kOn) return symbols.status();
  LogInfo("kernel stacks off, user stacks only: {}", symbols.status().ToString());
  return nullptr;
}

}  // namespace

absl::StatusOr<StackSources> OpenStackSources(const ProfilerOptions& options) {
  StackSources opened;
  if (options.inproc != ProfilerOptions::Inproc::kOn) {
    if (absl::Status probe = sampler::ProbePerfEvents(); probe.ok()) {
      auto scope = ChooseScope(options.sampling);
      if (!scope.ok()) return scope.status();
      auto symbols = KernelSymbolsFor(options.kernel_stacks, *scope);
      if (!symbols.ok()) return symbols.status();
      opened.kernel_symbols = std::move(*symbols);
      if (options.off_cpu) {
        // Off-CPU events are per thread in either scope (PerfSource).
        if (absl::Status off = sampler::ProbeKernelEvents(
                sampler::SamplingScope::kPerThread, sampler::SessionEvent::kContextSwitches);
            !off.ok()) {
          return absl::Status(off.code(), absl::StrCat("--off-cpu: ", off.message()));
        }
      }
      if (options.python_frames && options.python_capture != ProfilerOptions::PythonCapture::kOff) {
        auto capture = python::FrameCapture::Create();
        if (capture.ok()) {
          opened.python_capture = std::move(*capture);
          LogInfo("python frames: copied at each sample (a BPF program, attached to the perf "
                  "events once a target runs Python)");
        } else if (options.python_capture == ProfilerOptions::PythonCapture::kOn) {
          return absl::Status(capture.status().code(),
                              absl::StrCat("--python-capture: ", capture.status().message()));
        } else {
          LogInfo("python frames: read from memory after each sample ({})",
                  capture.status().ToString());
        }
      }
      auto perf = sources::PerfSource::Open({.frequency_hz = options.frequency_hz,
                                             .stack_bytes = options.stack_bytes,
                                             .scope = *scope,
                                             .kernel_stacks = opened.kernel_symbols != nullptr,
                                             .user_frame_chain = options.frame_walk,
                                             .off_cpu = options.off_cpu});
      if (!perf.ok()) return perf.status();
      opened.perf = std::move(*perf);
    } else if (options.inproc == ProfilerOptions::Inproc::kOff || options.off_cpu ||
               options.kernel_stacks == ProfilerOptions::KernelStacks::kOn) {
      return probe;
    } else {
      LogWarn("perf events unavailable ({}); sampling only processes that run the "
                   "in-process sampler (rings in {})",
                   probe.ToString(), options.inproc_dir);
    }
  }
  if (options.inproc != ProfilerOptions::Inproc::kOff) {
    sources::InprocSourceOptions ring_options;
    ring_options.dir = options.inproc_dir;
    ring_options.arch = static_cast<uint32_t>(unwind::kHostArch);
    opened.inproc = std::make_unique<sources::InprocSource>(std::move(ring_options));
  }
  return opened;
}

}  // namespace strata::agent
