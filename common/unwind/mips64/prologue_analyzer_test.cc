// Hand-assembled MIPS64 sequences for every pitfall of notes/mips64-prologue.md: the analyzer
// must give the right row at every instruction, in both byte orders.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "common/unwind/mips64/function_table.h"
#include "common/unwind/mips64/prologue_analyzer.h"

namespace strata::unwind::mips64 {
namespace {

using Base = UnwindRow::CfaBase;
using RaR = UnwindRow::RaRule;
using FpR = UnwindRow::FpRule;

constexpr int zero = 0, v0 = 2, v1 = 3, a0 = 4, t9 = 25, gp = 28, sp = 29, s8 = 30, ra = 31;
uint32_t I(uint32_t op, int rs, int rt, int imm) {
  return op << 26 | rs << 21 | rt << 16 | (static_cast<uint32_t>(imm) & 0xFFFF);
}
uint32_t R(int rs, int rt, int rd, uint32_t funct) { return rs << 21 | rt << 16 | rd << 11 | funct; }
uint32_t daddiu(int rt, int rs, int imm) { return I(0x19, rs, rt, imm); }
uint32_t sd(int rt, int off, int base) { return I(0x3F, base, rt, off); }
uint32_t ld(int rt, int off, int base) { return I(0x37, base, rt, off); }
uint32_t lui(int rt, int imm) { return I(0x0F, 0, rt, imm); }
uint32_t ori(int rt, int rs, int imm) { return I(0x0D, rs, rt, imm); }
uint32_t beq(int rs, int rt, int off) { return I(4, rs, rt, off); }
uint32_t dsubu(int rd, int rs, int rt) { return R(rs, rt, rd, 0x2F); }
uint32_t daddu(int rd, int rs, int rt) { return R(rs, rt, rd, 0x2D); }
uint32_t move(int rd, int rs) { return daddu(rd, rs, zero); }
uint32_t j(uint64_t target) { return 2u << 26 | ((target >> 2) & 0x03FFFFFF); }
constexpr uint32_t nop = 0, jr_ra = 0x03E00008, jalr_t9 = 0x0320F809, jr_t9 = 0x03200008;
constexpr uint32_t lui_gp = 0x3C1C0000, daddu_gp = 0x0399E02D, daddiu_gp = 0x679C0000;

// The row in force at byte offset `off`.
struct At {
  bool valid;
  UnwindRow row;
};
At RowAt(const std::vector<RowRange>& rows, uint32_t off) {
  At a{false, {}};
  for (const RowRange& r : rows) {
    if (r.offset <= off) a = {r.valid, r.row};
  }
  return a;
}

void ExpectSp(const std::vector<RowRange>& rows, uint32_t off, int cfa, RaR rar, int ra_off = 0) {
  At a = RowAt(rows, off);
  SCOPED_TRACE(testing::Message() << "offset " << off);
  ASSERT_TRUE(a.valid);
  EXPECT_EQ(a.row.cfa_base, Base::kSp);
  EXPECT_EQ(a.row.cfa_offset, cfa);
  EXPECT_EQ(a.row.ra_rule, rar);
  if (rar == RaR::kAtCfaOffset) {
    EXPECT_EQ(a.row.ra_offset, ra_off);
  }
}

TEST(PrologueAnalyzer, PicNonLeafWithGpSetupAndEpilogue) {
  std::vector<uint32_t> f = {
      daddiu(sp, sp, -32),  // 0
      sd(gp, 16, sp),       // 4
      lui_gp,               // 8
      sd(ra, 24, sp),       // 12
      daddu_gp,             // 16
      daddiu_gp,            // 20
      jalr_t9,              // 24
      nop,                  // 28
      ld(ra, 24, sp),       // 32
      ld(gp, 16, sp),       // 36
      jr_ra,                // 40
      daddiu(sp, sp, 32),   // 44: frame released in the delay slot
  };
  auto rows = AnalyzeFunction(f);
  ExpectSp(rows, 0, 0, RaR::kInRegister);       // before the sp adjustment
  ExpectSp(rows, 4, 32, RaR::kInRegister);      // between adjustment and ra save
  ExpectSp(rows, 12, 32, RaR::kInRegister);     // at the save itself
  ExpectSp(rows, 16, 32, RaR::kAtCfaOffset, -8);
  ExpectSp(rows, 28, 32, RaR::kAtCfaOffset, -8);
  ExpectSp(rows, 32, 32, RaR::kAtCfaOffset, -8);  // at `ld ra`
  ExpectSp(rows, 36, 32, RaR::kInRegister);       // after `ld ra`
  ExpectSp(rows, 40, 32, RaR::kInRegister);       // at `jr ra`
  ExpectSp(rows, 44, 32, RaR::kInRegister);       // delay slot: sp not yet restored
}

TEST(PrologueAnalyzer, LeafWithoutFrame) {
  std::vector<uint32_t> f = {daddu(v0, a0, a0), jr_ra, nop};
  auto rows = AnalyzeFunction(f);
  ASSERT_EQ(rows.size(), 1u);
  ExpectSp(rows, 8, 0, RaR::kInRegister);
}

TEST(PrologueAnalyzer, LeafWithFrameButNoRaSave) {
  std::vector<uint32_t> f = {daddiu(sp, sp, -64), sd(a0, 0, sp), ld(v0, 0, sp), jr_ra,
                             daddiu(sp, sp, 64)};
  auto rows = AnalyzeFunction(f);
  ExpectSp(rows, 0, 0, RaR::kInRegister);
  ExpectSp(rows, 4, 64, RaR::kInRegister);
  ExpectSp(rows, 16, 64, RaR::kInRegister);
}

TEST(PrologueAnalyzer, ShrinkWrappedEarlyExitPlacedAfterTheBody) {
  std::vector<uint32_t> f = {
      beq(a0, zero, 9),     // 0: -> 40 (early exit, no frame)
      nop,                  // 4
      daddiu(sp, sp, -16),  // 8
      sd(ra, 8, sp),        // 12
      jalr_t9,              // 16
      nop,                  // 20
      ld(ra, 8, sp),        // 24
      jr_ra,                // 28
      daddiu(sp, sp, 16),   // 32
      nop,                  // 36 (padding, unreached)
      jr_ra,                // 40
      move(v0, zero),       // 44
  };
  auto rows = AnalyzeFunction(f);
  ExpectSp(rows, 4, 0, RaR::kInRegister);
  ExpectSp(rows, 20, 16, RaR::kAtCfaOffset, -8);
  ExpectSp(rows, 28, 16, RaR::kInRegister);
  ExpectSp(rows, 40, 0, RaR::kInRegister);  // early-exit path has no frame
  ExpectSp(rows, 44, 0, RaR::kInRegister);
}

TEST(PrologueAnalyzer, RaSaveInDelaySlotOfFirstBranch) {
  std::vector<uint32_t> f = {
      daddiu(sp, sp, -32),  // 0
      beq(a0, zero, 4),     // 4 -> 24
      sd(ra, 16, sp),       // 8: delay slot, runs on both paths
      jalr_t9,              // 12
      nop,                  // 16
      nop,                  // 20
      ld(ra, 16, sp),       // 24
      jr_ra,                // 28
      daddiu(sp, sp, 32),   // 32
  };
  auto rows = AnalyzeFunction(f);
  ExpectSp(rows, 8, 32, RaR::kInRegister);
  ExpectSp(rows, 12, 32, RaR::kAtCfaOffset, -16);
  ExpectSp(rows, 24, 32, RaR::kAtCfaOffset, -16);
  ExpectSp(rows, 28, 32, RaR::kInRegister);
}

TEST(PrologueAnalyzer, LargeFrameViaLiV1AndDsubu) {
  const int big = 0x10010;  // > 32 KiB: does not fit daddiu's immediate
  std::vector<uint32_t> f = {
      daddiu(sp, sp, -48),  // 0
      sd(ra, 40, sp),       // 4
      sd(s8, 32, sp),       // 8
      lui(v1, 1),           // 12
      ori(v1, v1, 0x10),    // 16
      dsubu(sp, sp, v1),    // 20
      jalr_t9,              // 24
      nop,                  // 28
      lui(v1, 1),           // 32
      ori(v1, v1, 0x10),    // 36
      daddu(sp, sp, v1),    // 40
      ld(ra, 40, sp),       // 44
      ld(s8, 32, sp),       // 48
      jr_ra,                // 52
      daddiu(sp, sp, 48),   // 56
  };
  auto rows = AnalyzeFunction(f);
  ExpectSp(rows, 20, 48, RaR::kAtCfaOffset, -8);
  ExpectSp(rows, 24, 48 + big, RaR::kAtCfaOffset, -8);
  ExpectSp(rows, 40, 48 + big, RaR::kAtCfaOffset, -8);
  ExpectSp(rows, 44, 48, RaR::kAtCfaOffset, -8);
  At a = RowAt(rows, 24);
  EXPECT_EQ(a.row.fp_rule, FpR::kAtCfaOffset);
  EXPECT_EQ(a.row.fp_offset, -16);
  ExpectSp(rows, 56, 48, RaR::kInRegister);
  EXPECT_EQ(RowAt(rows, 52).row.fp_rule, FpR::kSame);  // s8 restored
}

// Frames of gigabytes (garbage code, or a constant subtracted over and over) make sp
// unknown; the offset arithmetic must not overflow (UBSan found it in the fuzzer).
TEST(PrologueAnalyzer, HugeFramesMakeSpUnknown) {
  std::vector<uint32_t> f = {
      lui(v1, 0x4000),     // 0: v1 = 1 GiB
      dsubu(sp, sp, v1),   // 4
      dsubu(sp, sp, v1),   // 8: past 1 GiB: unknown
      dsubu(sp, sp, v1),   // 12
      daddiu(s8, sp, -32768),  // 16
      daddiu(sp, s8, -32768),  // 20
      jr_ra,               // 24
      nop,                 // 28
  };
  auto rows = AnalyzeFunction(f);
  ExpectSp(rows, 8, 0x40000000, RaR::kInRegister);
  EXPECT_FALSE(RowAt(rows, 12).valid);
  EXPECT_FALSE(RowAt(rows, 24).valid);
  // Many small adjustments add up the same way.
  std::vector<uint32_t> g(70000, daddiu(sp, sp, -32768));
  g.push_back(jr_ra);
  g.push_back(nop);
  rows = AnalyzeFunction(g);
  EXPECT_FALSE(RowAt(rows, 4 * 69999).valid);
}

// A `j` whose function lies just below 2^63: its target is computed without signed overflow
// (UBSan found it in the fuzzer).
TEST(PrologueAnalyzer, JumpAcrossTwoToThe63) {
  const uint64_t start = (uint64_t{1} << 63) - 8;
  std::vector<uint32_t> f = {nop, j(uint64_t{1} << 63), nop, jr_ra, nop};
  AnalysisStats stats;
  auto rows = AnalyzeFunctionAt(f, start, false, &stats);
  ASSERT_FALSE(rows.empty());
  EXPECT_EQ(rows.front().offset, 0u);
  EXPECT_EQ(stats.instructions, f.size());
  EXPECT_FALSE(AnalyzeFunctionAt(f, UINT64_MAX - 3, false, nullptr).empty());
}

TEST(PrologueAnalyzer, AllocaUsesTheFramePointer) {
  std::vector<uint32_t> f = {
      daddiu(sp, sp, -32),  // 0
      sd(ra, 24, sp),       // 4
      sd(s8, 16, sp),       // 8
      move(s8, sp),         // 12
      dsubu(sp, sp, v0),    // 16: alloca of a run-time size
      jalr_t9,              // 20
      nop,                  // 24
      move(sp, s8),         // 28
      ld(ra, 24, sp),       // 32
      ld(s8, 16, sp),       // 36
      jr_ra,                // 40
      daddiu(sp, sp, 32),   // 44
  };
  auto rows = AnalyzeFunction(f);
  ExpectSp(rows, 16, 32, RaR::kAtCfaOffset, -8);
  At a = RowAt(rows, 20);
  ASSERT_TRUE(a.valid);
  EXPECT_EQ(a.row.cfa_base, Base::kFp);
  EXPECT_EQ(a.row.cfa_offset, 32);
  EXPECT_EQ(a.row.ra_offset, -8);
  EXPECT_EQ(a.row.fp_rule, FpR::kAtCfaOffset);
  EXPECT_EQ(a.row.fp_offset, -16);
  ExpectSp(rows, 32, 32, RaR::kAtCfaOffset, -8);  // sp re-derived from s8
  ExpectSp(rows, 40, 32, RaR::kInRegister);
}

TEST(PrologueAnalyzer, TailCallsEndThePathAndLaterCodeGetsTheBodyState) {
  std::vector<uint32_t> f = {
      daddiu(sp, sp, -16),  // 0
      sd(ra, 8, sp),        // 4
      beq(a0, zero, 5),     // 8 -> 32
      nop,                  // 12
      ld(ra, 8, sp),        // 16
      jr_t9,                // 20: tail call through t9
      daddiu(sp, sp, 16),   // 24
      nop,                  // 28
      jalr_t9,              // 32: reached by the branch, frame still allocated
      nop,                  // 36
      ld(ra, 8, sp),        // 40
      j(0x1000000),         // 44: tail call with `j` out of the function
      daddiu(sp, sp, 16),   // 48
      sd(zero, 0, sp),      // 52: unreached (after a jump): body state
  };
  auto rows = AnalyzeFunction(f);
  ExpectSp(rows, 20, 16, RaR::kInRegister);
  ExpectSp(rows, 24, 16, RaR::kInRegister);
  ExpectSp(rows, 32, 16, RaR::kAtCfaOffset, -8);
  ExpectSp(rows, 44, 16, RaR::kInRegister);
  ExpectSp(rows, 52, 16, RaR::kAtCfaOffset, -8);
}

TEST(PrologueAnalyzer, StubsAreFrameless) {
  // .MIPS.stubs: ld t9,-0x7ff0(gp); move t7,ra; jalr t9; li t8,n
  std::vector<uint32_t> f = {0xDF998010, 0x03E0782D, 0x0320F809, 0x64180005};
  auto rows = AnalyzeFunction(f, /*leaf_stub=*/true);
  ASSERT_EQ(rows.size(), 1u);
  ExpectSp(rows, 12, 0, RaR::kInRegister);
}

TEST(PrologueAnalyzer, CallWithoutSaveLosesTheReturnAddress) {
  std::vector<uint32_t> f = {jalr_t9, nop, jr_ra, nop};
  auto rows = AnalyzeFunction(f);
  EXPECT_TRUE(RowAt(rows, 0).valid);
  EXPECT_FALSE(RowAt(rows, 4).valid);  // delay slot: ra already overwritten
  EXPECT_FALSE(RowAt(rows, 8).valid);
}

TEST(PrologueAnalyzer, ZeroedRaMarksTheOutermostFrame) {
  std::vector<uint32_t> f = {move(ra, zero), daddiu(sp, sp, -32), jalr_t9, nop};
  auto rows = AnalyzeFunction(f);
  At a = RowAt(rows, 8);
  ASSERT_TRUE(a.valid);
  EXPECT_EQ(a.row.ra_rule, RaR::kUndefined);
}

// A loop exit branch with the epilogue's `ld ra` in its delay slot: on the loop path ra is
// reloaded (slot unchanged) and then overwritten by the next call. The return address stays
// in its slot; the loop's calls must still unwind through it (GCC -O2, seen in the wild).
TEST(PrologueAnalyzer, LdRaInLoopExitDelaySlotKeepsTheSlot) {
  std::vector<uint32_t> f = {
      daddiu(sp, sp, -64),  // 0
      sd(ra, 40, sp),       // 4
      jalr_t9,              // 8
      nop,                  // 12
      beq(v0, zero, 5),     // 16: exit to 40
      ld(ra, 40, sp),       // 20: delay slot, runs on both paths
      jalr_t9,              // 24: loop head, ra overwritten
      nop,                  // 28
      beq(v0, a0, -3),      // 32: back to 24
      nop,                  // 36
      jr_ra,                // 40: reached from 16 (ra reloaded) and from the loop (ra garbage)
      daddiu(sp, sp, 64),   // 44
  };
  auto rows = AnalyzeFunction(f);
  ExpectSp(rows, 24, 64, RaR::kAtCfaOffset, -24);  // loop head: the slot is right on both paths
  ExpectSp(rows, 28, 64, RaR::kAtCfaOffset, -24);  // return address of the loop's call
  ExpectSp(rows, 40, 64, RaR::kAtCfaOffset, -24);  // the register may hold the loop's call's
  ExpectSp(rows, 44, 64, RaR::kAtCfaOffset, -24);
}

// glibc's __start: `move ra,zero`, then sp realigned with `and` (no CFA the analysis can
// follow) before the call to __libc_start_main. The return address into it is outermost.
TEST(PrologueAnalyzer, ZeroedRaIsOutermostEvenAfterSpIsRealigned) {
  constexpr int at = 1;
  const uint32_t and_sp_sp_at = R(sp, at, sp, 0x24);
  std::vector<uint32_t> f = {move(ra, zero), daddiu(at, zero, -16), and_sp_sp_at,
                             daddiu(sp, sp, -32), jalr_t9, nop, 0x1000FFFF /* b . */, nop};
  auto rows = AnalyzeFunction(f);
  for (uint32_t off : {4u, 12u, 20u, 24u}) {
    At a = RowAt(rows, off);
    ASSERT_TRUE(a.valid) << off;
    EXPECT_EQ(a.row.ra_rule, RaR::kUndefined) << off;
  }
}

TEST(PrologueAnalyzer, GarbageNeverCrashes) {
  std::mt19937 rng(7);
  for (int iter = 0; iter < 300; ++iter) {
    std::vector<uint32_t> f(1 + rng() % 200);
    for (uint32_t& w : f) w = rng();
    if (iter % 2) {  // bias towards control flow and sp arithmetic
      for (size_t i = 0; i < f.size(); i += 3) f[i] = (f[i] & 0x03FFFFFF) | ((rng() % 8) << 26);
    }
    auto rows = AnalyzeFunction(f);
    ASSERT_FALSE(rows.empty());
    EXPECT_EQ(rows.front().offset, 0u);
    for (size_t i = 1; i < rows.size(); ++i) EXPECT_LT(rows[i - 1].offset, rows[i].offset);
  }
  EXPECT_EQ(AnalyzeFunction({}).size(), 1u);
}

// The same function through PrologueTable, stored in each byte order.
class TableTest : public testing::TestWithParam<Arch> {};

TEST_P(TableTest, LookupRowsAndReturnAddressChecks) {
  const Arch arch = GetParam();
  const std::vector<uint32_t> caller = {
      daddiu(sp, sp, -32), sd(ra, 24, sp), jalr_t9, nop,  // call at 0x1008, returns to 0x1010
      ld(ra, 24, sp),      jr_ra,          daddiu(sp, sp, 32), nop};
  const std::vector<uint32_t> leaf = {jr_ra, nop};
  std::vector<uint8_t> bytes(0x3000, 0);
  auto put = [&](uint64_t addr, const std::vector<uint32_t>& ws) {
    for (size_t i = 0; i < ws.size(); ++i) {
      uint32_t w = ws[i];
      uint8_t* p = bytes.data() + (addr - 0x1000) + 4 * i;
      for (int b = 0; b < 4; ++b) {
        p[IsBigEndian(arch) ? 3 - b : b] = static_cast<uint8_t>(w >> (8 * b));
      }
    }
  };
  put(0x1000, caller);
  put(0x2ff8, leaf);  // crosses into the next page
  CodeRegion code{0x1000, bytes.data(), bytes.size()};
  auto t = PrologueTable::Build(
      arch, {{0x2ff8, 8, 0}, {0x1000, 32, 0}, {0x1000, 4, 0}, {0x5000, 16, 0}}, {&code, 1});
  ASSERT_EQ(t->num_functions(), 3u);
  EXPECT_EQ(t->stats().without_code, 1u);
  for (uint64_t pc = 0xF00; pc < 0x5100; pc += 4) {
    ASSERT_EQ(t->FindFunction(pc), t->FindFunctionBinarySearch(pc)) << pc;
  }
  EXPECT_EQ(t->FindFunction(0x1020), -1);  // gap between functions
  UnwindRow row;
  ASSERT_TRUE(t->FindRow(0x1010, /*innermost=*/false, &row));
  EXPECT_EQ(row.cfa_offset, 32);
  EXPECT_EQ(row.ra_rule, RaR::kAtCfaOffset);
  EXPECT_EQ(row.ra_offset, -8);
  ASSERT_TRUE(t->FindRow(0x1014, /*innermost=*/true, &row));
  EXPECT_EQ(row.ra_rule, RaR::kInRegister);
  ASSERT_TRUE(t->FindRow(0x2ffc, true, &row));
  EXPECT_EQ(row.cfa_offset, 0);
  EXPECT_FALSE(t->FindRow(0x5000, true, &row));  // no code: no rule
  EXPECT_TRUE(t->IsPlausibleReturnAddress(0x1010));
  EXPECT_FALSE(t->IsPlausibleReturnAddress(0x100c));
  EXPECT_FALSE(t->IsPlausibleReturnAddress(0x1011));
  EXPECT_FALSE(t->IsPlausibleReturnAddress(0x900000));
}

// Code at the very top of the address space (a corrupt or hostile ELF segment ending at
// 2^64): building the table reads only the region's bytes (the word loop's `a + 4 <= end`
// used to wrap to 0 and read on past the region).
TEST(PrologueTable, CodeEndingAtTheTopOfTheAddressSpace) {
  const uint64_t top = UINT64_MAX - 15;  // region [2^64 - 16, 2^64)
  std::vector<uint8_t> bytes(16, 0);
  CodeRegion code{top, bytes.data(), bytes.size()};
  auto t = PrologueTable::Build(Arch::kMips64El,
                                {{top, 0, 0}, {top + 8, 0, 0}, {UINT64_MAX - 3, 1, 0},
                                 {UINT64_MAX - 1, 0, 0}},
                                {&code, 1});
  ASSERT_GE(t->num_functions(), 2u);
  EXPECT_EQ(t->FindFunction(top), 0);
  EXPECT_EQ(t->FindFunction(top + 8), 1);
  UnwindRow row;
  EXPECT_TRUE(t->FindRow(top, true, &row));
  for (uint64_t pc = top - 8; pc != 0; ++pc) {
    ASSERT_EQ(t->FindFunction(pc), t->FindFunctionBinarySearch(pc)) << pc;
  }
}

// Two code regions 64 GiB apart (a corrupt or hostile file's segments; the fuzzer found three
// FDEs over 130 GiB): the table's size follows the code, not the span, and return
// addresses in both regions are still recognized. A page index over the span was 64 MiB
// and took seconds to fill; a single bitmap over it was refused, so no return address passed.
TEST(PrologueTable, RegionsFarApartCostTheirCodeNotTheirSpan) {
  const uint64_t far = uint64_t{64} << 30;
  std::vector<uint8_t> bytes(32, 0);
  // jalr t9 (0x0320f809), little-endian: a call at offsets 0 and 16, returning to 8 and 24.
  for (size_t at : {0, 16}) {
    bytes[at] = 0x09, bytes[at + 1] = 0xf8, bytes[at + 2] = 0x20, bytes[at + 3] = 0x03;
  }
  const CodeRegion code[] = {{0x1000, bytes.data(), 16}, {far, bytes.data() + 16, 16}};
  auto t = PrologueTable::Build(Arch::kMips64El, {{0x1000, 16, 0}, {far, 16, 0}}, code);
  ASSERT_EQ(t->num_functions(), 2u);
  EXPECT_LT(t->stats().memory_bytes, 4096u);
  for (uint64_t pc : {uint64_t{0xff0}, uint64_t{0x1000}, uint64_t{0x100c}, uint64_t{0x1010},
                      far - 4, far, far + 12, far + 16}) {
    EXPECT_EQ(t->FindFunction(pc), t->FindFunctionBinarySearch(pc)) << pc;
  }
  EXPECT_EQ(t->FindFunction(far + 4), 1);
  EXPECT_TRUE(t->IsPlausibleReturnAddress(0x1008));
  EXPECT_TRUE(t->IsPlausibleReturnAddress(far + 8));
  EXPECT_FALSE(t->IsPlausibleReturnAddress(0x1004));
  EXPECT_FALSE(t->IsPlausibleReturnAddress(far + 4));
  EXPECT_FALSE(t->IsPlausibleReturnAddress(0x2008));
}

// Regions in any order, one inside another, a few bytes apart, far apart and at the top of the
// address space: every call's return address is recognized, whichever bitmap holds it.
TEST(PrologueTable, ReturnAddressesOfOverlappingAndAdjacentRegions) {
  // Each region's own bytes (regions sharing bytes are one region), little-endian: a jalr t9
  // at offset 0 of each, and at 0x100 of the 0x200-byte one, nothing else.
  std::vector<std::vector<uint8_t>> bytes(6, std::vector<uint8_t>(0x200, 0));
  for (auto& b : bytes) b[0] = 0x09, b[1] = 0xf8, b[2] = 0x20, b[3] = 0x03;
  bytes[2][0x100] = 0x09, bytes[2][0x101] = 0xf8, bytes[2][0x102] = 0x20, bytes[2][0x103] = 0x03;
  const uint64_t top = UINT64_MAX - 31;
  const CodeRegion code[] = {{0x9000, bytes[0].data(), 32},    {0x1010, bytes[1].data(), 32},
                             {0x1000, bytes[2].data(), 0x200}, {0x9040, bytes[3].data(), 32},
                             {0x40000, bytes[4].data(), 32},   {top, bytes[5].data(), 32}};
  auto t = PrologueTable::Build(Arch::kMips64El, {}, code);
  for (uint64_t start : {0x1000, 0x1010, 0x9000, 0x9040, 0x40000}) {
    EXPECT_TRUE(t->IsPlausibleReturnAddress(start + 8)) << start;
    EXPECT_FALSE(t->IsPlausibleReturnAddress(start + 12)) << start;
  }
  EXPECT_TRUE(t->IsPlausibleReturnAddress(0x1108));
  EXPECT_TRUE(t->IsPlausibleReturnAddress(top + 8));
  EXPECT_FALSE(t->IsPlausibleReturnAddress(top + 12));
  EXPECT_FALSE(t->IsPlausibleReturnAddress(0x8));
  EXPECT_FALSE(t->IsPlausibleReturnAddress(0x20000));
}

// A corrupt or hostile file mapping the same code bytes at a thousand addresses: they are
// analyzed, and a return-address bitmap built, once (the first address), not a thousand times.
TEST(PrologueTable, CodeMappedAtManyAddressesIsTakenOnce) {
  std::vector<uint8_t> bytes(64 * 1024, 0);
  bytes[0] = 0x09, bytes[1] = 0xf8, bytes[2] = 0x20, bytes[3] = 0x03;  // jalr t9
  std::vector<CodeRegion> code;
  std::vector<FunctionRange> functions;
  for (uint64_t i = 0; i < 1000; ++i) {
    const uint64_t vaddr = (i + 1) << 24;
    code.push_back({vaddr, bytes.data() + (i % 2) * 16, bytes.size() - (i % 2) * 16});
    functions.push_back({vaddr, 64, 0});
  }
  auto t = PrologueTable::Build(Arch::kMips64El, functions, code);
  ASSERT_EQ(t->num_functions(), 1000u);
  EXPECT_EQ(t->stats().without_code, 999u);
  EXPECT_LT(t->stats().memory_bytes, 64u * 1024);
  EXPECT_TRUE(t->IsPlausibleReturnAddress((uint64_t{1} << 24) + 8));
  EXPECT_FALSE(t->IsPlausibleReturnAddress((uint64_t{2} << 24) + 8));
}

INSTANTIATE_TEST_SUITE_P(BothEndians, TableTest,
                         testing::Values(Arch::kMips64El, Arch::kMips64Be),
                         [](const auto& info) {
                           return std::string(info.param == Arch::kMips64Be ? "Be" : "El");
                         });

}  // namespace
}  // namespace strata::unwind::mips64
