// agent/sources: where the agent's stacks come from. A StackSource samples the targets it is
// given and delivers their stacks to a StackSink (the agent's StackRecorder, agent/core):
//   PerfSource   (perf_source.h)   perf events per thread: registers and a stack copy, which
//                                  the recorder unwinds;
//   InprocSource (inproc_source.h) the rings of processes running the in-process runtime
//                                  (agent/runtime): stacks already unwound inside the target.
// Sources own their kernel objects and rings; targets, unwinding, symbolization and counting
// belong to agent/core. A source is driven from the agent's main loop only (not thread-safe).
//
// The interface does not assume one event per thread: thread notifications are hints a source
// may ignore (a per-CPU source samples whole CPUs and keeps the samples of its targets).
#ifndef STRATA_AGENT_SOURCES_STACK_SOURCE_H_
#define STRATA_AGENT_SOURCES_STACK_SOURCE_H_

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "agent/sampler/raw_sample.h"
#include "agent/symbols/process_address_space.h"

namespace strata::agent::sources {

class StackSource;

// A stack unwound before it reached the agent: absolute pcs, innermost first (pcs[0] exact,
// the others return addresses).
struct UnwoundStack {
  pid_t pid = 0;
  pid_t tid = 0;          // 0: unknown
  uint64_t time_ns = 0;   // CLOCK_MONOTONIC of the sample (0: unknown)
  const uint64_t* pcs = nullptr;
  size_t num_frames = 0;
  bool truncated = false;
  // Unwinding stopped at a pc in no module the target knew (it mapped a library since).
  bool stopped_outside_modules = false;
};

class StackSink {
 public:
  virtual ~StackSink() = default;
  // Registers and a stack copy, to be unwound by the agent.
  virtual void OnSample(const sampler::RawSample& sample) = 0;
  // A stack unwound by the target itself, delivered by `from`.
  virtual void OnStack(StackSource& from, const UnwoundStack& stack) = 0;
};

class StackSource {
 public:
  virtual ~StackSource() = default;

  // Looks for processes this source serves by itself, whatever the other sources do (a ring
  // that appeared), after delivering what it has to `sink`. `claimed` receives the pids that
  // are new since the last call.
  virtual absl::Status Rescan(StackSink& sink, std::vector<pid_t>* claimed) {
    return absl::OkStatus();
  }
  // A descriptor that is readable when Rescan() may find something new (-1: none), and
  // whether Rescan() needs calling on a period instead.
  virtual int rescan_fd() const { return -1; }
  virtual bool rescan_periodically() const { return false; }
  // True when the source serves `pid` by itself (see Rescan).
  virtual bool Claims(pid_t pid) const { return false; }

  // Continuous sampling of a target and its current threads; Detach stops it (the target
  // moves to another source); Remove forgets the target everywhere (it exited), after
  // delivering what was sampled of it to `sink`.
  virtual absl::Status Attach(pid_t pid, const std::vector<pid_t>& threads) = 0;
  // Before Attach(): asks for `pid`'s stacks as soon as each is taken, not in batches (the
  // owner reads its Python frames after each sample). False when the source cannot.
  virtual bool DeliverEachSample(pid_t pid) { return false; }
  virtual void Detach(pid_t pid) = 0;
  virtual void Remove(pid_t pid, StackSink& sink) = 0;
  // Threads of targets that started or exited (a tid may be reused later).
  virtual void ThreadStarted(pid_t pid, pid_t tid) {}
  virtual void ThreadExited(pid_t pid, pid_t tid) {}

  // A descriptor that is readable when stacks arrived (for the owner's poll), or -1: sources
  // without one are drained at least every max_wait(). After it was readable the owner calls
  // Ready() before the next Drain().
  virtual int wait_fd() const { return -1; }
  virtual absl::Status Ready() { return absl::OkStatus(); }
  virtual absl::Duration max_wait() const { return absl::InfiniteDuration(); }
  // Delivers every stack sampled so far.
  virtual void Drain(StackSink& sink) = 0;

  // True when the target's mappings come from the source (the target's own view, e.g. under
  // qemu-user) rather than from /proc/PID/maps.
  virtual bool ProvidesMappings() const { return false; }
  // The target's executable mappings; `generation` changes when they did.
  virtual absl::StatusOr<std::vector<symbols::MappingInfo>> Mappings(pid_t pid,
                                                                     uint64_t* generation) const {
    return absl::UnimplementedError("mappings come from /proc");
  }

  // Samples dropped before they reached the agent (full kernel or in-process rings), in total.
  virtual uint64_t lost() const = 0;
};

}  // namespace strata::agent::sources

#endif  // STRATA_AGENT_SOURCES_STACK_SOURCE_H_
