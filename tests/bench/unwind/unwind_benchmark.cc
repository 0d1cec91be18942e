// ns per sample for unwinding the same captured stacks (registers + stack copy, as a perf
// sample delivers them) with: the compiled CFI table (strata), libunwind's remote API with
// accessors over the copied bytes, and libdw (dwfl_getthread_frames with a memory callback).
// Depths 10, 50, 200 of a recursive non-inlined chain; frames per sample are reported.
//
// Steady state (BM_Seq*): a sequence of four samples of one thread whose outer frames stay
// and whose leaf side changes (chain depths d, d-1, d, d-2 from the same call site), replayed
// in order, as the agent sees a thread at 99 Hz. Full unwinding, the incremental unwinder
// (boundary and full verification) and libunwind run over the same sequence; the counters
// give frames per sample and frames actually unwound (rule lookups) per sample; for full
// verification also the reused frames re-derived with their row (0 when the word compare
// decides everything).
#include <benchmark/benchmark.h>
#include <elfutils/libdwfl.h>
#include <libunwind.h>
#include <link.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "common/unwind/incremental.h"
#include "common/unwind/unwind_test_chain.h"
#include "common/unwind/unwind_test_space.h"
#include "common/unwind/unwinder.h"

extern "C" int _Ux86_64_dwarf_search_unwind_table(unw_addr_space_t, unw_word_t, unw_dyn_info_t*,
                                                  unw_proc_info_t*, int, void*);

namespace strata::unwind {
namespace {

using testing::CapturedStack;

const CapturedStack& Stack(int depth) {
  static std::map<int, std::unique_ptr<CapturedStack>> stacks;
  auto& s = stacks[depth];
  if (!s) {
    s = std::make_unique<CapturedStack>();
    testing::CaptureChainNoFp(depth, s.get());
  }
  return *s;
}

// Four samples whose outer frames coincide: captured from one call site, one after another.
const std::vector<CapturedStack>& Sequence(int depth) {
  static std::map<int, std::unique_ptr<std::vector<CapturedStack>>> seqs;
  auto& s = seqs[depth];
  if (!s) {
    s = std::make_unique<std::vector<CapturedStack>>(4);
    const int depths[4] = {depth, depth - 1, depth, depth - 2};
    for (int i = 0; i < 4; ++i) testing::CaptureChainNoFp(depths[i], &(*s)[i]);
  }
  return *s;
}

const testing::SelfAddressSpace& Space() {
  static auto* space = new testing::SelfAddressSpace();
  return *space;
}

// ---------------------------------------------------------------------------- strata

void BM_CfiTable(benchmark::State& state) {
  const CapturedStack& cap = Stack(state.range(0));
  Frame frames[512];
  UnwindOptions options;
  options.max_frames = 512;
  size_t n = 0;
  for (auto _ : state) {
    n = Unwind(options, cap.regs, cap.snapshot(), Space(), frames, 512).num_frames;
    benchmark::DoNotOptimize(frames[n - 1]);
  }
  state.counters["frames"] = n;
}

void BM_SeqFull(benchmark::State& state) {
  const auto& seq = Sequence(state.range(0));
  Frame frames[512];
  UnwindOptions options;
  options.max_frames = 512;
  size_t i = 0, total = 0;
  for (auto _ : state) {
    const CapturedStack& cap = seq[i++ & 3];
    size_t n = Unwind(options, cap.regs, cap.snapshot(), Space(), frames, 512).num_frames;
    total += n;
    benchmark::DoNotOptimize(frames[n - 1]);
  }
  state.counters["frames"] = benchmark::Counter(total, benchmark::Counter::kAvgIterations);
  state.counters["unwound"] = benchmark::Counter(total, benchmark::Counter::kAvgIterations);
}

void SeqIncremental(benchmark::State& state, VerifyMode mode) {
  const auto& seq = Sequence(state.range(0));
  Frame frames[512];
  IncrementalOptions options;
  options.unwind.max_frames = 512;
  options.verify = mode;
  IncrementalUnwinder inc(options);
  // Warm the cache with the last sample of the cycle: what the previous tick left behind.
  inc.Unwind({seq[3].regs, seq[3].snapshot(), 1, false}, Space(), frames, 512);
  const IncrementalTotals before = inc.totals();
  size_t i = 0, total = 0;
  for (auto _ : state) {
    const CapturedStack& cap = seq[i++ & 3];
    size_t n = inc.Unwind({cap.regs, cap.snapshot(), 1, false}, Space(), frames, 512).num_frames;
    total += n;
    benchmark::DoNotOptimize(frames[n - 1]);
  }
  const IncrementalTotals& t = inc.totals();
  state.counters["frames"] = benchmark::Counter(total, benchmark::Counter::kAvgIterations);
  state.counters["unwound"] = benchmark::Counter(t.frames_unwound - before.frames_unwound,
                                                 benchmark::Counter::kAvgIterations);
  state.counters["reused"] = benchmark::Counter(t.frames_reused - before.frames_reused,
                                                benchmark::Counter::kAvgIterations);
  state.counters["rederived"] = benchmark::Counter(t.frames_rederived - before.frames_rederived,
                                                   benchmark::Counter::kAvgIterations);
  state.counters["verify_fail"] = t.verify_failures - before.verify_failures;
}
void BM_SeqIncrementalBoundary(benchmark::State& state) { SeqIncremental(state, VerifyMode::kBoundary); }
void BM_SeqIncrementalFull(benchmark::State& state) { SeqIncremental(state, VerifyMode::kFull); }

// ---------------------------------------------------------------------------- libunwind

struct UnwArg {
  const CapturedStack* cap;
};

int FindProcInfo(unw_addr_space_t as, unw_word_t ip, unw_proc_info_t* pi, int need, void* arg) {
  struct Found {
    unw_word_t ip;
    unw_dyn_info_t di;
    bool ok;
  } f{ip, {}, false};
  dl_iterate_phdr([](dl_phdr_info* info, size_t, void* data) {
    auto* f = static_cast<Found*>(data);
    const ElfW(Phdr)* text = nullptr;
    const ElfW(Phdr)* eh = nullptr;
    for (int i = 0; i < info->dlpi_phnum; ++i) {
      const ElfW(Phdr)& ph = info->dlpi_phdr[i];
      if (ph.p_type == PT_LOAD && (ph.p_flags & PF_X) && f->ip >= info->dlpi_addr + ph.p_vaddr &&
          f->ip < info->dlpi_addr + ph.p_vaddr + ph.p_memsz) {
        text = &ph;
      }
      if (ph.p_type == PT_GNU_EH_FRAME) eh = &ph;
    }
    if (text == nullptr || eh == nullptr) return 0;
    // .eh_frame_hdr: version, ptr encodings, eh_frame_ptr (4), fde_count (4), table.
    const uint8_t* hdr = reinterpret_cast<const uint8_t*>(info->dlpi_addr + eh->p_vaddr);
    uint32_t count;
    std::memcpy(&count, hdr + 8, 4);
    f->di.format = UNW_INFO_FORMAT_REMOTE_TABLE;
    f->di.start_ip = info->dlpi_addr + text->p_vaddr;
    f->di.end_ip = info->dlpi_addr + text->p_vaddr + text->p_memsz;
    f->di.u.rti.segbase = reinterpret_cast<unw_word_t>(hdr);
    f->di.u.rti.table_data = reinterpret_cast<unw_word_t>(hdr + 12);
    f->di.u.rti.table_len = count * 8 / sizeof(unw_word_t);
    f->ok = true;
    return 1;
  }, &f);
  if (!f.ok) return -UNW_ENOINFO;
  return _Ux86_64_dwarf_search_unwind_table(as, ip, &f.di, pi, need, arg);
}

void PutUnwindInfo(unw_addr_space_t, unw_proc_info_t*, void*) {}
int GetDynInfoListAddr(unw_addr_space_t, unw_word_t*, void*) { return -UNW_ENOINFO; }

int AccessMem(unw_addr_space_t, unw_word_t addr, unw_word_t* val, int write, void* arg) {
  if (write) return -UNW_EINVAL;
  const CapturedStack* cap = static_cast<UnwArg*>(arg)->cap;
  uint64_t v;
  if (cap->snapshot().Read64(addr, false, &v)) {
    *val = v;
    return 0;
  }
  // Not stack: module memory (eh_frame, code) of this very process.
  if (addr < 4096 || (addr >= cap->stack_start - (1 << 20) && addr < cap->stack_start + (1 << 24))) {
    return -UNW_EINVAL;
  }
  std::memcpy(val, reinterpret_cast<const void*>(addr), sizeof *val);
  return 0;
}

int AccessReg(unw_addr_space_t, unw_regnum_t reg, unw_word_t* val, int write, void* arg) {
  if (write) return -UNW_EINVAL;
  const CapturedStack* cap = static_cast<UnwArg*>(arg)->cap;
  switch (reg) {
    case UNW_X86_64_RIP: *val = cap->regs.pc; return 0;
    case UNW_X86_64_RSP: *val = cap->regs.sp; return 0;
    case UNW_X86_64_RBP: *val = cap->regs.fp; return 0;
    default: *val = 0; return 0;
  }
}

int AccessFpreg(unw_addr_space_t, unw_regnum_t, unw_fpreg_t*, int, void*) { return -UNW_EINVAL; }
int Resume(unw_addr_space_t, unw_cursor_t*, void*) { return -UNW_EINVAL; }
int GetProcName(unw_addr_space_t, unw_word_t, char*, size_t, unw_word_t*, void*) { return -UNW_EINVAL; }

unw_addr_space_t LibunwindSpace() {
  static unw_accessors_t accessors = {FindProcInfo, PutUnwindInfo, GetDynInfoListAddr, AccessMem,
                                      AccessReg, AccessFpreg, Resume, GetProcName};
  static unw_addr_space_t as = [] {
    unw_addr_space_t a = unw_create_addr_space(&accessors, 0);
    unw_set_caching_policy(a, UNW_CACHE_GLOBAL);
    return a;
  }();
  return as;
}

void BM_SeqLibunwind(benchmark::State& state) {
  const auto& seq = Sequence(state.range(0));
  unw_addr_space_t as = LibunwindSpace();
  size_t i = 0, total = 0;
  for (auto _ : state) {
    UnwArg arg{&seq[i++ & 3]};
    unw_cursor_t cursor;
    if (unw_init_remote(&cursor, as, &arg) != 0) {
      state.SkipWithError("unw_init_remote failed");
      return;
    }
    size_t n = 1;
    while (n < 512 && unw_step(&cursor) > 0) ++n;
    total += n;
    benchmark::DoNotOptimize(n);
  }
  state.counters["frames"] = benchmark::Counter(total, benchmark::Counter::kAvgIterations);
  state.counters["unwound"] = benchmark::Counter(total, benchmark::Counter::kAvgIterations);
}

void BM_LibunwindRemote(benchmark::State& state) {
  const CapturedStack& cap = Stack(state.range(0));
  unw_addr_space_t as = LibunwindSpace();
  UnwArg arg{&cap};
  size_t n = 0;
  for (auto _ : state) {
    unw_cursor_t cursor;
    if (unw_init_remote(&cursor, as, &arg) != 0) {
      state.SkipWithError("unw_init_remote failed");
      return;
    }
    n = 1;
    while (n < 512 && unw_step(&cursor) > 0) ++n;
    benchmark::DoNotOptimize(n);
  }
  state.counters["frames"] = n;
}

// ---------------------------------------------------------------------------- libdw

struct DwArg {
  const CapturedStack* cap;
  size_t frames;
};

pid_t DwNextThread(Dwfl*, void*, void** thread_argp) {
  if (*thread_argp != nullptr) return 0;
  *thread_argp = reinterpret_cast<void*>(1);
  return getpid();
}

bool DwMemoryRead(Dwfl*, Dwarf_Addr addr, Dwarf_Word* result, void* arg) {
  const CapturedStack* cap = static_cast<DwArg*>(arg)->cap;
  uint64_t v;
  if (!cap->snapshot().Read64(addr, false, &v)) return false;
  *result = v;
  return true;
}

DwArg g_dw_arg{nullptr, 0};  // set_initial_registers gets the thread argument, not this

bool DwSetInitialRegisters(Dwfl_Thread* thread, void*) {
  const CapturedStack* cap = g_dw_arg.cap;
  Dwarf_Word regs[17] = {};
  regs[6] = cap->regs.fp;
  regs[7] = cap->regs.sp;
  if (!dwfl_thread_state_registers(thread, 0, 17, regs)) return false;
  dwfl_thread_state_register_pc(thread, cap->regs.pc);
  return true;
}

const Dwfl_Thread_Callbacks kDwCallbacks = {DwNextThread, nullptr, DwMemoryRead,
                                            DwSetInitialRegisters, nullptr, nullptr};

void BM_Libdw(benchmark::State& state) {
  const CapturedStack& cap = Stack(state.range(0));
  static char* debuginfo_path = nullptr;
  static const Dwfl_Callbacks callbacks = {dwfl_linux_proc_find_elf, dwfl_standard_find_debuginfo,
                                           nullptr, &debuginfo_path};
  DwArg& arg = g_dw_arg;
  static Dwfl* dwfl = [] {
    Dwfl* d = dwfl_begin(&callbacks);
    dwfl_linux_proc_report(d, getpid());
    dwfl_report_end(d, nullptr, nullptr);
    if (!dwfl_attach_state(d, nullptr, getpid(), &kDwCallbacks, &arg)) return static_cast<Dwfl*>(nullptr);
    return d;
  }();
  if (dwfl == nullptr) {
    state.SkipWithError("dwfl_attach_state failed");
    return;
  }
  arg.cap = &cap;
  for (auto _ : state) {
    arg.frames = 0;
    dwfl_getthread_frames(dwfl, getpid(), [](Dwfl_Frame*, void* a) -> int {
      return ++static_cast<DwArg*>(a)->frames < 512 ? DWARF_CB_OK : DWARF_CB_ABORT;
    }, &arg);
    benchmark::DoNotOptimize(arg.frames);
  }
  state.counters["frames"] = arg.frames;
}

BENCHMARK(BM_CfiTable)->Arg(10)->Arg(50)->Arg(200);
BENCHMARK(BM_LibunwindRemote)->Arg(10)->Arg(50)->Arg(200);
BENCHMARK(BM_Libdw)->Arg(10)->Arg(50)->Arg(200);
BENCHMARK(BM_SeqFull)->Arg(10)->Arg(50)->Arg(200);
BENCHMARK(BM_SeqIncrementalBoundary)->Arg(10)->Arg(50)->Arg(200);
BENCHMARK(BM_SeqIncrementalFull)->Arg(10)->Arg(50)->Arg(200);
BENCHMARK(BM_SeqLibunwind)->Arg(10)->Arg(50)->Arg(200);

}  // namespace
}  // namespace strata::unwind

BENCHMARK_MAIN();
