// The one unwinding loop, shared by unwind::Unwind() and IncrementalUnwinder. Internal to
// strata_unwind: included only by this folder's .cc files.
//
// Every step takes the same decisions in the same order, so the unwinders return the same
// frames and stop reasons:
//  1. the frame's row: its module's rule, else (x86-64) the frame-pointer convention -- for
//     JIT code always, elsewhere when allowed; none: kNoRule. JIT frames are counted by how
//     they are left (UnwindResult::jit_frames_cfi / jit_frames_fp) once step 2 succeeds;
//  2. the row applied (StepWithRow): an undefined return address or a zero one ends the walk
//     (kOutermost), a row no step can follow (kNoRule), a word outside the copy
//     (kStackOutOfRange);
//     A stack switch (RaRule::kStackSwitch) is crossed here: AddressSpace::CrossStack gives
//     the other stack and the frame to go on from, and the walk continues on that stack;
//     where it cannot be crossed the walk ends as at a root (kOutermost);
//  3. the caller's sanity checks: its sp rises (or stays, for a MIPS leaf whose return address
//     is still in its register; across a stack switch, anywhere), its pc lies in a module or
//     in JIT code (else kNoModule) and, unless it was interrupted by a signal, follows a call
//     there (else, or where sp falls, kBadReturnAddress; after a crossing, kOutermost: the
//     switch counts as not crossed);
//  4. room for the caller's frame (kMaxFrames).
//
// What differs between the unwinders is passed as `Hooks` (a class with these members, all
// inlined):
//   UnwindRow& Row(const WalkState& w);
//       where the current frame's row is written (the incremental unwinder keeps it);
//   void Found(const WalkState& w, const UnwindRow& row);
//       the current frame has a row (step 1 succeeded);
//   WalkAction AtCaller(WalkState& w, WalkOutput& out, const UnwindRow& row,
//                       const WalkStep& step, StopReason* stop);
//       between steps 2 and 3: the incremental unwinder splices in its cached outer frames here
//       (kStop with *stop set, or kResumed after moving `w` to the frame to go on from);
//   void Left(const WalkState& w, const UnwindRow& row, const WalkStep& step);
//       the current frame was left for step.caller, which is written next (step 4 passed).
#ifndef STRATA_COMMON_UNWIND_WALK_H_
#define STRATA_COMMON_UNWIND_WALK_H_

#include <cstddef>
#include <cstdint>

#include "common/unwind/unwinder.h"

namespace strata::unwind {

// x86-64 frame-pointer convention: CFA = rbp + 16, return address at CFA - 8, saved rbp at
// CFA - 16.
inline constexpr UnwindRow kFramePointerRow{UnwindRow::CfaBase::kFp,
                                            UnwindRow::RaRule::kAtCfaOffset,
                                            UnwindRow::FpRule::kAtCfaOffset,
                                            StackSwitch::kNone, 16, -8, -16};

// The code at `pc`: a module's (Lookup), else JIT code (LookupJit, asked only then, so
// address spaces without JIT code cost nothing more). False: neither.
inline bool LookupCode(const AddressSpace& space, uint64_t pc, const RuleSource** rules,
                       uint64_t* module_pc, bool* jit) {
  if (space.Lookup(pc, rules, module_pc)) {
    *jit = false;
    return true;
  }
  *jit = space.LookupJit(pc, rules, module_pc);
  return *jit;
}

// Where a walk stands: the frame being left, its module's rules and the stack it is on.
struct WalkState {
  const AddressSpace& space;
  StackSnapshot stack;  // the sample's copy, or the stack a switch crossed to
  uint64_t g = 0;       // the goroutine that stack belongs to (Registers::g), 0: unknown
  Registers regs = {};  // the frame being left
  const RuleSource* rules = nullptr;  // its module's rules (null: the module has none)
  uint64_t module_pc = 0;
  // Its pc is exact (the interrupted frame, or one a signal frame leads to), not a return
  // address.
  bool innermost = true;
  bool jit = false;  // the frame is JIT code (AddressSpace::LookupJit)

  // Moves the walk to the frame with registers `r`; false when its pc is in no module and
  // no JIT code.
  bool MoveTo(const Registers& r, bool exact) {
    regs = r;
    innermost = exact;
    return LookupCode(space, r.pc, &rules, &module_pc, &jit);
  }
};

// The frames written, as the AtCaller hook sees them. (The loop itself keeps the count in a
// local: frames[] stores could alias a count kept in memory.)
struct WalkOutput {
  Frame* frames;
  size_t limit;  // frames[] has room for this many
  size_t n;      // frames written
};

// One step out of the current frame (steps 1 and 2 passed).
struct WalkStep {
  Registers caller;
  uint64_t ra_slot = 0;  // where the return address was read (0: from a register)
  bool interrupted = false;  // out of a signal frame: the caller's pc is exact
  bool sp_rises = false;     // the first sanity check of step 3
  bool crossed = false;      // across a stack switch: the caller is on another stack
};

enum class WalkAction : uint8_t { kGoOn, kStop, kResumed };

// Where step 1 found the row.
enum class RowFrom : uint8_t { kNone, kRules, kFramePointer };

// Step 1.
inline RowFrom FindRow(const UnwindOptions& options, const WalkState& w, UnwindRow* row) {
  if (w.rules != nullptr && w.rules->FindRow(w.module_pc, w.innermost, row)) {
    return RowFrom::kRules;
  }
  // JIT code has no other way out; for a module it is a guess its owner may forbid.
  if (options.arch != Arch::kX86_64 || !(options.frame_pointer_fallback || w.jit)) {
    return RowFrom::kNone;
  }
  *row = kFramePointerRow;
  return RowFrom::kFramePointer;
}

// Counts a JIT frame that was stepped out of with a row from `from`.
inline void CountJitFrame(const WalkState& w, RowFrom from, UnwindResult* result) {
  if (!w.jit) return;
  if (from == RowFrom::kRules) ++result->jit_frames_cfi;
  else ++result->jit_frames_fp;
}

// Step 2 for a stack switch: moves `w` onto the other stack (its bytes and goroutine) and
// writes the caller found there. False: not crossed, the walk ends as at a root.
inline bool CrossStack(Arch arch, const UnwindRow& row, WalkState& w, WalkStep* step,
                       StopReason* stop) {
  *stop = StopReason::kOutermost;
  CrossedStack to;
  if (!w.space.CrossStack({arch, row.stack_switch, w.regs, &w.stack, w.g, &w.space}, &to)) {
    return false;
  }
  if (to.restep) {
    // The switching frame's own row, on the other stack (a MIPS64 frame without a frame of
    // its own has no slot to read its return address from there).
    if (arch != Arch::kX86_64 && row.cfa_offset == 0) return false;
    UnwindRow on = row;
    on.ra_rule = UnwindRow::RaRule::kAtCfaOffset;
    uint64_t slot = 0;
    if (!StepWithRow(arch, on, to.regs, /*innermost=*/false, to.stack, &step->caller, &slot)) {
      return false;
    }
  } else {
    step->caller = to.regs;
  }
  if (step->caller.pc == 0) return false;
  // No slot on the sample's stack: never a splice point of the incremental unwinder.
  step->ra_slot = 0;
  step->interrupted = false;
  step->sp_rises = true;  // stacks lie anywhere relative to each other
  step->crossed = true;
  w.stack = to.stack;
  w.g = to.g;
  return true;
}

// Step 2, and the part of step 3 that needs no lookup. False: the walk ends, for `*stop`.
inline bool StepOut(Arch arch, const UnwindRow& row, WalkState& w, WalkStep* step,
                    StopReason* stop) {
  if (row.ra_rule == UnwindRow::RaRule::kUndefined) {
    *stop = StopReason::kOutermost;
    return false;
  }
  if (row.ra_rule == UnwindRow::RaRule::kStackSwitch) return CrossStack(arch, row, w, step, stop);
  if (row.cfa_base == UnwindRow::CfaBase::kUndefined ||
      (row.ra_rule == UnwindRow::RaRule::kInRegister && !w.innermost)) {
    *stop = StopReason::kNoRule;  // described, but not representable as a row
    return false;
  }
  if (!StepWithRow(arch, row, w.regs, w.innermost, w.stack, &step->caller, &step->ra_slot)) {
    *stop = StopReason::kStackOutOfRange;
    return false;
  }
  if (step->caller.pc == 0) {  // thread entry points leave a zero return address
    *stop = StopReason::kOutermost;
    return false;
  }
  // Out of a signal frame the caller was interrupted, not calling: its pc is exact, so its
  // row is looked up like the innermost frame's and it need not follow a call.
  step->interrupted = row.ra_rule == UnwindRow::RaRule::kSignalFrame;
  // The stack grows down: a caller's frame lies strictly above its callee's, except a MIPS
  // leaf that has not touched sp yet (return address still in a register). The kernel places
  // a signal frame below the interrupted sp (and its red zone), so the rule holds across it.
  step->sp_rises = step->caller.sp > w.regs.sp ||
                   (step->caller.sp == w.regs.sp &&
                    row.ra_rule == UnwindRow::RaRule::kInRegister);
  return true;
}

// The rest of step 3: the caller's module (or JIT code), and that its pc follows a call.
// Where it fails, *stop: kNoModule for a caller in a rising frame whose pc lies in no known
// code (most often a library mapped since the owner read the mappings), else
// kBadReturnAddress.
inline bool CallerPlausible(const AddressSpace& space, const WalkStep& step,
                            const RuleSource** caller_rules, uint64_t* caller_module_pc,
                            bool* caller_jit, StopReason* stop) {
  if (step.sp_rises &&
      !LookupCode(space, step.caller.pc, caller_rules, caller_module_pc, caller_jit)) {
    *stop = StopReason::kNoModule;
    return false;
  }
  if (step.sp_rises && (step.interrupted || *caller_rules == nullptr ||
                        (*caller_rules)->IsPlausibleReturnAddress(*caller_module_pc))) {
    return true;
  }
  *stop = StopReason::kBadReturnAddress;
  return false;
}

// Unwinds from `regs` into frames[0, limit), innermost first (see Unwind() in unwinder.h).
template <typename Hooks>
inline UnwindResult Walk(const UnwindOptions& options, const Registers& regs,
                         const StackSnapshot& stack, const AddressSpace& space, Frame* frames,
                         size_t limit, Hooks& hooks) {
  UnwindResult result;
  if (limit == 0) {
    result.stop = StopReason::kMaxFrames;
    return result;
  }
  WalkState w{.space = space, .stack = stack, .g = regs.g};
  size_t n = 0;
  frames[n++] = {regs.pc, regs.sp, 0};
  if (!w.MoveTo(regs, /*exact=*/true)) {
    result.num_frames = n;
    result.stop = StopReason::kNoModule;
    return result;
  }
  for (;;) {
    UnwindRow& row = hooks.Row(w);
    const RowFrom from = FindRow(options, w, &row);
    if (from == RowFrom::kNone) {
      result.stop = StopReason::kNoRule;
      break;
    }
    hooks.Found(w, row);
    WalkStep step;
    if (!StepOut(options.arch, row, w, &step, &result.stop)) {
      result.crossings_failed += row.ra_rule == UnwindRow::RaRule::kStackSwitch;
      break;
    }
    CountJitFrame(w, from, &result);
    WalkOutput out{frames, limit, n};
    const WalkAction action = hooks.AtCaller(w, out, row, step, &result.stop);
    n = out.n;
    if (action == WalkAction::kStop) break;
    if (action == WalkAction::kResumed) continue;
    const RuleSource* caller_rules = nullptr;
    uint64_t caller_module_pc = 0;
    bool caller_jit = false;
    if (!CallerPlausible(space, step, &caller_rules, &caller_module_pc, &caller_jit,
                         &result.stop)) {
      if (step.crossed) result.stop = StopReason::kOutermost;
      result.crossings_failed += step.crossed;
      break;
    }
    result.stack_crossings += step.crossed;
    if (n >= limit) {
      result.stop = StopReason::kMaxFrames;
      break;
    }
    frames[n - 1].ra_slot = step.ra_slot;
    hooks.Left(w, row, step);
    frames[n++] = {step.caller.pc, step.caller.sp, 0};
    w.regs = step.caller;
    w.rules = caller_rules;
    w.module_pc = caller_module_pc;
    w.innermost = step.interrupted;
    w.jit = caller_jit;
  }
  result.num_frames = n;
  return result;
}

}  // namespace strata::unwind

#endif  // STRATA_COMMON_UNWIND_WALK_H_
