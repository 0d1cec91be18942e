// Unwinds stacks recorded under qemu from real MIPS64 programs (programs/workload.c, both byte
// orders, -O0/-O2, with and without frame pointers) with the PrologueTable, and compares every
// sample frame by frame with the ground truth the program kept itself.
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
#include "tests/mips64/recorded_sample.h"

namespace strata::unwind::mips64 {
namespace {

// Same order as the enum in programs/workload.c.
const char* const kNames[] = {"main",        "work",        "leaf",          "recurse",
                              "use_alloca",  "big_frame",   "tail_caller",   "tail_target",
                              "qsort_cmp",   "sorter",      "epilogue_heavy"};

int IdOf(std::string_view name) {
  if (auto dot = name.find('.'); dot != std::string_view::npos) name = name.substr(0, dot);
  for (int i = 0; i < static_cast<int>(std::size(kNames)); ++i) {
    if (name == kNames[i]) return i;
  }
  return -1;
}

struct Totals {
  size_t samples = 0, exact = 0, transition = 0, expected_frames = 0, correct_frames = 0,
         tail_lost = 0;
};

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

  Totals t;
  std::map<std::string, int> failures;
  for (const RecordedSample& s : samples) {
    Frame frames[128];
    const size_t n = UnwindRecorded(arch, space, s, frames, 128).num_frames;
    // Instrumented frames only, innermost first (libc frames such as qsort's are unwound
    // through but not compared).
    std::vector<int> got;
    for (size_t i = 0; i < n; ++i) {
      const uint64_t lookup = i == 0 ? frames[i].pc : frames[i].pc - 4;
      const elf::SymbolTable::Function* f = symbols->Lookup(lookup);
      const int id = f ? IdOf(f->name) : -1;
      if (id >= 0) got.push_back(id);
      if (id == 0) break;  // main: the truth ends here
    }
    std::vector<int> truth(s.ids.rbegin(), s.ids.rend());
    std::vector<bool> tail(s.tail.rbegin(), s.tail.rend());
    // The leaf may be inside an instrumented function's prologue/epilogue, before its push or
    // after its pop: then the truth has it on top of the shadow stack.
    const elf::SymbolTable::Function* leaf = symbols->Lookup(s.regs.pc);
    const int leaf_id = leaf ? IdOf(leaf->name) : -1;
    bool transition = false;
    if (leaf_id >= 0 && !got.empty() && got[0] == leaf_id &&
        (truth.empty() || truth[0] != leaf_id || got.size() == truth.size() + 1)) {
      // Recursion (truth[0] == leaf_id) is ambiguous; only a chain one longer counts there.
      truth.insert(truth.begin(), leaf_id);
      tail.insert(tail.begin(), false);
      transition = true;
    }
    // Match, allowing tail-called-away frames to be missing (counted).
    size_t gi = 0, correct = 0, lost = 0;
    for (size_t k = 0; k < truth.size(); ++k) {
      if (gi < got.size() && got[gi] == truth[k]) {
        ++gi;
        ++correct;
      } else if (tail[k]) {
        ++lost;
      }
    }
    t.samples++;
    t.transition += transition;
    t.expected_frames += truth.size() - lost;
    t.correct_frames += correct;
    t.tail_lost += lost;
    const bool ok = correct + lost == truth.size() && gi == got.size();
    t.exact += ok;
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
