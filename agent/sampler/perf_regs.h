// Which user registers the sampler asks perf for, per architecture, and where they land in a
// PERF_RECORD_SAMPLE.
//
// The architecture is data here (numbers from the kernel's uapi asm/perf_regs.h), so records of
// either architecture can be parsed and tested on any host; the host's architecture is chosen
// in exactly one place (common/unwind/host_arch.h; HostArch() maps it to Arch).

#ifndef STRATA_AGENT_SAMPLER_PERF_REGS_H_
#define STRATA_AGENT_SAMPLER_PERF_REGS_H_

#include <cstdint>

#include "absl/status/statusor.h"

namespace strata::agent::sampler {

enum class Arch { kX86_64, kMips64 };

// Bit mask for perf_event_attr.sample_regs_user and the position of each register we use in
// the record's regs[] array (registers are stored in ascending bit order). -1: not sampled.
struct UserRegsLayout {
  uint64_t mask = 0;
  int count = 0;  // number of bits set in mask = number of u64 in the record
  int pc_index = -1;
  int sp_index = -1;
  int fp_index = -1;
  int ra_index = -1;
  // Go's g register (x86-64 r14; MIPS64 r30, the fp register): where a Go stack crossing
  // starts (unwind::Registers::g).
  int g_index = -1;
  // HotSpot's template interpreter's bytecode pointer (x86-64 r13): where an interpreted leaf
  // is in its method, which its frame saves only at calls. -1 on MIPS64 (Zero's interpreter
  // is C++).
  int bcp_index = -1;
};

const UserRegsLayout& RegsLayoutFor(Arch arch);

// The architecture this binary runs on; UnimplementedError on anything else.
absl::StatusOr<Arch> HostArch();

}  // namespace strata::agent::sampler

#endif  // STRATA_AGENT_SAMPLER_PERF_REGS_H_
