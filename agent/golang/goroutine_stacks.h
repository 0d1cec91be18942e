// agent/golang (strata::agent::golang): the Go runtime's state read from a target's memory.
//
// GoroutineStacks crosses the stack switches Go's unwind rules mark (unwind::StackSwitch,
// common/unwind/go/go_rules.h) the way Go's own profiler does (runtime/traceback.go and the
// cgo paths of runtime/proc.go): from g0 to the goroutine that switched there
// (g.m.curg.sched), from C code back to the goroutine that called it (the g and stack depth
// runtime.asmcgocall saves in its frame), and from a Go callback to the C code that called
// back (m.g0.sched.sp). The runtime's structures are read with process_vm_readv after the
// sample (the agent drains its rings every few hundred milliseconds), so every read is
// checked before it is used: g0 is its m's g0, the goroutine's m is that m and it is the m's
// current goroutine, its saved stack pointer lies inside its stack bounds and its saved frame
// pointer is the one the walk carried to the switch (the same switch, not a later one). A
// failed check refuses the crossing (the stack ends there as complete, as it did before
// crossings) and is counted. A goroutine that left the system stack (or parked) between the
// sample and the read has no saved state left: systemstack is then crossed with the frame
// pointer the sample holds, with the return addresses the kernel's frame-pointer walk found
// at the sample when the sample has that walk (StackSnapshot::frame_chain: CrossByFrameChain),
// else from the goroutine's stack as it is in memory (FindByFramePointer) -- its frames from
// the switch outwards, as long as the goroutine has not overwritten them. A cgo call's
// crossing needs less: its g and stack depth are in the sample's own copy.
//
// Layouts: the fields of runtime.g, runtime.m and runtime.gobuf used here sit at the same
// offsets in every Go release from 1.16 on (g.stack, g.m and g.sched lead runtime.g; m.curg
// follows the fixed-size head of runtime.m, whose signal mask is 8 bytes on x86-64 and 16 on
// MIPS64), checked against runtime/runtime2.go of Go 1.19 and of the current release; the
// frames of asmcgocall and cgocallback are runtime/asm_amd64.s's and asm_mips64x.s's. MIPS64
// keeps no frame pointer: a systemstack switch is taken as the sample's while the goroutine is
// still its m's current one on the system stack (a goroutine that left it since and entered
// another systemstack call shows the later call's caller), and one that left is not crossed.
// morestack's caller on MIPS64 has its return address in a register (gobuf.lr), which the
// walk cannot carry past one frame: that switch stays a root there.
//
// Owned by the target's address space (agent/symbols: ProcessAddressSpace::SetStackCrosser);
// its buffers hold the other stacks' bytes until the next crossing. Not thread-safe.
#ifndef STRATA_AGENT_GOLANG_GOROUTINE_STACKS_H_
#define STRATA_AGENT_GOLANG_GOROUTINE_STACKS_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "agent/python/remote_memory.h"
#include "agent/symbols/process_address_space.h"
#include "common/unwind/unwinder.h"

namespace strata::agent::golang {

// Offsets of the Go runtime's fields a crossing reads (bytes).
struct RuntimeLayout {
  uint32_t g_stack_lo = 0;  // g.stack.lo
  uint32_t g_stack_hi = 8;  // g.stack.hi
  uint32_t g_m = 48;        // g.m
  uint32_t g_sched_sp = 56;  // g.sched.sp (gobuf.sp)
  uint32_t g_sched_pc = 64;  // g.sched.pc
  uint32_t g_sched_lr = 96;  // g.sched.lr (link-register architectures)
  uint32_t g_sched_bp = 104;  // g.sched.bp
  uint32_t g_syscallsp = 112;  // g.syscallsp
  uint32_t g_size = 120;     // the bytes read of a g: up to the end of g.syscallsp
  uint32_t m_g0 = 0;         // m.g0
  uint32_t m_curg = 192;     // m.curg
  // asmcgocall's frame on g0, from its sp at the call into C: the calling g (0: it was
  // already on g0, and this slot holds the sp it came with) and its stack depth
  // (g.stack.hi - sp at entry, where the return address into the Go caller lies).
  uint32_t cgocall_g = 48;
  uint32_t cgocall_depth = 40;
  // cgocallback's frame on g0, from its sp: the g0.sched.sp it restores on return.
  uint32_t cgocallback_saved_sp = 0;
  // Go code keeps a frame pointer (x86-64): a systemstack switch is checked against it.
  bool frame_pointers = true;
};

// The layout of `arch`'s Go runtime; null when none is known.
const RuntimeLayout* RuntimeLayoutFor(unwind::Arch arch);

struct CrossingCounts {
  uint64_t crossed = 0;
  uint64_t no_goroutine = 0;     // no g known (register 0), or it is not where it should be
  uint64_t check_failed = 0;     // a read value failed its check (moved on since the sample)
  uint64_t read_failed = 0;      // the memory could not be read
  // Of `crossed`, systemstack switches whose goroutine had left the switch by the time of
  // the read, found from the frame pointer the sample holds (FindByFramePointer).
  uint64_t by_frame_pointer = 0;
  // Of `crossed`, callbacks whose g0 state was gone: continued on the goroutine's stack, as
  // Go's traceback does, without the C frames between.
  uint64_t callbacks_without_c = 0;
  // Of `crossed`, systemstack switches whose goroutine had moved on, crossed with the
  // sample's frame chain (CrossByFrameChain); of those, the ones whose switching function
  // (systemstack's caller, which the chain never holds) was not found in memory any more:
  // its caller's frame follows systemstack's callee directly, as in Go's own frame-pointer
  // tracebacks.
  uint64_t by_frame_chain = 0;
  uint64_t frame_chain_without_caller = 0;
};

class GoroutineStacks final : public symbols::StackCrosser {
 public:
  // Reads through `memory` (owned); `stack_bytes`: the most read of another stack.
  GoroutineStacks(unwind::Arch arch, std::unique_ptr<python::RemoteMemory> memory,
                  size_t stack_bytes = kDefaultStackBytes);

  bool Cross(const unwind::StackCrossing& at, unwind::CrossedStack* to) const override;

  const CrossingCounts& counts() const { return counts_; }
  static constexpr size_t kDefaultStackBytes = 32 << 10;

 private:
  struct G {
    uint64_t addr, stack_lo, stack_hi, m, sched_sp, sched_pc, sched_lr, sched_bp, syscall_sp;
  };
  bool ReadG(uint64_t addr, G* g) const;
  bool ReadWord(uint64_t addr, uint64_t* out) const;
  // The goroutine on g0 `g0` switched from: checks g0 is its m's g0 and curg's m is that m
  // (else curg->addr is 0), and that its saved sp lies on its stack.
  bool CurgOf(uint64_t g0, G* curg) const;
  // Reads [sp, min(hi, sp + stack_bytes_)) into the next buffer.
  bool ReadStack(uint64_t sp, uint64_t hi, unwind::StackSnapshot* out) const;
  bool Crossed() const;  // counts a crossing; true
  // systemstack's caller found from the frame pointer the switch kept (x86-64: rbp is
  // carried onto g0, so the walk has it at the switching frame): the caller's frame saved the
  // caller's caller's rbp at `fp`, so its return address into the caller lies at the slot s
  // below fp where the caller's own row puts the saved rbp at fp (s + its SP delta == fp).
  // Self-checking: a word that is a return address into a Go function whose frame ends there.
  // cgocallback onto g0 and the C code that called back; and the way Go's traceback goes
  // when g0's state is gone.
  bool CrossCallback(const unwind::StackCrossing& at, unwind::CrossedStack* to) const;
  bool CallbackOnGoroutineStack(const unwind::StackCrossing& at, unwind::CrossedStack* to) const;
  // Only on `curg`'s stack (the goroutine the m runs at the read; addr 0: none).
  bool FindByFramePointer(const unwind::StackCrossing& at, const G& curg,
                          unwind::CrossedStack* to) const;
  // The slot of systemstack's return address into its caller below `fp` in `stack` (the
  // caller's frame saved its caller's rbp at fp), or 0. With `caller_ra` non-zero, only if the
  // word at fp + 8 is that return address (the caller still returns where it did).
  uint64_t FindCallerSlot(const unwind::StackCrossing& at, const unwind::StackSnapshot& stack,
                          uint64_t caller_ra) const;
  // systemstack crossed with the sample's frame chain: the callers' return addresses as they
  // were, laid out in a stack of their own by their rows (the bytes the walk reads), below
  // them systemstack's caller when memory still holds it.
  bool CrossByFrameChain(const unwind::StackCrossing& at, unwind::CrossedStack* to) const;

  unwind::Arch arch_;
  const RuntimeLayout* layout_;  // null: no crossing
  std::unique_ptr<python::RemoteMemory> memory_;
  size_t stack_bytes_;
  // Two: the walk reads the stack it crossed to while a crossing fills the other.
  mutable std::vector<uint8_t> buffers_[2];
  mutable int next_buffer_ = 0;
  mutable CrossingCounts counts_;
};

}  // namespace strata::agent::golang

#endif  // STRATA_AGENT_GOLANG_GOROUTINE_STACKS_H_
