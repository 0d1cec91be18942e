// The architecture this agent binary samples (the host's): chosen here, once.
#ifndef STRATA_AGENT_CORE_HOST_ARCH_H_
#define STRATA_AGENT_CORE_HOST_ARCH_H_

#include "common/unwind/unwind_types.h"

namespace strata::agent {

#if defined(__x86_64__)
inline constexpr unwind::Arch kHostArch = unwind::Arch::kX86_64;
#elif defined(__mips__) && defined(__MIPSEL__)
inline constexpr unwind::Arch kHostArch = unwind::Arch::kMips64El;
#elif defined(__mips__)
inline constexpr unwind::Arch kHostArch = unwind::Arch::kMips64Be;
#else
#error "strata-agent: unsupported architecture (x86-64 and MIPS64 are supported)"
#endif

}  // namespace strata::agent

#endif  // STRATA_AGENT_CORE_HOST_ARCH_H_
