// agent/runtime: the in-process runtime library, the only part of the agent that runs inside
// target processes (libstrata_inproc.so, strata_inproc_static). It owns the sampler (this
// header), its start-up and pthread_create hooks (autostart.cc, preload.cc, static_wrap.cc)
// and the shared-memory ring (ring.h), whose reader side the agent uses through
// agent/sources/inproc_source.h. It links no agent library: only common/unwind and common/elf.
//
// The in-process sampler: samples the threads of the process it lives in, for hosts where the
// agent cannot use perf events (locked-down kernels, MIPS64 without virtualized counters,
// qemu-user). Shipped as libstrata_inproc.so (LD_PRELOAD; autostart.cc starts it from a
// constructor) or linked into a static program (strata_inproc_static, whole archive, with
// -Wl,--wrap=pthread_create so new threads are registered).
//
// Each registered thread gets a CPU-time timer (timer_create(CLOCK_THREAD_CPUTIME_ID) with
// SIGEV_THREAD_ID) raising SIGPROF at `hz`. The handler unwinds from the interrupted
// registers with the generic unwind::Unwind() over the live stack [sp, stack top) and an
// AddressSpace of this process's own modules (their RuleSources: CfiTable on x86-64,
// PrologueTable on MIPS64), then appends the pcs to the shared-memory ring (ring.h) that
// strata-agent reads. Everything the handler touches is built before it can run (modules at
// Start() and after dlopen, stack bounds at thread registration): the handler does not
// allocate, lock or use stdio.
//
// The sampler owns SIGPROF: a program's own SIGPROF handler is replaced.
// Module tables replaced after a dlopen/dlclose are kept (never freed) because a handler on
// another thread may still be reading them.
#ifndef STRATA_AGENT_RUNTIME_SAMPLER_H_
#define STRATA_AGENT_RUNTIME_SAMPLER_H_

#include <pthread.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace strata::agent::runtime {

struct SamplerOptions {
  uint32_t hz = 99;                   // STRATA_INPROC_HZ
  std::string dir = "/dev/shm";       // STRATA_INPROC_DIR: where the ring file is created
  uint32_t ring_capacity = 2048;      // records (about 1 KiB each)
  uint32_t module_poll_ms = 500;      // how often dlopen/dlclose are looked for
};

// Options from the environment (defaults above for unset or invalid values).
SamplerOptions OptionsFromEnvironment();

// Creates the ring, builds the module table, installs the SIGPROF handler, registers the
// calling thread and starts the module watcher. Idempotent.
absl::Status Start(const SamplerOptions& options);
// Stops every timer and removes the ring file (the mapping stays until exit: a handler on
// another thread may still be writing).
void Stop();
bool Running();

// Registers the calling thread (stack bounds, timer); it is unregistered when it exits.
absl::Status RegisterCurrentThread();

// Rebuilds the module table now (also done by the watcher when modules change).
absl::Status RefreshModules();

struct SamplerStats {
  uint64_t samples = 0;       // stacks written to the ring
  uint64_t lost = 0;          // ring full
  uint64_t off_stack = 0;     // sp outside the thread's registered stack
  size_t threads = 0;
  size_t modules = 0;
};
SamplerStats Stats();

// pthread_create that registers the new thread before it runs `start` (the interposers in
// preload.cc and static_wrap.cc pass the real pthread_create).
using PthreadCreateFn = int (*)(pthread_t*, const pthread_attr_t*, void* (*)(void*), void*);
int CreateRegisteredThread(PthreadCreateFn real, pthread_t* thread, const pthread_attr_t* attr,
                           void* (*start)(void*), void* arg);

}  // namespace strata::agent::runtime

// Optional test hook: when the program defines it (exported), the handler calls it after each
// sample with the unwound pcs. It runs in signal context: it must be async-signal-safe.
extern "C" void strata_inproc_on_sample(const uint64_t* pcs, size_t num_frames, int truncated)
    __attribute__((weak));

#endif  // STRATA_AGENT_RUNTIME_SAMPLER_H_
