// Go unwind rules on real Go 1.19 and 1.23 binaries (built by the build for common/elf's tests;
// 1.23 when its toolchain could be fetched, STRATA_GO_TOOLCHAINS): rows
// for roots and ordinary frames, and whole stacks laid out as the Go runtime itself reported
// them (runtime.Callers in the program, run natively and under qemu-mips64el), unwound by the
// one loop -- plain and incremental -- to the goroutine's root, complete.
#include "common/unwind/go/go_rules.h"

#include <sys/stat.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <sstream>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/elf/go_pclntab.h"
#include "common/unwind/incremental.h"
#include "common/unwind/mips64/recorded_sample.h"
#include "common/unwind/rule_source.h"
#include "gtest/gtest.h"
#include "common/testing/shell_output.h"

namespace strata::unwind::go {
namespace {

TEST(GoRowTest, PerArchitecture) {
  UnwindRow x = GoRow(Arch::kX86_64, 0x18);
  EXPECT_EQ(x.cfa_base, UnwindRow::CfaBase::kSp);
  EXPECT_EQ(x.cfa_offset, 0x20);
  EXPECT_EQ(x.ra_rule, UnwindRow::RaRule::kAtCfaOffset);
  EXPECT_EQ(x.ra_offset, -8);
  EXPECT_EQ(x.fp_rule, UnwindRow::FpRule::kSame);
  UnwindRow with_fp = GoRow(Arch::kX86_64, 0x18, /*saved_fp=*/true);
  EXPECT_EQ(with_fp.fp_rule, UnwindRow::FpRule::kAtCfaOffset);
  EXPECT_EQ(with_fp.fp_offset, -16);
  EXPECT_EQ(GoRow(Arch::kMips64El, 0x18, true).fp_rule, UnwindRow::FpRule::kSame);
  UnwindRow leaf = GoRow(Arch::kMips64El, 0);
  EXPECT_EQ(leaf.ra_rule, UnwindRow::RaRule::kInRegister);
  EXPECT_EQ(leaf.cfa_offset, 0);
  UnwindRow m = GoRow(Arch::kMips64Be, 0x40);
  EXPECT_EQ(m.cfa_offset, 0x40);
  EXPECT_EQ(m.ra_rule, UnwindRow::RaRule::kAtCfaOffset);
  EXPECT_EQ(m.ra_offset, -0x40);
}

#ifdef STRATA_GO_DIR

std::string RunCommand(const std::string& cmd) { return testing::ShellOutput(cmd); }

// The test program built as `variant` ("amd64", "go1.23_mips64le", ...), or empty when that
// build is missing (a toolchain that could not be fetched).
std::string GoProgram(const std::string& variant) {
  const std::string path = std::string(STRATA_GO_DIR) + "/pclntab_subject_" + variant;
  struct stat st;
  return stat(path.c_str(), &st) == 0 ? path : std::string();
}

// One module at its link address (the test binaries are not PIE).
using OneModuleSpace = mips64::StaticModuleSpace;

struct GoCase {
  std::string variant;
  Arch arch;
  bool needs_qemu;
};

class GoStackTest : public ::testing::TestWithParam<GoCase> {};

// The program's own stack (runtime.Callers; inlined calls folded into their physical frames
// with the table's inline tree) is rebuilt in memory with each frame's size from the table,
// then unwound from the innermost frame's pc.
TEST_P(GoStackTest, UnwindsToGoexitAsComplete) {
  const GoCase c = GetParam();
  if (c.needs_qemu && std::string(STRATA_QEMU_MIPS64EL).empty()) GTEST_SKIP() << "no qemu";
  const std::string bin = GoProgram(c.variant);
  if (bin.empty()) GTEST_SKIP() << "no " << c.variant << " build (its Go toolchain is missing)";
  auto elf = elf::ElfFile::Open(bin);
  ASSERT_TRUE(elf.ok()) << elf.status();
  auto table = elf::GoPclntab::Find(**elf);
  ASSERT_TRUE(table.ok());
  auto rules = MakeRuleSource(c.arch, **elf);
  ASSERT_TRUE(rules.ok()) << rules.status();
  ASSERT_NE(dynamic_cast<const GoRuleSource*>(rules->get()), nullptr);

  // Physical frames' pcs (Frame.PC: inside the call), outermost last.
  std::vector<uint64_t> pcs;
  std::istringstream in(RunCommand(
      (c.needs_qemu ? std::string(STRATA_QEMU_MIPS64EL) + " " : std::string()) + bin + " frames"));
  std::string line;
  std::vector<std::pair<uint64_t, std::string>> truth;
  while (std::getline(in, line)) {
    std::vector<std::string> f = absl::StrSplit(line, ' ');
    if (f.size() == 4) truth.emplace_back(std::stoull(f[0], nullptr, 16), f[1]);
  }
  ASSERT_GE(truth.size(), 5u);
  ASSERT_EQ(truth.back().second, "runtime.goexit");
  for (size_t i = 0; i < truth.size();) {
    const int64_t fi = (*table)->FindFunction(truth[i].first);
    ASSERT_GE(fi, 0);
    size_t n = (*table)->Symbolize((*table)->functions()[fi], truth[i].first).size();
    if (i == 0) n = std::max<size_t>(n, 2) - 1;  // runtime.Callers, inlined, is skipped
    pcs.push_back(truth[i].first);
    i += n;
  }
  ASSERT_GE(pcs.size(), 5u);

  // Lay the frames out: each frame's size is its SP delta at its pc.
  const bool be = IsBigEndian(c.arch);
  const bool x86 = c.arch == Arch::kX86_64;
  const uint64_t pc_step = x86 ? 1 : 8;  // Frame.PC + this = the return address
  std::vector<uint8_t> bytes(16384, 0xcc);
  const uint64_t base = 0x7ffe0000;
  uint64_t sp = base + 256;
  std::vector<uint64_t> sps;
  auto put = [&](uint64_t addr, uint64_t v) {
    ASSERT_LT(addr - base + 8, bytes.size());
    if (be) v = __builtin_bswap64(v);
    std::memcpy(bytes.data() + (addr - base), &v, 8);
  };
  for (size_t i = 0; i + 1 < pcs.size(); ++i) {
    const auto& f = (*table)->functions()[(*table)->FindFunction(pcs[i])];
    int32_t delta = -1;
    for (const auto& r : (*table)->SpDeltas(f)) {
      if (pcs[i] >= r.start && pcs[i] < r.end) delta = r.value;
    }
    ASSERT_GT(delta, 0) << f.name;
    sps.push_back(sp);
    const uint64_t return_address = pcs[i + 1] + pc_step;
    if (x86) {
      put(sp + delta, return_address);
      sp += delta + 8;
    } else {
      put(sp, return_address);  // 0(SP) of the frame
      sp += delta;
    }
  }
  sps.push_back(sp);
  StackSnapshot stack{base, bytes.data(), bytes.size()};
  Registers regs;
  regs.pc = pcs[0];
  regs.sp = sps[0];
  OneModuleSpace space(**elf, rules->get());
  UnwindOptions options;
  options.arch = c.arch;
  options.frame_pointer_fallback = false;
  std::vector<Frame> frames(64);
  UnwindResult r = Unwind(options, regs, stack, space, frames.data(), frames.size());
  EXPECT_EQ(r.stop, StopReason::kOutermost) << StopReasonName(r.stop);
  ASSERT_EQ(r.num_frames, pcs.size());
  for (size_t i = 1; i < pcs.size(); ++i) {
    EXPECT_EQ(frames[i].pc, pcs[i] + pc_step) << i;
    EXPECT_EQ(frames[i].sp, sps[i]) << i;
  }

  // The incremental unwinder: the same frames, then the outer part reused, still complete.
  IncrementalOptions inc_options;
  inc_options.unwind = options;
  inc_options.verify = VerifyMode::kFull;
  IncrementalUnwinder inc(inc_options);
  SampleInput sample{regs, stack, 1, false};
  std::vector<Frame> again(64);
  for (int round = 0; round < 2; ++round) {
    SampleStats stats;
    UnwindResult ir = inc.Unwind(sample, space, again.data(), again.size(), &stats);
    EXPECT_EQ(ir.stop, StopReason::kOutermost) << round;
    ASSERT_EQ(ir.num_frames, r.num_frames);
    for (size_t i = 0; i < ir.num_frames; ++i) EXPECT_EQ(again[i].pc, frames[i].pc);
    if (round == 1) {
      EXPECT_GT(stats.frames_reused, 0u);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Go119, GoStackTest,
                         ::testing::Values(GoCase{"amd64", Arch::kX86_64, false},
                                           GoCase{"amd64_stripped", Arch::kX86_64, false},
                                           GoCase{"mips64le", Arch::kMips64El, true},
                                           GoCase{"mips64le_stripped", Arch::kMips64El, true}),
                         [](const auto& info) { return info.param.variant; });
INSTANTIATE_TEST_SUITE_P(Go123, GoStackTest,
                         ::testing::Values(GoCase{"go1.23_amd64", Arch::kX86_64, false},
                                           GoCase{"go1.23_amd64_stripped", Arch::kX86_64, false},
                                           GoCase{"go1.23_mips64le", Arch::kMips64El, true},
                                           GoCase{"go1.23_mips64le_stripped", Arch::kMips64El,
                                                  true}),
                         [](const auto& info) { return info.param.variant.substr(7); });

// A built Go program opened with its table; `elf` is null when the program was not built
// (its Go toolchain is missing), which is printed.
struct GoBinary {
  std::unique_ptr<elf::ElfFile> elf;
  Arch arch = Arch::kX86_64;
  std::unique_ptr<elf::GoPclntab> table;
};
void OpenGoBinary(const char* variant, GoBinary* out) {
  const std::string bin = GoProgram(variant);
  if (bin.empty()) {
    std::printf("no %s build (its Go toolchain is missing): not checked\n", variant);
    return;
  }
  auto elf = elf::ElfFile::Open(bin);
  ASSERT_TRUE(elf.ok());
  auto arch = ArchOf(**elf);
  ASSERT_TRUE(arch.ok());
  auto table = elf::GoPclntab::Find(**elf);
  ASSERT_TRUE(table.ok());
  out->elf = std::move(*elf);
  out->arch = *arch;
  out->table = std::move(*table);
}

TEST(GoRulesTest, RootsEndTheWalkSwitchesAreCrossed) {
  const std::map<std::string_view, StackSwitch> switches = {
      {"runtime.systemstack", StackSwitch::kSystemStack},
      {"runtime.mcall", StackSwitch::kGoroutineContext},
      {"runtime.morestack", StackSwitch::kGoroutineContext},
      {"runtime.asmcgocall", StackSwitch::kCgoCall},
      {"runtime.cgocallback", StackSwitch::kCgoCallback}};
  for (const char* variant : {"amd64", "mips64", "mips64le", "go1.23_amd64", "go1.23_mips64",
                              "go1.23_mips64le"}) {
    GoBinary go;
    ASSERT_NO_FATAL_FAILURE(OpenGoBinary(variant, &go));
    if (go.elf == nullptr) continue;
    auto rules = MakeRuleSource(go.arch, *go.elf);
    ASSERT_TRUE(rules.ok()) << rules.status();
    int roots_checked = 0;
    for (const auto& f : go.table->functions()) {
      UnwindRow row;
      const bool found = (*rules)->FindRow(f.entry, true, &row);
      // Stack roots end the walk; the switches to the system stack -- for runtime calls, for
      // cgo calls (asmcgocall) and back from C (cgocallback), and for stack growth
      // (morestack) -- are rows of their own, with the function's SP delta, that the walk
      // crosses.
      const auto sw = switches.find(f.name);
      if (sw != switches.end()) {
        ++roots_checked;
        ASSERT_TRUE(found) << f.name;
        EXPECT_EQ(row.ra_rule, UnwindRow::RaRule::kStackSwitch) << f.name << " " << variant;
        EXPECT_EQ(row.stack_switch, sw->second) << f.name;
        EXPECT_EQ(row.cfa_base, UnwindRow::CfaBase::kSp);
        EXPECT_EQ(row.cfa_offset, go.arch == Arch::kX86_64 ? 8 : 0) << f.name;  // at the entry
      } else if (f.name == "runtime.goexit" || f.name == "runtime.mstart" ||
                 f.name == "runtime.rt0_go") {
        ++roots_checked;
        ASSERT_TRUE(found) << f.name;
        EXPECT_EQ(row.ra_rule, UnwindRow::RaRule::kUndefined) << f.name << " " << variant;
        // A return address into goexit (goexit+quantum, Go's fake caller) ends it too.
        ASSERT_TRUE((*rules)->FindRow(f.entry + go.table->pc_quantum(), false, &row));
        EXPECT_EQ(row.ra_rule, UnwindRow::RaRule::kUndefined);
      } else if (f.name == "main.main" || f.name == "runtime.main") {
        ASSERT_TRUE(found);
        // At the entry nothing is pushed yet.
        EXPECT_EQ(row.cfa_offset, go.arch == Arch::kX86_64 ? 8 : 0) << f.name;
        EXPECT_NE(row.ra_rule, UnwindRow::RaRule::kUndefined);
      }
    }
    // (A MIPS64 build without cgo links no runtime.cgocallback.)
    EXPECT_EQ(roots_checked, go.arch == Arch::kX86_64 ? 8 : 7) << variant;
    // Outside every Go function (before the text): no Go rule.
    UnwindRow row;
    EXPECT_FALSE((*rules)->FindRow(go.table->functions().front().entry - 0x100000, true, &row));
  }
}

#endif  // STRATA_GO_DIR

// The rules that pcs outside every Go function fall back to: records that it was asked.
class AskedFallback final : public RuleSource {
 public:
  bool FindRow(uint64_t, bool, UnwindRow*) const override {
    asked = true;
    return false;
  }
  mutable bool asked = false;
};

// Runs `check(variant, go, rules, asked)` on each Go build the rule tests use that was built,
// with `go`'s rules falling back to an AskedFallback.
template <typename Check>
void ForEachGoBuild(Check check) {
  for (const char* variant : {"amd64", "go1.23_amd64", "mips64le"}) {
    GoBinary go;
    ASSERT_NO_FATAL_FAILURE(OpenGoBinary(variant, &go));
    if (go.elf == nullptr) continue;
    auto fallback = std::make_unique<AskedFallback>();
    const AskedFallback* asked = fallback.get();
    std::unique_ptr<GoRuleSource> rules =
        GoRuleSource::Build(go.arch, *go.table, std::move(fallback));
    ASSERT_GT(go.table->functions().size(), 100u) << variant;
    ASSERT_NO_FATAL_FAILURE(check(variant, go, *rules, *asked));
  }
}

// Addresses to look up: every function's first and last byte and the bytes around them (gaps,
// neighbours), its middle, both sides of each 4 KiB bucket's edge, and pcs all over the text
// and past both of its ends.
std::set<uint64_t> ProbeAddresses(const elf::GoPclntab& table) {
  std::set<uint64_t> pcs;
  const auto& functions = table.functions();
  for (const auto& f : functions) {
    for (uint64_t pc : {f.entry - 1, f.entry, f.entry + 1, (f.entry + f.end) / 2, f.end - 1,
                        f.end, f.end + 1}) {
      pcs.insert(pc);
    }
  }
  const uint64_t text_start = functions.front().entry, text_end = functions.back().end;
  for (uint64_t pc = text_start - 8192; pc < text_end + 8192; pc += 61) pcs.insert(pc);
  for (uint64_t pc = text_start & ~uint64_t{4095}; pc < text_end; pc += 4096) {
    pcs.insert(pc - 1);
    pcs.insert(pc);
  }
  return pcs;
}

// The text index (4 KiB buckets) finds a pc's function exactly where the table's own search
// does.
TEST(GoRulesTest, BucketIndexFindsTheFunctionsTheTableFinds) {
  ForEachGoBuild([](const char* variant, const GoBinary& go, const GoRuleSource& rules,
                    const AskedFallback& asked) {
    const std::set<uint64_t> pcs = ProbeAddresses(*go.table);
    size_t in_functions = 0;
    for (uint64_t pc : pcs) {
      asked.asked = false;
      UnwindRow row;
      rules.FindRow(pc, /*innermost=*/true, &row);
      const bool in_function = go.table->FindFunction(pc) >= 0;
      in_functions += in_function;
      ASSERT_EQ(asked.asked, !in_function) << variant << " pc 0x" << std::hex << pc;
    }
    EXPECT_GT(in_functions, pcs.size() / 2) << variant;
  });
}

// Looked up again at once (its cache slot just written), every address answers from the
// lookup cache what its first lookup -- a search: each address is new -- answered: the row,
// or the fallback's turn outside every Go function; for return addresses and plausibility
// too.
TEST(GoRulesTest, CachedLookupsAnswerAsTheFirstLookups) {
  ForEachGoBuild([](const char* variant, const GoBinary& go, const GoRuleSource& rules,
                    const AskedFallback& asked) {
    struct Answer {
      bool found, fallback_asked, plausible;
      UnwindRow row;
    };
    auto answer = [&](uint64_t pc) {
      Answer a{};
      asked.asked = false;
      // innermost = false looks up pc - 1: pc + 1 is the same address as pc innermost.
      a.found = rules.FindRow(pc + 1, /*innermost=*/false, &a.row);
      a.fallback_asked = asked.asked;
      a.plausible = rules.IsPlausibleReturnAddress(pc + 1);
      return a;
    };
    const std::set<uint64_t> pcs = ProbeAddresses(*go.table);
    size_t found = 0;
    for (uint64_t pc : pcs) {
      const Answer was = answer(pc);
      const Answer again = answer(pc);
      found += was.found;
      ASSERT_EQ(again.found, was.found) << variant << " pc 0x" << std::hex << pc;
      ASSERT_EQ(again.fallback_asked, was.fallback_asked) << variant << " 0x" << std::hex << pc;
      ASSERT_EQ(again.plausible, was.plausible) << variant << " 0x" << std::hex << pc;
      if (was.found) {
        ASSERT_TRUE(again.row == was.row) << variant << " 0x" << std::hex << pc;
      }
    }
    EXPECT_GT(found, pcs.size() / 2) << variant;
  });
}

}  // namespace
}  // namespace strata::unwind::go
