// Go's stack switches crossed by the one loop (walk.h): hand-made Go frames on g0 and on a
// goroutine's stack, with an address space whose CrossStack hands over the other stack as the
// agent's reader of the runtime's memory would. Plain and incremental unwinding agree, a
// refused crossing ends the stack as a root did, and nothing is spliced across a switch.
#include <cstring>
#include <map>
#include <vector>

#include "common/unwind/go/go_rules.h"
#include "common/unwind/incremental.h"
#include "gtest/gtest.h"

namespace strata::unwind::go {
namespace {

// Functions of one module at its link address: [start, start + 0x100), each with one SP delta.
constexpr uint64_t kLeaf = 0x1000, kFn = 0x1100, kSystemStack = 0x1200, kMallocgc = 0x1300,
                   kMain = 0x1400, kGoexit = 0x1500, kEnd = 0x1600;

class FakeGoRules final : public RuleSource {
 public:
  bool FindRow(uint64_t pc, bool innermost, UnwindRow* row) const override {
    const uint64_t at = innermost ? pc : pc - 1;
    if (at < kLeaf || at >= kEnd) return false;
    const uint64_t f = at & ~uint64_t{0xff};
    if (f == kGoexit) {
      *row = UnwindRow{};
      row->cfa_base = UnwindRow::CfaBase::kSp;
      return true;
    }
    static const std::map<uint64_t, int32_t> kDelta = {
        {kLeaf, 0x10}, {kFn, 0x20}, {kSystemStack, 0}, {kMallocgc, 0x30}, {kMain, 0x18}};
    *row = GoRow(Arch::kX86_64, kDelta.at(f));
    if (f == kSystemStack) {
      row->ra_rule = UnwindRow::RaRule::kStackSwitch;
      row->stack_switch = switch_kind;
    }
    return true;
  }
  StackSwitch switch_kind = StackSwitch::kSystemStack;
};

// A stack's bytes at `start`, written word by word.
struct Memory {
  uint64_t start;
  std::vector<uint8_t> bytes = std::vector<uint8_t>(0x100);
  void Put(uint64_t addr, uint64_t value) { std::memcpy(&bytes[addr - start], &value, 8); }
  StackSnapshot Snapshot() const { return {start, bytes.data(), bytes.size()}; }
};

constexpr uint64_t kG0 = 0xc000000100, kCurg = 0xc000000200;

class SwitchingSpace final : public AddressSpace {
 public:
  bool Lookup(uint64_t pc, const RuleSource** rules, uint64_t* module_pc) const override {
    if (pc < kLeaf || pc >= kEnd) return false;
    *rules = &rules_;
    *module_pc = pc;
    return true;
  }
  bool CrossStack(const StackCrossing& at, CrossedStack* to) const override {
    ++asked;
    last = at;
    last_stack_start = at.stack->start;
    if (!cross || at.g != kG0) return false;
    to->stack = goroutine.Snapshot();
    to->g = kCurg;
    to->restep = at.kind == StackSwitch::kSystemStack;
    // systemstack: its own frame at the saved sp; the others: the saved context.
    to->regs = {to->restep ? at.regs.pc : kMallocgc + 0x10, goroutine.start + (to->restep ? 0 : 8),
                0x1234, 0, 0};
    return true;
  }

  FakeGoRules rules_;
  // The goroutine's stack lies below g0's: a crossing may go either way.
  Memory goroutine{0x8000};
  bool cross = true;
  mutable int asked = 0;
  mutable StackCrossing last;  // (its stack pointer is the walk's: dangling after it)
  mutable uint64_t last_stack_start = 0;
};

class StackSwitchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // g0: leaf <- fn <- systemstack (called by the runtime's fn closure call).
    g0_.Put(0x10010, kFn + 0x10);
    g0_.Put(0x10038, kSystemStack + 5);
    // The goroutine: systemstack's return address at the saved sp, then mallocgc <- main <-
    // goexit.
    space_.goroutine.Put(0x8000, kMallocgc + 0x10);
    space_.goroutine.Put(0x8038, kMain + 8);
    space_.goroutine.Put(0x8058, kGoexit + 1);
  }
  std::vector<uint64_t> Pcs(const Frame* frames, size_t n) {
    std::vector<uint64_t> pcs;
    for (size_t i = 0; i < n; ++i) pcs.push_back(frames[i].pc);
    return pcs;
  }

  Memory g0_{0x10000};
  SwitchingSpace space_;
  Registers regs_{.pc = kLeaf + 4, .sp = 0x10000, .fp = 0, .ra = 0, .g = kG0};
  UnwindOptions options_;
};

TEST_F(StackSwitchTest, SystemStackContinuesOnTheGoroutineToItsRoot) {
  Frame frames[16];
  const UnwindResult r = Unwind(options_, regs_, g0_.Snapshot(), space_, frames, 16);
  EXPECT_EQ(r.stop, StopReason::kOutermost);
  EXPECT_EQ(r.stack_crossings, 1u);
  EXPECT_EQ(r.crossings_failed, 0u);
  EXPECT_EQ(Pcs(frames, r.num_frames),
            (std::vector<uint64_t>{kLeaf + 4, kFn + 0x10, kSystemStack + 5, kMallocgc + 0x10,
                                   kMain + 8, kGoexit + 1}));
  // The crossing saw the switching frame on g0, with the sample's g.
  EXPECT_EQ(space_.last.kind, StackSwitch::kSystemStack);
  EXPECT_EQ(space_.last.regs.sp, 0x10040u);
  EXPECT_EQ(space_.last.g, kG0);
  EXPECT_EQ(space_.last_stack_start, 0x10000u);
  // Frames past the switch are on the goroutine's stack; none has a slot on the sample's.
  EXPECT_EQ(frames[3].sp, 0x8008u);
  EXPECT_EQ(frames[2].ra_slot, 0u);
  EXPECT_EQ(frames[3].ra_slot, 0x8008u + 0x30);
}

TEST_F(StackSwitchTest, SavedContextIsTheCaller) {
  space_.rules_.switch_kind = StackSwitch::kGoroutineContext;  // morestack, mcall
  Frame frames[16];
  const UnwindResult r = Unwind(options_, regs_, g0_.Snapshot(), space_, frames, 16);
  EXPECT_EQ(r.stop, StopReason::kOutermost);
  EXPECT_EQ(r.stack_crossings, 1u);
  EXPECT_EQ(Pcs(frames, r.num_frames),
            (std::vector<uint64_t>{kLeaf + 4, kFn + 0x10, kSystemStack + 5, kMallocgc + 0x10,
                                   kMain + 8, kGoexit + 1}));
}

TEST_F(StackSwitchTest, RefusedCrossingEndsTheStackAsARoot) {
  space_.cross = false;
  Frame frames[16];
  const UnwindResult r = Unwind(options_, regs_, g0_.Snapshot(), space_, frames, 16);
  EXPECT_EQ(r.stop, StopReason::kOutermost);
  EXPECT_EQ(r.stack_crossings, 0u);
  EXPECT_EQ(r.crossings_failed, 1u);
  EXPECT_EQ(r.num_frames, 3u);  // ... systemstack, as before crossings
  // A crossing whose caller is implausible (no module there) counts as not crossed too.
  space_.cross = true;
  space_.goroutine.Put(0x8000, 0x99999);
  const UnwindResult bad = Unwind(options_, regs_, g0_.Snapshot(), space_, frames, 16);
  EXPECT_EQ(bad.stop, StopReason::kOutermost);
  EXPECT_EQ(bad.crossings_failed, 1u);
  EXPECT_EQ(bad.num_frames, 3u);
}

TEST_F(StackSwitchTest, NoSpaceCrossesByDefault) {
  // An address space without crossings (the in-process sampler's, tests'): a root, as before.
  class Plain final : public AddressSpace {
   public:
    bool Lookup(uint64_t pc, const RuleSource** rules, uint64_t* module_pc) const override {
      return inner->Lookup(pc, rules, module_pc);
    }
    const SwitchingSpace* inner;
  } plain;
  plain.inner = &space_;
  Frame frames[16];
  const UnwindResult r = Unwind(options_, regs_, g0_.Snapshot(), plain, frames, 16);
  EXPECT_EQ(r.stop, StopReason::kOutermost);
  EXPECT_EQ(r.num_frames, 3u);
}

TEST_F(StackSwitchTest, IncrementalUnwindingAgreesAndNeverSplicesAcross) {
  for (VerifyMode mode : {VerifyMode::kFull, VerifyMode::kBoundary}) {
    IncrementalOptions options;
    options.verify = mode;
    IncrementalUnwinder unwinder(options);
    Frame expected[16], frames[16];
    const UnwindResult full = Unwind(options_, regs_, g0_.Snapshot(), space_, expected, 16);
    for (int sample = 0; sample < 3; ++sample) {
      SampleStats stats;
      const UnwindResult r =
          unwinder.Unwind({regs_, g0_.Snapshot(), 1, false}, space_, frames, 16, &stats);
      ASSERT_EQ(r.num_frames, full.num_frames) << VerifyModeName(mode);
      EXPECT_EQ(r.stop, full.stop);
      EXPECT_EQ(r.stack_crossings, 1u);
      EXPECT_EQ(Pcs(frames, r.num_frames), Pcs(expected, full.num_frames));
      EXPECT_FALSE(stats.spliced) << sample;  // the cache holds a switch: in full
      EXPECT_EQ(stats.frames_reused, 0u);
    }
    // A sample on the goroutine's own stack after one that crossed: unwound in full, then
    // reused again from the next sample on.
    Memory stack{0x7f00};
    stack.bytes.resize(0x200);
    stack.Put(0x7f10, kMain + 8);            // leaf (delta 0x10) returns into main
    stack.Put(0x7f18 + 0x18, kGoexit + 1);   // main's return address into goexit
    const Registers on_goroutine{.pc = kLeaf + 4, .sp = 0x7f00, .fp = 0, .ra = 0, .g = kCurg};
    SampleStats first, second;
    unwinder.Unwind({on_goroutine, stack.Snapshot(), 1, false}, space_, frames, 16, &first);
    const UnwindResult again =
        unwinder.Unwind({on_goroutine, stack.Snapshot(), 1, false}, space_, frames, 16, &second);
    EXPECT_FALSE(first.spliced);
    EXPECT_TRUE(second.spliced) << VerifyModeName(mode);
    EXPECT_EQ(again.num_frames, 3u);
    EXPECT_EQ(again.stop, StopReason::kOutermost);
  }
}

}  // namespace
}  // namespace strata::unwind::go
