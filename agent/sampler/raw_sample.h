// The unit of data the sampler hands to the agent: one sample of one thread (registers needed
// to start unwinding its user stack, a copy of the top of that stack, and, when the session
// asks for it, the kernel's call chain), or, in off-CPU sessions, the moment a thread was
// scheduled back in.
//
// A RawSample points into memory owned by the sampler (the perf ring or a scratch buffer) and is
// valid only during the callback that receives it; copy what you keep.

#ifndef STRATA_AGENT_SAMPLER_RAW_SAMPLE_H_
#define STRATA_AGENT_SAMPLER_RAW_SAMPLE_H_

#include <cstddef>
#include <cstdint>

#include "absl/functional/function_ref.h"

namespace strata::agent::sampler {

enum class RawEventKind : uint8_t {
  kSample,    // registers, stack and kernel chain of a thread (on CPU, or switching out)
  kSwitchIn,  // the thread runs again (off-CPU sessions): only pid, tid and time are set
};

struct RawSample {
  RawEventKind kind = RawEventKind::kSample;
  uint32_t pid = 0;
  uint32_t tid = 0;
  uint64_t time_ns = 0;  // CLOCK_MONOTONIC
  uint64_t pc = 0;
  uint64_t sp = 0;
  uint64_t fp = 0;  // x86-64: rbp; MIPS64: s8/fp (r30)
  uint64_t ra = 0;  // MIPS64: ra (r31); 0 on x86-64 (the return address is on the stack)
  uint64_t g = 0;   // Go's g register: x86-64 r14; MIPS64 r30 (= fp)
  uint64_t bcp = 0;  // x86-64 r13: HotSpot's interpreter's bytecode pointer; 0 on MIPS64
  // Copy of the user stack starting at `sp`: only the `stack_size` valid bytes (the kernel's
  // dyn_size), possibly fewer than requested when the stack is shallower.
  const uint8_t* stack = nullptr;
  size_t stack_size = 0;
  // The kernel call chain, innermost first (the kernel pc where the sample was taken, then
  // return addresses), for sessions with kernel stacks; empty for a sample taken in user mode.
  const uint64_t* kernel_pcs = nullptr;
  size_t kernel_depth = 0;
  // The kernel's frame-pointer walk of the user stack, for sessions with user_frame_chain:
  // the user pc, then the return addresses found from the frame pointer, innermost first.
  const uint64_t* user_pcs = nullptr;
  size_t user_depth = 0;
  uint32_t session_id = 0;  // the sampling session that took it
};

using SampleCallback = absl::FunctionRef<void(const RawSample&)>;

}  // namespace strata::agent::sampler

#endif  // STRATA_AGENT_SAMPLER_RAW_SAMPLE_H_
