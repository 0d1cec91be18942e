// MIPS64 (n64) prologue/epilogue analysis: turns one function's instruction words into the
// unwind row that holds at every instruction offset, as a short run-length list.
//
// MIPS has no frame-pointer convention and n64 binaries rarely keep usable unwind tables, so
// the rule for leaving a frame is recovered from the code: the `daddiu sp,sp,-N` (or
// `li v1,N; dsubu sp,sp,v1`) that allocates the frame, the `sd ra,off(sp)` that saves the
// return address, `move s8,sp` frame pointers (alloca), and the epilogue (`ld ra`, `jr ra`
// with the frame release in its delay slot). Unlike the kernel's and gdb's single forward
// scan, the analysis follows branches (with delay slots) through the whole function, so
// shrink-wrapped prologues, several epilogues and code placed after an early return get the
// state that really holds there. It runs once per function when a module is loaded; the
// per-sample path only looks up the precomputed rows (see function_table.h).
//
// Pure functions over caller-owned words; no I/O. Thread-compatible.
#ifndef STRATA_COMMON_UNWIND_MIPS64_PROLOGUE_ANALYZER_H_
#define STRATA_COMMON_UNWIND_MIPS64_PROLOGUE_ANALYZER_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "common/unwind/unwind_types.h"

namespace strata::unwind::mips64 {

// Register numbers used by the analysis.
inline constexpr int kZero = 0, kV0 = 2, kV1 = 3, kGp = 28, kSp = 29, kS8 = 30, kRa = 31;

// Instruction classification shared by the analyzer, the table and the benchmarks.
namespace insn {
constexpr uint32_t Op(uint32_t w) { return w >> 26; }
constexpr int Rs(uint32_t w) { return (w >> 21) & 31; }
constexpr int Rt(uint32_t w) { return (w >> 16) & 31; }
constexpr int Rd(uint32_t w) { return (w >> 11) & 31; }
constexpr uint32_t Funct(uint32_t w) { return w & 63; }
constexpr int32_t Imm(uint32_t w) { return static_cast<int16_t>(w & 0xFFFF); }

// daddiu/addiu sp,sp,imm
constexpr bool IsSpAdjust(uint32_t w) {
  return (w & 0xFFFF0000u) == 0x67BD0000u || (w & 0xFFFF0000u) == 0x27BD0000u;
}
// A call: jal, jalx, jalr (any rd), bal/bgezal/bltzal (+likely). Return address = call + 8.
constexpr bool IsCallWithDelaySlot(uint32_t w) {
  const uint32_t op = Op(w);
  if (op == 3 || op == 0x1D) return true;                      // jal, jalx
  if (op == 0 && (Funct(w) == 9) && Rt(w) == 0) return true;   // jalr / jalr.hb
  if (op == 1) {                                               // REGIMM
    const int rt = Rt(w);
    return rt == 0x10 || rt == 0x11 || rt == 0x12 || rt == 0x13;  // bltzal, bgezal(l)
  }
  return false;
}
// R6 compact calls (no delay slot): balc, jialc. Return address = call + 4.
constexpr bool IsCompactCall(uint32_t w) {
  return Op(w) == 0x3A || (Op(w) == 0x3E && Rs(w) == 0);
}
}  // namespace insn

// What holds before the instruction at `offset` (bytes from the function start) until the
// next entry. `row` follows UnwindRow; `valid` is false where the analysis cannot say how to
// leave the frame (return address lost, stack pointer unknown without a frame pointer).
struct RowRange {
  uint32_t offset = 0;
  bool valid = false;
  UnwindRow row;
};

struct AnalysisStats {
  uint32_t instructions = 0;
  uint32_t unreached = 0;   // filled by the linear fallback (jump tables, data in text)
  uint32_t conflicts = 0;   // join points reached with different frame states
};

// Analyzes `words` (already in host order) as one function. `leaf_stub` marks PLT/
// .MIPS.stubs code: no frame, ra in register throughout. The result starts at offset 0, has
// no two consecutive entries with the same row, and covers [0, 4 * words.size()).
std::vector<RowRange> AnalyzeFunction(std::span<const uint32_t> words, bool leaf_stub = false,
                                      AnalysisStats* stats = nullptr);
// Same, for a function at module address `start_vaddr` (resolves `j` targets: inside the
// function a jump, outside a tail call).
std::vector<RowRange> AnalyzeFunctionAt(std::span<const uint32_t> words, uint64_t start_vaddr,
                                        bool leaf_stub, AnalysisStats* stats);

// True when the two rows say the same thing (ignoring offsets the rule does not use).
bool SameRow(const RowRange& a, const RowRange& b);

}  // namespace strata::unwind::mips64

#endif  // STRATA_COMMON_UNWIND_MIPS64_PROLOGUE_ANALYZER_H_
