#include "common/unwind/unwinder.h"

#include <algorithm>

#include "common/unwind/walk.h"

namespace strata::unwind {

std::string_view ArchName(Arch arch) {
  switch (arch) {
    case Arch::kX86_64: return "x86_64";
    case Arch::kMips64El: return "mips64el";
    case Arch::kMips64Be: return "mips64";
  }
  return "unknown";
}

std::string_view StackSwitchName(StackSwitch s) {
  switch (s) {
    case StackSwitch::kNone: return "none";
    case StackSwitch::kSystemStack: return "systemstack";
    case StackSwitch::kGoroutineContext: return "goroutine_context";
    case StackSwitch::kCgoCall: return "cgo_call";
    case StackSwitch::kCgoCallback: return "cgo_callback";
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
  if (row.fp_rule == UnwindRow::FpRule::kAtCfaOffset) {
    // A save slot below sp has been popped: compilers leave the save rules in force across
    // an epilogue's pops (GCC up to the `ret`), so the frame pointer already holds the
    // caller's value. Reading the slot would need bytes below the copy and end the walk.
    const uint64_t fp_slot = cfa + static_cast<int64_t>(row.fp_offset);
    if (fp_slot >= regs.sp && !stack.Read64(fp_slot, be, &next.fp)) return false;
  }
  next.ra = 0;  // only the innermost frame's RA register is known
  *caller = next;
  return true;
}

namespace {

// unwind::Unwind() keeps nothing between steps.
struct NoHooks {
  UnwindRow row;
  UnwindRow& Row(const WalkState&) {
    row = UnwindRow{};
    return row;
  }
  void Found(const WalkState&, const UnwindRow&) {}
  WalkAction AtCaller(WalkState&, WalkOutput&, const UnwindRow&, const WalkStep&, StopReason*) {
    return WalkAction::kGoOn;
  }
  void Left(const WalkState&, const UnwindRow&, const WalkStep&) {}
};

}  // namespace

UnwindResult Unwind(const UnwindOptions& options, const Registers& regs,
                    const StackSnapshot& stack, const AddressSpace& space, Frame* frames,
                    size_t capacity) {
  NoHooks hooks;
  return Walk(options, regs, stack, space, frames, std::min(capacity, options.max_frames),
              hooks);
}

}  // namespace strata::unwind
