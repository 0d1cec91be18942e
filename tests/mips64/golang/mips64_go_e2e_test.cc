// Go on MIPS64 end to end. The Go workload of tests/e2e/golang (one goroutine hashing with
// crypto/sha256, one sorting and encoding JSON, a cgo call), cross-built for mips64le with
// the sampler of recorder/ linked in, runs under qemu-mips64el -- where there are no perf
// events -- while it writes its own runtime/pprof CPU profile. The sampler records what a perf
// sample holds (the interrupted registers and the stack bytes from sp up) on per-thread
// CPU-time timers; the host unwinds every record as the agent does: the module from the
// agent's ModuleCache (Go rules from .gopclntab, names from .gopclntab and .symtab), one
// incremental unwinder per thread with full verification, Arch::kMips64El. Strata's view
// must agree with Go's: the top three functions of `go tool pprof -top -cum` have the same
// cumulative share within 3 points (plus twice pprof's sampling error, as on x86-64), and
// stacks that reach a goroutine's root (runtime.goexit) are complete. Unstripped and stripped
// (-ldflags=-s -w: Go's names from .gopclntab only), built by Debian's Go 1.19 and by Go 1.23
// (variants go1.23_plain and go1.23_stripped: the 1.20+ .gopclntab layout). The switches
// variants also run the goroutines whose work crosses stack switches (allocating: systemstack
// and mcall; called back from C: cgo calls and callbacks), crossed by the agent's
// GoroutineStacks over the runtime memory the sampler copied with each sample (g, m, and the
// other stack): their shares must agree with pprof's too, and every callback's stack must run
// through the C code that called back to runtime.goexit.
#include <signal.h>
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "agent/golang/goroutine_stacks.h"
#include "agent/python/remote_memory.h"
#include "agent/symbols/module_cache.h"
#include "common/elf/go_pclntab.h"
#include "common/testing/temp_dir.h"
#include "tests/e2e/golang/pprof_top.h"
#include "common/unwind/incremental.h"
#include "common/unwind/mips64/recorded_sample.h"
#include "gtest/gtest.h"
#include "tests/e2e/harness.h"

namespace strata::e2e {
namespace {

// The workload runs until it has used kCpuSeconds of CPU (about 1,000 samples of each
// profile), however much of the machine qemu gets, for at most kMaxSeconds.
constexpr double kCpuSeconds = 10;
constexpr double kMaxSeconds = 60;
constexpr int kHz = 100;          // the sampler's rate per thread CPU second (Go's too)
constexpr double kTolerance = 3;  // percentage points
constexpr size_t kMaxFrames = 256;

// Layout of struct record in recorder/recorder.c (little-endian, like the target).
struct RecordHeader {
  uint64_t magic;
  uint32_t tid;
  uint32_t flags;
  uint64_t pc;
  uint64_t gregs[32];
  uint64_t stack_start;
  uint64_t stack_size;
  uint64_t memory_size;  // bytes of runtime memory regions after the stack bytes
};
struct RegionHeader {
  uint64_t start;
  uint64_t size;
};
constexpr uint64_t kSampleMagic = 0x504d53474f525453ull;  // "STRGOSMP"
constexpr uint64_t kEndMagic = 0x444e45474f525453ull;     // "STRGOEND"

struct Region {
  uint64_t start = 0;
  std::vector<uint8_t> bytes;
};

struct Record {
  uint32_t tid = 0;
  bool top_from_g = false;  // the copy ends at the top of the goroutine's (or g0's) stack
  unwind::mips64::RecordedSample sample;
  std::vector<Region> memory;  // the runtime's memory as it was at the sample
};

// The size of the other stacks the recorder copies and the crossings read (their
// GoroutineStacks' stack_bytes): both sides must agree, a read being all or nothing.
constexpr size_t kCrossedStackBytes = 16 << 10;

// The recorder's STRATA_GO_RECORD_LAYOUT: the offsets the crossings read, from their own table.
std::string RecorderLayout() {
  const agent::golang::RuntimeLayout& l =
      *agent::golang::RuntimeLayoutFor(unwind::Arch::kMips64El);
  return absl::StrCat(l.g_stack_hi, ",", l.g_m, ",", l.g_sched_sp, ",", l.g_size, ",", l.m_g0,
                      ",", l.m_curg, ",", kCrossedStackBytes);
}

// The target's memory as a crossing reads it: what the recorder copied at the current sample.
class RecordedMemory final : public agent::python::RemoteMemory {
 public:
  RecordedMemory() : RemoteMemory(0) {}
  void set_record(const Record* record) { record_ = record; }
  // From the regions, or from the sample's own stack copy (a cgo call's goroutine, read
  // while a callback from that call runs on it).
  bool Read(uint64_t address, void* out, size_t size) const override {
    auto from = [&](uint64_t start, const std::vector<uint8_t>& bytes) {
      if (address < start || size > bytes.size() || address - start > bytes.size() - size) {
        return false;
      }
      std::memcpy(out, bytes.data() + (address - start), size);
      return true;
    };
    if (from(record_->sample.stack_start, record_->sample.stack)) return true;
    for (const Region& r : record_->memory) {
      if (from(r.start, r.bytes)) return true;
    }
    return false;
  }

 private:
  const Record* record_ = nullptr;
};

// The module's rules, and the stack crossings of GoroutineStacks over the recorded memory.
class CrossingSpace final : public unwind::AddressSpace {
 public:
  CrossingSpace(const unwind::AddressSpace& modules, const agent::golang::GoroutineStacks& stacks)
      : modules_(modules), stacks_(stacks) {}
  bool Lookup(uint64_t pc, const unwind::RuleSource** rules, uint64_t* module_pc) const override {
    return modules_.Lookup(pc, rules, module_pc);
  }
  bool CrossStack(const unwind::StackCrossing& at, unwind::CrossedStack* to) const override {
    return stacks_.Cross(at, to);
  }

 private:
  const unwind::AddressSpace& modules_;
  const agent::golang::GoroutineStacks& stacks_;
};

// The records, and whether the end record (written last) was found with their count.
bool ReadRecords(const std::string& path, std::vector<Record>* out, uint32_t* dropped) {
  std::ifstream in(path, std::ios::binary);
  RecordHeader h;
  while (in.read(reinterpret_cast<char*>(&h), sizeof h)) {
    if (h.magic == kEndMagic) {
      *dropped = h.flags;
      return h.tid == out->size();
    }
    if (h.magic != kSampleMagic || h.stack_size > (1u << 20)) return false;
    Record r;
    r.tid = h.tid;
    r.top_from_g = h.flags & 1;
    r.sample.regs.pc = h.pc;
    r.sample.regs.sp = h.gregs[29];
    r.sample.regs.fp = h.gregs[30];
    r.sample.regs.ra = h.gregs[31];
    r.sample.regs.g = h.gregs[30];  // Go's g register
    r.sample.stack_start = h.stack_start;
    r.sample.stack.resize(h.stack_size);
    const size_t padded = (h.stack_size + 7) & ~uint64_t{7};
    std::vector<char> bytes(padded);
    if (!in.read(bytes.data(), static_cast<std::streamsize>(padded))) return false;
    std::memcpy(r.sample.stack.data(), bytes.data(), h.stack_size);
    for (uint64_t read = 0; read < h.memory_size;) {
      RegionHeader region;
      if (h.memory_size - read < sizeof region ||
          !in.read(reinterpret_cast<char*>(&region), sizeof region)) {
        return false;
      }
      const uint64_t region_padded = (region.size + 7) & ~uint64_t{7};
      read += sizeof region + region_padded;
      if (region.size > (1u << 20) || read > h.memory_size) return false;
      Region& m = r.memory.emplace_back();
      m.start = region.start;
      m.bytes.resize(region_padded);
      if (!in.read(reinterpret_cast<char*>(m.bytes.data()),
                   static_cast<std::streamsize>(region_padded))) {
        return false;
      }
      m.bytes.resize(region.size);
    }
    out->push_back(std::move(r));
  }
  return false;
}

// `go tool pprof -top -cum`'s rows (flat flat% sum% cum cum% name), and in *samples the
// profile's sample count (its CPU time at the runtime's 100 Hz). With the names the runtime
// wrote into the profile (-symbolize=none): through qemu the profile's mapping names the
// binary's host path, and pprof's own symbolization of a stripped mips64le cgo binary found
// there names other functions than the runtime does.
std::vector<CumShare> PprofTopCum(const std::string& go, const std::string& profile,
                                  double* samples) {
  CommandResult r = RunCommand({go, "tool", "pprof", "-symbolize=none", "-top", "-cum", profile},
                               60);
  return ParsePprofTopCum(r.output, samples);
}

struct StrataView {
  uint64_t total = 0;
  uint64_t sysmon = 0;  // samples of sysmon's thread, not counted in total
  std::map<std::string, uint64_t> cum;  // samples of stacks holding the function
  std::map<std::string, uint64_t> stops;  // by stop reason
  uint64_t truncated = 0;
  uint64_t reach_goexit = 0;
  uint64_t complete_goroutine_truncated = 0;  // reach runtime.goexit yet truncated
  uint64_t copy_from_g = 0;
  uint64_t frames_walked = 0, frames_reused = 0, verify_failures = 0;
  uint64_t crossings = 0, crossings_failed = 0;  // stack switches crossed, and not
  // Go called back from C (main.goSpin), the stacks of it that reach the goroutine that
  // called C, and of those the ones through the C code that called back.
  uint64_t callback = 0, callback_complete = 0, callback_through_c = 0;
  std::string symbols_source;  // where the module's names came from
  std::map<std::string, uint64_t> truncated_paths;  // for failure messages
  std::map<std::string, uint64_t> outside_goroutines;  // stacks not reaching goexit
};

// Unwinds every record as the agent unwinds a perf sample of the process (StackRecorder):
// per thread, an incremental unwinder over the module's rules; then names each frame (the
// innermost by its pc, callers by their call: return address - 1).
StrataView Unwind(const std::string& binary, const std::vector<Record>& records) {
  StrataView v;
  agent::symbols::ModuleCache cache;
  struct stat st{};
  stat(binary.c_str(), &st);
  auto module = cache.Get(binary, binary, st.st_ino);
  EXPECT_TRUE(module.ok()) << module.status();
  if (!module.ok()) return v;
  EXPECT_NE((*module)->rules, nullptr) << (*module)->rules_status;
  if ((*module)->rules == nullptr) return v;
  v.symbols_source = (*module)->symbols_source;
  // Inlined calls are named from the table too, as the server does once it has the binary:
  // pprof lists them as functions of their own.
  auto table = elf::GoPclntab::Find(*(*module)->elf);
  EXPECT_TRUE(table.ok()) << table.status();
  if (!table.ok()) return v;
  const unwind::mips64::StaticModuleSpace modules(*(*module)->elf, (*module)->rules.get());
  // Stack switches are crossed as the agent crosses them, over the memory recorded with each
  // sample instead of the target's.
  auto memory = std::make_unique<RecordedMemory>();
  RecordedMemory* recorded = memory.get();
  const agent::golang::GoroutineStacks stacks(unwind::Arch::kMips64El, std::move(memory),
                                              kCrossedStackBytes);
  const CrossingSpace space(modules, stacks);
  unwind::IncrementalOptions options;
  options.unwind.arch = unwind::Arch::kMips64El;
  options.unwind.max_frames = kMaxFrames;
  options.verify = unwind::VerifyMode::kFull;
  std::map<uint32_t, std::unique_ptr<unwind::IncrementalUnwinder>> threads;
  std::vector<unwind::Frame> frames(kMaxFrames);
  for (const Record& r : records) {
    auto& unwinder = threads[r.tid];
    if (unwinder == nullptr) unwinder = std::make_unique<unwind::IncrementalUnwinder>(options);
    unwind::SampleStats stats;
    recorded->set_record(&r);
    const unwind::UnwindResult result = unwinder->Unwind(
        {r.sample.regs, r.sample.snapshot(), /*epoch=*/0, /*stack_end_known=*/r.top_from_g},
        space, frames.data(), frames.size(), &stats);
    v.frames_walked += stats.frames_unwound;
    v.frames_reused += stats.frames_reused;
    v.verify_failures += stats.verify_failed;
    v.crossings += result.stack_crossings;
    v.crossings_failed += result.crossings_failed;
    std::vector<std::string> names;
    std::set<std::string> distinct;
    for (size_t i = 0; i < result.num_frames; ++i) {
      const uint64_t pc = i == 0 ? frames[i].pc : frames[i].pc - 1;
      const elf::SymbolTable::Function* f = (*module)->symbols.Lookup(pc);
      names.push_back(f != nullptr ? std::string(f->name) : "[unknown]");
      distinct.insert(names.back());
      if (const int64_t fi = (*table)->FindFunction(pc); fi >= 0) {
        for (const auto& inlined : (*table)->Symbolize((*table)->functions()[fi], pc)) {
          distinct.insert(std::string(inlined.function));
        }
      }
    }
    const bool truncated = result.stop != unwind::StopReason::kOutermost;
    // Go's profiler never samples sysmon's thread (it runs without a P); its samples are left
    // out here too, so that both profiles divide by the same CPU.
    if (distinct.count("runtime.sysmon")) {
      ++v.sysmon;
      continue;
    }
    ++v.total;
    ++v.stops[std::string(unwind::StopReasonName(result.stop))];
    v.copy_from_g += r.top_from_g;
    for (const std::string& n : distinct) ++v.cum[n];
    if (distinct.count("main.goSpin")) {
      ++v.callback;
      // Outermost first: the goroutine, its call into C, the C code, the callback.
      const std::vector<std::string> outward(names.rbegin(), names.rend());
      const auto at = [&](const std::string& n) {
        return std::find(outward.begin(), outward.end(), n) - outward.begin();
      };
      const auto c_code = at("strata_c_calls_back");
      if (!truncated && outward.front() == "runtime.goexit" &&
          at("main.callbackWorker") < at("runtime.cgocallback") &&
          at("runtime.cgocallback") < at("main.goSpin")) {
        ++v.callback_complete;
        if (at("main.callbackWorker") < at("runtime.asmcgocall") &&
            at("runtime.asmcgocall") < c_code && c_code < at("runtime.cgocallback")) {
          ++v.callback_through_c;
        }
      }
    }
    if (distinct.count("runtime.goexit")) {
      ++v.reach_goexit;
      v.complete_goroutine_truncated += truncated;
    } else {
      ++v.outside_goroutines[absl::StrJoin(names.rbegin(), names.rend(), " > ")];
    }
    if (truncated) {
      ++v.truncated;
      ++v.truncated_paths[absl::StrCat(std::string(unwind::StopReasonName(result.stop)), ": ",
                                       absl::StrJoin(names, " < "))];
    }
  }
  return v;
}

std::string TruncatedPaths(const StrataView& v) {
  std::string out;
  for (const auto& [path, n] : v.truncated_paths) absl::StrAppend(&out, n, " ", path, "\n");
  return out.substr(0, 6000);
}

class Mips64GoTest : public ::testing::TestWithParam<std::string> {
 protected:
  strata::testing::TempDir dir_{"strata_mips64_go"};
};

TEST_P(Mips64GoTest, AgreesWithRuntimePprof) {
  if (std::string(STRATA_GO).empty()) GTEST_SKIP() << "no go (golang-go) installed";
  if (std::string(STRATA_QEMU_MIPS64EL).empty()) GTEST_SKIP() << "no qemu-mips64el installed";
  if (std::string(STRATA_MIPS64EL_GCC).empty()) {
    GTEST_SKIP() << "no mips64el-linux-gnuabi64-gcc (cgo's cross compiler) installed";
  }
  const std::string variant = GetParam();
  const bool go123 = variant.rfind("go1.23_", 0) == 0;
  const bool stripped = variant.size() >= 8 && variant.substr(variant.size() - 8) == "stripped";
  // With the goroutines whose work crosses stack switches: allocating (systemstack, mcall)
  // and called back from C (cgo calls and callbacks).
  const bool switches = variant.size() >= 8 && variant.substr(variant.size() - 8) == "switches";
  const std::string go = go123 ? STRATA_GO_1_23 : STRATA_GO;
  if (go.empty()) {
    GTEST_SKIP() << "no Go 1.23 toolchain: not in STRATA_GO_VERSIONS, or "
                    "deploy/cross/make-go-root.sh could not fetch it (CMake's output)";
  }
  const std::string binary = std::string(STRATA_GO_DIR) + "/mips64le_go_workload" +
                             (go123 ? "_go1.23" : "") + (stripped ? "_stripped" : "");
  const std::string profile = dir_.File("cpu.pprof");
  const std::string samples = dir_.File("samples");
  std::vector<std::string> argv = {
      STRATA_QEMU_MIPS64EL, binary, "-seconds", absl::StrCat(kMaxSeconds), "-cpu-seconds",
      absl::StrCat(kCpuSeconds), "-cpuprofile", profile};
  if (switches) argv.push_back("-switches");
  ChildProcess workload(argv, dir_.File("workload.log"),
                        {{"STRATA_GO_RECORD", samples},
                         {"STRATA_GO_RECORD_HZ", absl::StrCat(kHz)},
                         {"STRATA_GO_RECORD_SECONDS", absl::StrCat(kMaxSeconds)},
                         {"STRATA_GO_RECORD_LAYOUT", RecorderLayout()}});
  ASSERT_TRUE(workload.WaitForOutput("ready", 30)) << workload.Output();
  // Both profiles start now, for the same work (qemu passes the signal to the program).
  ASSERT_EQ(kill(workload.pid(), SIGUSR1), 0);
  ASSERT_EQ(workload.Wait(kMaxSeconds + 60), 0) << workload.Output();
  ASSERT_NE(workload.Output().find("recorded "), std::string::npos) << workload.Output();

  std::vector<Record> records;
  uint32_t dropped = 0;
  ASSERT_TRUE(ReadRecords(samples, &records, &dropped)) << "incomplete " << samples;
  EXPECT_EQ(dropped, 0u);
  const StrataView strata = Unwind(binary, records);
  ASSERT_GT(strata.total, 500u) << workload.Output();
  // Stripped, the Go functions are named by Go's own table.
  EXPECT_EQ(strata.symbols_source, stripped ? "gopclntab" : "symtab");

  double pprof_samples = 0;
  const std::vector<CumShare> pprof = PprofTopCum(go, profile, &pprof_samples);
  ASSERT_GE(pprof.size(), 3u) << "no pprof output";
  ASSERT_GT(pprof_samples, 0) << "no total in pprof's output";
  auto share = [&](const std::string& name) {
    const auto it = strata.cum.find(name);
    return 100.0 * (it == strata.cum.end() ? 0 : it->second) / strata.total;
  };
  std::string report;
  for (size_t i = 0; i < pprof.size() && i < 12; ++i) {
    absl::StrAppend(&report, i < 3 ? "" : "  ", pprof[i].function, ": strata ",
                    share(pprof[i].function), "% pprof ", pprof[i].percent, "%\n");
    if (i >= 3) continue;
    // Each profile's share of several hundred samples has a standard error of about 2 points
    // (fewer samples when qemu gets less of a loaded machine): twice their combined error.
    const double p = pprof[i].percent / 100;
    const double sampling_error =
        100 * std::sqrt(p * (1 - p) / pprof_samples + p * (1 - p) / strata.total);
    EXPECT_NEAR(share(pprof[i].function), pprof[i].percent, kTolerance + 2 * sampling_error)
        << pprof[i].function << "\n" << TruncatedPaths(strata);
  }
  // The goroutines' own CPU times (each runs locked to a thread, its CPU time from
  // /proc/thread-self/schedstat): how each profile splits the two, for the record.
  std::smatch cpu;
  const std::string out = workload.Output();
  ASSERT_TRUE(std::regex_search(out, cpu, std::regex(R"(cpu hash (\d+) \d+ \d+ sort (\d+))")))
      << out;
  auto hash_split = [](double hash, double sort) { return 100 * hash / std::max(1.0, hash + sort); };
  auto pprof_share = [&](const std::string& name) {
    for (const CumShare& row : pprof) {
      if (row.function == name) return row.percent;
    }
    return 0.0;
  };
  absl::StrAppend(&report, "  hashing's part of the two goroutines: thread CPU time ",
                  hash_split(std::stod(cpu[1]), std::stod(cpu[2])), "%, strata ",
                  hash_split(share("main.hashWorker"), share("main.sortAndEncode")), "%, pprof ",
                  hash_split(pprof_share("main.hashWorker"), pprof_share("main.sortAndEncode")),
                  "%\n");
  // The goroutines whose CPU is past a stack switch. pprof follows those switches; so must
  // Strata, and with the runtime's memory as it was at the sample nothing has moved on.
  if (switches) {
    for (const std::string name : {"main.allocWorker", "main.callbackWorker"}) {
      const double theirs = pprof_share(name), p = theirs / 100;
      absl::StrAppend(&report, "  ", name, ": strata ", share(name), "% pprof ", theirs, "%\n");
      EXPECT_GT(theirs, 2) << name << " has too little CPU to compare";
      const double sampling_error =
          100 * std::sqrt(p * (1 - p) / pprof_samples + p * (1 - p) / strata.total);
      EXPECT_NEAR(share(name), theirs, kTolerance + 2 * sampling_error)
          << name << "\n" << TruncatedPaths(strata);
    }
    absl::StrAppend(&report, "  stack switches: ", strata.crossings, " crossed, ",
                    strata.crossings_failed, " not crossed\n  callbacks: ", strata.callback,
                    " samples, ", strata.callback_complete, " complete to runtime.goexit, ",
                    strata.callback_through_c, " through the C code that called back\n");
    EXPECT_GT(strata.crossings, 0u);
    EXPECT_GT(strata.callback, 0u);
    EXPECT_GE(strata.callback_complete + 3, strata.callback * 9 / 10) << TruncatedPaths(strata);
    EXPECT_GT(strata.callback_through_c, 0u) << TruncatedPaths(strata);
  }
  std::smatch recorded;
  if (std::regex_search(out, recorded, std::regex("recorded [^\n]*"))) {
    absl::StrAppend(&report, "  ", recorded.str(), "\n");
  }
  std::string stops;
  for (const auto& [reason, n] : strata.stops) absl::StrAppend(&stops, " ", reason, " ", n);
  std::cout << "[ " << variant << " ] " << strata.total << " samples, " << strata.sysmon
            << " of sysmon left out (pprof " << pprof_samples
            << "), truncated " << strata.truncated << ", reaching runtime.goexit "
            << strata.reach_goexit << ", copies to g's stack top " << strata.copy_from_g
            << "\n  stops:" << stops << "\n  unwinding: " << strata.frames_walked
            << " frames walked, " << strata.frames_reused << " reused, "
            << strata.verify_failures << " verification failures\n"
            << report;
  // STRATA_GO_E2E_VERBOSE=1: the stacks outside the goroutines (runtime work on g0).
  if (getenv("STRATA_GO_E2E_VERBOSE") != nullptr) {
    for (const auto& [path, n] : strata.outside_goroutines) std::cout << "other " << n << " " << path << "\n";
  }
  EXPECT_EQ(strata.complete_goroutine_truncated, 0u) << TruncatedPaths(strata);
  // Nearly every sample is of the goroutines, whose stacks end at runtime.goexit.
  EXPECT_GT(strata.reach_goexit, strata.total * 8 / 10) << TruncatedPaths(strata);
  EXPECT_LT(strata.truncated, strata.total / 20) << TruncatedPaths(strata);
  EXPECT_GT(strata.frames_reused, 0u);
}

INSTANTIATE_TEST_SUITE_P(Variants, Mips64GoTest,
                         ::testing::Values("plain", "stripped", "go1.23_plain", "go1.23_stripped",
                                           "switches", "go1.23_switches"),
                         [](const auto& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), '.', '_');
                           return name;
                         });

}  // namespace
}  // namespace strata::e2e
