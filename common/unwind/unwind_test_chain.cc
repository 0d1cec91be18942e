// Compiled twice (see CMakeLists.txt): as is (-fomit-frame-pointer) and, through
// unwind_test_fp_chain.cc, with frame pointers.
#include <pthread.h>
#include <signal.h>
#include <sys/time.h>
#include <ucontext.h>

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
// Copies live stack memory as the kernel's stack sampling does, the redzones AddressSanitizer
// puts between locals included: unchecked, and not through memcpy (which ASan intercepts).
__attribute__((no_sanitize_address)) static void CopyRawStack(void* dst, uint64_t src,
                                                              size_t len) {
  const volatile uint8_t* from = reinterpret_cast<const volatile uint8_t*>(src);
  uint8_t* to = static_cast<uint8_t*>(dst);
  for (size_t i = 0; i < len; ++i) to[i] = from[i];
}

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
  CopyRawStack(out->stack.data(), sp, len);
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

#ifdef STRATA_DEFINE_COPY
// ---- signal-handler capture (no frame pointers, like the chain above)

SignalCapture* g_signal_out = nullptr;
uint64_t g_signal_stack_top = 0;
int g_handler_depth = 0;
volatile int g_signal_done = 0;

__attribute__((noinline)) void HandlerLeaf(SignalCapture* out) {
  uint64_t pc, sp, fp;
  asm volatile(
      "leaq 1f(%%rip), %0\n"
      "1:\n"
      "movq %%rsp, %1\n"
      "movq %%rbp, %2\n"
      : "=r"(pc), "=r"(sp), "=r"(fp)::"memory");
  out->stack.regs = {pc, sp, fp, 0};
  out->handler_return_addresses[out->num_handler++] =
      reinterpret_cast<uint64_t>(__builtin_return_address(0));
  // The copy buffer was sized before the signal: a plain copy only (async-signal-safe).
  size_t len = std::min<uint64_t>(g_signal_stack_top - sp, out->stack.stack.size());
  out->stack.stack_start = sp;
  CopyRawStack(out->stack.stack.data(), sp, len);
  out->stack.stack.resize(len);  // shrinking: no allocation
}

__attribute__((noinline)) void HandlerStep(int depth, SignalCapture* out) {
  if (depth <= 1) HandlerLeaf(out);
  else HandlerStep(depth - 1, out);
  if (out->num_handler < SignalCapture::kMax) {
    out->handler_return_addresses[out->num_handler++] =
        reinterpret_cast<uint64_t>(__builtin_return_address(0));
  }
  asm volatile("" ::: "memory");
}

__attribute__((noinline)) void OnSignal(int, siginfo_t*, void* context) {
  SignalCapture* out = g_signal_out;
  if (out == nullptr || out->captured) return;
  const auto* uc = static_cast<const ucontext_t*>(context);
  out->interrupted_pc = static_cast<uint64_t>(uc->uc_mcontext.gregs[REG_RIP]);
  out->interrupted_sp = static_cast<uint64_t>(uc->uc_mcontext.gregs[REG_RSP]);
  out->interrupted_fp = static_cast<uint64_t>(uc->uc_mcontext.gregs[REG_RBP]);
  HandlerStep(g_handler_depth, out);
  // The handler's own return address: where the kernel made it "return" to.
  out->handler_return_addresses[out->num_handler++] =
      reinterpret_cast<uint64_t>(__builtin_return_address(0));
  out->captured = true;
  g_signal_done = 1;
}

// A frameless leaf the signal interrupts at an exact pc inside its loop.
__attribute__((noinline)) uint64_t SpinLeaf(SignalCapture* out) {
  out->interrupted_return_addresses.push_back(
      reinterpret_cast<uint64_t>(__builtin_return_address(0)));
  uint64_t x = 1;
  for (uint64_t i = 0; i < 40'000'000'000ull && !g_signal_done; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
  }
  return x;
}

__attribute__((noinline)) uint64_t SpinStep(int depth, SignalCapture* out) {
  uint64_t r = depth <= 1 ? SpinLeaf(out) : SpinStep(depth - 1, out);
  out->interrupted_return_addresses.push_back(
      reinterpret_cast<uint64_t>(__builtin_return_address(0)));
  asm volatile("" ::: "memory");
  return r + 1;
}
#endif

}  // namespace

#ifdef STRATA_DEFINE_COPY
bool CaptureInSignalHandler(int depth, int handler_depth, SignalCapture* out) {
  out->captured = false;
  out->num_handler = 0;
  out->interrupted_return_addresses.clear();
  out->interrupted_return_addresses.reserve(depth + 2);
  out->stack.stack.assign(1 << 20, 0);
  pthread_attr_t attr;
  pthread_getattr_np(pthread_self(), &attr);
  void* addr;
  size_t size;
  pthread_attr_getstack(&attr, &addr, &size);
  pthread_attr_destroy(&attr);
  g_signal_stack_top = reinterpret_cast<uint64_t>(addr) + size;
  g_handler_depth = handler_depth;
  g_signal_done = 0;
  g_signal_out = out;

  struct sigaction action = {}, old_action;
  action.sa_sigaction = OnSignal;
  action.sa_flags = SA_SIGINFO;
  sigemptyset(&action.sa_mask);
  sigaction(SIGALRM, &action, &old_action);
  itimerval timer = {};
  timer.it_value.tv_usec = 2000;
  setitimer(ITIMER_REAL, &timer, nullptr);
  uint64_t r = SpinStep(depth, out);
  itimerval off = {};
  setitimer(ITIMER_REAL, &off, nullptr);
  sigaction(SIGALRM, &old_action, nullptr);
  g_signal_out = nullptr;
  asm volatile("" : : "r"(r) : "memory");
  return out->captured;
}
#endif

int STRATA_CHAIN(CaptureChain)(int depth, CapturedStack* out) {
  out->return_addresses.clear();
  return STRATA_CHAIN(Step)(depth, out) + 1;
}

}  // namespace strata::unwind::testing
