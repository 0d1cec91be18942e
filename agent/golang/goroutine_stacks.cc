#include "agent/golang/goroutine_stacks.h"

#include <algorithm>
#include <cstring>

namespace strata::agent::golang {
namespace {

// runtime/runtime2.go (type g, m, gobuf, gsignalStack, sigset on linux/amd64: [2]uint32) and
// runtime/asm_amd64.s (asmcgocall: MOVQ DI, 48(SP) // save g; MOVQ DI, 40(SP) // save depth).
constexpr RuntimeLayout kAmd64Layout;

// linux/mips64x: sigset is [2]uint64, so m.curg lies 8 bytes further. asm_mips64x.s:
// asmcgocall saves g at 0(R29) and the depth at 8(R29) before the call into C; cgocallback's
// g0 frame keeps the saved g0.sched.sp at 8(R29) (0(R29) is its saved link register).
constexpr RuntimeLayout kMips64Layout = [] {
  RuntimeLayout l;
  l.m_curg = 200;
  l.cgocall_g = 0;
  l.cgocall_depth = 8;
  l.cgocallback_saved_sp = 8;
  l.frame_pointers = false;
  return l;
}();

}  // namespace

const RuntimeLayout* RuntimeLayoutFor(unwind::Arch arch) {
  switch (arch) {
    case unwind::Arch::kX86_64:
      return &kAmd64Layout;
    case unwind::Arch::kMips64El:
    case unwind::Arch::kMips64Be:
      return &kMips64Layout;
  }
  return nullptr;
}

GoroutineStacks::GoroutineStacks(unwind::Arch arch, std::unique_ptr<python::RemoteMemory> memory,
                                 size_t stack_bytes)
    : arch_(arch),
      layout_(RuntimeLayoutFor(arch)),
      memory_(std::move(memory)),
      stack_bytes_(stack_bytes) {}

bool GoroutineStacks::ReadWord(uint64_t addr, uint64_t* out) const {
  if (memory_->ReadValue(addr, out)) return true;
  ++counts_.read_failed;
  return false;
}

bool GoroutineStacks::ReadG(uint64_t addr, G* g) const {
  const RuntimeLayout& l = *layout_;
  uint8_t bytes[256];
  if (addr == 0 || l.g_size > sizeof bytes) return false;
  if (!memory_->Read(addr, bytes, l.g_size)) {
    ++counts_.read_failed;
    return false;
  }
  g->addr = addr;
  g->stack_lo = python::FieldAt<uint64_t>(bytes, l.g_stack_lo);
  g->stack_hi = python::FieldAt<uint64_t>(bytes, l.g_stack_hi);
  g->m = python::FieldAt<uint64_t>(bytes, l.g_m);
  g->sched_sp = python::FieldAt<uint64_t>(bytes, l.g_sched_sp);
  g->sched_pc = python::FieldAt<uint64_t>(bytes, l.g_sched_pc);
  g->sched_lr = python::FieldAt<uint64_t>(bytes, l.g_sched_lr);
  g->sched_bp = python::FieldAt<uint64_t>(bytes, l.g_sched_bp);
  g->syscall_sp = python::FieldAt<uint64_t>(bytes, l.g_syscallsp);
  return true;
}

bool GoroutineStacks::CurgOf(uint64_t g0, G* curg) const {
  curg->addr = 0;
  G g;
  uint64_t m_g0 = 0, m_curg = 0;
  if (g0 == 0) {
    ++counts_.no_goroutine;
    return false;
  }
  if (!ReadG(g0, &g) || g.m == 0 || !ReadWord(g.m + layout_->m_g0, &m_g0)) return false;
  // The g register is g0 only while its thread runs on the system stack.
  if (m_g0 != g0) {
    ++counts_.no_goroutine;
    return false;
  }
  if (!ReadWord(g.m + layout_->m_curg, &m_curg)) return false;
  if (m_curg == 0) {  // no goroutine switched here (scheduler, GC workers' own code)
    ++counts_.no_goroutine;
    return false;
  }
  if (!ReadG(m_curg, curg)) return false;
  if (curg->m != g.m) {
    ++counts_.check_failed;
    curg->addr = 0;
    return false;
  }
  // Its saved state (sched) is the switch's only while it is on the system stack.
  if (curg->sched_sp < curg->stack_lo || curg->sched_sp >= curg->stack_hi) {
    ++counts_.check_failed;
    return false;
  }
  return true;
}

bool GoroutineStacks::ReadStack(uint64_t sp, uint64_t hi, unwind::StackSnapshot* out) const {
  const size_t size = static_cast<size_t>(std::min<uint64_t>(hi - sp, stack_bytes_));
  std::vector<uint8_t>& buffer = buffers_[next_buffer_];
  if (buffer.size() < stack_bytes_) buffer.resize(stack_bytes_);
  if (!memory_->Read(sp, buffer.data(), size)) {
    ++counts_.read_failed;
    return false;
  }
  next_buffer_ ^= 1;
  *out = {sp, buffer.data(), size};
  return true;
}

bool GoroutineStacks::Crossed() const {
  ++counts_.crossed;
  return true;
}

// How far below a saved rbp a frame's return address may lie: its frame size.
constexpr uint64_t kMaxFrame = 4096;

uint64_t GoroutineStacks::FindCallerSlot(const unwind::StackCrossing& at,
                                         const unwind::StackSnapshot& stack,
                                         uint64_t caller_ra) const {
  const uint64_t fp = at.regs.fp;
  const bool be = unwind::IsBigEndian(arch_);
  uint64_t word = 0;
  if (caller_ra != 0 && (!stack.Read64(fp + 8, be, &word) || word != caller_ra)) return 0;
  for (uint64_t slot = fp - 8; slot >= stack.start && slot + kMaxFrame >= fp; slot -= 8) {
    uint64_t ra = 0, module_pc = 0;
    const unwind::RuleSource* rules = nullptr;
    unwind::UnwindRow row;
    if (!stack.Read64(slot, be, &ra) || !at.space->Lookup(ra, &rules, &module_pc) ||
        rules == nullptr || !rules->FindRow(module_pc, /*innermost=*/false, &row) ||
        row.cfa_base != unwind::UnwindRow::CfaBase::kSp ||
        row.ra_rule != unwind::UnwindRow::RaRule::kAtCfaOffset ||
        row.fp_rule != unwind::UnwindRow::FpRule::kAtCfaOffset) {
      continue;
    }
    // The caller's sp is slot + 8 (the CALL pushed ra at slot); its row puts the saved rbp
    // at CFA + fp_offset.
    const uint64_t cfa = slot + 8 + static_cast<int64_t>(row.cfa_offset);
    if (cfa + static_cast<int64_t>(row.fp_offset) == fp &&
        rules->IsPlausibleReturnAddress(module_pc)) {
      return slot;
    }
  }
  return 0;
}

bool GoroutineStacks::FindByFramePointer(const unwind::StackCrossing& at, const G& curg,
                                         unwind::CrossedStack* to) const {
  const uint64_t fp = at.regs.fp;
  if (!layout_->frame_pointers || at.space == nullptr || fp < kMaxFrame || fp % 8 != 0) {
    return false;
  }
  // Only on the stack of the goroutine the m still runs (CurgOf found it, whatever its saved
  // state): a goroutine that parked may have had its stack freed and reused by another.
  if (curg.addr == 0 || fp < curg.stack_lo || fp + 16 > curg.stack_hi ||
      fp - kMaxFrame < curg.stack_lo) {
    return false;
  }
  // The goroutine's stack from the lowest slot searched up: as much as is mapped (a stack's
  // top may end a mapping).
  const uint64_t lo = fp - kMaxFrame;
  std::vector<uint8_t>& buffer = buffers_[next_buffer_];
  if (buffer.size() < std::max<size_t>(stack_bytes_, kMaxFrame + 16)) {
    buffer.resize(std::max<size_t>(stack_bytes_, kMaxFrame + 16));
  }
  // At least up to the caller's return address into its own caller (fp + 16).
  constexpr size_t kLeast = kMaxFrame + 16;
  size_t size = std::max(stack_bytes_, kLeast);
  while (!memory_->Read(lo, buffer.data(), size)) {
    if (size == kLeast) {
      ++counts_.read_failed;
      return false;
    }
    size = std::max(size / 2, kLeast);
  }
  const unwind::StackSnapshot stack{lo, buffer.data(), size};
  const uint64_t slot = FindCallerSlot(at, stack, /*caller_ra=*/0);
  if (slot == 0) {
    ++counts_.check_failed;
    return false;
  }
  next_buffer_ ^= 1;
  to->stack = stack;
  to->restep = true;  // systemstack's own frame at that sp: its return address is ra
  to->regs = {at.regs.pc, slot, fp, 0, 0};
  to->g = curg.addr;  // the goroutine whose stack holds the frames
  ++counts_.by_frame_pointer;
  return Crossed();
}

bool GoroutineStacks::CrossByFrameChain(const unwind::StackCrossing& at,
                                        unwind::CrossedStack* to) const {
  const unwind::StackSnapshot& left = *at.stack;
  const uint64_t fp = at.regs.fp;
  if (!layout_->frame_pointers || left.frame_chain_size == 0 || at.space == nullptr ||
      fp < kMaxFrame || fp % 8 != 0) {
    return false;
  }
  // The walk's last frame on this stack returned into systemstack (at.regs.pc): the chain's
  // entries after that return address were read at fp + 8, then at each caller's saved rbp
  // + 8, at the sample.
  const uint64_t* chain = left.frame_chain;
  const size_t n = left.frame_chain_size;
  size_t k = 0;
  while (k < n && chain[k] != at.regs.pc) ++k;
  if (k + 1 >= n) return false;
  const uint64_t* callers = chain + k + 1;
  const size_t num_callers = n - k - 1;

  // The buffer holds [fp - kMaxFrame, ...): systemstack's caller's frame below fp, then its
  // callers' frames.
  std::vector<uint8_t>& buffer = buffers_[next_buffer_];
  const size_t capacity = std::max<size_t>(stack_bytes_, 2 * kMaxFrame);
  if (buffer.size() < capacity) buffer.resize(capacity);
  const uint64_t lo = fp - kMaxFrame;
  constexpr size_t kBelow = kMaxFrame + 16;  // up to the caller's frame end, fp + 16
  // systemstack's caller, from memory as it is now: only if its frame is still there and
  // still returns where the chain says.
  uint64_t slot = 0;
  if (memory_->Read(lo, buffer.data(), kBelow)) {
    slot = FindCallerSlot(at, {lo, buffer.data(), kBelow}, callers[0]);
  }
  const uint64_t start = slot != 0 ? slot : fp + 16;
  auto put = [&](uint64_t addr, uint64_t value) {
    if (addr < start || addr - lo + 8 > buffer.size()) return false;
    std::memcpy(buffer.data() + (addr - lo), &value, 8);
    return true;
  };
  // The callers' frames laid out by their rows from fp + 16 up: each one's return address,
  // and the rbp it saved (its caller's frame pointer, just below that caller's return
  // address), where the walk reads them. (The first caller's return address, at fp + 8, is
  // in the memory read when systemstack's caller was found, else where the walk starts.)
  // The rbp systemstack's caller saved (at fp) is read only when that caller is there.
  uint64_t sp = fp + 16, saved_fp_slot = slot != 0 ? fp : 0, first_fp = 0;
  bool complete = false;
  for (size_t i = 0; i < num_callers; ++i) {
    uint64_t module_pc = 0;
    const unwind::RuleSource* rules = nullptr;
    unwind::UnwindRow row;
    if (!at.space->Lookup(callers[i], &rules, &module_pc) || rules == nullptr ||
        !rules->FindRow(module_pc, /*innermost=*/false, &row)) {
      break;
    }
    // A root (runtime.goexit), or another switch: the walk ends there as complete.
    if (row.ra_rule == unwind::UnwindRow::RaRule::kUndefined ||
        row.ra_rule == unwind::UnwindRow::RaRule::kStackSwitch) {
      complete = true;
      break;
    }
    if (i + 1 == num_callers || row.cfa_base != unwind::UnwindRow::CfaBase::kSp ||
        row.ra_rule != unwind::UnwindRow::RaRule::kAtCfaOffset) {
      break;
    }
    const uint64_t cfa = sp + static_cast<int64_t>(row.cfa_offset);
    if (cfa <= sp || cfa - lo > buffer.size()) break;
    // The frame's bytes other than those written below are not read: zeros.
    std::fill(buffer.begin() + (sp - lo), buffer.begin() + (cfa - lo), 0);
    if ((saved_fp_slot != 0 && !put(saved_fp_slot, cfa - 16)) ||
        !put(cfa + static_cast<int64_t>(row.ra_offset), callers[i + 1])) {
      break;
    }
    if (first_fp == 0) first_fp = cfa - 16;
    saved_fp_slot = row.fp_rule == unwind::UnwindRow::FpRule::kAtCfaOffset
                        ? cfa + static_cast<int64_t>(row.fp_offset)
                        : 0;
    sp = cfa;
  }
  // The copy ends at the last frame laid out: a root or a switch ends the walk as complete;
  // a chain cut short (its length bound, a frame without a row) leaves the last frame's return
  // address outside it, so the walk stops there as truncated.
  const uint64_t top = sp;
  if (top <= start || (!complete && first_fp == 0)) return false;
  next_buffer_ ^= 1;
  to->stack = {start, buffer.data() + (start - lo), static_cast<size_t>(top - start)};
  to->g = 0;
  ++counts_.by_frame_chain;
  if (slot != 0) {
    to->restep = true;  // systemstack's own frame at the slot: its return address is ra
    to->regs = {at.regs.pc, slot, fp, 0, 0};
  } else {
    ++counts_.frame_chain_without_caller;
    to->restep = false;
    to->regs = {callers[0], fp + 16, first_fp, 0, 0};
  }
  return Crossed();
}

bool GoroutineStacks::Cross(const unwind::StackCrossing& at, unwind::CrossedStack* to) const {
  if (layout_ == nullptr || at.arch != arch_) return false;
  const RuntimeLayout& l = *layout_;
  const bool be = unwind::IsBigEndian(arch_);
  switch (at.kind) {
    case unwind::StackSwitch::kSystemStack:
    case unwind::StackSwitch::kGoroutineContext: {
      const bool systemstack = at.kind == unwind::StackSwitch::kSystemStack;
      G curg;
      if (!CurgOf(at.g, &curg)) {
        return systemstack && (CrossByFrameChain(at, to) || FindByFramePointer(at, curg, to));
      }
      // The same switch as the sample's: the frame pointer it saved is the one the walk
      // carried to the switching frame (x86-64 keeps rbp across the switch). A goroutine that
      // switched again since shows another.
      if (l.frame_pointers && at.regs.fp != 0 && curg.sched_bp != at.regs.fp) {
        ++counts_.check_failed;
        return systemstack && (CrossByFrameChain(at, to) || FindByFramePointer(at, curg, to));
      }
      // morestack on a link-register architecture: the caller it saved has its return
      // address in gobuf.lr, a register the walk cannot carry past that frame.
      if (!systemstack && !l.frame_pointers && curg.sched_lr != 0) {
        ++counts_.check_failed;
        return false;
      }
      if (!ReadStack(curg.sched_sp, curg.stack_hi, &to->stack)) return false;
      // systemstack returns normally: its own frame goes on at the saved sp (runtime's
      // gosave_systemstack_switch). morestack and mcall never return: their caller is the
      // goroutine's saved context.
      to->restep = at.kind == unwind::StackSwitch::kSystemStack;
      to->regs = {to->restep ? at.regs.pc : curg.sched_pc, curg.sched_sp, curg.sched_bp, 0, 0};
      to->g = curg.addr;
      return Crossed();
    }
    case unwind::StackSwitch::kCgoCall: {
      uint64_t g = 0, depth = 0;
      if (!at.stack->Read64(at.regs.sp + l.cgocall_g, be, &g) ||
          !at.stack->Read64(at.regs.sp + l.cgocall_depth, be, &depth)) {
        ++counts_.read_failed;
        return false;
      }
      uint64_t entry_sp = 0;
      if (g == 0) {
        // Called on the system stack already: the slot holds the sp it came with, on this
        // same stack.
        entry_sp = depth;
        to->stack = *at.stack;
        to->g = at.g;
      } else {
        // The g and depth are the sample's (its copy of this frame). The depth is measured
        // from the stack's top because the stack may move while C runs (a callback can grow
        // it): the goroutine's current bounds place it. Its frames from there out stay as
        // they were while the C call lasts.
        G caller;
        if (!ReadG(g, &caller)) return false;
        entry_sp = caller.stack_hi - depth;
        if (depth < 8 || depth > caller.stack_hi - caller.stack_lo) {
          ++counts_.check_failed;
          return false;
        }
        // Still in that call: entersyscall (runtime.cgocall) saved the caller's sp right
        // above asmcgocall's entry sp, and exitsyscall clears it -- also while a callback
        // runs, when the walk came from that callback's validated crossing (its g0 is `at.g`,
        // and the goroutine is its m's).
        bool in_call = caller.syscall_sp > entry_sp && caller.syscall_sp - entry_sp <= 512;
        if (!in_call && caller.syscall_sp == 0 && at.g != 0 && caller.m != 0) {
          uint64_t m_g0 = 0, m_curg = 0;
          in_call = ReadWord(caller.m + l.m_g0, &m_g0) && ReadWord(caller.m + l.m_curg, &m_curg) &&
                    m_g0 == at.g && m_curg == g;
        }
        if (!in_call) {
          ++counts_.check_failed;
          return false;
        }
        if (!ReadStack(entry_sp, caller.stack_hi, &to->stack)) return false;
        to->g = g;
      }
      // At asmcgocall's entry sp: the return address into its Go caller (x86-64's CALL).
      uint64_t pc = 0;
      if (!to->stack.Read64(entry_sp, be, &pc)) {
        ++counts_.check_failed;
        return false;
      }
      to->restep = false;
      to->regs = {pc, entry_sp + 8, at.regs.fp, 0, 0};
      return Crossed();
    }
    case unwind::StackSwitch::kCgoCallback:
      // Without g0's state (the callback returned since the sample), the way Go's own
      // traceback goes: cgocallback keeps a frame valid on both stacks, whose return address
      // on the goroutine's leads to the Go code that called C -- without the C frames.
      return CrossCallback(at, to) || CallbackOnGoroutineStack(at, to);
    case unwind::StackSwitch::kNone:
      break;
  }
  return false;
}

bool GoroutineStacks::CallbackOnGoroutineStack(const unwind::StackCrossing& at,
                                               unwind::CrossedStack* to) const {
  // cgocallback's frame on the goroutine's stack: its return address slot holds the
  // goroutine's saved pc from its cgo call -- runtime.systemstack_switch's entry in Go 1.19
  // (asmcgocall's gosave_systemstack_switch), a frame of nothing whose caller's return address
  // (into runtime.cgocall) lies right above it; in later releases a return address into it.
  const unwind::RuleSource* rules = nullptr;
  uint64_t module_pc = 0, pushed = 0;
  unwind::UnwindRow row;
  const bool be = unwind::IsBigEndian(arch_);
  if (at.space == nullptr || !at.space->Lookup(at.regs.pc, &rules, &module_pc) ||
      rules == nullptr || !rules->FindRow(module_pc, /*innermost=*/false, &row) ||
      row.cfa_base != unwind::UnwindRow::CfaBase::kSp) {
    return false;
  }
  const uint64_t cfa = at.regs.sp + static_cast<int64_t>(row.cfa_offset);
  if (!at.stack->Read64(cfa + static_cast<int64_t>(row.ra_offset), be, &pushed)) return false;
  unwind::UnwindRow pushed_row;
  const unwind::RuleSource* pushed_rules = nullptr;
  uint64_t pushed_pc = 0;
  to->stack = *at.stack;
  to->restep = false;
  to->g = at.g;
  if (at.space->Lookup(pushed, &pushed_rules, &pushed_pc) && pushed_rules != nullptr &&
      pushed_rules->FindRow(pushed_pc, /*innermost=*/false, &pushed_row)) {
    to->regs = {pushed, cfa, at.regs.fp, 0, 0};
  } else {
    uint64_t ra = 0;
    if (!at.stack->Read64(cfa, be, &ra)) return false;
    to->regs = {ra, cfa + 8, at.regs.fp, 0, 0};
  }
  ++counts_.callbacks_without_c;
  return Crossed();
}

bool GoroutineStacks::CrossCallback(const unwind::StackCrossing& at,
                                    unwind::CrossedStack* to) const {
  const RuntimeLayout& l = *layout_;
  const bool be = unwind::IsBigEndian(arch_);
  // On the goroutine's stack: cgocallback's frame continues on g0's, at the sp it saved
  // in m.g0.sched.sp before switching (runtime/asm_amd64.s).
  G curg, g0;
  uint64_t m_curg = 0, m_g0 = 0;
  if (at.g == 0) {
    ++counts_.no_goroutine;
    return false;
  }
  if (!ReadG(at.g, &curg) || curg.m == 0 || !ReadWord(curg.m + l.m_curg, &m_curg) ||
      !ReadWord(curg.m + l.m_g0, &m_g0)) {
    return false;
  }
  if (m_curg != at.g) {
    ++counts_.no_goroutine;
    return false;
  }
  if (!ReadG(m_g0, &g0)) return false;
  if (g0.m != curg.m || g0.sched_sp < g0.stack_lo || g0.sched_sp >= g0.stack_hi) {
    ++counts_.check_failed;
    return false;
  }
  if (!ReadStack(g0.sched_sp, g0.stack_hi, &to->stack)) return false;
  // Inside a callback, the word at that sp is the g0.sched.sp cgocallback saved to restore
  // on return: at or above it on g0's stack. (Out of the callback by now, g0.sched.sp is
  // back at the thread's base, whose word is no such thing as a rule.)
  uint64_t saved = 0;
  if (!to->stack.Read64(g0.sched_sp + l.cgocallback_saved_sp, be, &saved) ||
      saved < g0.sched_sp ||
      saved >= g0.stack_hi) {
    ++counts_.check_failed;
    return false;
  }
  to->restep = true;
  to->regs = {at.regs.pc, g0.sched_sp, at.regs.fp, 0, 0};
  to->g = m_g0;
  return Crossed();
}

}  // namespace strata::agent::golang
