// MIPS64 unwinding cost on a real MIPS64 binary (the statically linked workload, libc
// included), natively on x86-64:
//  - PC -> function: page-indexed table vs plain binary search vs gdb's backward scan from
//    the PC for the frame allocation (`daddiu sp,sp,-N`);
//  - PC -> row: function lookup plus the row compare;
//  - whole unwinds of the stacks recorded under qemu (ns per sample);
//  - table construction for the module;
//  - full vs incremental unwinding (common/unwind/incremental.h) per sample:
//    BM_Replay/<program>/<mode>: every recorded sample of the workload's thread replayed in
//    recording order (wrapping around) through unwind::Unwind (mode 0), IncrementalUnwinder
//    with boundary (1) and full (2) verification;
//    BM_ChainSeq/<depth>/<mode>: steady state on a real MIPS64 binary (programs/chain.c): four
//    samples of one call site at recursion depths d, d-1, d, d-2, replayed in a loop, for
//    d = 10, 50, 200 (the recorded workload stacks average 8 frames).
//    Counters per sample: frames, unwound (rule lookups), reused (from the cache), rederived
//    (full verification re-derived with the cached row). The setup checks that both
//    incremental modes return frame for frame (pc, sp, ra slot, count, stop reason) what
//    unwind::Unwind returns for every sample in that order, and aborts otherwise.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/elf/elf_file.h"
#include "common/unwind/incremental.h"
#include "common/unwind/mips64/prologue_table.h"
#include "common/unwind/mips64/recorded_sample.h"

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

// ------------------------------------------------------------ full vs incremental, per sample

// One real MIPS64 program and its samples in recording order (one thread).
struct Program {
  std::string name;
  std::unique_ptr<elf::ElfFile> elf;
  std::unique_ptr<PrologueTable> table;
  std::unique_ptr<StaticModuleSpace> space;
  std::vector<RecordedSample> samples;
  size_t boundary_differing = 0;  // per replayed round (CheckModes)
  Arch arch() const { return table->arch(); }
};

constexpr size_t kMaxFrames = 512;

SampleInput InputOf(const RecordedSample& s) {
  // The copies end at the thread's stack top (__libc_stack_end + 64), one mapping epoch.
  return {s.regs, s.snapshot(), 1, true};
}

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "mips64_lookup_benchmark: %s\n", what.c_str());
  std::abort();
}

// Replays `order` (indices into p.samples) `rounds` times through a fresh incremental
// unwinder in `mode`, after warming it with sample `warm` (-1: cold), and compares every
// result with unwind::Unwind frame for frame (pc, sp, ra slot, count, stop reason). Returns
// the number of samples that differ; `must_equal` aborts at the first one.
size_t CompareWithFull(const Program& p, const std::vector<size_t>& order, int warm,
                       VerifyMode mode, int rounds, bool must_equal) {
  IncrementalOptions options;
  options.unwind.arch = p.arch();
  options.unwind.max_frames = kMaxFrames;
  options.verify = mode;
  IncrementalUnwinder inc(options);
  UnwindOptions full;
  full.arch = p.arch();
  full.max_frames = kMaxFrames;
  static Frame want[kMaxFrames], got[kMaxFrames];
  if (warm >= 0) {
    inc.Unwind(InputOf(p.samples[static_cast<size_t>(warm)]), *p.space, got, kMaxFrames);
  }
  size_t differing = 0;
  for (int r = 0; r < rounds; ++r) {
    for (size_t k : order) {
      const RecordedSample& s = p.samples[k];
      const UnwindResult w = Unwind(full, s.regs, s.snapshot(), *p.space, want, kMaxFrames);
      const UnwindResult g = inc.Unwind(InputOf(s), *p.space, got, kMaxFrames);
      bool same = w.num_frames == g.num_frames && w.stop == g.stop;
      size_t first = 0;
      for (; same && first < w.num_frames; ++first) {
        same = want[first].pc == got[first].pc && want[first].sp == got[first].sp &&
               want[first].ra_slot == got[first].ra_slot;
      }
      if (same) continue;
      ++differing;
      if (!must_equal) continue;
      for (size_t j = 0; j < std::max(w.num_frames, g.num_frames); ++j) {
        std::fprintf(stderr, "  %2zu: full pc %#llx sp %#llx slot %#llx | incremental %#llx %#llx %#llx\n",
                     j, (unsigned long long)want[j].pc, (unsigned long long)want[j].sp,
                     (unsigned long long)want[j].ra_slot, (unsigned long long)got[j].pc,
                     (unsigned long long)got[j].sp, (unsigned long long)got[j].ra_slot);
      }
      Die(p.name + " sample " + std::to_string(k) + " (" + std::string(VerifyModeName(mode)) +
          "): " + std::to_string(w.num_frames) + " frames " + std::string(StopReasonName(w.stop)) +
          " vs " + std::to_string(g.num_frames) + " " + std::string(StopReasonName(g.stop)));
    }
  }
  return differing;
}

// Full verification must equal the full unwind on every sample; boundary verification checks
// only the splice element and may reuse outer frames that changed (e.g. recursion that
// returned and re-descended through another call site onto the same slots): counted.
size_t CheckModes(const Program& p, const std::vector<size_t>& order, int warm, int rounds) {
  CompareWithFull(p, order, warm, VerifyMode::kFull, rounds, true);
  const size_t boundary = CompareWithFull(p, order, warm, VerifyMode::kBoundary, rounds, false);
  std::fprintf(stderr, "%s: %zu samples x %d rounds: full verification equal to the full unwind "
               "on all; boundary verification differs on %zu\n",
               p.name.c_str(), order.size(), rounds, boundary);
  return boundary;
}

std::unique_ptr<Program> LoadProgram(const std::string& binary, const std::string& samples,
                                     const std::string& name) {
  auto p = std::make_unique<Program>();
  p->name = name;
  auto elf = elf::ElfFile::Open(binary);
  if (!elf.ok()) Die("cannot open " + binary);
  p->elf = std::move(*elf);
  auto table = BuildMips64Table(*p->elf);
  if (!table.ok()) Die("no table for " + binary);
  p->table = std::move(*table);
  p->space = std::make_unique<StaticModuleSpace>(*p->elf, p->table.get());
  if (!ReadRecordedSamples(samples, p->elf->big_endian(), &p->samples) || p->samples.empty()) {
    Die("cannot read " + samples);
  }
  return p;
}

// Recorded workloads (tests/mips64: SIGPROF every 1 ms of thread CPU time under qemu).
const char* const kReplayPrograms[] = {"workload-mips64el-O2", "workload-mips64el-O0",
                                       "workload-mips64el-O2fp", "workload-mips64el-Os",
                                       "workload-mips64-O2"};

const Program& ReplayProgram(int index) {
  static std::map<int, std::unique_ptr<Program>> programs;
  auto& p = programs[index];
  if (!p) {
    const std::string base = std::string(STRATA_MIPS64_TESTDATA_DIR) + "/" + kReplayPrograms[index];
    p = LoadProgram(base, base + ".samples", kReplayPrograms[index]);
    std::vector<size_t> order(p->samples.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    // One round as the benchmark loops it: warm with the last sample, wrap to the first.
    p->boundary_differing = CheckModes(*p, order, static_cast<int>(order.size()) - 1, 1);
  }
  return *p;
}

// chain-mips64el-O2.d<depth>.samples: d, d-1, d, d-2 from one call site.
const Program& ChainProgram(int depth) {
  static std::map<int, std::unique_ptr<Program>> programs;
  auto& p = programs[depth];
  if (!p) {
    const std::string base = std::string(STRATA_MIPS64_TESTDATA_DIR) + "/chain-mips64el-O2";
    p = LoadProgram(base, base + ".d" + std::to_string(depth) + ".samples",
                    "chain d" + std::to_string(depth));
    if (p->samples.size() != 4) Die(p->name + ": expected 4 samples");
    UnwindOptions full;
    full.arch = p->arch();
    full.max_frames = kMaxFrames;
    static Frame frames[kMaxFrames];
    const int depths[4] = {depth, depth - 1, depth, depth - 2};
    for (size_t i = 0; i < 4; ++i) {
      const RecordedSample& s = p->samples[i];
      const UnwindResult r = Unwind(full, s.regs, s.snapshot(), *p->space, frames, kMaxFrames);
      if (r.stop != StopReason::kOutermost || r.num_frames < static_cast<size_t>(depths[i]) + 2) {
        Die(p->name + ": sample " + std::to_string(i) + " unwound " +
            std::to_string(r.num_frames) + " frames, " + std::string(StopReasonName(r.stop)));
      }
    }
    p->boundary_differing = CheckModes(*p, {0, 1, 2, 3}, 3, 1);
  }
  return *p;
}

// Runs the samples of `p` in `order` (cyclically) with mode 0 = unwind::Unwind,
// 1 = incremental boundary, 2 = incremental full. `warm`: sample unwound before timing.
void RunSequence(benchmark::State& state, const Program& p, const std::vector<size_t>& order,
                 int warm, int mode) {
  static Frame frames[kMaxFrames];
  std::vector<SampleInput> inputs;
  for (size_t k : order) inputs.push_back(InputOf(p.samples[k]));
  const size_t n_in = inputs.size();
  size_t i = 0;
  uint64_t total = 0;
  if (mode == 0) {
    UnwindOptions options;
    options.arch = p.arch();
    options.max_frames = kMaxFrames;
    for (auto _ : state) {
      const SampleInput& in = inputs[i];
      if (++i == n_in) i = 0;
      const size_t n = Unwind(options, in.regs, in.stack, *p.space, frames, kMaxFrames).num_frames;
      total += n;
      benchmark::DoNotOptimize(frames[n - 1]);
    }
    state.counters["unwound"] = benchmark::Counter(static_cast<double>(total),
                                                   benchmark::Counter::kAvgIterations);
    state.counters["reused"] = 0;
    state.counters["rederived"] = 0;
  } else {
    IncrementalOptions options;
    options.unwind.arch = p.arch();
    options.unwind.max_frames = kMaxFrames;
    options.verify = mode == 1 ? VerifyMode::kBoundary : VerifyMode::kFull;
    IncrementalUnwinder inc(options);
    if (warm >= 0) {
      inc.Unwind(InputOf(p.samples[static_cast<size_t>(warm)]), *p.space, frames, kMaxFrames);
    }
    const IncrementalTotals before = inc.totals();
    for (auto _ : state) {
      const SampleInput& in = inputs[i];
      if (++i == n_in) i = 0;
      const size_t n = inc.Unwind(in, *p.space, frames, kMaxFrames).num_frames;
      total += n;
      benchmark::DoNotOptimize(frames[n - 1]);
    }
    const IncrementalTotals& t = inc.totals();
    auto avg = [](uint64_t v) {
      return benchmark::Counter(static_cast<double>(v), benchmark::Counter::kAvgIterations);
    };
    state.counters["unwound"] = avg(t.frames_unwound - before.frames_unwound);
    state.counters["reused"] = avg(t.frames_reused - before.frames_reused);
    state.counters["rederived"] = avg(t.frames_rederived - before.frames_rederived);
    state.counters["verify_fail"] = avg(t.verify_failures - before.verify_failures);
    // Share of samples of one round whose boundary-verified result differs from the full
    // unwind (CheckModes); 0 for full verification by construction (checked).
    state.counters["wrong"] = mode == 1 ? static_cast<double>(p.boundary_differing) /
                                              static_cast<double>(order.size())
                                        : 0.0;
  }
  state.counters["frames"] = benchmark::Counter(static_cast<double>(total),
                                                benchmark::Counter::kAvgIterations);
  state.SetLabel(p.name + " " + (mode == 0 ? "full-unwind" : mode == 1 ? "incr-boundary" : "incr-full"));
}

void BM_Replay(benchmark::State& state) {
  const Program& p = ReplayProgram(static_cast<int>(state.range(0)));
  std::vector<size_t> order(p.samples.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  // Warm with the last sample: the loop wraps around to the first one.
  RunSequence(state, p, order, static_cast<int>(order.size()) - 1, static_cast<int>(state.range(1)));
}
BENCHMARK(BM_Replay)->ArgsProduct({{0, 1, 2, 3, 4}, {0, 1, 2}});

void BM_ChainSeq(benchmark::State& state) {
  const Program& p = ChainProgram(static_cast<int>(state.range(0)));
  RunSequence(state, p, {0, 1, 2, 3}, 3, static_cast<int>(state.range(1)));
}
BENCHMARK(BM_ChainSeq)->ArgsProduct({{10, 50, 200}, {0, 1, 2}});

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
