// The architecture this binary runs on, for the code that samples its own host (the agent,
// the in-process runtime): the one place that tests the compiler's architecture macros.
// Everything else in strata::unwind takes the architecture as data (unwind_types.h), so a
// build for another host is an error here, not a silent fallback elsewhere.
#ifndef STRATA_COMMON_UNWIND_HOST_ARCH_H_
#define STRATA_COMMON_UNWIND_HOST_ARCH_H_

#include <ucontext.h>

#include <cstdint>

#include "common/unwind/unwind_types.h"

namespace strata::unwind {

// kHostArch: the host's architecture.
// kRedZoneBytes: bytes below sp the ABI lets code use without moving sp; a signal leaves them
//   intact, so a stack copy taken in a handler starts that far below sp (x86-64 epilogues
//   restore registers from just below sp while the CFI still describes the popped slots).
// RegistersFromContext(): the interrupted thread's registers in a signal handler's context.
#if defined(__x86_64__)

inline constexpr Arch kHostArch = Arch::kX86_64;
inline constexpr uint64_t kRedZoneBytes = 128;
inline Registers RegistersFromContext(const ucontext_t& uc) {
  Registers r;
  r.pc = static_cast<uint64_t>(uc.uc_mcontext.gregs[REG_RIP]);
  r.sp = static_cast<uint64_t>(uc.uc_mcontext.gregs[REG_RSP]);
  r.fp = static_cast<uint64_t>(uc.uc_mcontext.gregs[REG_RBP]);
  return r;
}

#elif defined(__mips__) && defined(_ABI64) && _MIPS_SIM == _ABI64

#if defined(__MIPSEL__)
inline constexpr Arch kHostArch = Arch::kMips64El;
#else
inline constexpr Arch kHostArch = Arch::kMips64Be;
#endif
inline constexpr uint64_t kRedZoneBytes = 0;
inline Registers RegistersFromContext(const ucontext_t& uc) {
  Registers r;
  r.pc = uc.uc_mcontext.pc;
  r.sp = uc.uc_mcontext.gregs[29];
  r.fp = uc.uc_mcontext.gregs[30];
  r.ra = uc.uc_mcontext.gregs[31];
  return r;
}

#else
#error "unsupported host architecture (x86-64 and MIPS64 n64 are supported)"
#endif

}  // namespace strata::unwind

#endif  // STRATA_COMMON_UNWIND_HOST_ARCH_H_
