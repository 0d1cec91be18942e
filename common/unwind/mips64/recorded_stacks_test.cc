// Unwinds stacks recorded under qemu from real MIPS64 programs
// (tests/mips64/programs/workload.c, both byte orders, -O0/-O2, with and without frame
// pointers) with the PrologueTable, and compares every sample frame by frame with the ground
// truth the program kept itself.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "common/elf/elf_file.h"
#include "common/elf/symbol_table.h"
#include "common/unwind/mips64/prologue_table.h"
#include "common/unwind/mips64/recorded_sample.h"
#include "common/unwind/mips64/truth_match.h"

namespace strata::unwind::mips64 {
namespace {

class RecordedStacks : public testing::TestWithParam<std::string> {};

TEST_P(RecordedStacks, MatchGroundTruth) {
  const std::string base = std::string(STRATA_MIPS64_TESTDATA_DIR) + "/" + GetParam();
  auto elf = elf::ElfFile::Open(base);
  ASSERT_TRUE(elf.ok()) << elf.status();
  auto table = BuildMips64Table(**elf);
  ASSERT_TRUE(table.ok()) << table.status();
  auto symbols = elf::SymbolTable::Build(**elf);
  ASSERT_TRUE(symbols.ok());
  std::vector<RecordedSample> samples;
  ASSERT_TRUE(ReadRecordedSamples(base + ".samples", (*elf)->big_endian(), &samples));
  ASSERT_GE(samples.size(), 50u);

  const StaticModuleSpace space(**elf, table->get());
  const Arch arch = (*table)->arch();

  MatchTotals t;
  std::map<std::string, int> failures;
  size_t not_outermost = 0;
  for (const RecordedSample& s : samples) {
    Frame frames[128];
    const UnwindResult result = UnwindRecorded(arch, space, s, frames, 128);
    const size_t n = result.num_frames;
    // Every recorded stack runs up to __start (main thread) and must end there as outermost.
    if (result.stop != StopReason::kOutermost) ++not_outermost;
    const SampleMatch m = MatchSample(
        frames, n, s.ids, s.tail, [&](uint64_t pc) {
          const elf::SymbolTable::Function* f = symbols->Lookup(pc);
          return f ? IdOf(f->name) : -1;
        });
    const std::vector<int>& got = m.got;
    const std::vector<int>& truth = m.truth;
    t.Add(m);
    const bool ok = m.exact;
    if (!ok) {
      const elf::SymbolTable::Function* f = symbols->Lookup(s.regs.pc);
      failures[f ? std::string(f->name) : "?"]++;
      std::string g, tr;
      for (int id : got) g += std::to_string(id) + " ";
      for (int id : truth) tr += std::to_string(id) + " ";
      std::printf("  pc %#llx (%s+%#llx) ra %#llx: unwound [%s] truth [%s]\n",
                  static_cast<unsigned long long>(s.regs.pc), f ? std::string(f->name).c_str() : "?",
                  static_cast<unsigned long long>(f ? s.regs.pc - f->start : 0),
                  static_cast<unsigned long long>(s.regs.ra), g.c_str(), tr.c_str());
    }
  }
  const double acc = 100.0 * t.correct_frames / std::max<size_t>(1, t.expected_frames);
  std::printf("[%s] samples %zu exact %zu (%.1f%%), frames %zu/%zu correct (%.2f%%), "
              "frames lost to tail calls %zu, prologue/epilogue samples %zu\n",
              GetParam().c_str(), t.samples, t.exact, 100.0 * t.exact / t.samples,
              t.correct_frames, t.expected_frames, acc, t.tail_lost, t.transition);
  for (const auto& [name, count] : failures) std::printf("  mismatch with leaf in %s: %d\n", name.c_str(), count);
  EXPECT_EQ(t.exact, t.samples);
  EXPECT_EQ(not_outermost, 0u) << "stacks that did not end at the outermost frame";
}

INSTANTIATE_TEST_SUITE_P(
    Programs, RecordedStacks,
    testing::Values("workload-mips64el-O0", "workload-mips64el-O2", "workload-mips64el-O2fp",
                    "workload-mips64el-Os", "workload-mips64-O0", "workload-mips64-O2",
                    "workload-mips64-O2fp", "workload-mips64-Os"),
    [](const auto& info) {
      std::string n = info.param;
      for (char& c : n) if (c == '-') c = '_';
      return n;
    });

}  // namespace
}  // namespace strata::unwind::mips64
