#include "common/unwind/x86_64/cfi_table.h"

#include <algorithm>
#include <limits>
#include <tuple>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/elf/cfi_records.h"

namespace strata::unwind::x86_64 {
namespace {

constexpr uint64_t kRegRbp = 6;
constexpr uint64_t kRegRsp = 7;
constexpr uint64_t kRegRip = 16;  // the return-address column
constexpr size_t kNumRegs = 17;
constexpr size_t kMaxStateStack = 32;

// A pc range the table describes but a row cannot represent: the unwinder stops (kNoRule).
constexpr UnwindRow kUnrepresentable{UnwindRow::CfaBase::kUndefined,
                                     UnwindRow::RaRule::kAtCfaOffset,
                                     UnwindRow::FpRule::kSame, StackSwitch::kNone, 0, 0, 0};

auto RowKey(const UnwindRow& r) {
  return std::make_tuple(r.cfa_base, r.ra_rule, r.fp_rule, r.cfa_offset, r.ra_offset, r.fp_offset);
}

struct RegRule {
  // kExpression: DW_CFA_expression (saved at the address the expression computes); only
  // signal frames' rules are read back, every other use is as unrepresentable as kOther.
  enum Kind : uint8_t { kSame, kUndefined, kOffset, kExpression, kOther };
  RegRule() = default;
  RegRule(Kind k, int64_t off, std::string_view expr = {}) : kind(k), offset(off), expression(expr) {}
  Kind kind = kSame;
  int64_t offset = 0;
  std::string_view expression;
};

struct CfaRule {
  uint64_t reg = kRegRsp;
  int64_t offset = 0;
  std::string_view expression;  // non-empty: DW_CFA_def_cfa_expression
};

struct CfiState {
  CfaRule cfa;
  RegRule regs[kNumRegs];
};

// What a CIE's initial instructions leave, computed once per CIE: they run before each of its
// FDEs' programs, and a CIE of megabytes shared by many FDEs (a hostile file) would otherwise
// be run again for each. Keyed by where the instructions are in the image.
struct CieStart {
  bool ok = false;
  CfiState state;
  std::vector<CfiState> stack;
};
using CieStarts = absl::flat_hash_map<const char*, CieStart>;

// Recognizes the CFA expression binutils emits for lazy-binding PLT stubs:
//   DW_OP_breg7 N; DW_OP_breg16 0; DW_OP_lit<M>; DW_OP_and; DW_OP_lit<K>; DW_OP_ge;
//   DW_OP_lit3; DW_OP_shl; DW_OP_plus
// i.e. CFA = rsp + N + ((rip & M) >= K ? 8 : 0): each M+1-byte stub pushes one word at K.
struct PltExpression {
  int64_t sp_offset;
  uint64_t period;
  uint64_t threshold;
};

// Two rows per PLT entry: a real .plt is a few thousand entries of 16 bytes (the largest on
// a Debian 12 system, librocksdb's, is 90 KB). A damaged FDE claiming a PLT expression over
// gigabytes, or many FDEs (or advances of one) each claiming a megabyte, would otherwise
// compile into billions of rows: a range is compiled per stub when it is at most kMaxPltBytes
// and the module's PLT ranges so far stay within kMaxPltBytesPerModule, and the period is at
// least kMinPltPeriod (two rows per 8 bytes at most); other ranges are unrepresentable.
constexpr uint64_t kMaxPltBytes = uint64_t{1} << 20;
constexpr uint64_t kMaxPltBytesPerModule = uint64_t{256} << 10;
constexpr uint64_t kMinPltPeriod = 8;

std::optional<PltExpression> MatchPltExpression(std::string_view expr) {
  elf::ByteReader r(expr, false);
  if (r.U8() != 0x77) return std::nullopt;  // DW_OP_breg7
  int64_t n = r.Sleb128();
  if (r.U8() != 0x80 || r.Sleb128() != 0) return std::nullopt;  // DW_OP_breg16 0
  uint8_t mask_op = r.U8();
  if (mask_op < 0x30 || mask_op > 0x4f || r.U8() != 0x1a) return std::nullopt;  // lit, and
  uint8_t k_op = r.U8();
  if (k_op < 0x30 || k_op > 0x4f || r.U8() != 0x2a) return std::nullopt;  // lit, ge
  if (r.U8() != 0x33 || r.U8() != 0x24 || r.U8() != 0x22) return std::nullopt;  // lit3 shl plus
  if (!r.ok() || r.remaining() != 0) return std::nullopt;
  uint64_t mask = mask_op - 0x30;
  uint64_t k = k_op - 0x30;
  if (((mask + 1) & mask) != 0 || k > mask) return std::nullopt;  // period must be 2^n
  if (mask + 1 < kMinPltPeriod) return std::nullopt;
  return PltExpression{n, mask + 1, k};
}

// Offsets of the interrupted rip, rsp and rbp from rsp inside x86-64 __restore_rt. The handler
// was entered as if called with rsp at the kernel's struct rt_sigframe {char* pretcode;
// struct ucontext uc; struct siginfo info;}; its `ret` popped pretcode, so in the trampoline
// rsp points at uc itself (not uc + 8), and uc.uc_mcontext.gregs[] (struct sigcontext: r8..r15,
// rdi, rsi, rbp, rbx, rdx, rax, rcx, rsp, rip) starts 40 bytes in, after uc_flags, uc_link
// and the 24-byte stack_t. Hence gregs[REG_RBP = 10] at 120, [REG_RSP = 15] at 160,
// [REG_RIP = 16] at 168 -- the same numbers glibc's sigaction.c writes into its CFI (oRBP,
// oRSP, oRIP). Used when a signal FDE's expressions are not glibc's but its code is the
// kernel's rt_sigreturn trampoline (the layout is the kernel ABI, not a libc choice).
constexpr int32_t kSigFrameRbp = 120;
constexpr int32_t kSigFrameRsp = 160;
constexpr int32_t kSigFrameRip = 168;
// mov $__NR_rt_sigreturn (15), %rax; syscall
constexpr uint8_t kRtSigreturnCode[] = {0x48, 0xc7, 0xc0, 0x0f, 0x00, 0x00, 0x00, 0x0f, 0x05};

// DW_OP_breg7 (rsp) N [; DW_OP_deref]: the only expression forms signal-frame CFI uses for
// "at rsp + N" (registers) and "[rsp + N]" (the CFA).
std::optional<int32_t> MatchRspExpression(std::string_view expr, bool deref) {
  elf::ByteReader r(expr, false);
  if (r.U8() != 0x77) return std::nullopt;  // DW_OP_breg7
  int64_t n = r.Sleb128();
  if (deref && r.U8() != 0x06) return std::nullopt;  // DW_OP_deref
  if (!r.ok() || r.remaining() != 0) return std::nullopt;
  if (n < std::numeric_limits<int32_t>::min() || n > std::numeric_limits<int32_t>::max()) {
    return std::nullopt;
  }
  return static_cast<int32_t>(n);
}

class FdeCompiler {
 public:
  // `plt_bytes_left`: what the module's PLT ranges may still cover; `cie_starts`: the CIEs
  // run so far. Both shared by the module's FDEs.
  FdeCompiler(const elf::ElfFile& elf, const elf::Cie& cie, const elf::Fde& fde,
              CfiStats* stats, uint64_t* plt_bytes_left, CieStarts* cie_starts,
              std::vector<CfiTable::Span>* out)
      : elf_(elf), cie_(cie), fde_(fde), stats_(stats), plt_bytes_left_(plt_bytes_left),
        cie_starts_(cie_starts), out_(out) {}

  // False when the instructions are malformed; spans emitted so far are then discarded.
  bool Compile() {
    size_t first = out_->size();
    if (cie_.signal_frame) ++stats_->signal_frames;
    loc_ = fde_.pc_start;
    auto [start, inserted] = cie_starts_->try_emplace(cie_.initial_instructions.data());
    if (inserted) {
      // No advances in a CIE: what it leaves does not depend on the FDE.
      ++stats_->cie_programs_run;
      start->second.ok = Run(cie_.initial_instructions, /*in_cie=*/true);
      start->second.state = state_;
      start->second.stack = stack_;
    } else {
      state_ = start->second.state;
      stack_ = start->second.stack;
    }
    if (!start->second.ok) return Fail(first);
    initial_ = state_;
    if (!Run(fde_.instructions, /*in_cie=*/false)) return Fail(first);
    Emit(fde_.pc_end);
    return true;
  }

 private:
  bool Fail(size_t first) {
    out_->resize(first);
    ++stats_->bad_instructions;
    return false;
  }

  void Emit(uint64_t end) {
    if (end <= loc_) return;
    const CfaRule& cfa = state_.cfa;
    if (cie_.signal_frame) {
      out_->push_back({loc_, end, SignalRow()});
    } else if (!cfa.expression.empty()) {
      std::optional<PltExpression> plt = MatchPltExpression(cfa.expression);
      if (plt && end - loc_ <= kMaxPltBytes && end - loc_ <= *plt_bytes_left_) {
        *plt_bytes_left_ -= end - loc_;
        EmitPlt(*plt, end);
      } else {
        ++stats_->unsupported_cfa_expressions;
        out_->push_back({loc_, end, kUnrepresentable});
      }
    } else {
      out_->push_back({loc_, end, ToRow(cfa.reg, cfa.offset)});
    }
    loc_ = end;
  }

  void EmitPlt(const PltExpression& plt, uint64_t end) {
    ++stats_->plt_expressions;
    UnwindRow before = ToRow(kRegRsp, plt.sp_offset);
    UnwindRow after = ToRow(kRegRsp, plt.sp_offset + 8);
    for (uint64_t pc = loc_; pc < end;) {
      uint64_t block = pc & ~(plt.period - 1);
      uint64_t split = block + plt.threshold;
      uint64_t next = std::min(end, block + plt.period);
      if (pc < split) {
        out_->push_back({pc, std::min(split, next), before});
        pc = std::min(split, next);
      }
      if (pc < next) {
        out_->push_back({pc, next, after});
        pc = next;
      }
    }
  }

  // A signal FDE ('S' augmentation) describes the kernel-saved context of the interrupted
  // frame. glibc's (sysdeps/unix/sysv/linux/x86_64/sigaction.c) says CFA = [rsp + oRSP],
  // rip at rsp + oRIP, rbp at rsp + oRBP, all DW_OP_breg7 forms: taken as they are. Any
  // other form is trusted only over the kernel's trampoline code, with the kernel's layout.
  UnwindRow SignalRow() {
    UnwindRow row;
    row.cfa_base = UnwindRow::CfaBase::kSp;
    row.ra_rule = UnwindRow::RaRule::kSignalFrame;
    const RegRule& rip = state_.regs[kRegRip];
    const RegRule& rbp = state_.regs[kRegRbp];
    std::optional<int32_t> sp_at, pc_at, fp_at;
    if (!state_.cfa.expression.empty()) sp_at = MatchRspExpression(state_.cfa.expression, true);
    if (rip.kind == RegRule::kExpression) pc_at = MatchRspExpression(rip.expression, false);
    if (rbp.kind == RegRule::kExpression) fp_at = MatchRspExpression(rbp.expression, false);
    if (sp_at && pc_at && (fp_at || rbp.kind == RegRule::kSame)) {
      row.cfa_offset = *sp_at;
      row.ra_offset = *pc_at;
      if (fp_at) {
        row.fp_rule = UnwindRow::FpRule::kAtCfaOffset;
        row.fp_offset = *fp_at;
      }
      ++stats_->signal_frame_rows;
      return row;
    }
    if (IsRtSigreturnTrampoline()) {
      row.cfa_offset = kSigFrameRsp;
      row.ra_offset = kSigFrameRip;
      row.fp_rule = UnwindRow::FpRule::kAtCfaOffset;
      row.fp_offset = kSigFrameRbp;
      ++stats_->signal_frame_rows;
      return row;
    }
    ++stats_->unsupported_signal_frames;
    return kUnrepresentable;
  }

  // The FDE covers the kernel's rt_sigreturn sequence (glibc and GCC start signal FDEs one
  // byte early, at a nop, so that a pc - 1 lookup of the trampoline's address still hits).
  bool IsRtSigreturnTrampoline() const {
    const uint64_t len = fde_.pc_end - fde_.pc_start;
    if (len < sizeof kRtSigreturnCode || len > 64) return false;
    std::optional<std::string_view> code = elf_.ReadAt(fde_.pc_start, len);
    if (!code) return false;
    return code->find(std::string_view(reinterpret_cast<const char*>(kRtSigreturnCode),
                                       sizeof kRtSigreturnCode)) != std::string_view::npos;
  }

  UnwindRow ToRow(uint64_t cfa_reg, int64_t cfa_offset) {
    UnwindRow row;
    if (cfa_reg == kRegRsp) row.cfa_base = UnwindRow::CfaBase::kSp;
    else if (cfa_reg == kRegRbp) row.cfa_base = UnwindRow::CfaBase::kFp;
    else {
      ++stats_->unsupported_cfa_registers;
      return kUnrepresentable;
    }
    auto fits = [](int64_t v) {
      return v >= std::numeric_limits<int32_t>::min() && v <= std::numeric_limits<int32_t>::max();
    };
    if (!fits(cfa_offset)) {
      ++stats_->unsupported_cfa_registers;
      return kUnrepresentable;
    }
    row.cfa_offset = static_cast<int32_t>(cfa_offset);
    const RegRule& ra = state_.regs[kRegRip];
    if (ra.kind == RegRule::kUndefined) {
      row.ra_rule = UnwindRow::RaRule::kUndefined;
    } else if (ra.kind == RegRule::kOffset && fits(ra.offset)) {
      row.ra_rule = UnwindRow::RaRule::kAtCfaOffset;
      row.ra_offset = static_cast<int32_t>(ra.offset);
    } else {
      ++stats_->unsupported_register_rules;
      return kUnrepresentable;
    }
    const RegRule& fp = state_.regs[kRegRbp];
    if (fp.kind == RegRule::kOffset && fits(fp.offset)) {
      row.fp_rule = UnwindRow::FpRule::kAtCfaOffset;
      row.fp_offset = static_cast<int32_t>(fp.offset);
    } else if (fp.kind == RegRule::kOther || fp.kind == RegRule::kExpression) {
      ++stats_->unsupported_register_rules;
      return kUnrepresentable;
    }
    return row;
  }

  void SetRule(uint64_t reg, RegRule rule) {
    if (reg < kNumRegs) state_.regs[reg] = rule;
  }

  bool Advance(uint64_t delta) {
    uint64_t target = loc_ + delta * cie_.code_align;
    if (target < loc_ || target > fde_.pc_end) return false;
    Emit(target);
    loc_ = target;
    return true;
  }

  // value * data_align, as the factored offsets are defined. A product that overflows (a
  // damaged CFI program) becomes an offset no row can hold: its range is unrepresentable.
  static int64_t Factored(int64_t value, int64_t factor) {
    int64_t out;
    return __builtin_mul_overflow(value, factor, &out) ? INT64_MAX : out;
  }
  static int64_t NegatedFactored(int64_t value, int64_t factor) {
    int64_t out;
    return __builtin_sub_overflow(int64_t{0}, Factored(value, factor), &out) ? INT64_MAX : out;
  }

  bool Run(std::string_view program, bool in_cie) {
    elf::ByteReader r(program, big_endian_);
    const int64_t da = cie_.data_align;
    while (r.ok() && r.remaining() > 0) {
      uint8_t op = r.U8();
      uint8_t high = op & 0xc0, low = op & 0x3f;
      if (high == 0x40) {  // DW_CFA_advance_loc
        if (in_cie || !Advance(low)) return false;
        continue;
      }
      if (high == 0x80) {  // DW_CFA_offset
        SetRule(low, {RegRule::kOffset, Factored(static_cast<int64_t>(r.Uleb128()), da)});
        continue;
      }
      if (high == 0xc0) {  // DW_CFA_restore
        if (in_cie) return false;
        if (low < kNumRegs) state_.regs[low] = initial_.regs[low];
        continue;
      }
      switch (op) {
        case 0x00: break;  // nop
        case 0x01: return false;  // DW_CFA_set_loc: not emitted for x86-64 .eh_frame
        case 0x02: if (in_cie || !Advance(r.U8())) return false; break;
        case 0x03: if (in_cie || !Advance(r.U16())) return false; break;
        case 0x04: if (in_cie || !Advance(r.U32())) return false; break;
        case 0x05: {  // offset_extended
          uint64_t reg = r.Uleb128();
          SetRule(reg, {RegRule::kOffset, Factored(static_cast<int64_t>(r.Uleb128()), da)});
          break;
        }
        case 0x06: {  // restore_extended
          uint64_t reg = r.Uleb128();
          if (in_cie) return false;
          if (reg < kNumRegs) state_.regs[reg] = initial_.regs[reg];
          break;
        }
        case 0x07: SetRule(r.Uleb128(), {RegRule::kUndefined, 0}); break;
        case 0x08: SetRule(r.Uleb128(), {RegRule::kSame, 0}); break;
        case 0x09: {  // register: saved in another register
          uint64_t reg = r.Uleb128();
          r.Uleb128();
          SetRule(reg, {RegRule::kOther, 0});
          break;
        }
        case 0x0a:  // remember_state
          if (stack_.size() >= kMaxStateStack) return false;
          stack_.push_back(state_);
          break;
        case 0x0b:  // restore_state (the CFA survives only via the saved copy, as in GCC)
          if (stack_.empty()) return false;
          state_ = stack_.back();
          stack_.pop_back();
          break;
        case 0x0c:  // def_cfa
          state_.cfa.reg = r.Uleb128();
          state_.cfa.offset = static_cast<int64_t>(r.Uleb128());
          state_.cfa.expression = {};
          break;
        case 0x0d:  // def_cfa_register
          state_.cfa.reg = r.Uleb128();
          state_.cfa.expression = {};
          break;
        case 0x0e: state_.cfa.offset = static_cast<int64_t>(r.Uleb128()); break;
        case 0x0f: {  // def_cfa_expression
          std::string_view expr = r.Bytes(r.Uleb128());
          state_.cfa.expression = expr.empty() ? std::string_view("\0", 1) : expr;
          break;
        }
        case 0x10: case 0x16: {  // expression, val_expression
          uint64_t reg = r.Uleb128();
          std::string_view expr = r.Bytes(r.Uleb128());
          if (op == 0x10) SetRule(reg, {RegRule::kExpression, 0, expr});
          else SetRule(reg, {RegRule::kOther, 0});
          break;
        }
        case 0x11: {  // offset_extended_sf
          uint64_t reg = r.Uleb128();
          SetRule(reg, {RegRule::kOffset, Factored(r.Sleb128(), da)});
          break;
        }
        case 0x12:  // def_cfa_sf
          state_.cfa.reg = r.Uleb128();
          state_.cfa.offset = Factored(r.Sleb128(), da);
          state_.cfa.expression = {};
          break;
        case 0x13: state_.cfa.offset = Factored(r.Sleb128(), da); break;  // def_cfa_offset_sf
        case 0x14: case 0x15: {  // val_offset, val_offset_sf
          uint64_t reg = r.Uleb128();
          if (op == 0x14) r.Uleb128(); else r.Sleb128();
          SetRule(reg, {RegRule::kOther, 0});
          break;
        }
        case 0x2e: r.Uleb128(); break;  // GNU_args_size
        case 0x2f: {  // GNU_negative_offset_extended
          uint64_t reg = r.Uleb128();
          SetRule(reg, {RegRule::kOffset, NegatedFactored(static_cast<int64_t>(r.Uleb128()), da)});
          break;
        }
        default: return false;
      }
    }
    return r.ok();
  }

 public:
  bool big_endian_ = false;

 private:
  const elf::ElfFile& elf_;
  const elf::Cie& cie_;
  const elf::Fde& fde_;
  CfiStats* stats_;
  uint64_t* plt_bytes_left_;
  CieStarts* cie_starts_;
  std::vector<CfiTable::Span>* out_;
  CfiState state_;
  CfiState initial_;
  std::vector<CfiState> stack_;
  uint64_t loc_ = 0;
};

}  // namespace

std::string CfiStats::ToString() const {
  return absl::StrCat("cies=", cies, " fdes=", fdes, " cie_programs_run=", cie_programs_run,
                      " debug_frame_fdes=", debug_frame_fdes,
                      " overlapping_fdes=", overlapping_fdes, " bad_records=", bad_records,
                      " bad_instructions=", bad_instructions, " rows=", rows,
                      " distinct_rows=", distinct_rows, " plt_expressions=", plt_expressions,
                      " unsupported_cfa_expressions=", unsupported_cfa_expressions,
                      " unsupported_cfa_registers=", unsupported_cfa_registers,
                      " unsupported_register_rules=", unsupported_register_rules,
                      " signal_frames=", signal_frames,
                      " signal_frame_rows=", signal_frame_rows,
                      " unsupported_signal_frames=", unsupported_signal_frames);
}

absl::StatusOr<std::unique_ptr<CfiTable>> CfiTable::Build(const elf::ElfFile& elf) {
  std::unique_ptr<CfiTable> table(new CfiTable());
  CfiStats& stats = table->stats_;
  struct FdeSpans {
    uint64_t start, end;
    int priority;  // .eh_frame (0) wins over .debug_frame (1)
    size_t first, count;
  };
  std::vector<FdeSpans> fdes;
  std::vector<Span> spans;
  uint64_t plt_bytes_left = kMaxPltBytesPerModule;
  CieStarts cie_starts;
  bool any_section = false;
  for (elf::CfiSectionKind kind : {elf::CfiSectionKind::kEhFrame, elf::CfiSectionKind::kDebugFrame}) {
    elf::CfiWalkStats walk;
    int priority = kind == elf::CfiSectionKind::kEhFrame ? 0 : 1;
    absl::Status s = elf::ForEachFde(elf, kind, [&](const elf::Cie& cie, const elf::Fde& fde) {
      size_t first = spans.size();
      FdeCompiler compiler(elf, cie, fde, &stats, &plt_bytes_left, &cie_starts, &spans);
      compiler.big_endian_ = elf.big_endian();
      if (compiler.Compile()) {
        fdes.push_back({fde.pc_start, fde.pc_end, priority, first, spans.size() - first});
        if (priority == 1) ++stats.debug_frame_fdes;
      }
    }, &walk);
    if (s.ok()) any_section = true;
    else if (!absl::IsNotFound(s)) return s;
    stats.cies += walk.cies;
    stats.fdes += walk.fdes;
    stats.bad_records += walk.bad_records;
  }
  if (!any_section) return absl::NotFoundError("module has no .eh_frame or .debug_frame");
  std::sort(fdes.begin(), fdes.end(), [](const FdeSpans& a, const FdeSpans& b) {
    return a.start != b.start ? a.start < b.start : a.priority < b.priority;
  });
  std::vector<Span> ordered;
  ordered.reserve(spans.size());
  uint64_t covered_end = 0;
  for (const FdeSpans& f : fdes) {
    if (f.start < covered_end) {
      ++stats.overlapping_fdes;
      continue;
    }
    ordered.insert(ordered.end(), spans.begin() + f.first, spans.begin() + f.first + f.count);
    covered_end = f.end;
  }
  if (!ordered.empty() && ordered.back().end - ordered.front().start >= 0xffffffffu) {
    return absl::InvalidArgumentError("CFI spans more than 4 GiB");
  }
  table->Assemble(std::move(ordered));
  return table;
}

void CfiTable::Assemble(std::vector<Span> spans) {
  if (spans.empty()) return;
  base_ = spans.front().start;
  absl::flat_hash_map<decltype(RowKey(UnwindRow())), uint32_t> distinct;
  uint64_t prev_end = base_;
  auto push = [&](uint64_t start, uint32_t index) {
    uint32_t off = static_cast<uint32_t>(start - base_);
    if (!starts_.empty() && starts_.back() == off) {  // zero-length predecessor
      row_index_.back() = index;
    } else if (row_index_.empty() || row_index_.back() != index) {
      starts_.push_back(off);
      row_index_.push_back(index);
    }
  };
  for (const Span& s : spans) {
    if (s.start > prev_end) push(prev_end, kGap);
    auto [it, inserted] = distinct.try_emplace(RowKey(s.row), static_cast<uint32_t>(rows_.size()));
    if (inserted) rows_.push_back(s.row);
    push(s.start, it->second);
    prev_end = s.end;
  }
  push(prev_end, kGap);
  stats_.rows = starts_.size();
  stats_.distinct_rows = rows_.size();
}

bool CfiTable::Search(uint64_t addr, uint32_t* row_index) const {
  if (starts_.empty() || addr < base_ || addr - base_ >= 0xffffffffu) return false;
  uint32_t off = static_cast<uint32_t>(addr - base_);
  auto it = std::upper_bound(starts_.begin(), starts_.end(), off);
  if (it == starts_.begin()) return false;
  *row_index = row_index_[it - starts_.begin() - 1];
  return true;
}

bool CfiTable::FindRowUncached(uint64_t pc, bool innermost, UnwindRow* row) const {
  uint32_t index;
  if (!Search(innermost ? pc : pc - 1, &index) || index == kGap) return false;
  *row = rows_[index];
  return true;
}

bool CfiTable::FindRow(uint64_t pc, bool innermost, UnwindRow* row) const {
  uint64_t addr = innermost ? pc : pc - 1;
  if (starts_.empty() || addr < base_ || !LookupCache::Cacheable(addr - base_)) return false;
  const uint64_t off = addr - base_;
  uint32_t index;
  if (!cache_.Find(off, &index)) {
    if (!Search(addr, &index)) return false;
    cache_.Store(off, index);
  }
  if (index == kGap) return false;
  *row = rows_[index];
  return true;
}

size_t CfiTable::MemoryBytes() const {
  return starts_.capacity() * sizeof(uint32_t) + row_index_.capacity() * sizeof(uint32_t) +
         rows_.capacity() * sizeof(UnwindRow) + LookupCache::kMemoryBytes;
}

absl::StatusOr<std::unique_ptr<RuleSource>> BuildRuleSource(const elf::ElfFile& elf) {
  absl::StatusOr<std::unique_ptr<CfiTable>> table = CfiTable::Build(elf);
  if (!table.ok()) return table.status();
  return std::unique_ptr<RuleSource>(std::move(*table));
}

}  // namespace strata::unwind::x86_64
