// IncrementalUnwinder against unwind::Unwind(): over synthetic stacks (x86-64 and big-endian
// MIPS64 layouts, a persistent stack buffer so stale return addresses of returned frames stay
// in memory like on a real stack) and over real captured stacks of this process.
#include "common/unwind/incremental.h"

#include <algorithm>
#include <cstdlib>
#include <new>
#include <random>
#include <vector>

#include "common/unwind/unwind_test_chain.h"
#include "common/unwind/unwind_test_space.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

// Allocation counter for the steady-state check (this binary only).
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
namespace {
thread_local bool g_count_allocations = false;
thread_local size_t g_allocations = 0;
}  // namespace
void* operator new(size_t size) {
  if (g_count_allocations) ++g_allocations;
  void* p = std::malloc(size == 0 ? 1 : size);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }

namespace strata::unwind {
namespace {

// ---------------------------------------------------------------------------- synthetic

// Functions live at 0x10000 * id (id 1..15); a function's frame is 16 + 16 * (id % 5) bytes, the
// return address is at CFA - 8, the frame pointer is not saved. Function 1 is the outermost
// (return address undefined).
uint64_t FuncPc(int id, int call_site) { return 0x10000ull * id + 0x40 + 8 * call_site; }
int FuncId(uint64_t pc) { return static_cast<int>(pc >> 16); }
int32_t FrameSize(int id) { return 16 + 16 * (id % 5); }

class SyntheticRules final : public RuleSource {
 public:
  bool FindRow(uint64_t pc, bool innermost, UnwindRow* row) const override {
    int id = FuncId(innermost ? pc : pc - 1);
    if (id < 1 || id > 15) return false;
    row->cfa_base = UnwindRow::CfaBase::kSp;
    row->ra_rule = id == 1 ? UnwindRow::RaRule::kUndefined : UnwindRow::RaRule::kAtCfaOffset;
    row->fp_rule = UnwindRow::FpRule::kSame;
    row->cfa_offset = FrameSize(id);
    row->ra_offset = -8;
    return true;
  }
};

class SyntheticSpace final : public AddressSpace {
 public:
  bool Lookup(uint64_t pc, const RuleSource** rules, uint64_t* module_pc) const override {
    if (pc < 0x10000 || pc >= 0x100000) return false;
    *rules = &rules_;
    *module_pc = pc;
    return true;
  }

 private:
  SyntheticRules rules_;
};

// A thread's stack memory: [kTop - kSize, kTop). Frames are written into it and never
// cleared, so returned frames leave their return addresses behind.
class SyntheticStack {
 public:
  static constexpr uint64_t kTop = 0x7fff0000;
  static constexpr size_t kSize = 64 * 1024;

  explicit SyntheticStack(Arch arch) : arch_(arch), mem_(kSize, 0xcc) {}

  // `pcs` outermost first: pcs[0] in function 1, the others the pcs of the callees (a
  // caller's pc is its return address). Returns the sample's registers.
  Registers Build(const std::vector<uint64_t>& pcs) {
    uint64_t sp = kTop - 64 - FrameSize(1);
    for (size_t k = 1; k < pcs.size(); ++k) {
      Write(sp - 8, pcs[k - 1]);
      sp -= FrameSize(FuncId(pcs[k]));
    }
    return {pcs.back(), sp, 0x1234, 0};
  }
  StackSnapshot Snapshot(uint64_t sp, size_t max_bytes = kSize) const {
    size_t len = std::min<uint64_t>(kTop - sp, max_bytes);
    return {sp, mem_.data() + (sp - (kTop - kSize)), len};
  }
  void Write(uint64_t addr, uint64_t value) {
    if (IsBigEndian(arch_)) value = __builtin_bswap64(value);
    std::memcpy(mem_.data() + (addr - (kTop - kSize)), &value, 8);
  }

 private:
  Arch arch_;
  std::vector<uint8_t> mem_;
};

void ExpectSameFrames(const Frame* a, const UnwindResult& ra, const Frame* b,
                      const UnwindResult& rb, const char* what) {
  ASSERT_EQ(ra.num_frames, rb.num_frames) << what;
  EXPECT_EQ(ra.stop, rb.stop) << what << ": " << StopReasonName(ra.stop) << " vs "
                              << StopReasonName(rb.stop);
  for (size_t i = 0; i < ra.num_frames; ++i) {
    EXPECT_EQ(a[i].pc, b[i].pc) << what << " frame " << i;
    EXPECT_EQ(a[i].sp, b[i].sp) << what << " frame " << i;
    EXPECT_EQ(a[i].ra_slot, b[i].ra_slot) << what << " frame " << i;
  }
}

IncrementalOptions Options(Arch arch, VerifyMode mode, size_t max_frames = 256) {
  IncrementalOptions o;
  o.unwind.arch = arch;
  o.unwind.max_frames = max_frames;
  o.verify = mode;
  return o;
}

class RandomSequenceTest : public ::testing::TestWithParam<std::tuple<Arch, VerifyMode>> {};

// Random walk of call chains: each sample keeps an outer prefix of the previous one (usually
// all but a few frames) and calls new functions below it. New frames get call sites unique
// to the sample, so a cached element can only match inside the kept prefix. Sometimes an
// element inside the kept prefix changes (a frame returned and its caller called elsewhere
// at the same depth): kFull must still equal a full unwind; kBoundary compares only the
// splice element and may keep the stale outer part, by design.
TEST_P(RandomSequenceTest, EqualsFullUnwind) {
  const auto [arch, mode] = GetParam();
  SyntheticSpace space;
  SyntheticStack mem(arch);
  IncrementalUnwinder inc(Options(arch, mode));
  UnwindOptions full_options;
  full_options.arch = arch;
  std::mt19937 rng(42);
  std::vector<uint64_t> pcs = {FuncPc(1, 0)};
  Frame want[256], got[256];
  size_t exact = 0, reused = 0, unwound = 0;
  // Outermost changed element kBoundary may not have seen yet (SIZE_MAX: none). The cache
  // is clean again once a sample keeps no frame at or outside it.
  size_t dirty = SIZE_MAX;
  for (int sample = 0; sample < 3000; ++sample) {
    const bool jump = rng() % 20 == 0;
    size_t keep = jump ? 1 + rng() % pcs.size()
                       : std::max<size_t>(1, pcs.size() - std::min<size_t>(pcs.size(), rng() % 4));
    pcs.resize(keep);
    if (keep <= dirty) dirty = SIZE_MAX;
    if (keep > 2 && rng() % 50 == 0) {
      size_t k = 1 + rng() % (keep - 2);
      pcs[k] = FuncPc(FuncId(pcs[k]), static_cast<int>(rng() % 4));
      dirty = std::min(dirty, k);
    }
    const bool mutated = dirty != SIZE_MAX;
    size_t depth = jump ? 2 + rng() % 199 : keep + rng() % 4;
    while (pcs.size() < depth) {
      pcs.push_back(FuncPc(2 + static_cast<int>(rng() % 14), sample % 4096));
    }
    Registers regs = mem.Build(pcs);
    // Mostly 16 KiB copies; sometimes 1..4 KiB ones that lose the outermost frames.
    size_t copy = rng() % 20 == 0 ? (1 + rng() % 4) * 1024 : 16 * 1024;
    StackSnapshot stack = mem.Snapshot(regs.sp, copy);
    UnwindResult w = Unwind(full_options, regs, stack, space, want, 256);
    SampleStats st;
    UnwindResult g = inc.Unwind({regs, stack, 7, false}, space, got, 256, &st);
    reused += st.frames_reused;
    unwound += st.frames_unwound;
    if (mode == VerifyMode::kFull || mode == VerifyMode::kOff) {
      ExpectSameFrames(want, w, got, g, "sample");
      ++exact;
    } else if (!mutated && st.frames_beyond_copy == 0) {
      ExpectSameFrames(want, w, got, g, "sample");
      ++exact;
    } else if (st.frames_beyond_copy > 0 && !mutated) {
      // Frames beyond the copy are reused in kBoundary: the full unwind is a prefix.
      ASSERT_GE(g.num_frames, w.num_frames);
      EXPECT_EQ(w.stop, StopReason::kStackOutOfRange);
      ASSERT_LE(g.num_frames, pcs.size());
      for (size_t i = 0; i < g.num_frames; ++i) EXPECT_EQ(got[i].pc, pcs[pcs.size() - 1 - i]);
    }
    if (::testing::Test::HasFailure()) break;
  }
  EXPECT_GT(exact, mode == VerifyMode::kBoundary ? 1000u : 2990u);
  if (mode != VerifyMode::kOff) {
    EXPECT_GT(reused, 3 * unwound) << "reuse should dominate";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Modes, RandomSequenceTest,
    ::testing::Combine(::testing::Values(Arch::kX86_64, Arch::kMips64Be),
                       ::testing::Values(VerifyMode::kOff, VerifyMode::kBoundary,
                                         VerifyMode::kFull)),
    [](const auto& info) {
      return std::string(ArchName(std::get<0>(info.param))) == "mips64"
                 ? "mips64be_" + std::string(VerifyModeName(std::get<1>(info.param)))
                 : std::string(ArchName(std::get<0>(info.param))) + "_" +
                       std::string(VerifyModeName(std::get<1>(info.param)));
    });

std::vector<uint64_t> Chain(size_t depth, int variant) {
  std::vector<uint64_t> pcs = {FuncPc(1, 0)};
  for (size_t i = 1; i < depth; ++i) pcs.push_back(FuncPc(2 + i % 13, static_cast<int>(i % 3)));
  pcs.back() = FuncPc(15, variant);
  return pcs;
}

TEST(IncrementalTest, SteadyStateUnwindsOnlyTheLeafSide) {
  SyntheticSpace space;
  SyntheticStack mem(Arch::kX86_64);
  for (VerifyMode mode : {VerifyMode::kBoundary, VerifyMode::kFull}) {
    IncrementalUnwinder inc(Options(Arch::kX86_64, mode));
    Frame got[256];
    std::vector<uint64_t> pcs = Chain(100, 0);
    Registers regs = mem.Build(pcs);
    SampleStats st;
    inc.Unwind({regs, mem.Snapshot(regs.sp), 1, false}, space, got, 256, &st);
    EXPECT_FALSE(st.spliced);
    EXPECT_EQ(st.frames_unwound, 100u);
    // The leaf moves within its function and calls one level deeper: two frames are new.
    pcs.back() = FuncPc(15, 1);
    pcs.push_back(FuncPc(3, 2));
    regs = mem.Build(pcs);
    UnwindResult r = inc.Unwind({regs, mem.Snapshot(regs.sp), 1, false}, space, got, 256, &st);
    EXPECT_TRUE(st.spliced);
    EXPECT_EQ(r.num_frames, 101u);
    EXPECT_EQ(r.stop, StopReason::kOutermost);
    EXPECT_EQ(st.frames_unwound, 2u);
    EXPECT_EQ(st.frames_reused, 99u);
    EXPECT_EQ(st.frames_verified, mode == VerifyMode::kFull ? 99u : 0u);
    EXPECT_EQ(got[0].pc, pcs.back());
    EXPECT_EQ(got[100].pc, pcs.front());
  }
}

TEST(IncrementalTest, ChangedOuterElementFullVerifiesBoundaryTrusts) {
  SyntheticSpace space;
  SyntheticStack mem(Arch::kX86_64);
  UnwindOptions full_options;
  for (VerifyMode mode : {VerifyMode::kBoundary, VerifyMode::kFull}) {
    IncrementalUnwinder inc(Options(Arch::kX86_64, mode));
    Frame got[256], want[256];
    std::vector<uint64_t> pcs = Chain(60, 0);
    Registers regs = mem.Build(pcs);
    inc.Unwind({regs, mem.Snapshot(regs.sp), 1, false}, space, got, 256);
    // Frame 20 from the outside now sits at another call site of the same function (same
    // frame size): its callee's return-address slot changed, the leaf side did not.
    std::vector<uint64_t> changed = pcs;
    changed[20] = FuncPc(FuncId(pcs[20]), 3);
    regs = mem.Build(changed);
    SampleStats st;
    UnwindResult g = inc.Unwind({regs, mem.Snapshot(regs.sp), 1, false}, space, got, 256, &st);
    UnwindResult w = Unwind(full_options, regs, mem.Snapshot(regs.sp), space, want, 256);
    EXPECT_TRUE(st.spliced);
    if (mode == VerifyMode::kFull) {
      EXPECT_TRUE(st.verify_failed);
      ExpectSameFrames(want, w, got, g, "full");
    } else {
      // The patent's lowest confidence threshold: only the boundary element is compared.
      EXPECT_FALSE(st.verify_failed);
      EXPECT_EQ(got[59 - 20].pc, pcs[20]);
      EXPECT_EQ(want[59 - 20].pc, changed[20]);
    }
    // Mutating the cached part itself: the next sample of the original chain must be right.
    regs = mem.Build(pcs);
    g = inc.Unwind({regs, mem.Snapshot(regs.sp), 1, false}, space, got, 256, &st);
    w = Unwind(full_options, regs, mem.Snapshot(regs.sp), space, want, 256);
    if (mode == VerifyMode::kFull) {
      ExpectSameFrames(want, w, got, g, "after");
    }
  }
}

TEST(IncrementalTest, EpochAndStackRangeInvalidate) {
  SyntheticSpace space;
  SyntheticStack mem(Arch::kX86_64);
  IncrementalUnwinder inc(Options(Arch::kX86_64, VerifyMode::kBoundary));
  Frame got[256];
  Registers regs = mem.Build(Chain(30, 0));
  SampleStats st;
  inc.Unwind({regs, mem.Snapshot(regs.sp), 1, true}, space, got, 256, &st);
  inc.Unwind({regs, mem.Snapshot(regs.sp), 1, true}, space, got, 256, &st);
  EXPECT_TRUE(st.spliced);
  inc.Unwind({regs, mem.Snapshot(regs.sp), 2, true}, space, got, 256, &st);  // dlopen
  EXPECT_TRUE(st.invalidated);
  EXPECT_FALSE(st.spliced);
  EXPECT_EQ(st.frames_unwound, 30u);
  // Same registers, but the copy now ends elsewhere: another stack.
  StackSnapshot shorter = mem.Snapshot(regs.sp);
  shorter.size -= 8;
  inc.Unwind({regs, shorter, 2, true}, space, got, 256, &st);
  EXPECT_TRUE(st.invalidated);
  EXPECT_FALSE(st.spliced);
  inc.Invalidate();
  EXPECT_EQ(inc.cached_frames(), 0u);
  inc.Unwind({regs, mem.Snapshot(regs.sp), 2, false}, space, got, 256, &st);
  EXPECT_FALSE(st.spliced);
  EXPECT_EQ(inc.totals().invalidations, 2u);
}

TEST(IncrementalTest, CapacityAndCopyLimitsMatchFullUnwind) {
  SyntheticSpace space;
  SyntheticStack mem(Arch::kX86_64);
  UnwindOptions full_options;
  for (VerifyMode mode : {VerifyMode::kBoundary, VerifyMode::kFull}) {
    for (size_t cap : {1, 2, 5, 40, 256}) {
      IncrementalUnwinder inc(Options(Arch::kX86_64, mode));
      Frame got[256], want[256];
      for (size_t depth : {50, 50, 45, 80, 80, 10, 50}) {
        Registers regs = mem.Build(Chain(depth, static_cast<int>(depth % 4)));
        UnwindResult g = inc.Unwind({regs, mem.Snapshot(regs.sp), 1, false}, space, got, cap);
        UnwindResult w = Unwind(full_options, regs, mem.Snapshot(regs.sp), space, want, cap);
        ExpectSameFrames(want, w, got, g, "capacity");
      }
    }
  }
  // A copy too short for the outer frames: kFull stops like the full unwind, kBoundary
  // reuses the frames it verified in an earlier, shallower sample.
  for (VerifyMode mode : {VerifyMode::kBoundary, VerifyMode::kFull}) {
    IncrementalUnwinder inc(Options(Arch::kX86_64, mode));
    Frame got[256], want[256];
    std::vector<uint64_t> pcs = Chain(40, 0);
    Registers regs = mem.Build(pcs);
    inc.Unwind({regs, mem.Snapshot(regs.sp), 1, false}, space, got, 256);
    pcs.back() = FuncPc(15, 2);
    regs = mem.Build(pcs);
    StackSnapshot small = mem.Snapshot(regs.sp, 1024);
    SampleStats st;
    UnwindResult g = inc.Unwind({regs, small, 1, false}, space, got, 256, &st);
    UnwindResult w = Unwind(full_options, regs, small, space, want, 256);
    EXPECT_EQ(w.stop, StopReason::kStackOutOfRange);
    if (mode == VerifyMode::kFull) {
      ExpectSameFrames(want, w, got, g, "short copy");
    } else {
      EXPECT_EQ(g.num_frames, 40u);
      EXPECT_EQ(g.stop, StopReason::kOutermost);
      EXPECT_GT(st.frames_beyond_copy, 0u);
    }
  }
}

TEST(IncrementalTest, MalformedStacksNeverCrash) {
  SyntheticSpace space;
  std::mt19937_64 rng(7);
  std::vector<uint8_t> junk(8192);
  for (VerifyMode mode : {VerifyMode::kBoundary, VerifyMode::kFull}) {
    IncrementalUnwinder inc(Options(Arch::kX86_64, mode, 64));
    Frame got[64];
    for (int i = 0; i < 2000; ++i) {
      for (size_t k = 0; k < junk.size(); k += 8) {
        uint64_t v = rng() % 3 == 0 ? FuncPc(2 + rng() % 14, rng() % 4) : rng();
        std::memcpy(&junk[k], &v, 8);
      }
      Registers regs{FuncPc(2 + rng() % 14, 0), 0x100000 + (rng() % 64) * 8, 0, 0};
      StackSnapshot stack{regs.sp, junk.data(), rng() % junk.size()};
      UnwindResult r = inc.Unwind({regs, stack, 1, false}, space, got, 64);
      ASSERT_GE(r.num_frames, 1u);
      ASSERT_LE(r.num_frames, 64u);
    }
  }
}

TEST(IncrementalTest, SteadyStateDoesNotAllocate) {
  SyntheticSpace space;
  SyntheticStack mem(Arch::kX86_64);
  IncrementalUnwinder inc(Options(Arch::kX86_64, VerifyMode::kFull));
  Frame got[256];
  std::vector<Registers> regs;
  for (int v = 0; v < 4; ++v) regs.push_back(mem.Build(Chain(120 + v, v)));
  g_allocations = 0;
  g_count_allocations = true;
  for (int i = 0; i < 100; ++i) {
    const Registers& r = regs[i % 4];
    inc.Unwind({r, mem.Snapshot(r.sp), 1, false}, space, got, 256);
  }
  g_count_allocations = false;
  EXPECT_EQ(g_allocations, 0u);
}

TEST(IncrementalTest, ParseVerifyMode) {
  EXPECT_EQ(*ParseVerifyMode("full"), VerifyMode::kFull);
  EXPECT_EQ(*ParseVerifyMode("boundary"), VerifyMode::kBoundary);
  EXPECT_EQ(*ParseVerifyMode("off"), VerifyMode::kOff);
  EXPECT_FALSE(ParseVerifyMode("sometimes").ok());
}

// ---------------------------------------------------------------------------- fp rows

// Frames whose rows use or restore the frame pointer, to check that full verification by
// return-address words alone never accepts a frame whose slots depend on an fp that changed.
// Function kinds by id % 3: kFpBased (push fp; mov sp, fp: CFA = fp + 16, fp saved at
// CFA - 16), kSpNoFp (CFA = sp + 16, fp untouched), kSpSavesFp (CFA = sp + 32, fp saved at
// CFA - 16 and the register reused for data). Id 1 is the outermost.
enum FpKind { kFpBased = 0, kSpNoFp = 1, kSpSavesFp = 2 };
FpKind KindOf(int id) { return static_cast<FpKind>(id % 3); }
int32_t FpFrameSize(int id) { return id == 1 ? 16 : KindOf(id) == kSpNoFp ? 16 : 32; }

class FpRules final : public RuleSource {
 public:
  bool FindRow(uint64_t pc, bool innermost, UnwindRow* row) const override {
    int id = FuncId(innermost ? pc : pc - 1);
    if (id < 1 || id > 15) return false;
    *row = {};
    row->ra_rule = id == 1 ? UnwindRow::RaRule::kUndefined : UnwindRow::RaRule::kAtCfaOffset;
    row->ra_offset = -8;
    switch (id == 1 ? kSpNoFp : KindOf(id)) {
      case kFpBased:
        *row = {UnwindRow::CfaBase::kFp, row->ra_rule, UnwindRow::FpRule::kAtCfaOffset,
                StackSwitch::kNone, 16, -8, -16};
        break;
      case kSpNoFp:
        row->cfa_base = UnwindRow::CfaBase::kSp;
        row->fp_rule = UnwindRow::FpRule::kSame;
        row->cfa_offset = FpFrameSize(id);
        break;
      case kSpSavesFp:
        *row = {UnwindRow::CfaBase::kSp, row->ra_rule, UnwindRow::FpRule::kAtCfaOffset,
                StackSwitch::kNone, FpFrameSize(id), -8, -16};
        break;
    }
    return true;
  }
};

class FpSpace final : public AddressSpace {
 public:
  bool Lookup(uint64_t pc, const RuleSource** rules, uint64_t* module_pc) const override {
    if (pc < 0x10000 || pc >= 0x100000) return false;
    *rules = &rules_;
    *module_pc = pc;
    return true;
  }

 private:
  FpRules rules_;
};

// Lays out `pcs` (outermost first) on `mem` like the compiled frames would: return addresses
// at CFA - 8, saved fps at CFA - 16, an fp-based frame's fp pointing at its saved fp, and
// `data[k]` as the fp register's value inside a kSpSavesFp frame k (rbp used for data).
Registers BuildFp(SyntheticStack& mem, const std::vector<uint64_t>& pcs,
                  const std::vector<uint64_t>& data) {
  uint64_t sp = SyntheticStack::kTop - 64 - FpFrameSize(1);
  uint64_t fp = 0x5eed;  // the outermost frame's fp register
  for (size_t k = 1; k < pcs.size(); ++k) {
    const int id = FuncId(pcs[k]);
    const uint64_t cfa = sp;
    mem.Write(cfa - 8, pcs[k - 1]);
    switch (KindOf(id)) {
      case kFpBased: mem.Write(cfa - 16, fp); fp = cfa - 16; break;
      case kSpNoFp: break;
      case kSpSavesFp: mem.Write(cfa - 16, fp); fp = data[k]; break;
    }
    sp = cfa - FpFrameSize(id);
  }
  return {pcs.back(), sp, fp, 0};
}

uint64_t FpPc(FpKind kind, int n, int call_site) {
  return FuncPc(3 * (1 + n % 4) + kind, call_site);  // ids 3..14, kind = id % 3
}

// Outer part of a chain: 1 -> kFpBased -> kSpSavesFp -> kSpNoFp x3 -> kSpSavesFp x2, then a
// leaf side that the test varies.
std::vector<uint64_t> FpChain(int leaf_site) {
  std::vector<uint64_t> pcs = {FuncPc(1, 0)};
  pcs.push_back(FpPc(kFpBased, 0, 0));
  pcs.push_back(FpPc(kSpSavesFp, 1, 0));
  for (int i = 0; i < 3; ++i) pcs.push_back(FpPc(kSpNoFp, i, 1));
  pcs.push_back(FpPc(kSpSavesFp, 2, 2));
  pcs.push_back(FpPc(kSpSavesFp, 3, 2));
  pcs.push_back(FpPc(kSpNoFp, 3, leaf_site));
  return pcs;
}

// rbp holding data that changes between samples (code built without frame pointers) is not a
// change of any frame: full verification stays a word compare and reuses everything.
TEST(IncrementalFpTest, ChangingFpDataIsNotAChangedFrame) {
  for (Arch arch : {Arch::kX86_64, Arch::kMips64Be}) {
    FpSpace space;
    SyntheticStack mem(arch);
    UnwindOptions full_options;
    full_options.arch = arch;
    IncrementalUnwinder inc(Options(arch, VerifyMode::kFull));
    Frame got[256], want[256];
    std::vector<uint64_t> data(16, 0);
    for (int sample = 0; sample < 8; ++sample) {
      for (size_t k = 0; k < data.size(); ++k) data[k] = 0x1000 * sample + k;
      Registers regs = BuildFp(mem, FpChain(sample % 3), data);
      SampleStats st;
      UnwindResult g = inc.Unwind({regs, mem.Snapshot(regs.sp), 1, false}, space, got, 256, &st);
      UnwindResult w = Unwind(full_options, regs, mem.Snapshot(regs.sp), space, want, 256);
      ExpectSameFrames(want, w, got, g, "fp data");
      EXPECT_EQ(w.stop, StopReason::kOutermost);
      if (sample > 0) {
        EXPECT_TRUE(st.spliced);
        EXPECT_FALSE(st.verify_failed);
        EXPECT_EQ(st.frames_unwound, 1u);
        EXPECT_EQ(st.frames_rederived, 0u) << "only words compared";
      }
    }
  }
}

// The stale frame a return-address-only comparison would miss: every return-address word
// stays where it was, but the saved fp an fp-based frame derives its CFA from changed (and,
// separately, the fp register a run of fp-preserving frames hands up to it). The fp-based
// frame's return address is then read from another slot; full verification must notice and
// agree with the full unwind.
TEST(IncrementalFpTest, ChangedFpUnderFpBasedFrameIsVerified) {
  for (Arch arch : {Arch::kX86_64, Arch::kMips64Be}) {
    for (int variant = 0; variant < 2; ++variant) {
      FpSpace space;
      SyntheticStack mem(arch);
      UnwindOptions full_options;
      full_options.arch = arch;
      IncrementalUnwinder inc(Options(arch, VerifyMode::kFull));
      Frame got[256], want[256];
      std::vector<uint64_t> data(16, 0x77);
      std::vector<uint64_t> pcs = FpChain(0);
      if (variant == 1) {
        // Only fp-preserving frames between the leaf side and the fp-based frame.
        pcs = {FuncPc(1, 0), FpPc(kFpBased, 0, 0)};
        for (int i = 0; i < 4; ++i) pcs.push_back(FpPc(kSpNoFp, i, 1));
        pcs.push_back(FpPc(kSpNoFp, 3, 0));
      }
      Registers regs = BuildFp(mem, pcs, data);
      inc.Unwind({regs, mem.Snapshot(regs.sp), 1, false}, space, got, 256);
      pcs.back() = FpPc(kSpNoFp, 3, 3);  // the leaf moved: a splice below the outer part
      regs = BuildFp(mem, pcs, data);
      Frame base[256];
      UnwindResult before = Unwind(full_options, regs, mem.Snapshot(regs.sp), space, base, 256);
      ASSERT_EQ(before.stop, StopReason::kOutermost);
      // The fp-based frame (second from the outside) has its CFA at the outermost frame's sp
      // and its locals in [CFA - 32, CFA - 16). An fp pointing into those locals makes it read
      // its return address there: put a plausible one in.
      const uint64_t cfa = base[before.num_frames - 1].sp;
      const uint64_t moved = cfa - 32;
      mem.Write(moved + 8, FuncPc(5, 1));
      mem.Write(moved, 0);
      if (variant == 0) {
        // The kSpSavesFp frame right below it saved its fp at (its CFA = cfa - 32) - 16.
        mem.Write(cfa - 32 - 16, moved);
      } else {
        regs.fp = moved;  // the fp register, handed up unchanged by the fp-preserving frames
      }
      SampleStats st;
      UnwindResult g = inc.Unwind({regs, mem.Snapshot(regs.sp), 1, false}, space, got, 256, &st);
      UnwindResult w = Unwind(full_options, regs, mem.Snapshot(regs.sp), space, want, 256);
      ExpectSameFrames(want, w, got, g, variant == 0 ? "saved fp" : "fp register");
      EXPECT_TRUE(st.spliced);
      // The full unwind no longer reaches the old outermost frame through the old slot.
      EXPECT_NE(want[w.num_frames - 1].sp, base[before.num_frames - 1].sp);
      // And restoring the stack restores the original frames, also from the cache.
      regs = BuildFp(mem, pcs, data);
      g = inc.Unwind({regs, mem.Snapshot(regs.sp), 1, false}, space, got, 256, &st);
      w = Unwind(full_options, regs, mem.Snapshot(regs.sp), space, want, 256);
      ExpectSameFrames(want, w, got, g, "restored");
    }
  }
}

// ---------------------------------------------------------------------------- jit code

// JIT code: anonymous executable memory at [kJitStart, kJitEnd) that no module covers and no
// rule describes (AddressSpace::LookupJit). Its frames follow the frame-pointer convention
// (return address at CFA - 8, saved fp at CFA - 16, fp = CFA - 16, sp = CFA - 48); the
// synthetic functions around them are CFI-described and leave fp alone.
constexpr uint64_t kJitStart = 0x200000;
constexpr uint64_t kJitEnd = kJitStart + 0x1000000;
constexpr int32_t kJitFrameSize = 48;
// JIT function n (0..4095) at its call site (0..63).
uint64_t JitPc(int n, int call_site) { return kJitStart + 0x1000ull * n + 0x40 + 8 * call_site; }
bool IsJitPc(uint64_t pc) { return pc >= kJitStart && pc < kJitEnd; }

class JitSpace final : public AddressSpace {
 public:
  explicit JitSpace(bool knows_jit = true) : knows_jit_(knows_jit) {}
  bool Lookup(uint64_t pc, const RuleSource** rules, uint64_t* module_pc) const override {
    if (pc < 0x10000 || pc >= 0x100000) return false;
    *rules = &rules_;
    *module_pc = pc;
    return true;
  }
  bool LookupJit(uint64_t pc, const RuleSource** rules, uint64_t* module_pc) const override {
    if (!knows_jit_ || !IsJitPc(pc)) return false;
    *rules = nullptr;
    *module_pc = pc;
    return true;
  }

 private:
  SyntheticRules rules_;
  bool knows_jit_;
};

// Lays out `pcs` (outermost first, pcs[0] in function 1) with JIT frames where the pc is JIT
// code. Returns the sample's registers.
Registers BuildJit(SyntheticStack& mem, const std::vector<uint64_t>& pcs) {
  uint64_t sp = SyntheticStack::kTop - 64 - FrameSize(1);
  uint64_t fp = 0x5eed;
  for (size_t k = 1; k < pcs.size(); ++k) {
    const uint64_t cfa = sp;
    mem.Write(cfa - 8, pcs[k - 1]);
    if (IsJitPc(pcs[k])) {
      mem.Write(cfa - 16, fp);
      fp = cfa - 16;
      sp = cfa - kJitFrameSize;
    } else {
      sp = cfa - FrameSize(FuncId(pcs[k]));
    }
  }
  return {pcs.back(), sp, fp, 0};
}

size_t CountJit(const std::vector<uint64_t>& pcs) {
  return static_cast<size_t>(std::count_if(pcs.begin(), pcs.end(), IsJitPc));
}

// CFI code calling into JIT code calling back into CFI code: the walk leaves the JIT frames
// by frame pointers -- even where a module without rules would not be -- and goes on with
// rules beyond them, to the outermost frame.
TEST(JitUnwindTest, FramePointersCarryThroughJitCode) {
  const std::vector<std::vector<uint64_t>> chains = {
      {FuncPc(1, 0), FuncPc(2, 1), FuncPc(3, 2), JitPc(0, 1), JitPc(1, 2), JitPc(2, 0),
       FuncPc(4, 3), FuncPc(5, 1)},
      // The interrupted frame itself in JIT code.
      {FuncPc(1, 0), FuncPc(7, 1), JitPc(3, 1), FuncPc(8, 2), JitPc(4, 5)},
  };
  for (const std::vector<uint64_t>& pcs : chains) {
    for (bool fallback : {true, false}) {
      SyntheticStack mem(Arch::kX86_64);
      JitSpace space;
      Registers regs = BuildJit(mem, pcs);
      UnwindOptions options;
      options.frame_pointer_fallback = fallback;
      Frame frames[64];
      UnwindResult r = Unwind(options, regs, mem.Snapshot(regs.sp), space, frames, 64);
      EXPECT_EQ(r.stop, StopReason::kOutermost) << StopReasonName(r.stop);
      ASSERT_EQ(r.num_frames, pcs.size());
      for (size_t i = 0; i < pcs.size(); ++i) {
        EXPECT_EQ(frames[i].pc, pcs[pcs.size() - 1 - i]) << "frame " << i;
      }
      EXPECT_EQ(r.jit_frames_fp, CountJit(pcs));
      EXPECT_EQ(r.jit_frames_cfi, 0u);
    }
  }
}

// Without LookupJit (an address space that knows no JIT code) the walk stops at the first JIT
// frame as before; on MIPS64 JIT frames are not unwound (kNoRule) but do not break the walk
// up to them.
TEST(JitUnwindTest, StopsWhereJitCodeIsUnknownOrUnsupported) {
  const std::vector<uint64_t> pcs = {FuncPc(1, 0), FuncPc(2, 1), JitPc(0, 1), JitPc(1, 2),
                                     FuncPc(4, 3), FuncPc(5, 1)};
  Frame frames[64];
  {
    SyntheticStack mem(Arch::kX86_64);
    JitSpace space(/*knows_jit=*/false);
    Registers regs = BuildJit(mem, pcs);
    UnwindResult r = Unwind({}, regs, mem.Snapshot(regs.sp), space, frames, 64);
    EXPECT_EQ(r.stop, StopReason::kNoModule);  // a return address in no known code
    EXPECT_EQ(r.num_frames, 2u);
    EXPECT_EQ(r.jit_frames_fp, 0u);
    regs.pc = JitPc(1, 0);
    r = Unwind({}, regs, mem.Snapshot(regs.sp), space, frames, 64);
    EXPECT_EQ(r.stop, StopReason::kNoModule);
    EXPECT_EQ(r.num_frames, 1u);
  }
  {
    SyntheticStack mem(Arch::kMips64Be);
    JitSpace space;
    Registers regs = BuildJit(mem, pcs);
    UnwindOptions options;
    options.arch = Arch::kMips64Be;
    UnwindResult r = Unwind(options, regs, mem.Snapshot(regs.sp), space, frames, 64);
    EXPECT_EQ(r.stop, StopReason::kNoRule);
    ASSERT_EQ(r.num_frames, 3u);
    EXPECT_EQ(frames[2].pc, JitPc(1, 2));
    EXPECT_EQ(r.jit_frames_fp, 0u);
  }
}

// Random call chains through JIT code: every mode returns the full unwind's frames (kBoundary
// while nothing inside the kept prefix changed), and JIT frames are counted where they were
// found -- all of them without a cache.
TEST(JitUnwindTest, IncrementalEqualsFullUnwindThroughJitCode) {
  for (VerifyMode mode : {VerifyMode::kOff, VerifyMode::kBoundary, VerifyMode::kFull}) {
    SCOPED_TRACE(VerifyModeName(mode));
    JitSpace space;
    SyntheticStack mem(Arch::kX86_64);
    IncrementalUnwinder inc(Options(Arch::kX86_64, mode));
    std::mt19937 rng(7);
    std::vector<uint64_t> pcs = {FuncPc(1, 0)};
    Frame want[256], got[256];
    size_t reused = 0, jit_counted = 0, jit_seen = 0;
    for (int sample = 0; sample < 2000; ++sample) {
      size_t keep = std::max<size_t>(1, pcs.size() - std::min<size_t>(pcs.size(), rng() % 4));
      if (rng() % 25 == 0) keep = 1 + rng() % pcs.size();
      pcs.resize(keep);
      bool mutated = false;
      if (mode != VerifyMode::kBoundary && keep > 2 && rng() % 30 == 0) {
        // A frame inside the kept part returned and its caller called again from elsewhere.
        const size_t k = 1 + rng() % (keep - 2);
        pcs[k] = IsJitPc(pcs[k]) ? JitPc(static_cast<int>((pcs[k] - kJitStart) >> 12),
                                         static_cast<int>(rng() % 4))
                                 : FuncPc(FuncId(pcs[k]), static_cast<int>(rng() % 4));
        mutated = true;
      }
      const size_t depth = std::min<size_t>(keep + rng() % 5, 120);
      while (pcs.size() < depth) {
        pcs.push_back(rng() % 3 == 0 ? JitPc(sample % 4096, static_cast<int>(rng() % 64))
                                     : FuncPc(2 + static_cast<int>(rng() % 14), sample % 4096));
      }
      Registers regs = BuildJit(mem, pcs);
      StackSnapshot stack = mem.Snapshot(regs.sp);
      UnwindResult w = Unwind({}, regs, stack, space, want, 256);
      ASSERT_EQ(w.stop, StopReason::kOutermost);
      ASSERT_EQ(w.num_frames, pcs.size());
      ASSERT_EQ(w.jit_frames_fp, CountJit(pcs));
      SampleStats st;
      UnwindResult g = inc.Unwind({regs, stack, 3, false}, space, got, 256, &st);
      ExpectSameFrames(want, w, got, g, mutated ? "mutated" : "sample");
      EXPECT_EQ(g.jit_frames_fp, st.jit_frames_fp);
      EXPECT_LE(st.jit_frames_fp, st.frames_unwound);
      if (mode == VerifyMode::kOff) {
        EXPECT_EQ(st.jit_frames_fp, CountJit(pcs));
      }
      reused += st.frames_reused;
      jit_counted += st.jit_frames_fp;
      jit_seen += CountJit(pcs);
      if (::testing::Test::HasFailure()) return;
    }
    if (mode != VerifyMode::kOff) {
      EXPECT_GT(reused, 10000u);
      EXPECT_LT(jit_counted, jit_seen / 4) << "reused JIT frames are not stepped again";
    }
  }
}

// A JIT frame's saved fp changed while every return-address word stayed: the JIT frame above
// it now derives its CFA from another fp. Full verification must re-derive it and agree with
// the full unwind, and agree again once the stack is restored.
TEST(JitUnwindTest, ChangedSavedFpUnderJitFrameIsVerified) {
  JitSpace space;
  SyntheticStack mem(Arch::kX86_64);
  IncrementalUnwinder inc(Options(Arch::kX86_64, VerifyMode::kFull));
  std::vector<uint64_t> pcs = {FuncPc(1, 0), FuncPc(2, 1), JitPc(0, 1), JitPc(1, 2),
                               FuncPc(4, 3), FuncPc(5, 1)};
  Frame got[256], want[256], base[256];
  Registers regs = BuildJit(mem, pcs);
  SampleStats st;
  inc.Unwind({regs, mem.Snapshot(regs.sp), 1, false}, space, got, 256, &st);
  EXPECT_EQ(st.jit_frames_fp, 2u);
  pcs.back() = FuncPc(5, 2);  // the leaf moved: a splice below the JIT frames
  regs = BuildJit(mem, pcs);
  UnwindResult before = Unwind({}, regs, mem.Snapshot(regs.sp), space, base, 256);
  ASSERT_EQ(before.stop, StopReason::kOutermost);
  ASSERT_EQ(before.num_frames, 6u);
  UnwindResult g = inc.Unwind({regs, mem.Snapshot(regs.sp), 1, false}, space, got, 256, &st);
  ExpectSameFrames(base, before, got, g, "unchanged");
  EXPECT_TRUE(st.spliced);
  EXPECT_EQ(st.jit_frames_fp, 0u);
  EXPECT_EQ(st.frames_rederived, 0u) << "only words compared";
  // The outer JIT frame (frames[3]) has its CFA at frames[4].sp; its locals lie below its
  // saved fp. The inner JIT frame's saved fp now points into those locals, where a plausible
  // return address waits.
  const uint64_t outer_cfa = base[4].sp;
  const uint64_t moved = outer_cfa - 32;
  mem.Write(moved + 8, FuncPc(3, 1));
  mem.Write(moved, 0);
  const uint64_t inner_cfa = base[3].sp;
  mem.Write(inner_cfa - 16, moved);
  g = inc.Unwind({regs, mem.Snapshot(regs.sp), 1, false}, space, got, 256, &st);
  UnwindResult w = Unwind({}, regs, mem.Snapshot(regs.sp), space, want, 256);
  ExpectSameFrames(want, w, got, g, "saved fp");
  EXPECT_TRUE(st.spliced);
  EXPECT_GT(st.frames_rederived, 0u);
  EXPECT_EQ(want[4].pc, FuncPc(3, 1));
  regs = BuildJit(mem, pcs);
  g = inc.Unwind({regs, mem.Snapshot(regs.sp), 1, false}, space, got, 256, &st);
  ExpectSameFrames(base, before, got, g, "restored");
}

// ---------------------------------------------------------------------------- real stacks

// Captured chains of this process (no frame pointers, compiled CFI): a sequence of depths
// from the same call site shares the outer frames.
TEST(IncrementalTest, RealCapturedStacksEqualFullUnwind) {
  const testing::SelfAddressSpace space;
  UnwindOptions full_options;
  full_options.max_frames = 512;
  for (VerifyMode mode : {VerifyMode::kBoundary, VerifyMode::kFull}) {
    IncrementalUnwinder inc(Options(Arch::kX86_64, mode, 512));
    size_t spliced = 0;
    int previous = 0;
    for (int depth : {50, 50, 60, 45, 200, 199, 10, 50}) {
      testing::CapturedStack cap;
      testing::CaptureChainNoFp(depth, &cap);
      std::vector<Frame> want(512), got(512);
      UnwindResult w = Unwind(full_options, cap.regs, cap.snapshot(), space, want.data(), 512);
      SampleStats st;
      UnwindResult g = inc.Unwind({cap.regs, cap.snapshot(), 1, false}, space, got.data(), 512,
                                  &st);
      ExpectSameFrames(want.data(), w, got.data(), g, "captured");
      EXPECT_GE(w.num_frames, static_cast<size_t>(depth) + 2);
      spliced += st.spliced;
      // Only the frames below the deepest common one (plus the leaf's caller) are new.
      if (st.spliced) {
        EXPECT_LE(st.frames_unwound, std::abs(depth - previous) + 3) << depth;
      }
      previous = depth;
    }
    EXPECT_GE(spliced, 6u) << VerifyModeName(mode);
  }
}

}  // namespace
}  // namespace strata::unwind
