#include "agent/golang/goroutine_stacks.h"

#include <cstring>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "agent/python/fake_memory_for_test.h"
#include "common/unwind/go/go_rules.h"
#include "gtest/gtest.h"

namespace strata::agent::golang {
namespace {

using python::testing::FakeMemory;

// Go code at 0x4b0000..0x4b1000 whose frames are 0x28 bytes below their saved rbp (a Go
// function with a frame: rbp saved at the top of it).
class OneFunctionSpace final : public unwind::AddressSpace {
 public:
  class Rules final : public unwind::RuleSource {
   public:
    bool FindRow(uint64_t pc, bool innermost, unwind::UnwindRow* row) const override {
      *row = unwind::go::GoRow(unwind::Arch::kX86_64, 0x28, /*saved_fp=*/!innermost);
      return true;
    }
  };
  bool Lookup(uint64_t pc, const unwind::RuleSource** rules, uint64_t* module_pc) const override {
    if (pc < 0x4b0000 || pc >= 0x4b1000) return false;
    *rules = &rules_;
    *module_pc = pc;
    return true;
  }
  Rules rules_;
};

constexpr uint64_t kM = 0xc000100000, kG0 = 0xc000200000, kCurg = 0xc000300000;
constexpr uint64_t kStackLo = 0xc000400000, kStackHi = 0xc000402000;  // the goroutine's
constexpr uint64_t kG0Lo = 0x7f0000000000, kG0Hi = 0x7f0000010000;   // the thread's
constexpr uint64_t kSchedSp = kStackHi - 0x100, kSchedPc = 0x4a0010, kSchedBp = kStackHi - 0x20;

class GoroutineStacksTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const RuntimeLayout& l = *RuntimeLayoutFor(unwind::Arch::kX86_64);
    auto memory = std::make_unique<FakeMemory>();
    mem_ = memory.get();
    mem_->Map(kM, 0x400);
    mem_->Map(kG0, 0x200);
    mem_->Map(kCurg, 0x200);
    mem_->Map(kStackLo, kStackHi - kStackLo);
    mem_->Map(kG0Hi - 0x1000, 0x1000);
    mem_->Put(kM + l.m_g0, kG0);
    mem_->Put(kM + l.m_curg, kCurg);
    PutG(kG0, kG0Lo, kG0Hi, kG0Hi - 0x800, 0, 0);
    PutG(kCurg, kStackLo, kStackHi, kSchedSp, kSchedPc, kSchedBp);
    mem_->Put(kSchedSp, 0x4b0020);  // systemstack's return address into its caller
    stacks_ = std::make_unique<GoroutineStacks>(unwind::Arch::kX86_64, std::move(memory));
  }
  void PutG(uint64_t g, uint64_t lo, uint64_t hi, uint64_t sp, uint64_t pc, uint64_t bp) {
    const RuntimeLayout& l = *RuntimeLayoutFor(unwind::Arch::kX86_64);
    mem_->Put(g + l.g_stack_lo, lo);
    mem_->Put(g + l.g_stack_hi, hi);
    mem_->Put(g + l.g_m, kM);
    mem_->Put(g + l.g_sched_sp, sp);
    mem_->Put(g + l.g_sched_pc, pc);
    mem_->Put(g + l.g_sched_bp, bp);
  }
  unwind::StackCrossing At(unwind::StackSwitch kind, uint64_t g) {
    // The walk's fp at the switching frame: the frame pointer the switch saved.
    return {unwind::Arch::kX86_64, kind, {0x460005, kG0Hi - 0x900, kSchedBp, 0, 0}, &g0_copy_, g};
  }

  FakeMemory* mem_ = nullptr;
  std::unique_ptr<GoroutineStacks> stacks_;
  unwind::StackSnapshot g0_copy_{};
};

TEST_F(GoroutineStacksTest, SystemStackGoesOnAtTheGoroutinesSavedSp) {
  unwind::CrossedStack to;
  ASSERT_TRUE(stacks_->Cross(At(unwind::StackSwitch::kSystemStack, kG0), &to));
  EXPECT_TRUE(to.restep);
  EXPECT_EQ(to.regs.pc, 0x460005u);  // systemstack's own frame, stepped again there
  EXPECT_EQ(to.regs.sp, kSchedSp);
  EXPECT_EQ(to.regs.fp, kSchedBp);
  EXPECT_EQ(to.g, kCurg);
  // The goroutine's stack from the saved sp to its top.
  EXPECT_EQ(to.stack.start, kSchedSp);
  EXPECT_EQ(to.stack.size, kStackHi - kSchedSp);
  uint64_t ra = 0;
  EXPECT_TRUE(to.stack.Read64(kSchedSp, false, &ra));
  EXPECT_EQ(ra, 0x4b0020u);
  EXPECT_EQ(stacks_->counts().crossed, 1u);
}

TEST_F(GoroutineStacksTest, MorestackAndMcallResumeTheSavedContext) {
  unwind::CrossedStack to;
  ASSERT_TRUE(stacks_->Cross(At(unwind::StackSwitch::kGoroutineContext, kG0), &to));
  EXPECT_FALSE(to.restep);
  EXPECT_EQ(to.regs.pc, kSchedPc);
  EXPECT_EQ(to.regs.sp, kSchedSp);
  EXPECT_EQ(to.regs.fp, kSchedBp);
}

TEST_F(GoroutineStacksTest, EveryReadIsCheckedAndFailuresCounted) {
  const RuntimeLayout& l = *RuntimeLayoutFor(unwind::Arch::kX86_64);
  unwind::CrossedStack to;
  // The g register is no g0 (the sample was on the goroutine's stack, or it is unknown).
  EXPECT_FALSE(stacks_->Cross(At(unwind::StackSwitch::kSystemStack, kCurg), &to));
  EXPECT_FALSE(stacks_->Cross(At(unwind::StackSwitch::kSystemStack, 0), &to));
  EXPECT_EQ(stacks_->counts().no_goroutine, 2u);
  // Unreadable g.
  EXPECT_FALSE(stacks_->Cross(At(unwind::StackSwitch::kSystemStack, 0xdead0000), &to));
  EXPECT_EQ(stacks_->counts().read_failed, 1u);
  // The goroutine moved on since the sample: another m, or its saved sp off its stack.
  mem_->Put(kCurg + l.g_m, kM + 0x1000);
  EXPECT_FALSE(stacks_->Cross(At(unwind::StackSwitch::kSystemStack, kG0), &to));
  mem_->Put(kCurg + l.g_m, kM);
  mem_->Put(kCurg + l.g_sched_sp, 0);  // systemstack clears it on the way back
  EXPECT_FALSE(stacks_->Cross(At(unwind::StackSwitch::kSystemStack, kG0), &to));
  EXPECT_EQ(stacks_->counts().check_failed, 2u);
  // The goroutine switched again since the sample: its saved frame pointer is another.
  mem_->Put(kCurg + l.g_sched_sp, kSchedSp);
  mem_->Put(kCurg + l.g_sched_bp, kSchedBp - 0x40);
  EXPECT_FALSE(stacks_->Cross(At(unwind::StackSwitch::kSystemStack, kG0), &to));
  EXPECT_EQ(stacks_->counts().check_failed, 3u);
  mem_->Put(kCurg + l.g_sched_bp, kSchedBp);
  EXPECT_TRUE(stacks_->Cross(At(unwind::StackSwitch::kSystemStack, kG0), &to));
  // No current goroutine.
  mem_->Put(kM + l.m_curg, 0);
  EXPECT_FALSE(stacks_->Cross(At(unwind::StackSwitch::kSystemStack, kG0), &to));
  EXPECT_EQ(stacks_->counts().no_goroutine, 3u);
  EXPECT_EQ(stacks_->counts().crossed, 1u);
}

TEST_F(GoroutineStacksTest, CgoCallLeadsBackToTheCallingGoroutine) {
  const RuntimeLayout& l = *RuntimeLayoutFor(unwind::Arch::kX86_64);
  // asmcgocall's frame on g0 (the sample's copy): the calling g and its stack depth.
  std::vector<uint8_t> bytes(0x100);
  const uint64_t sp = kG0Hi - 0x900;
  const uint64_t entry_sp = kStackHi - 0x180;
  auto put = [&](uint64_t off, uint64_t v) { std::memcpy(&bytes[off], &v, 8); };
  put(l.cgocall_g, kCurg);
  put(l.cgocall_depth, kStackHi - entry_sp);
  g0_copy_ = {sp, bytes.data(), bytes.size()};
  mem_->Put(entry_sp, 0x4c0042);  // the return address into runtime.cgocall
  mem_->Put(kCurg + l.g_syscallsp, entry_sp + 8);  // cgocall's entersyscall
  unwind::CrossedStack to;
  ASSERT_TRUE(stacks_->Cross(At(unwind::StackSwitch::kCgoCall, 0), &to));
  EXPECT_FALSE(to.restep);
  EXPECT_EQ(to.regs.pc, 0x4c0042u);
  EXPECT_EQ(to.regs.sp, entry_sp + 8);
  EXPECT_EQ(to.g, kCurg);
  EXPECT_EQ(to.stack.start, entry_sp);
  // Already on the system stack (no g saved): the sp it came with, on the same stack.
  put(l.cgocall_g, 0);
  put(l.cgocall_depth, sp + 0x20);
  put(0x20, 0x4d0001);
  ASSERT_TRUE(stacks_->Cross(At(unwind::StackSwitch::kCgoCall, kG0), &to));
  EXPECT_EQ(to.regs.pc, 0x4d0001u);
  EXPECT_EQ(to.regs.sp, sp + 0x28);
  EXPECT_EQ(to.stack.data, bytes.data());
  EXPECT_EQ(to.g, kG0);
  // The g and depth come from the sample's copy: the goroutine need not still run on its m
  // (it is in C until the call returns), but the depth must lie inside its stack.
  put(l.cgocall_g, kCurg);
  put(l.cgocall_depth, kStackHi - entry_sp);
  mem_->Put(kM + l.m_curg, 0);
  EXPECT_TRUE(stacks_->Cross(At(unwind::StackSwitch::kCgoCall, 0), &to));
  put(l.cgocall_depth, kStackHi - kStackLo + 8);
  EXPECT_FALSE(stacks_->Cross(At(unwind::StackSwitch::kCgoCall, 0), &to));
  EXPECT_EQ(stacks_->counts().check_failed, 1u);
  // The call returned since (exitsyscall cleared the saved sp): its frames may be gone.
  put(l.cgocall_depth, kStackHi - entry_sp);
  mem_->Put(kCurg + l.g_syscallsp, 0);
  EXPECT_FALSE(stacks_->Cross(At(unwind::StackSwitch::kCgoCall, 0), &to));
  // ... unless a callback runs on it, whose crossing to g0 the walk came through.
  mem_->Put(kM + l.m_curg, kCurg);
  EXPECT_TRUE(stacks_->Cross(At(unwind::StackSwitch::kCgoCall, kG0), &to));
  EXPECT_EQ(stacks_->counts().check_failed, 2u);
}

TEST_F(GoroutineStacksTest, CgoCallbackGoesOnOnG0AtItsSavedSp) {
  // cgocallback's frame on g0: the g0.sched.sp it replaced, restored on return.
  mem_->Put(kG0Hi - 0x800, kG0Hi - 0x100);
  unwind::CrossedStack to;
  ASSERT_TRUE(stacks_->Cross(At(unwind::StackSwitch::kCgoCallback, kCurg), &to));
  EXPECT_TRUE(to.restep);
  EXPECT_EQ(to.regs.sp, kG0Hi - 0x800);
  EXPECT_EQ(to.g, kG0);
  EXPECT_EQ(to.stack.start, kG0Hi - 0x800);
  EXPECT_EQ(to.stack.size, 0x800u);
  // Not in a callback any more (g0.sched.sp holds no saved one), or the m runs another
  // goroutine by now: on the goroutine's stack, as Go's traceback goes, without the C frames.
  // cgocallback's frame there (0x28 below its CFA, the same frame as on g0) holds the
  // goroutine's saved pc: systemstack_switch's entry (Go 1.19), no return address, so the
  // word above it is the return address into runtime.cgocall.
  mem_->Put(kG0Hi - 0x800, 0x1234);
  OneFunctionSpace space;
  std::vector<uint8_t> bytes(0x100);
  auto put = [&](uint64_t off, uint64_t v) { std::memcpy(&bytes[off], &v, 8); };
  put(0x28, 0x463920);   // the pushed pc: in no function
  put(0x30, 0x4b0042);   // the return address into runtime.cgocall
  const uint64_t sp = kStackHi - 0x100;
  g0_copy_ = {sp, bytes.data(), bytes.size()};
  unwind::StackCrossing at = At(unwind::StackSwitch::kCgoCallback, kCurg);
  at.regs = {0x4b0010, sp, 0, 0, 0};
  at.space = &space;
  ASSERT_TRUE(stacks_->Cross(at, &to));
  EXPECT_EQ(stacks_->counts().check_failed, 1u);
  EXPECT_FALSE(to.restep);
  EXPECT_EQ(to.regs.pc, 0x4b0042u);
  EXPECT_EQ(to.regs.sp, sp + 0x38);
  EXPECT_EQ(to.stack.data, g0_copy_.data);
  EXPECT_EQ(to.g, kCurg);
  // A pushed pc that is a return address (later releases) is the caller itself.
  put(0x28, 0x4b0080);
  mem_->Put(kM + RuntimeLayoutFor(unwind::Arch::kX86_64)->m_curg, 0);
  ASSERT_TRUE(stacks_->Cross(at, &to));
  EXPECT_EQ(to.regs.pc, 0x4b0080u);
  EXPECT_EQ(to.regs.sp, sp + 0x30);
  EXPECT_EQ(stacks_->counts().no_goroutine, 1u);
  EXPECT_EQ(stacks_->counts().callbacks_without_c, 2u);
}

TEST_F(GoroutineStacksTest, SystemStackLeftSinceIsFoundByItsFramePointer) {
  const RuntimeLayout& l = *RuntimeLayoutFor(unwind::Arch::kX86_64);
  // The goroutine left the system stack since (systemstack clears the saved sp on return):
  // no saved state to cross with, but the m still runs it.
  mem_->Put(kCurg + l.g_sched_sp, 0);
  OneFunctionSpace space;
  // systemstack's caller saved its caller's rbp at kSchedBp; its return address from the
  // call into systemstack sits where its frame (0x28 below the saved rbp) began.
  const uint64_t slot = kSchedBp - 0x28;
  mem_->Put(slot, 0x4b0020);
  mem_->Put(slot + 0x10, 0x4b0999);  // a return address at a slot that does not fit
  unwind::StackCrossing at = At(unwind::StackSwitch::kSystemStack, kG0);
  at.space = &space;
  unwind::CrossedStack to;
  ASSERT_TRUE(stacks_->Cross(at, &to));
  EXPECT_TRUE(to.restep);
  EXPECT_EQ(to.regs.sp, slot);
  EXPECT_EQ(to.regs.fp, kSchedBp);
  uint64_t ra = 0;
  ASSERT_TRUE(to.stack.Read64(slot, false, &ra));
  EXPECT_EQ(ra, 0x4b0020u);
  EXPECT_EQ(stacks_->counts().by_frame_pointer, 1u);
  // Nothing that fits (the frames were overwritten): not crossed.
  mem_->Put(slot, 0x123);
  EXPECT_FALSE(stacks_->Cross(at, &to));
  // Without the walk's address space to check code addresses: no search.
  at.space = nullptr;
  mem_->Put(slot, 0x4b0020);
  EXPECT_FALSE(stacks_->Cross(at, &to));
  // Nor when the m runs no goroutine any more (its stack may have been reused by another).
  at.space = &space;
  mem_->Put(kM + l.m_curg, 0);
  EXPECT_FALSE(stacks_->Cross(at, &to));
  EXPECT_EQ(stacks_->counts().crossed, 1u);
}

// Go code at 0x4b0000 (frames 0x28 below their saved rbp), runtime.systemstack at 0x460000
// (no frame; a stack switch), runtime.goexit at 0x4c0000 (a root); crossings by `stacks`.
class GoroutineSpace final : public unwind::AddressSpace {
 public:
  class Rules final : public unwind::RuleSource {
   public:
    bool FindRow(uint64_t pc, bool innermost, unwind::UnwindRow* row) const override {
      const uint64_t at = innermost ? pc : pc - 1;
      if (at >= 0x460000 && at < 0x461000) {
        *row = unwind::go::GoRow(unwind::Arch::kX86_64, 0);
        row->ra_rule = unwind::UnwindRow::RaRule::kStackSwitch;
        row->stack_switch = unwind::StackSwitch::kSystemStack;
      } else if (at >= 0x4c0000 && at < 0x4c1000) {
        *row = unwind::UnwindRow{};
        row->cfa_base = unwind::UnwindRow::CfaBase::kSp;
        row->ra_rule = unwind::UnwindRow::RaRule::kUndefined;
      } else {
        *row = unwind::go::GoRow(unwind::Arch::kX86_64, 0x28, /*saved_fp=*/!innermost);
      }
      return true;
    }
  };
  explicit GoroutineSpace(const GoroutineStacks& stacks) : stacks_(stacks) {}
  bool Lookup(uint64_t pc, const unwind::RuleSource** rules, uint64_t* module_pc) const override {
    if (!((pc >= 0x4b0000 && pc < 0x4b1000) || (pc >= 0x460000 && pc < 0x461000) ||
          (pc > 0x4c0000 && pc <= 0x4c1000))) {
      return false;
    }
    *rules = &rules_;
    *module_pc = pc;
    return true;
  }
  bool CrossStack(const unwind::StackCrossing& at, unwind::CrossedStack* to) const override {
    return stacks_.Cross(at, to);
  }
  Rules rules_;
  const GoroutineStacks& stacks_;
};

// The goroutine left the system stack before the read, but the sample carries the kernel's
// frame-pointer walk: its callers are as they were at the sample, found through systemstack's
// caller's saved rbp. Walked by the real unwinding loop.
TEST_F(GoroutineStacksTest, SystemStackLeftSinceIsCrossedWithTheSamplesFrameChain) {
  const RuntimeLayout& l = *RuntimeLayoutFor(unwind::Arch::kX86_64);
  mem_->Put(kCurg + l.g_sched_sp, 0);  // systemstack returned: no saved state
  GoroutineSpace space(*stacks_);
  // The sample, on g0: a Go function (frame 0x28, rbp still the goroutine's) called by
  // systemstack.
  const uint64_t sp = kG0Hi - 0x900;
  std::vector<uint8_t> g0(0x100, 0);
  const uint64_t into_systemstack = 0x460005;
  std::memcpy(g0.data() + 0x28, &into_systemstack, 8);
  // The kernel's walk: the pc, systemstack's return address, then from kSchedBp up: A, B and
  // goexit (systemstack's caller C is not in it: its call pushed no frame record).
  std::vector<uint64_t> chain = {0x4b0300, into_systemstack, 0x4b0100, 0x4b0200, 0x4c0010};
  unwind::StackSnapshot copy{sp, g0.data(), g0.size(), chain.data(), chain.size()};
  const unwind::Registers regs{0x4b0300, sp, kSchedBp, 0, kG0};
  auto walk = [&](std::vector<uint64_t>* pcs) {
    unwind::UnwindOptions options;
    std::vector<unwind::Frame> frames(16);
    const unwind::UnwindResult r =
        unwind::Unwind(options, regs, copy, space, frames.data(), frames.size());
    pcs->clear();
    for (size_t i = 0; i < r.num_frames; ++i) pcs->push_back(frames[i].pc);
    return r.stop;
  };
  std::vector<uint64_t> pcs;
  // C's frame is still in memory, returning where the chain says: C is shown too.
  const uint64_t slot = kSchedBp - 0x28;
  mem_->Put(slot, 0x4b0020);
  mem_->Put(kSchedBp + 8, 0x4b0100);
  EXPECT_EQ(walk(&pcs), unwind::StopReason::kOutermost);
  EXPECT_EQ(pcs, (std::vector<uint64_t>{0x4b0300, into_systemstack, 0x4b0020, 0x4b0100,
                                        0x4b0200, 0x4c0010}));
  EXPECT_EQ(stacks_->counts().by_frame_chain, 1u);
  // The memory moved on (C's caller calls elsewhere now): the sample's callers without C.
  mem_->Put(kSchedBp + 8, 0x4b0180);
  EXPECT_EQ(walk(&pcs), unwind::StopReason::kOutermost);
  EXPECT_EQ(pcs, (std::vector<uint64_t>{0x4b0300, into_systemstack, 0x4b0100, 0x4b0200,
                                        0x4c0010}));
  EXPECT_EQ(stacks_->counts().frame_chain_without_caller, 1u);
  // A chain cut short (the kernel's bound on its length) is not a complete stack.
  copy.frame_chain_size = 4;
  EXPECT_NE(walk(&pcs), unwind::StopReason::kOutermost);
  EXPECT_EQ(pcs, (std::vector<uint64_t>{0x4b0300, into_systemstack, 0x4b0100, 0x4b0200}));
  // Without a chain, the frame-pointer search of memory as before (nothing fits there now).
  copy.frame_chain_size = 0;
  mem_->Put(slot, 0x123);
  walk(&pcs);
  EXPECT_EQ(pcs, (std::vector<uint64_t>{0x4b0300, into_systemstack}));
  EXPECT_EQ(stacks_->counts().by_frame_chain, 3u);
}

// MIPS64: m.curg 8 bytes further (a 16-byte signal mask), no frame pointer to check a
// systemstack switch with, and morestack's caller (its return address in gobuf.lr) not crossed.
TEST(GoroutineStacksMips64Test, SystemStackAndMcallCrossWithoutFramePointers) {
  const RuntimeLayout& l = *RuntimeLayoutFor(unwind::Arch::kMips64El);
  EXPECT_EQ(RuntimeLayoutFor(unwind::Arch::kMips64Be), &l);
  EXPECT_EQ(l.m_curg, RuntimeLayoutFor(unwind::Arch::kX86_64)->m_curg + 8);
  EXPECT_FALSE(l.frame_pointers);
  auto memory = std::make_unique<FakeMemory>();
  FakeMemory& mem = *memory;
  mem.Map(kM, 0x400);
  mem.Map(kG0, 0x200);
  mem.Map(kCurg, 0x200);
  mem.Map(kStackLo, kStackHi - kStackLo);
  mem.Put(kM + l.m_g0, kG0);
  mem.Put(kM + l.m_curg, kCurg);
  for (const auto& [g, lo, hi, sp] : {std::tuple{kG0, kG0Lo, kG0Hi, kG0Hi - 0x800},
                                      std::tuple{kCurg, kStackLo, kStackHi, kSchedSp}}) {
    mem.Put(g + l.g_stack_lo, lo);
    mem.Put(g + l.g_stack_hi, hi);
    mem.Put(g + l.g_m, kM);
    mem.Put(g + l.g_sched_sp, sp);
  }
  mem.Put(kCurg + l.g_sched_pc, kSchedPc);
  GoroutineStacks stacks(unwind::Arch::kMips64El, std::move(memory));
  unwind::StackSnapshot copy;
  // The walk's fp is r30, which is g itself on MIPS64: not a frame pointer to compare.
  const unwind::StackCrossing at{unwind::Arch::kMips64El, unwind::StackSwitch::kSystemStack,
                                 {0x460005, kG0Hi - 0x900, kG0, 0, 0}, &copy, kG0};
  unwind::CrossedStack to;
  ASSERT_TRUE(stacks.Cross(at, &to));
  EXPECT_TRUE(to.restep);
  EXPECT_EQ(to.regs.sp, kSchedSp);
  EXPECT_EQ(to.g, kCurg);
  EXPECT_EQ(to.stack.start, kSchedSp);
  // mcall saved its caller's pc and sp (gobuf.lr 0) ...
  unwind::StackCrossing mcall = at;
  mcall.kind = unwind::StackSwitch::kGoroutineContext;
  ASSERT_TRUE(stacks.Cross(mcall, &to));
  EXPECT_FALSE(to.restep);
  EXPECT_EQ(to.regs.pc, kSchedPc);
  // ... morestack also the link register of the function that grew its stack: not crossed.
  mem.Put(kCurg + l.g_sched_lr, 0x4b0040);
  EXPECT_FALSE(stacks.Cross(mcall, &to));
  EXPECT_EQ(stacks.counts().crossed, 2u);
  EXPECT_EQ(stacks.counts().check_failed, 1u);
  // The x86-64 frame-pointer search has nothing to go by: a goroutine that left is not crossed.
  mem.Put(kM + l.m_curg, 0);
  EXPECT_FALSE(stacks.Cross(at, &to));
  EXPECT_EQ(stacks.counts().by_frame_pointer, 0u);
}

}  // namespace
}  // namespace strata::agent::golang
