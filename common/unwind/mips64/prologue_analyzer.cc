#include "common/unwind/mips64/prologue_analyzer.h"

#include <algorithm>
#include <optional>

namespace strata::unwind::mips64 {
namespace {

using namespace insn;  // NOLINT: local instruction vocabulary

enum class Ra : uint8_t {
  kInRegister,  // the caller's return address is still in $ra
  kSaved,       // stored at CFA + ra_off
  kLost,        // $ra overwritten (call) without a save: no way out of this frame
  kZeroed,      // `move ra,zero`: thread/process entry, the outermost frame
};

// Frame state before an instruction. Offsets are relative to the CFA (the caller's sp).
struct State {
  bool reached = false;
  bool sp_known = true;
  bool fp_known = false;     // s8 == CFA + fp_off
  bool fp_modified = false;  // s8 no longer holds the caller's value
  bool fp_saved = false;     // the caller's s8 is at CFA + fp_save_off
  Ra ra = Ra::kInRegister;
  // With ra kInRegister after `ld ra` from its save slot: the slot (CFA + ra_off) still holds
  // the return address until the frame is released, so a call that overwrites ra (a loop
  // whose exit branch has the `ld ra` in its delay slot) leaves it kSaved, not lost.
  bool ra_slot_copy = false;
  int32_t sp_off = 0;
  int32_t fp_off = 0;
  int32_t ra_off = 0;
  int32_t fp_save_off = 0;

  bool SameFrame(const State& o) const {
    return sp_known == o.sp_known && (!sp_known || sp_off == o.sp_off) &&
           fp_known == o.fp_known && (!fp_known || fp_off == o.fp_off) && ra == o.ra &&
           (ra != Ra::kSaved || ra_off == o.ra_off) &&
           (ra != Ra::kInRegister || (ra_slot_copy == o.ra_slot_copy &&
                                      (!ra_slot_copy || ra_off == o.ra_off))) &&
           fp_saved == o.fp_saved &&
           (!fp_saved || fp_save_off == o.fp_save_off) && fp_modified == o.fp_modified;
  }
};

// The general-purpose register an instruction writes, or -1.
int DestRegister(uint32_t w) {
  const uint32_t op = Op(w);
  switch (op) {
    case 0: {  // SPECIAL
      const uint32_t f = Funct(w);
      if (f == 0x08 || f == 0x0C || f == 0x0D || f == 0x0F || f == 0x11 || f == 0x13 ||
          (f >= 0x18 && f <= 0x1F) || (f >= 0x30 && f <= 0x36)) {
        return -1;
      }
      return Rd(w);
    }
    case 1: {  // REGIMM: only the linking branches write ra
      const int rt = Rt(w);
      return (rt >= 0x10 && rt <= 0x13) ? kRa : -1;
    }
    case 3:
    case 0x1D:
      return kRa;  // jal, jalx
    case 0x10:     // COP0 mfc0/dmfc0
    case 0x11:     // COP1 mfc1/dmfc1/cfc1/mfhc1
      return Rs(w) <= 3 ? Rt(w) : -1;
    case 0x1C: {  // SPECIAL2
      const uint32_t f = Funct(w);
      return (f == 2 || f == 0x20 || f == 0x21 || f == 0x24 || f == 0x25) ? Rd(w) : -1;
    }
    case 0x1F: {  // SPECIAL3
      const uint32_t f = Funct(w);
      if (f <= 7 || f == 0x3B) return Rt(w);
      if (f == 0x20 || f == 0x24) return Rd(w);
      return -1;
    }
    default:
      break;
  }
  if ((op >= 0x08 && op <= 0x0F) || op == 0x18 || op == 0x19 || op == 0x1A || op == 0x1B ||
      (op >= 0x20 && op <= 0x27) || op == 0x30 || op == 0x34 || op == 0x37 || op == 0x38 ||
      op == 0x3C) {
    return Rt(w);
  }
  return -1;
}

// The constant in `reg` just before words[i], when a short `li` sequence (lui/ori/daddiu from
// zero) in the preceding few instructions sets it: the large-frame `li v1,N; dsubu sp,sp,v1`.
std::optional<int64_t> ConstBefore(std::span<const uint32_t> words, size_t i, int reg,
                                   int depth = 0) {
  if (reg == kZero) return 0;
  if (depth > 4) return std::nullopt;
  const size_t lo = i > 12 ? i - 12 : 0;
  for (size_t j = i; j-- > lo;) {
    const uint32_t w = words[j];
    if (DestRegister(w) != reg) continue;
    const uint32_t op = Op(w);
    const int rs = Rs(w);
    if (op == 0x0F) return static_cast<int64_t>(static_cast<int32_t>((w & 0xFFFF) << 16));
    if (op == 0x0D) {  // ori
      auto base = ConstBefore(words, j, rs, depth + 1);
      if (!base) return std::nullopt;
      return *base | static_cast<int64_t>(w & 0xFFFF);
    }
    if (op == 0x19 || op == 0x09) {  // daddiu / addiu
      auto base = ConstBefore(words, j, rs, depth + 1);
      if (!base) return std::nullopt;
      int64_t v = *base + Imm(w);
      if (op == 0x09) v = static_cast<int32_t>(v);
      return v;
    }
    if (op == 0 && (Funct(w) == 0x2D || Funct(w) == 0x25 || Funct(w) == 0x21) &&
        Rt(w) == kZero) {  // move reg,rs
      return ConstBefore(words, j, rs, depth + 1);
    }
    return std::nullopt;
  }
  return std::nullopt;
}

bool IsMoveFunct(uint32_t f) { return f == 0x2D || f == 0x25 || f == 0x21; }  // daddu/or/addu

// Applies one instruction's effect on the frame state.
State ApplyInsn(State s, std::span<const uint32_t> words, size_t i);

// The state after instruction i. The slot copy of ra dies with the frame.
State Apply(State s, std::span<const uint32_t> words, size_t i) {
  State out = ApplyInsn(s, words, i);
  if (out.ra != Ra::kInRegister ||
      (out.ra_slot_copy && (!out.sp_known || out.sp_off > out.ra_off))) {
    out.ra_slot_copy = false;
  }
  return out;
}

// Frame offsets stay within +-1 GiB (far beyond any real frame), so that adding a 16-bit
// immediate to one never overflows; a result beyond that (garbage code, or a constant
// subtracted over and over) leaves the offset unknown instead.
constexpr int64_t kMaxFrameOffset = int64_t{1} << 30;
bool SetOffset(int32_t* off, int64_t value) {
  if (value < -kMaxFrameOffset || value > kMaxFrameOffset) return false;
  *off = static_cast<int32_t>(value);
  return true;
}

State ApplyInsn(State s, std::span<const uint32_t> words, size_t i) {
  const uint32_t w = words[i];
  const uint32_t op = Op(w);
  const int rs = Rs(w), rt = Rt(w);

  // sp = sp + imm (frame allocation / release).
  if (IsSpAdjust(w)) {
    if (s.sp_known && !SetOffset(&s.sp_off, int64_t{s.sp_off} + Imm(w))) s.sp_known = false;
    if (s.sp_off > 0) s.sp_known = false;
    return s;
  }
  if ((op == 0x19 || op == 0x09) && rt == kSp && rs == kS8) {  // daddiu sp,s8,imm
    s.sp_known = SetOffset(&s.sp_off, int64_t{s.fp_off} + Imm(w)) && s.fp_known;
    return s;
  }
  if ((op == 0x19 || op == 0x09) && rt == kS8 && rs == kSp) {  // daddiu s8,sp,imm
    s.fp_known = SetOffset(&s.fp_off, int64_t{s.sp_off} + Imm(w)) && s.sp_known;
    s.fp_modified = true;
    return s;
  }
  if (op == 0) {
    const uint32_t f = Funct(w);
    const int rd = Rd(w);
    if (rd == kSp) {
      const bool add = f == 0x2D || f == 0x21;  // daddu / addu
      const bool sub = f == 0x2F || f == 0x23;  // dsubu / subu
      const int other = rs == kSp ? rt : (rt == kSp && add ? rs : -1);
      if (IsMoveFunct(f) && ((rs == kS8 && rt == kZero) || (rt == kS8 && rs == kZero))) {
        s.sp_known = s.fp_known;  // move sp,s8
        s.sp_off = s.fp_off;
        return s;
      }
      if ((add || sub) && other >= 0) {
        auto c = ConstBefore(words, i, other);
        if (s.sp_known && c) {
          if (!SetOffset(&s.sp_off, int64_t{s.sp_off} + (sub ? -*c : *c))) s.sp_known = false;
          if (s.sp_off > 0) s.sp_known = false;
        } else {
          s.sp_known = false;  // alloca
        }
        return s;
      }
      if (f == 0x25 && rs == kSp && rt == kZero) return s;  // move sp,sp
      s.sp_known = false;
      return s;
    }
    if (rd == kS8 && IsMoveFunct(f) &&
        ((rs == kSp && rt == kZero) || (rt == kSp && rs == kZero))) {  // move s8,sp
      s.fp_known = s.sp_known;
      s.fp_off = s.sp_off;
      s.fp_modified = true;
      return s;
    }
    if (rd == kRa && IsMoveFunct(f) && rs == kZero && rt == kZero) {  // move ra,zero
      s.ra = Ra::kZeroed;
      return s;
    }
  }
  // Stores of ra / s8 relative to sp or s8.
  if ((op == 0x3F || op == 0x2B) && (rs == kSp || rs == kS8) && (rt == kRa || rt == kS8)) {
    const bool base_known = rs == kSp ? s.sp_known : s.fp_known;
    const int32_t base = rs == kSp ? s.sp_off : s.fp_off;
    if (base_known) {
      const int32_t slot = base + Imm(w);
      if (rt == kRa && s.ra == Ra::kInRegister) {
        s.ra = Ra::kSaved;
        s.ra_off = slot;
        s.ra_slot_copy = false;
      } else if (rt == kS8 && !s.fp_modified && !s.fp_saved) {
        s.fp_saved = true;
        s.fp_save_off = slot;
      }
    }
    return s;
  }
  // Loads back into ra / s8 (epilogue).
  if ((op == 0x37 || op == 0x23) && (rs == kSp || rs == kS8) && (rt == kRa || rt == kS8)) {
    if (rt == kRa) {
      const bool base_known = rs == kSp ? s.sp_known : s.fp_known;
      const int32_t slot = (rs == kSp ? s.sp_off : s.fp_off) + Imm(w);
      if (s.ra == Ra::kSaved) {
        s.ra_slot_copy = base_known && slot == s.ra_off;
        s.ra = Ra::kInRegister;
      } else {
        s.ra = Ra::kLost;
      }
    } else if (s.fp_saved) {
      s.fp_saved = false;
      s.fp_known = false;
      s.fp_modified = false;
    } else {
      s.fp_known = false;
      s.fp_modified = true;
    }
    return s;
  }
  const int dest = DestRegister(w);
  if (dest == kSp) s.sp_known = false;
  if (dest == kS8) {
    s.fp_known = false;
    s.fp_modified = true;
  }
  if (dest == kRa && s.ra == Ra::kInRegister) s.ra = s.ra_slot_copy ? Ra::kSaved : Ra::kLost;
  return s;
}

enum class Flow : uint8_t {
  kNone,         // not a control transfer
  kConditional,  // both the target and the fall-through follow the delay slot
  kLikely,       // branch-likely: the delay slot runs only when taken
  kAlways,       // unconditional branch/jump inside the function
  kCall,         // returns to after the delay slot
  kExit,         // jr ra, tail call, jump table or jump out of the function
};

struct Transfer {
  Flow flow = Flow::kNone;
  bool has_target = false;
  int64_t target = 0;  // instruction index
};

Transfer Classify(uint32_t w, size_t i, size_t n, uint64_t start_vaddr) {
  const uint32_t op = Op(w);
  const int rs = Rs(w), rt = Rt(w);
  Transfer t;
  const int64_t rel = static_cast<int64_t>(i) + 1 + Imm(w);
  auto internal = [&](int64_t idx) { return idx >= 0 && idx < static_cast<int64_t>(n); };
  switch (op) {
    case 0:
      if (Funct(w) == 0x08) t.flow = Flow::kExit;  // jr (ra, t9 tail call, jump table)
      if (Funct(w) == 0x09) t.flow = Flow::kCall;  // jalr
      return t;
    case 1:
      if (rt == 0x10 || rt == 0x11 || rt == 0x12 || rt == 0x13) {
        t.flow = Flow::kCall;
        return t;
      }
      if (rt == 0 || rt == 1 || rt == 2 || rt == 3) {
        const bool always = rt == 1 && rs == 0;  // bgez zero = b
        t.flow = always ? Flow::kAlways : (rt >= 2 ? Flow::kLikely : Flow::kConditional);
        t.has_target = true;
        t.target = rel;
        if (!internal(rel) && always) t.flow = Flow::kExit;
      }
      return t;
    case 2: {  // j
      const uint64_t pc = start_vaddr + 4 * i;
      const uint64_t dest = ((pc + 4) & ~uint64_t{0x0FFFFFFF}) | ((w & 0x03FFFFFF) << 2);
      // Unsigned: the addresses may lie anywhere in the 64-bit space (their signed
      // difference overflowed across 2^63).
      const uint64_t offset = dest - start_vaddr;
      if (dest >= start_vaddr && offset / 4 < n && (dest & 3) == 0) {
        t.flow = Flow::kAlways;
        t.has_target = true;
        t.target = static_cast<int64_t>(offset / 4);
      } else {
        t.flow = Flow::kExit;  // tail call
      }
      return t;
    }
    case 3:
    case 0x1D:
      t.flow = Flow::kCall;
      return t;
    case 4:
    case 5:
    case 6:
    case 7:
    case 0x14:
    case 0x15:
    case 0x16:
    case 0x17: {
      const bool always = op == 4 && rs == 0 && rt == 0;  // beq zero,zero = b
      t.flow = always ? Flow::kAlways : (op >= 0x14 ? Flow::kLikely : Flow::kConditional);
      t.has_target = true;
      t.target = rel;
      if (!internal(rel) && always) t.flow = Flow::kExit;
      return t;
    }
    case 0x11:  // COP1 bc1f/bc1t(l)
      if (rs == 8) {
        t.flow = (rt & 2) ? Flow::kLikely : Flow::kConditional;
        t.has_target = true;
        t.target = rel;
      }
      return t;
    default:
      return t;
  }
}

UnwindRow ToRow(const State& s, bool* valid) {
  UnwindRow row;
  *valid = true;
  if (s.ra == Ra::kZeroed) {
    // `move ra,zero`: the outermost frame. Valid whatever sp is (entry code realigns it).
    row.cfa_base = UnwindRow::CfaBase::kSp;
    row.ra_rule = UnwindRow::RaRule::kUndefined;
    return row;
  }
  if (s.sp_known && s.sp_off <= 0) {
    row.cfa_base = UnwindRow::CfaBase::kSp;
    row.cfa_offset = -s.sp_off;
  } else if (s.fp_known && s.fp_off <= 0) {
    row.cfa_base = UnwindRow::CfaBase::kFp;
    row.cfa_offset = -s.fp_off;
  } else {
    *valid = false;
  }
  switch (s.ra) {
    case Ra::kInRegister:
      row.ra_rule = UnwindRow::RaRule::kInRegister;
      break;
    case Ra::kSaved:
      row.ra_rule = UnwindRow::RaRule::kAtCfaOffset;
      row.ra_offset = s.ra_off;
      break;
    case Ra::kZeroed:
      row.ra_rule = UnwindRow::RaRule::kUndefined;
      break;
    case Ra::kLost:
      *valid = false;
      break;
  }
  if (s.fp_saved) {
    row.fp_rule = UnwindRow::FpRule::kAtCfaOffset;
    row.fp_offset = s.fp_save_off;
  }
  if (!*valid) row = UnwindRow{};
  return row;
}

// Joins a newly arriving state into `slot`. Returns true when `slot` changed and its
// successors must be revisited. Knowledge only decreases (sp/fp known -> unknown), so the
// propagation terminates; other disagreements keep the first state and are counted.
bool Join(State* slot, const State& in, uint32_t* conflicts) {
  if (!slot->reached) {
    *slot = in;
    slot->reached = true;
    return true;
  }
  if (slot->SameFrame(in)) return false;
  bool changed = false;
  if (slot->sp_known && (!in.sp_known || in.sp_off != slot->sp_off)) {
    slot->sp_known = false;
    changed = true;
  }
  if (slot->fp_known && (!in.fp_known || in.fp_off != slot->fp_off)) {
    slot->fp_known = false;
    changed = true;
  }
  // ra back in the register after `ld ra` (slot still intact) on one path, saved in that same
  // slot on the other (a loop around a call): the slot is right on both.
  if (slot->ra == Ra::kInRegister && slot->ra_slot_copy) {
    if (in.ra == Ra::kSaved && in.ra_off == slot->ra_off) {
      slot->ra = Ra::kSaved;
      slot->ra_slot_copy = false;
      changed = true;
    } else if (in.ra == Ra::kInRegister && !in.ra_slot_copy) {
      slot->ra_slot_copy = false;
      changed = true;
    }
  }
  if (!changed) ++*conflicts;
  return changed;
}

}  // namespace

bool SameRow(const RowRange& a, const RowRange& b) {
  if (a.valid != b.valid) return false;
  if (!a.valid) return true;
  const UnwindRow &x = a.row, &y = b.row;
  return x.cfa_base == y.cfa_base && x.cfa_offset == y.cfa_offset && x.ra_rule == y.ra_rule &&
         (x.ra_rule != UnwindRow::RaRule::kAtCfaOffset || x.ra_offset == y.ra_offset) &&
         x.fp_rule == y.fp_rule &&
         (x.fp_rule != UnwindRow::FpRule::kAtCfaOffset || x.fp_offset == y.fp_offset);
}

std::vector<RowRange> AnalyzeFunctionAt(std::span<const uint32_t> words, uint64_t start_vaddr,
                                        bool leaf_stub, AnalysisStats* stats) {
  std::vector<RowRange> out;
  const size_t n = words.size();
  AnalysisStats local;
  local.instructions = static_cast<uint32_t>(n);
  if (n == 0 || leaf_stub) {
    RowRange r;
    r.valid = true;
    r.row.cfa_base = UnwindRow::CfaBase::kSp;
    r.row.ra_rule = UnwindRow::RaRule::kInRegister;
    out.push_back(r);
    if (stats) *stats = local;
    return out;
  }

  std::vector<State> in(n);
  std::vector<uint8_t> is_delay_slot(n, 0);
  for (size_t i = 0; i + 1 < n; ++i) {
    if (!is_delay_slot[i] && Classify(words[i], i, n, start_vaddr).flow != Flow::kNone) {
      is_delay_slot[i + 1] = 1;
    }
  }

  std::vector<size_t> work;
  bool filling = false;  // the fallback never overrides states derived from the entry
  auto push = [&](int64_t idx, const State& s) {
    if (idx < 0 || idx >= static_cast<int64_t>(n)) return;
    if (filling && in[idx].reached) return;
    if (Join(&in[idx], s, &local.conflicts)) work.push_back(static_cast<size_t>(idx));
  };
  auto run = [&]() {
    while (!work.empty()) {
      const size_t i = work.back();
      work.pop_back();
      const State s = in[i];
      const Transfer t = is_delay_slot[i] ? Transfer{} : Classify(words[i], i, n, start_vaddr);
      if (t.flow == Flow::kNone) {
        if (!is_delay_slot[i]) push(static_cast<int64_t>(i) + 1, Apply(s, words, i));
        continue;
      }
      // A transfer and its delay slot, handled as one unit.
      const State after_branch = Apply(s, words, i);
      if (i + 1 >= n) continue;
      // The delay slot's successors are decided here, not by its own fall-through.
      if (!filling || !in[i + 1].reached) Join(&in[i + 1], after_branch, &local.conflicts);
      const State after_delay = Apply(in[i + 1], words, i + 1);
      const int64_t next = static_cast<int64_t>(i) + 2;
      switch (t.flow) {
        case Flow::kConditional:
          if (t.has_target) push(t.target, after_delay);
          push(next, after_delay);
          break;
        case Flow::kLikely:
          if (t.has_target) push(t.target, after_delay);
          push(next, after_branch);
          break;
        case Flow::kAlways:
          if (t.has_target) push(t.target, after_delay);
          break;
        case Flow::kCall:
          push(next, after_delay);
          break;
        case Flow::kExit:
        case Flow::kNone:
          break;
      }
    }
  };

  State entry;
  push(0, entry);
  run();

  // Code no path from the entry reaches (jump-table targets, code after `jr`): continue
  // linearly from the previous instruction, or from the function's body state after a
  // return/tail call/unconditional jump.
  State body = entry;
  body.reached = true;
  for (size_t i = 0; i < n; ++i) {
    const State& s = in[i];
    if (s.reached && s.sp_known && s.sp_off < 0 && s.ra == Ra::kSaved) {
      body = s;
      break;
    }
  }
  filling = true;
  for (size_t i = 1; i < n; ++i) {
    if (in[i].reached) continue;
    ++local.unreached;
    State seed;
    const size_t prev = i - 1;
    bool after_exit = false;
    if (is_delay_slot[prev] && prev > 0) {
      const Flow f = Classify(words[prev - 1], prev - 1, n, start_vaddr).flow;
      after_exit = f == Flow::kExit || f == Flow::kAlways;
    }
    if (after_exit) {
      seed = body;
    } else {
      seed = Apply(in[prev], words, prev);
    }
    push(static_cast<int64_t>(i), seed);
    run();
  }

  for (size_t i = 0; i < n; ++i) {
    RowRange r;
    r.offset = static_cast<uint32_t>(4 * i);
    r.row = ToRow(in[i], &r.valid);
    if (out.empty() || !SameRow(out.back(), r)) out.push_back(r);
  }
  if (stats) *stats = local;
  return out;
}

std::vector<RowRange> AnalyzeFunction(std::span<const uint32_t> words, bool leaf_stub,
                                      AnalysisStats* stats) {
  return AnalyzeFunctionAt(words, 0, leaf_stub, stats);
}

}  // namespace strata::unwind::mips64
