// common/unwind (strata::unwind): stack unwinding from a register snapshot and a copy of the
// stack bytes, for the agent (perf samples), the in-process runtime (its signal handler) and
// the tests and benchmarks (recorded stacks). The architecture is data, so every
// architecture's stacks unwind on any host.
//
// Who owns what:
//  - unwinder.h (this header): the unwinding loop and the two interfaces it needs (below);
//    walk.h is that loop's steps and checks, shared with the incremental unwinder (internal).
//  - incremental.h: the per-thread unwinder that reuses the previous sample's outer frames
//    (VerifyMode full, boundary, or off: a plain unwind every sample). One per thread, owned
//    by whoever tracks threads (the agent).
//  - rule_source.h: the one factory that builds a module's RuleSource for its architecture.
//    The decoders are one folder each, built the same way (library strata_unwind_<arch>, its
//    tests beside it, entry point <arch>::BuildRuleSource): x86_64/ (compiled DWARF CFI) and
//    mips64/ (decoded prologues). Languages whose binaries carry their own unwind tables are
//    rules of another kind behind the same interface: go/ (Go's .gopclntab).
//  - host_arch.h: the architecture this binary runs on (kHostArch and the per-architecture
//    constants of sampling one's own host); the only place that tests architecture macros.
//  - unwind_types.h: the plain-data vocabulary (Arch, Registers, StackSnapshot, UnwindRow,
//    Frame, StopReason).
//
// The interfaces of the loop:
//  - RuleSource: per module, "how do I leave the frame executing at module-relative pc?".
//    A RuleSource is built once per module (keyed by build ID, by the caller of
//    MakeRuleSource) and is immutable afterwards, so it can be shared by every process
//    mapping that module and read from a signal handler.
//  - AddressSpace: per process, absolute pc -> (module's RuleSource, module-relative pc),
//    plus whether an address is executable (sanity checks), and which pcs outside every
//    module are JIT-compiled code (stepped out of by frame pointers when nothing describes
//    them). Owned by whoever tracks the process's mappings (the agent, or the in-process
//    sampler).
//
// Unwind() writes frames into a caller-provided buffer and never allocates, so it is
// async-signal-safe as long as the RuleSource/AddressSpace lookups are.
#ifndef STRATA_COMMON_UNWIND_UNWINDER_H_
#define STRATA_COMMON_UNWIND_UNWINDER_H_

#include <cstddef>
#include <cstdint>

#include "common/unwind/unwind_types.h"

namespace strata::unwind {

class RuleSource {
 public:
  virtual ~RuleSource() = default;
  // Fills `row` for module-relative `pc`. `innermost` is true for the interrupted frame and
  // for the frame a signal frame leads to (their pc is exact; for other caller frames pc is a
  // return address and the lookup uses pc - 1, which the implementation handles). False when
  // the module has no rule for pc.
  virtual bool FindRow(uint64_t pc, bool innermost, UnwindRow* row) const = 0;
  // Optional per-architecture check that `return_address` (module-relative) follows a call
  // instruction (MIPS: jal/jalr + delay slot 8 bytes before). Default: accept.
  virtual bool IsPlausibleReturnAddress(uint64_t return_address) const { return true; }
};

class AddressSpace;

// A walk at a frame whose row is RaRule::kStackSwitch (AddressSpace::CrossStack).
struct StackCrossing {
  Arch arch = Arch::kX86_64;
  StackSwitch kind = StackSwitch::kNone;
  Registers regs;                        // the switching frame, on the stack being left
  const StackSnapshot* stack = nullptr;  // the bytes of the stack being left
  uint64_t g = 0;  // the goroutine that stack belongs to, as far as known (0: unknown)
  const AddressSpace* space = nullptr;  // the walk's, to check code addresses read
};

// Where a crossing leads.
struct CrossedStack {
  // The frame to go on from on the other stack: the switching frame itself, to be stepped
  // with its row (`restep`), or its caller (pc a return address).
  Registers regs;
  bool restep = false;
  // The other stack's bytes, valid until the next CrossStack() of the same address space.
  StackSnapshot stack;
  uint64_t g = 0;  // the goroutine the other stack belongs to (g0 for the system stack)
};

class AddressSpace {
 public:
  virtual ~AddressSpace() = default;
  // Maps absolute `pc` to the module containing it: its rule source (may be null when the
  // module has no unwind info) and the module-relative pc. False when pc is in no module.
  virtual bool Lookup(uint64_t pc, const RuleSource** rules, uint64_t* module_pc) const = 0;
  // Asked only for a pc Lookup() places in no module: true when it lies in JIT-compiled code
  // (anonymous executable memory), with the rules describing that code when some source has
  // them (else null) and pc's offset for them. The walk steps out of a JIT frame without
  // rules by the frame-pointer convention (x86-64; other architectures stop with kNoRule).
  // Default: the process has no JIT code.
  virtual bool LookupJit(uint64_t pc, const RuleSource** rules, uint64_t* module_pc) const {
    return false;
  }
  // Asked at a frame whose row is RaRule::kStackSwitch: the other stack and where the walk
  // goes on there, read from the process's memory (the runtime's structures, checked). False:
  // the switch cannot be crossed and the walk ends there (kOutermost), as if the frame were a
  // stack root. Default: no crossing.
  virtual bool CrossStack(const StackCrossing& at, CrossedStack* to) const { return false; }
};

struct UnwindOptions {
  Arch arch = Arch::kX86_64;
  size_t max_frames = 256;
  // Fall back to a frame-pointer walk when a module has no rule (x86-64 only). JIT code
  // without rules is always stepped out of by frame pointers (x86-64).
  bool frame_pointer_fallback = true;
};

struct UnwindResult {
  size_t num_frames = 0;
  StopReason stop = StopReason::kOutermost;
  // JIT frames (AddressSpace::LookupJit) this walk stepped out of, by how: with their rules,
  // or by frame pointers.
  uint32_t jit_frames_cfi = 0;
  uint32_t jit_frames_fp = 0;
  // Stack switches (RaRule::kStackSwitch) crossed, and the one that could not be (the walk
  // ended there).
  uint32_t stack_crossings = 0;
  uint32_t crossings_failed = 0;
};

// Unwinds from `regs` over `stack`, writing at most min(capacity, options.max_frames) frames,
// innermost first. frames[0].pc == regs.pc.
UnwindResult Unwind(const UnwindOptions& options, const Registers& regs,
                    const StackSnapshot& stack, const AddressSpace& space, Frame* frames,
                    size_t capacity);

// One step: computes the caller's registers from `row`. Exposed for the incremental
// unwinder and for tests. `ra_slot` receives the address the return address was read from
// (0 if from a register; for a signal-frame row, the saved pc's slot in the signal context).
// False when a needed word is outside `stack`.
bool StepWithRow(Arch arch, const UnwindRow& row, const Registers& regs, bool innermost,
                 const StackSnapshot& stack, Registers* caller, uint64_t* ra_slot);

}  // namespace strata::unwind

#endif  // STRATA_COMMON_UNWIND_UNWINDER_H_
