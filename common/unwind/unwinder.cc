#include "common/unwind/unwinder.h"

#include <algorithm>

namespace strata::unwind {

std::string_view ArchName(Arch arch) {
  switch (arch) {
    case Arch::kX86_64: return "x86_64";
    case Arch::kMips64El: return "mips64el";
    case Arch::kMips64Be: return "mips64";
  }
  return "unknown";
}

std::string_view StopReasonName(StopReason reason) {
  switch (reason) {
    case StopReason::kOutermost: return "outermost";
    case StopReason::kMaxFrames: return "max_frames";
    case StopReason::kNoModule: return "no_module";
    case StopReason::kNoRule: return "no_rule";
    case StopReason::kStackOutOfRange: return "stack_out_of_range";
    case StopReason::kBadReturnAddress: return "bad_return_address";
    case StopReason::kSpliced: return "spliced";
  }
  return "unknown";
}

bool StepWithRow(Arch arch, const UnwindRow& row, const Registers& regs, bool innermost,
                 const StackSnapshot& stack, Registers* caller, uint64_t* ra_slot) {
  const bool be = IsBigEndian(arch);
  if (row.ra_rule == UnwindRow::RaRule::kSignalFrame) {
    // The interrupted context as the kernel saved it: three words read from the copy (a
    // context outside it, e.g. on a sigaltstack-switched stack, is kStackOutOfRange).
    if (row.cfa_base != UnwindRow::CfaBase::kSp) return false;
    Registers next;
    const uint64_t pc_slot = regs.sp + static_cast<int64_t>(row.ra_offset);
    if (!stack.Read64(pc_slot, be, &next.pc) ||
        !stack.Read64(regs.sp + static_cast<int64_t>(row.cfa_offset), be, &next.sp)) {
      return false;
    }
    next.fp = regs.fp;
    if (row.fp_rule == UnwindRow::FpRule::kAtCfaOffset &&
        !stack.Read64(regs.sp + static_cast<int64_t>(row.fp_offset), be, &next.fp)) {
      return false;
    }
    // The interrupted frame's RA register is in the context too, but no architecture that
    // emits these rows needs it (x86-64 has none).
    next.ra = 0;
    *ra_slot = pc_slot;
    *caller = next;
    return true;
  }
  uint64_t cfa = (row.cfa_base == UnwindRow::CfaBase::kFp ? regs.fp : regs.sp) +
                 static_cast<int64_t>(row.cfa_offset);
  Registers next;
  next.sp = cfa;
  *ra_slot = 0;
  if (row.ra_rule == UnwindRow::RaRule::kAtCfaOffset) {
    uint64_t slot = cfa + static_cast<int64_t>(row.ra_offset);
    if (!stack.Read64(slot, be, &next.pc)) return false;
    *ra_slot = slot;
  } else {
    next.pc = regs.ra;
  }
  next.fp = regs.fp;
  if (row.fp_rule == UnwindRow::FpRule::kAtCfaOffset &&
      !stack.Read64(cfa + static_cast<int64_t>(row.fp_offset), be, &next.fp)) {
    return false;
  }
  next.ra = 0;  // only the innermost frame's RA register is known
  *caller = next;
  return true;
}

UnwindResult Unwind(const UnwindOptions& options, const Registers& regs,
                    const StackSnapshot& stack, const AddressSpace& space, Frame* frames,
                    size_t capacity) {
  const size_t limit = std::min(capacity, options.max_frames);
  UnwindResult result;
  if (limit == 0) {
    result.stop = StopReason::kMaxFrames;
    return result;
  }
  // Frame-pointer convention: CFA = rbp + 16, return address at CFA - 8, saved rbp at CFA - 16.
  const UnwindRow kFramePointerRow{UnwindRow::CfaBase::kFp, UnwindRow::RaRule::kAtCfaOffset,
                                   UnwindRow::FpRule::kAtCfaOffset, 16, -8, -16};
  Registers cur = regs;
  bool innermost = true;
  size_t n = 0;
  frames[n++] = {regs.pc, regs.sp, 0};
  const RuleSource* rules = nullptr;
  uint64_t module_pc = 0;
  if (!space.Lookup(cur.pc, &rules, &module_pc)) {
    result.num_frames = n;
    result.stop = StopReason::kNoModule;
    return result;
  }
  for (;;) {
    UnwindRow row;
    bool have_row = rules != nullptr && rules->FindRow(module_pc, innermost, &row);
    if (!have_row) {
      if (!options.frame_pointer_fallback || options.arch != Arch::kX86_64) {
        result.stop = StopReason::kNoRule;
        break;
      }
      row = kFramePointerRow;
    }
    if (row.ra_rule == UnwindRow::RaRule::kUndefined) {
      result.stop = StopReason::kOutermost;
      break;
    }
    if (row.cfa_base == UnwindRow::CfaBase::kUndefined ||
        (row.ra_rule == UnwindRow::RaRule::kInRegister && !innermost)) {
      result.stop = StopReason::kNoRule;  // described, but not representable as a row
      break;
    }
    Registers caller;
    uint64_t ra_slot = 0;
    if (!StepWithRow(options.arch, row, cur, innermost, stack, &caller, &ra_slot)) {
      result.stop = StopReason::kStackOutOfRange;
      break;
    }
    if (caller.pc == 0) {  // thread entry points leave a zero return address
      result.stop = StopReason::kOutermost;
      break;
    }
    // Out of a signal frame the caller was interrupted, not calling: its pc is exact, so
    // its row is looked up like the innermost frame's and it need not follow a call.
    const bool interrupted = row.ra_rule == UnwindRow::RaRule::kSignalFrame;
    // The stack grows down: a caller's frame lies strictly above its callee's, except a
    // MIPS leaf that has not touched sp yet (return address still in a register). The
    // kernel places a signal frame below the interrupted sp (and its red zone), so the rule
    // holds across it too.
    bool sp_ok = caller.sp > cur.sp ||
                 (caller.sp == cur.sp && row.ra_rule == UnwindRow::RaRule::kInRegister);
    const RuleSource* caller_rules = nullptr;
    uint64_t caller_module_pc = 0;
    if (!sp_ok || !space.Lookup(caller.pc, &caller_rules, &caller_module_pc) ||
        (!interrupted && caller_rules != nullptr &&
         !caller_rules->IsPlausibleReturnAddress(caller_module_pc))) {
      result.stop = StopReason::kBadReturnAddress;
      break;
    }
    if (n >= limit) {
      result.stop = StopReason::kMaxFrames;
      break;
    }
    frames[n - 1].ra_slot = ra_slot;
    frames[n++] = {caller.pc, caller.sp, 0};
    cur = caller;
    rules = caller_rules;
    module_pc = caller_module_pc;
    innermost = interrupted;
  }
  result.num_frames = n;
  return result;
}

}  // namespace strata::unwind
