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

}  // namespace strata::unwind::testing

#endif  // STRATA_COMMON_UNWIND_UNWIND_TEST_CHAIN_H_
