#include "agent/sampler/perf_regs.h"

#include <bit>

#include "absl/status/status.h"
#include "common/unwind/host_arch.h"

namespace strata::agent::sampler {
namespace {

// Register numbers from the kernel's uapi asm/perf_regs.h of each architecture.
namespace x86_64 {
constexpr int kBp = 6;  // PERF_REG_X86_BP
constexpr int kSp = 7;  // PERF_REG_X86_SP
constexpr int kIp = 8;  // PERF_REG_X86_IP
constexpr int kR13 = 21;  // PERF_REG_X86_R13: HotSpot's interpreter's bytecode pointer
constexpr int kR14 = 22;  // PERF_REG_X86_R14: Go's g (ABIInternal)
}  // namespace x86_64
namespace mips64 {
constexpr int kPc = 0;   // PERF_REG_MIPS_PC
constexpr int kSp = 29;  // PERF_REG_MIPS_R29
constexpr int kFp = 30;  // PERF_REG_MIPS_R30 (s8/fp)
constexpr int kRa = 31;  // PERF_REG_MIPS_R31
}  // namespace mips64

constexpr uint64_t Bit(int reg) { return uint64_t{1} << reg; }

// Index of `reg` in the record's regs[]: the number of requested registers below it.
constexpr int IndexOf(uint64_t mask, int reg) {
  return std::popcount(mask & (Bit(reg) - 1));
}

constexpr UserRegsLayout MakeLayout(uint64_t mask, int pc, int sp, int fp, int ra, int g,
                                    int bcp) {
  UserRegsLayout layout;
  layout.mask = mask;
  layout.count = std::popcount(mask);
  layout.pc_index = IndexOf(mask, pc);
  layout.sp_index = IndexOf(mask, sp);
  layout.fp_index = IndexOf(mask, fp);
  layout.ra_index = ra < 0 ? -1 : IndexOf(mask, ra);
  layout.g_index = IndexOf(mask, g);
  layout.bcp_index = bcp < 0 ? -1 : IndexOf(mask, bcp);
  return layout;
}

constexpr UserRegsLayout kX86_64Layout =
    MakeLayout(Bit(x86_64::kBp) | Bit(x86_64::kSp) | Bit(x86_64::kIp) | Bit(x86_64::kR13) |
                   Bit(x86_64::kR14),
               x86_64::kIp, x86_64::kSp, x86_64::kBp, -1, x86_64::kR14, x86_64::kR13);
constexpr UserRegsLayout kMips64Layout =
    MakeLayout(Bit(mips64::kPc) | Bit(mips64::kSp) | Bit(mips64::kFp) | Bit(mips64::kRa),
               mips64::kPc, mips64::kSp, mips64::kFp, mips64::kRa, mips64::kFp, -1);

static_assert(kX86_64Layout.count == 5 && kX86_64Layout.fp_index == 0 &&
              kX86_64Layout.sp_index == 1 && kX86_64Layout.pc_index == 2 &&
              kX86_64Layout.bcp_index == 3 && kX86_64Layout.g_index == 4);
static_assert(kMips64Layout.count == 4 && kMips64Layout.pc_index == 0 &&
              kMips64Layout.sp_index == 1 && kMips64Layout.fp_index == 2 &&
              kMips64Layout.ra_index == 3 && kMips64Layout.g_index == 2 &&
              kMips64Layout.bcp_index == -1);

}  // namespace

const UserRegsLayout& RegsLayoutFor(Arch arch) {
  switch (arch) {
    case Arch::kX86_64:
      return kX86_64Layout;
    case Arch::kMips64:
      return kMips64Layout;
  }
  return kX86_64Layout;
}

absl::StatusOr<Arch> HostArch() {
  switch (unwind::kHostArch) {
    case unwind::Arch::kX86_64:
      return Arch::kX86_64;
    case unwind::Arch::kMips64El:
    case unwind::Arch::kMips64Be:
      return Arch::kMips64;
  }
  return absl::UnimplementedError("perf sampling: unsupported architecture");
}

}  // namespace strata::agent::sampler
