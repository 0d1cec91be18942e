// agent/core/stack_sources: which stack sources the agent runs on this host, as
// ProfilerOptions ask and the kernel allows: perf events (per CPU or per thread, with kernel
// stacks and off-CPU events where asked and allowed) and the in-process runtime's rings. The
// Profiler takes what OpenStackSources() returns and owns it.
#ifndef STRATA_AGENT_CORE_STACK_SOURCES_H_
#define STRATA_AGENT_CORE_STACK_SOURCES_H_

#include <memory>

#include "absl/status/statusor.h"
#include "agent/core/profiler.h"
#include "agent/kernel/kernel_symbols.h"
#include "agent/python/frame_capture.h"
#include "agent/sources/inproc_source.h"
#include "agent/sources/perf_source.h"

namespace strata::agent {

struct StackSources {
  std::unique_ptr<sources::PerfSource> perf;              // null: no perf events
  std::unique_ptr<sources::InprocSource> inproc;          // null: --inproc off
  std::unique_ptr<kernel::KernelSymbols> kernel_symbols;  // null: no kernel stacks
  // Python frames copied at each perf sample (its program attached by the Profiler once a
  // target runs Python); null: read from memory after the sample.
  std::unique_ptr<python::FrameCapture> python_capture;
};

// Probes the kernel and opens the sources. An error where the options insist on what the
// kernel refuses (kOff in-process with no perf events, per-CPU, kernel stacks, off-CPU,
// the Python frame capture).
absl::StatusOr<StackSources> OpenStackSources(const ProfilerOptions& options);

}  // namespace strata::agent

#endif  // STRATA_AGENT_CORE_STACK_SOURCES_H_
