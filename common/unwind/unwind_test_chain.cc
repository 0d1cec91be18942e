// Compiled twice (see CMakeLists.txt): as is (-fomit-frame-pointer) and, through
// unwind_test_fp_chain.cc, with frame pointers.
#include <pthread.h>

#include <algorithm>
#include <cstring>

#include "common/unwind/unwind_test_chain.h"

#ifndef STRATA_CHAIN_SUFFIX
#define STRATA_CHAIN_SUFFIX NoFp
#define STRATA_DEFINE_COPY 1
#endif
#define STRATA_CAT2(a, b) a##b
#define STRATA_CAT(a, b) STRATA_CAT2(a, b)
#define STRATA_CHAIN(name) STRATA_CAT(name, STRATA_CHAIN_SUFFIX)

namespace strata::unwind::testing {

#ifdef STRATA_DEFINE_COPY
void CopyCurrentStack(uint64_t sp, size_t max_bytes, CapturedStack* out) {
  pthread_attr_t attr;
  pthread_getattr_np(pthread_self(), &attr);
  void* addr;
  size_t size;
  pthread_attr_getstack(&attr, &addr, &size);
  pthread_attr_destroy(&attr);
  uint64_t top = reinterpret_cast<uint64_t>(addr) + size;
  size_t len = std::min<uint64_t>(top - sp, max_bytes);
  out->stack_start = sp;
  out->stack.resize(len);
  std::memcpy(out->stack.data(), reinterpret_cast<const void*>(sp), len);
}
#endif

namespace {

__attribute__((noinline)) int STRATA_CHAIN(Leaf)(CapturedStack* out) {
  uint64_t pc, sp, fp;
  asm volatile(
      "leaq 1f(%%rip), %0\n"
      "1:\n"
      "movq %%rsp, %1\n"
      "movq %%rbp, %2\n"
      : "=r"(pc), "=r"(sp), "=r"(fp)::"memory");
  out->regs.pc = pc;
  out->regs.sp = sp;
  out->regs.fp = fp;
  out->return_addresses.insert(out->return_addresses.begin(),
                               reinterpret_cast<uint64_t>(__builtin_return_address(0)));
  CopyCurrentStack(sp, 1 << 20, out);
  return static_cast<int>(out->stack.size() & 1);
}

__attribute__((noinline)) int STRATA_CHAIN(Step)(int depth, CapturedStack* out) {
  int r = depth <= 1 ? STRATA_CHAIN(Leaf)(out) : STRATA_CHAIN(Step)(depth - 1, out);
  out->return_addresses.push_back(reinterpret_cast<uint64_t>(__builtin_return_address(0)));
  asm volatile("" ::: "memory");
  return r + 1;
}

}  // namespace

int STRATA_CHAIN(CaptureChain)(int depth, CapturedStack* out) {
  out->return_addresses.clear();
  return STRATA_CHAIN(Step)(depth, out) + 1;
}

}  // namespace strata::unwind::testing
