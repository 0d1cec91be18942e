// Test support: capture the current thread's registers and a copy of its stack from inside a
// chain of non-inlined functions, as a sampler would see them. Two builds of the same chain:
// without frame pointers (CFI only) and with frame pointers (the FP-walk fallback).
#ifndef STRATA_COMMON_UNWIND_UNWIND_TEST_CHAIN_H_
#define STRATA_COMMON_UNWIND_UNWIND_TEST_CHAIN_H_

#include <cstdint>
#include <vector>

#include "common/unwind/unwind_types.h"

namespace strata::unwind::testing {

struct CapturedStack {
  Registers regs;
  uint64_t stack_start = 0;
  std::vector<uint8_t> stack;
  // return_addresses[i] = __builtin_return_address(0) of the i-th function from the leaf.
  std::vector<uint64_t> return_addresses;

  StackSnapshot snapshot() const { return {stack_start, stack.data(), stack.size()}; }
};

// Calls a chain of `depth` (>= 1) functions; the innermost captures into `out`.
// Returns a value the caller must use (keeps the chain from being folded).
int CaptureChainNoFp(int depth, CapturedStack* out);
int CaptureChainFp(int depth, CapturedStack* out);

// Copies [sp, top of the current thread's stack) into `out` (at most `max_bytes`).
void CopyCurrentStack(uint64_t sp, size_t max_bytes, CapturedStack* out);

// A stack captured inside a signal handler, as a sampler interrupting the handler sees it.
// The arrays are fixed-size because they are filled in the handler (no allocation there).
struct SignalCapture {
  static constexpr size_t kMax = 64;
  CapturedStack stack;  // registers of the handler chain's innermost function + stack copy
  // __builtin_return_address(0) of the handler chain's functions, innermost first; the last
  // one is the signal handler's own: the sa_restorer (__restore_rt) the kernel pushed.
  uint64_t handler_return_addresses[kMax] = {};
  size_t num_handler = 0;
  // The interrupted context (uc_mcontext.gregs): the frame after __restore_rt.
  uint64_t interrupted_pc = 0, interrupted_sp = 0, interrupted_fp = 0;
  // Return addresses of the interrupted chain, innermost (the spinning leaf's) first.
  std::vector<uint64_t> interrupted_return_addresses;
  bool captured = false;
};

// Runs a chain of `depth` (>= 1) non-inlined functions whose innermost spins until a one-shot
// ITIMER_REAL SIGALRM interrupts it; the SA_SIGINFO handler calls a chain of `handler_depth`
// functions whose innermost captures into `out`. Not reentrant (one process-wide handler).
// False when the signal did not arrive in time.
bool CaptureInSignalHandler(int depth, int handler_depth, SignalCapture* out);

}  // namespace strata::unwind::testing

#endif  // STRATA_COMMON_UNWIND_UNWIND_TEST_CHAIN_H_
