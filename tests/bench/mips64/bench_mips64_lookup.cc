// MIPS64 unwinding cost on a real MIPS64 binary (the statically linked workload, libc
// included), natively on x86-64:
//  - PC -> function: page-indexed table vs plain binary search vs gdb's backward scan from
//    the PC for the frame allocation (`daddiu sp,sp,-N`);
//  - PC -> row: function lookup plus the row compare;
//  - whole unwinds of the stacks recorded under qemu (ns per sample);
//  - table construction for the module.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "common/elf/elf_file.h"
#include "common/unwind/mips64/prologue_table.h"
#include "tests/mips64/recorded_sample.h"

namespace strata::unwind::mips64 {
namespace {

struct Fixture {
  std::unique_ptr<elf::ElfFile> elf;
  std::unique_ptr<PrologueTable> table;
  uint64_t text_lo = 0;
  std::vector<uint32_t> text;  // host-order words of the executable segment
  std::vector<uint64_t> pcs;   // random instruction addresses inside functions
  std::vector<RecordedSample> samples;
  std::unique_ptr<StaticModuleSpace> space;
};

Fixture& Get() {
  static Fixture* f = [] {
    auto* fx = new Fixture;
    const std::string path = std::string(STRATA_MIPS64_TESTDATA_DIR) + "/workload-mips64el-O2";
    auto elf = elf::ElfFile::Open(path);
    if (!elf.ok()) {
      std::fprintf(stderr, "cannot open %s\n", path.c_str());
      std::abort();
    }
    fx->elf = std::move(*elf);
    fx->table = std::move(*BuildMips64Table(*fx->elf));
    for (const elf::LoadSegment& seg : fx->elf->load_segments()) {
      if (!seg.executable()) continue;
      auto bytes = fx->elf->ReadAt(seg.vaddr, seg.filesz);
      fx->text_lo = seg.vaddr;
      for (size_t i = 0; i + 4 <= bytes->size(); i += 4) {
        fx->text.push_back(LoadWord(reinterpret_cast<const uint8_t*>(bytes->data()) + i,
                                    fx->elf->big_endian()));
      }
    }
    std::mt19937_64 rng(1);
    const PrologueTable& t = *fx->table;
    while (fx->pcs.size() < 4096) {
      const size_t i = rng() % t.num_functions();
      const uint64_t len = t.function_end(i) - t.function_start(i);
      if (len < 4) continue;
      fx->pcs.push_back((t.function_start(i) + rng() % len) & ~uint64_t{3});
    }
    fx->space = std::make_unique<StaticModuleSpace>(*fx->elf, fx->table.get());
    ReadRecordedSamples(path + ".samples", fx->elf->big_endian(), &fx->samples);
    std::fprintf(stderr, "module: %zu functions, %zu rows, %zu instructions, table %zu bytes\n",
                 t.stats().functions, t.stats().rows, t.stats().instructions,
                 t.stats().memory_bytes);
    return fx;
  }();
  return *f;
}

void BM_PageIndexedLookup(benchmark::State& state) {
  Fixture& f = Get();
  size_t i = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(f.table->FindFunction(f.pcs[i++ & 4095]));
  }
}
BENCHMARK(BM_PageIndexedLookup);

void BM_BinarySearchLookup(benchmark::State& state) {
  Fixture& f = Get();
  size_t i = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(f.table->FindFunctionBinarySearch(f.pcs[i++ & 4095]));
  }
}
BENCHMARK(BM_BinarySearchLookup);

// What gdb (mips-tdep.c heuristic_proc_start) and the kernel do without a table: walk words
// backwards from the PC until the frame allocation `daddiu sp,sp,-N` (bounded).
void BM_GdbBackwardScan(benchmark::State& state) {
  Fixture& f = Get();
  size_t i = 0;
  for (auto _ : state) {
    const uint64_t pc = f.pcs[i++ & 4095];
    int64_t k = static_cast<int64_t>((pc - f.text_lo) / 4);
    const int64_t limit = std::max<int64_t>(0, k - 16384);
    for (; k > limit; --k) {
      const uint32_t w = f.text[static_cast<size_t>(k)];
      if (insn::IsSpAdjust(w) && insn::Imm(w) < 0) break;
    }
    benchmark::DoNotOptimize(k);
  }
}
BENCHMARK(BM_GdbBackwardScan);

void BM_FindRow(benchmark::State& state) {
  Fixture& f = Get();
  size_t i = 0;
  UnwindRow row;
  for (auto _ : state) {
    benchmark::DoNotOptimize(f.table->FindRow(f.pcs[i++ & 4095], true, &row));
  }
}
BENCHMARK(BM_FindRow);

void BM_UnwindRecordedSample(benchmark::State& state) {
  Fixture& f = Get();
  Frame frames[128];
  size_t i = 0, total = 0;
  for (auto _ : state) {
    const RecordedSample& s = f.samples[i++ % f.samples.size()];
    total += UnwindRecorded(f.table->arch(), *f.space, s, frames, 128).num_frames;
  }
  state.counters["frames_per_sample"] =
      benchmark::Counter(static_cast<double>(total) / static_cast<double>(state.iterations()));
}
BENCHMARK(BM_UnwindRecordedSample);

void BM_BuildTable(benchmark::State& state) {
  Fixture& f = Get();
  for (auto _ : state) {
    auto t = BuildMips64Table(*f.elf);
    benchmark::DoNotOptimize(t);
  }
}
BENCHMARK(BM_BuildTable)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace strata::unwind::mips64

BENCHMARK_MAIN();
