#include <dlfcn.h>
#include <signal.h>

#include <cstring>
#include <string>

#include "common/elf/symbol_table.h"
#include "common/unwind/incremental.h"
#include "common/unwind/unwind_test_chain.h"
#include "common/unwind/unwind_test_space.h"
#include "common/unwind/unwinder.h"
#include "gtest/gtest.h"

namespace strata::unwind {
namespace {

using testing::CapturedStack;
using testing::SelfAddressSpace;

// Name of the function of this executable containing `pc` (from its .symtab).
std::string SymbolAt(uint64_t pc) {
  static const auto* table = [] {
    auto elf = elf::ElfFile::Open("/proc/self/exe");
    return new elf::SymbolTable(std::move(*elf::SymbolTable::Build(**elf)));
  }();
  uint64_t bias = 0;
  dl_iterate_phdr([](dl_phdr_info* info, size_t, void* data) {
    *static_cast<uint64_t*>(data) = info->dlpi_addr;
    return 1;
  }, &bias);
  const elf::SymbolTable::Function* f = table->Lookup(pc - bias);
  return f == nullptr ? "?" : std::string(f->name);
}

TEST(UnwindTest, CfiUnwindMatchesReturnAddresses) {
  SelfAddressSpace space;
  for (int depth : {1, 5, 20}) {
    CapturedStack cap;
    ASSERT_GT(testing::CaptureChainNoFp(depth, &cap), 0);
    ASSERT_EQ(cap.return_addresses.size(), static_cast<size_t>(depth + 1));
    Frame frames[256];
    UnwindOptions options;
    options.frame_pointer_fallback = false;  // CFI alone must get through
    UnwindResult r = Unwind(options, cap.regs, cap.snapshot(), space, frames, 256);
    ASSERT_GT(r.num_frames, cap.return_addresses.size()) << StopReasonName(r.stop);
    EXPECT_EQ(frames[0].pc, cap.regs.pc);
    EXPECT_EQ(frames[0].sp, cap.regs.sp);
    for (size_t i = 0; i < cap.return_addresses.size(); ++i) {
      EXPECT_EQ(frames[i + 1].pc, cap.return_addresses[i]) << "frame " << i + 1 << " depth " << depth;
      // The slot the return address was read from holds it.
      uint64_t v = 0;
      ASSERT_TRUE(cap.snapshot().Read64(frames[i].ra_slot, false, &v));
      EXPECT_EQ(v, frames[i + 1].pc);
    }
    for (size_t i = 1; i < r.num_frames; ++i) EXPECT_GT(frames[i].sp, frames[i - 1].sp);
    // The walk continues through this test, gtest, main and libc up to _start.
    EXPECT_EQ(r.stop, StopReason::kOutermost) << StopReasonName(r.stop);
    bool saw_main = false;
    for (size_t i = 0; i < r.num_frames; ++i) saw_main |= SymbolAt(frames[i].pc) == "main";
    EXPECT_TRUE(saw_main);
    EXPECT_EQ(frames[r.num_frames - 1].ra_slot, 0u);
    EXPECT_EQ(SymbolAt(frames[r.num_frames - 1].pc), "_start");
  }
}

TEST(UnwindTest, MaxFramesAndTruncatedStack) {
  SelfAddressSpace space;
  CapturedStack cap;
  testing::CaptureChainNoFp(10, &cap);
  Frame frames[4];
  UnwindOptions options;
  UnwindResult r = Unwind(options, cap.regs, cap.snapshot(), space, frames, 4);
  EXPECT_EQ(r.num_frames, 4u);
  EXPECT_EQ(r.stop, StopReason::kMaxFrames);
  // Keep only the first 200 bytes of the stack copy: the walk stops inside it, cleanly.
  StackSnapshot small{cap.stack_start, cap.stack.data(), 200};
  Frame more[64];
  r = Unwind(options, cap.regs, small, space, more, 64);
  EXPECT_EQ(r.stop, StopReason::kStackOutOfRange);
  EXPECT_GE(r.num_frames, 1u);
  EXPECT_LT(r.num_frames, 12u);
}

TEST(UnwindTest, GarbageStackStopsWithoutCrashing) {
  SelfAddressSpace space;
  CapturedStack cap;
  testing::CaptureChainNoFp(5, &cap);
  uint64_t state = 12345;
  for (int iter = 0; iter < 200; ++iter) {
    std::vector<uint8_t> bytes = cap.stack;
    for (size_t i = 0; i < std::min<size_t>(bytes.size(), 4096); ++i) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      if ((state >> 60) == 0) bytes[i] = static_cast<uint8_t>(state >> 32);
    }
    Frame frames[64];
    UnwindOptions options;
    UnwindResult r = Unwind(options, cap.regs, {cap.stack_start, bytes.data(), bytes.size()},
                            space, frames, 64);
    ASSERT_GE(r.num_frames, 1u);
    for (size_t i = 1; i < r.num_frames; ++i) ASSERT_GT(frames[i].sp, frames[i - 1].sp);
  }
}

TEST(UnwindTest, FramePointerFallback) {
  SelfAddressSpace no_rules(/*with_rules=*/false);
  CapturedStack cap;
  testing::CaptureChainFp(6, &cap);
  Frame frames[64];
  UnwindOptions options;
  UnwindResult r = Unwind(options, cap.regs, cap.snapshot(), no_rules, frames, 64);
  ASSERT_GE(r.num_frames, cap.return_addresses.size() + 1) << StopReasonName(r.stop);
  for (size_t i = 0; i < cap.return_addresses.size(); ++i) {
    EXPECT_EQ(frames[i + 1].pc, cap.return_addresses[i]) << i;
  }
  // Without the fallback there is no rule at all.
  options.frame_pointer_fallback = false;
  r = Unwind(options, cap.regs, cap.snapshot(), no_rules, frames, 64);
  EXPECT_EQ(r.num_frames, 1u);
  EXPECT_EQ(r.stop, StopReason::kNoRule);
}

TEST(UnwindTest, PcOutsideModules) {
  SelfAddressSpace space;
  Registers regs{.pc = 0x10, .sp = 0x1000};
  Frame frames[4];
  UnwindResult r = Unwind(UnwindOptions(), regs, StackSnapshot(), space, frames, 4);
  EXPECT_EQ(r.num_frames, 1u);
  EXPECT_EQ(r.stop, StopReason::kNoModule);
}

// A stack captured inside a SIGALRM handler that interrupted a frameless spinning leaf: the
// walk goes through the handler's frames, __restore_rt (a signal-frame row), the interrupted
// leaf at its exact pc, and the interrupted chain up to _start.
TEST(UnwindTest, ThroughSignalFrame) {
  SelfAddressSpace space;
  testing::SignalCapture cap;
  constexpr int kDepth = 6, kHandlerDepth = 3;
  ASSERT_TRUE(testing::CaptureInSignalHandler(kDepth, kHandlerDepth, &cap));
  const size_t h = cap.num_handler;  // HandlerLeaf..HandlerStep x3..OnSignal -> restorer
  ASSERT_EQ(h, static_cast<size_t>(kHandlerDepth + 2));
  ASSERT_EQ(cap.interrupted_return_addresses.size(), static_cast<size_t>(kDepth + 1));
  // The handler's return address is the restorer glibc registered: __restore_rt.
  struct sigaction current;
  ASSERT_EQ(sigaction(SIGALRM, nullptr, &current), 0);
  EXPECT_EQ(cap.handler_return_addresses[h - 1],
            reinterpret_cast<uint64_t>(current.sa_restorer));

  Frame frames[256];
  UnwindOptions options;
  options.frame_pointer_fallback = false;  // CFI alone, signal frame included
  const StackSnapshot snap = cap.stack.snapshot();
  UnwindResult r = Unwind(options, cap.stack.regs, snap, space, frames, 256);
  ASSERT_GT(r.num_frames, h + 1 + cap.interrupted_return_addresses.size())
      << StopReasonName(r.stop) << " after " << r.num_frames << " frames";
  EXPECT_NE(SymbolAt(frames[0].pc).find("HandlerLeaf"), std::string::npos);
  for (size_t i = 0; i < h; ++i) {
    EXPECT_EQ(frames[i + 1].pc, cap.handler_return_addresses[i]) << "handler frame " << i + 1;
  }
  EXPECT_NE(SymbolAt(frames[h - 1].pc).find("OnSignal"), std::string::npos);
  // frames[h] is __restore_rt; its step read the interrupted rip from the ucontext.
  uint64_t saved_pc = 0;
  ASSERT_TRUE(snap.Read64(frames[h].ra_slot, false, &saved_pc));
  EXPECT_EQ(saved_pc, cap.interrupted_pc);
  // The interrupted frame: exact pc and sp of the context, inside the spinning leaf.
  EXPECT_EQ(frames[h + 1].pc, cap.interrupted_pc);
  EXPECT_EQ(frames[h + 1].sp, cap.interrupted_sp);
  // Built with coverage instrumentation (the fuzzing build), the signal may land in a
  // __sanitizer_cov_* callback the leaf calls: the leaf is then the next frame.
  size_t leaf = h + 1;
  if (SymbolAt(frames[leaf].pc).starts_with("__sanitizer_cov")) ++leaf;
  EXPECT_NE(SymbolAt(frames[leaf].pc).find("SpinLeaf"), std::string::npos)
      << SymbolAt(frames[leaf].pc);
  for (size_t i = 0; i < cap.interrupted_return_addresses.size(); ++i) {
    EXPECT_EQ(frames[leaf + 1 + i].pc, cap.interrupted_return_addresses[i])
        << "interrupted " << i;
  }
  for (size_t i = 1; i < r.num_frames; ++i) EXPECT_GT(frames[i].sp, frames[i - 1].sp) << i;
  EXPECT_EQ(r.stop, StopReason::kOutermost) << StopReasonName(r.stop);
  bool saw_main = false;
  for (size_t i = 0; i < r.num_frames; ++i) saw_main |= SymbolAt(frames[i].pc) == "main";
  EXPECT_TRUE(saw_main);
  EXPECT_EQ(SymbolAt(frames[r.num_frames - 1].pc), "_start");

  // The incremental unwinder agrees, sample after sample, and never splices across the
  // signal frame (the second sample of the same stack is unwound in full).
  for (VerifyMode mode : {VerifyMode::kFull, VerifyMode::kBoundary}) {
    IncrementalOptions inc_options;
    inc_options.unwind = options;
    inc_options.verify = mode;
    IncrementalUnwinder inc(inc_options);
    for (int round = 0; round < 2; ++round) {
      Frame got[256];
      SampleStats stats;
      UnwindResult ri = inc.Unwind({cap.stack.regs, snap, 1, false}, space, got, 256, &stats);
      ASSERT_EQ(ri.num_frames, r.num_frames);
      EXPECT_EQ(ri.stop, r.stop);
      for (size_t i = 0; i < r.num_frames; ++i) {
        EXPECT_EQ(got[i].pc, frames[i].pc) << i;
        EXPECT_EQ(got[i].sp, frames[i].sp) << i;
        EXPECT_EQ(got[i].ra_slot, frames[i].ra_slot) << i;
      }
      EXPECT_FALSE(stats.spliced) << VerifyModeName(mode) << " round " << round;
    }
  }

  // The saved context must come from the copy: cut just before the saved rip, the walk stops
  // at __restore_rt with kStackOutOfRange.
  StackSnapshot cut{snap.start, snap.data, static_cast<size_t>(frames[h].ra_slot - snap.start)};
  Frame few[64];
  UnwindResult rc = Unwind(options, cap.stack.regs, cut, space, few, 64);
  EXPECT_EQ(rc.stop, StopReason::kStackOutOfRange);
  EXPECT_EQ(rc.num_frames, h + 1);
}

// The signal-frame row on its own: pc, sp and fp read at sp offsets, bounds-checked.
TEST(StepWithRowTest, SignalFrameRow) {
  uint8_t bytes[256] = {};
  auto put = [&](size_t off, uint64_t v) { std::memcpy(bytes + off, &v, 8); };
  put(120, 0x7ffd0000);  // rbp
  put(160, 0x7ffe0000);  // rsp
  put(168, 0x401234);    // rip
  StackSnapshot stack{0x1000, bytes, sizeof bytes};
  UnwindRow row{UnwindRow::CfaBase::kSp, UnwindRow::RaRule::kSignalFrame,
                UnwindRow::FpRule::kAtCfaOffset, StackSwitch::kNone, 160, 168, 120};
  Registers regs{.pc = 0x500000, .sp = 0x1000, .fp = 7, .ra = 0};
  Registers caller;
  uint64_t slot = 0;
  ASSERT_TRUE(StepWithRow(Arch::kX86_64, row, regs, false, stack, &caller, &slot));
  EXPECT_EQ(caller.pc, 0x401234u);
  EXPECT_EQ(caller.sp, 0x7ffe0000u);
  EXPECT_EQ(caller.fp, 0x7ffd0000u);
  EXPECT_EQ(slot, 0x1000u + 168);
  row.fp_rule = UnwindRow::FpRule::kSame;
  ASSERT_TRUE(StepWithRow(Arch::kX86_64, row, regs, false, stack, &caller, &slot));
  EXPECT_EQ(caller.fp, 7u);
  StackSnapshot short_copy{0x1000, bytes, 168};  // the saved rip is beyond the copy
  EXPECT_FALSE(StepWithRow(Arch::kX86_64, row, regs, false, short_copy, &caller, &slot));
  row.cfa_base = UnwindRow::CfaBase::kFp;  // not a valid signal-frame row
  EXPECT_FALSE(StepWithRow(Arch::kX86_64, row, regs, false, stack, &caller, &slot));
}

// At an epilogue's `ret` GCC's CFI still places rbp at CFA - 16, below sp: popped already,
// so the register holds the caller's value (libprotobuf's InternalMetadata::CheckedDestruct
// ends `pop %rbx; pop %rbp; ret` with rbx at CFA - 24 and rbp at CFA - 16 in force). Reading
// the slot would need bytes below the copy: such samples ended with one frame.
TEST(StepWithRowTest, SaveSlotBelowSpWasPopped) {
  uint8_t bytes[16] = {};
  const uint64_t ra = 0x401234;
  std::memcpy(bytes, &ra, 8);  // the return address at sp
  StackSnapshot stack{0x1000, bytes, sizeof bytes};
  UnwindRow row{UnwindRow::CfaBase::kSp, UnwindRow::RaRule::kAtCfaOffset,
                UnwindRow::FpRule::kAtCfaOffset, StackSwitch::kNone, 8, -8, -16};
  Registers regs{.pc = 0x500000, .sp = 0x1000, .fp = 0x7ffd0000, .ra = 0};
  Registers caller;
  uint64_t slot = 0;
  ASSERT_TRUE(StepWithRow(Arch::kX86_64, row, regs, true, stack, &caller, &slot));
  EXPECT_EQ(caller.pc, ra);
  EXPECT_EQ(caller.sp, 0x1008u);
  EXPECT_EQ(caller.fp, 0x7ffd0000u);
  EXPECT_EQ(slot, 0x1000u);
  // A slot at or above sp is still read, and one there beyond the copy still ends the walk.
  row.cfa_offset = 16;
  row.ra_offset = -16;
  row.fp_offset = -8;
  const uint64_t saved_fp = 0x7ffe0000;
  std::memcpy(bytes + 8, &saved_fp, 8);
  ASSERT_TRUE(StepWithRow(Arch::kX86_64, row, regs, true, stack, &caller, &slot));
  EXPECT_EQ(caller.fp, saved_fp);
  StackSnapshot short_copy{0x1000, bytes, 8};
  EXPECT_FALSE(StepWithRow(Arch::kX86_64, row, regs, true, short_copy, &caller, &slot));
}

TEST(StepWithRowTest, BigEndianAndRegisterRules) {
  uint8_t bytes[32] = {};
  // Big-endian words: RA 0x1122334455667788 at 0x1010, fp 0xaabb at 0x1008.
  const uint8_t ra[8] = {0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88};
  std::memcpy(bytes + 0x10, ra, 8);
  bytes[0x08 + 6] = 0xaa;
  bytes[0x08 + 7] = 0xbb;
  StackSnapshot stack{0x1000, bytes, sizeof bytes};
  UnwindRow row{UnwindRow::CfaBase::kSp, UnwindRow::RaRule::kAtCfaOffset,
                UnwindRow::FpRule::kAtCfaOffset, StackSwitch::kNone, 0x18, -8, -16};
  Registers regs{.pc = 0x400000, .sp = 0x1000, .fp = 7, .ra = 0};
  Registers caller;
  uint64_t slot;
  ASSERT_TRUE(StepWithRow(Arch::kMips64Be, row, regs, true, stack, &caller, &slot));
  EXPECT_EQ(caller.pc, 0x1122334455667788u);
  EXPECT_EQ(caller.fp, 0xaabbu);
  EXPECT_EQ(caller.sp, 0x1018u);
  EXPECT_EQ(slot, 0x1010u);
  row.ra_rule = UnwindRow::RaRule::kInRegister;
  row.fp_rule = UnwindRow::FpRule::kSame;
  regs.ra = 0x400100;
  ASSERT_TRUE(StepWithRow(Arch::kMips64El, row, regs, true, stack, &caller, &slot));
  EXPECT_EQ(caller.pc, 0x400100u);
  EXPECT_EQ(caller.fp, 7u);
  EXPECT_EQ(slot, 0u);
  row.cfa_offset = 0x40;  // RA slot beyond the copy
  row.ra_rule = UnwindRow::RaRule::kAtCfaOffset;
  EXPECT_FALSE(StepWithRow(Arch::kX86_64, row, regs, true, stack, &caller, &slot));
}

}  // namespace
}  // namespace strata::unwind
