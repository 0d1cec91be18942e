// Architecture-neutral vocabulary for unwinding a stack from a register snapshot plus a copy
// of the stack bytes (a perf sample, an in-process signal handler, or a recorded snapshot).
//
// The architecture is data, not the build target: the same code unwinds x86-64 and MIPS64
// (either endianness) stacks on any host, so the MIPS64 unwinder is unit-tested on x86-64.
// Everything here is plain data with no allocation, usable from a signal handler.
#ifndef STRATA_COMMON_UNWIND_UNWIND_TYPES_H_
#define STRATA_COMMON_UNWIND_UNWIND_TYPES_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace strata::unwind {

enum class Arch : uint8_t {
  kX86_64 = 0,
  kMips64El = 1,  // little-endian n64 (Debian mips64el)
  kMips64Be = 2,  // big-endian n64
};

std::string_view ArchName(Arch arch);  // "x86_64", "mips64el", "mips64"
inline bool IsBigEndian(Arch arch) { return arch == Arch::kMips64Be; }

// Registers of the interrupted thread under architecture-neutral names.
struct Registers {
  uint64_t pc = 0;
  uint64_t sp = 0;
  uint64_t fp = 0;  // rbp on x86-64, s8/fp ($30) on MIPS64
  uint64_t ra = 0;  // $31 on MIPS64 (valid for the innermost frame only); unused on x86-64
  // Go's g register at the sample (x86-64 r14; MIPS64 r30, the same register as `fp`): the
  // goroutine a Go stack crossing starts from (AddressSpace::CrossStack). 0: unknown. Only
  // the innermost frame's; callers never have it.
  uint64_t g = 0;
};

// A copy of the thread's stack taken at sample time: `data` holds memory [start, start+size).
// Not owned.
struct StackSnapshot {
  uint64_t start = 0;
  const uint8_t* data = nullptr;
  size_t size = 0;
  // The kernel's frame-pointer walk of the same stack at the same moment, when the sample has
  // one (x86-64 perf samples with PERF_SAMPLE_CALLCHAIN's user part): the pc, then return
  // addresses, innermost first. It reaches memory the copy does not hold (another stack that
  // the frame pointers lead to); stack crossings use it. Empty: none.
  const uint64_t* frame_chain = nullptr;
  size_t frame_chain_size = 0;

  bool Contains(uint64_t addr, size_t len) const {
    return addr >= start && len <= size && addr - start <= size - len;
  }
  // Reads a 64-bit word in the target's byte order. False when outside the copy.
  bool Read64(uint64_t addr, bool big_endian, uint64_t* out) const {
    if (!Contains(addr, 8)) return false;
    uint64_t v;
    std::memcpy(&v, data + (addr - start), 8);
    if (big_endian) v = __builtin_bswap64(v);  // hosts are little-endian (x86-64, mips64el)
    *out = v;
    return true;
  }
};

// How a frame whose row is RaRule::kStackSwitch switched stacks: how its caller is found on
// the other stack (Go's runtime/traceback.go and the runtime's assembly; see
// AddressSpace::CrossStack).
enum class StackSwitch : uint8_t {
  kNone,
  // runtime.systemstack on g0: the frame itself continues on the goroutine's stack
  // (m.curg.sched.sp and bp), stepped there with its row.
  kSystemStack,
  // runtime.morestack, runtime.mcall on g0: the caller is the goroutine's saved context
  // (m.curg.sched.pc, sp, bp), its pc a return address.
  kGoroutineContext,
  // runtime.asmcgocall on g0, under C code: the calling goroutine and its stack depth are
  // saved in the frame; the caller is the Go code that called it, on that goroutine's stack.
  kCgoCall,
  // runtime.cgocallback on the goroutine's stack, under a Go callback: the frame itself
  // continues on g0's stack (m.g0.sched.sp), stepped there with its row, into the C code that
  // called back.
  kCgoCallback,
};
std::string_view StackSwitchName(StackSwitch s);  // "systemstack", ...

// How to step from a frame to its caller, as compiled from CFI (x86-64) or from a decoded
// prologue (MIPS64). All offsets are relative to the CFA, the caller's stack pointer value --
// except in a signal-frame row (RaRule::kSignalFrame), see there.
struct UnwindRow {
  enum class CfaBase : uint8_t { kSp, kFp, kUndefined };
  enum class RaRule : uint8_t {
    kAtCfaOffset,  // return address stored at CFA + ra_offset
    kInRegister,   // still in the RA register (MIPS leaf / before the save); innermost frame only
    kUndefined,    // outermost frame: stop here
    // The frame is a signal trampoline (x86-64 __restore_rt): the kernel saved the whole
    // interrupted context on the stack, at offsets fixed by its sigframe layout and measured
    // from THIS frame's sp (cfa_base is kSp), not from a CFA:
    //   caller pc = [sp + ra_offset], caller sp = [sp + cfa_offset],
    //   caller fp = [sp + fp_offset] when fp_rule is kAtCfaOffset (else unchanged).
    // The caller was interrupted, not calling: its pc is exact (the unwinder looks its row up
    // without the return-address pc - 1 adjustment and skips call-site plausibility checks).
    kSignalFrame,
    // The frame switched stacks (Go's systemstack, mcall, morestack, asmcgocall,
    // cgocallback): its caller lies on another stack, which AddressSpace::CrossStack finds
    // (`stack_switch` says how). The offsets are the frame's own row (as for kAtCfaOffset, or
    // a MIPS64 frame without one), for crossings that step it again on the other stack. Where
    // the crossing fails the walk ends here, as at kUndefined.
    kStackSwitch,
  };
  enum class FpRule : uint8_t { kSame, kAtCfaOffset };

  CfaBase cfa_base = CfaBase::kUndefined;
  RaRule ra_rule = RaRule::kUndefined;
  FpRule fp_rule = FpRule::kSame;
  StackSwitch stack_switch = StackSwitch::kNone;  // with RaRule::kStackSwitch
  int32_t cfa_offset = 0;
  int32_t ra_offset = 0;
  int32_t fp_offset = 0;

  bool operator==(const UnwindRow&) const = default;
};

// One unwound frame. `ra_slot` is the stack address the return address that leads OUT of
// this frame was read from (0 when it came from a register or for the outermost frame): the
// (ra_slot, return address) pairs are what the incremental unwinder compares between samples.
struct Frame {
  // For frames other than the innermost: the return address -- except for the frame right
  // outside a signal frame, whose pc is the exact interrupted pc (see RaRule::kSignalFrame).
  uint64_t pc = 0;
  uint64_t sp = 0;       // the frame's stack pointer
  uint64_t ra_slot = 0;
};

enum class StopReason : uint8_t {
  kOutermost,        // reached a frame whose RA rule is undefined (_start, thread start)
  kMaxFrames,        // output buffer full
  kNoModule,         // pc (the sample's, or a return address) outside any known module
  kNoRule,           // module has no rule for pc
  kStackOutOfRange,  // needed bytes beyond the stack copy
  kBadReturnAddress, // sanity check failed (not after a call, sp not rising)
  kSpliced,          // incremental unwinder reused cached outer frames
};

std::string_view StopReasonName(StopReason reason);

}  // namespace strata::unwind

#endif  // STRATA_COMMON_UNWIND_UNWIND_TYPES_H_
