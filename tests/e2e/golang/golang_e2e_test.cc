// Go programs end to end: a Go workload (tests/e2e/golang/workload: one goroutine hashing with
// crypto/sha256, one sorting and encoding JSON, one allocating -- its CPU mostly on the system
// stack -- and, with cgo, one in C that calls back into Go) profiled by the real strata-agent
// and strata-server while it writes its own runtime/pprof CPU profile. Strata's view must
// agree with Go's: the top three functions of `go tool pprof -top -cum`, the allocating
// goroutine (its system-stack work crossed with the kernel's frame-pointer walk at the sample
// once the goroutine has moved on) and the callback goroutine (its stacks cross cgo calls and
// callbacks) have the same cumulative share within 3 points, and stacks that reach a
// goroutine's root (runtime.goexit) are complete, never marked truncated. Unstripped,
// stripped (-ldflags=-s -w: names from .gopclntab) and with cgo, built by Debian's Go 1.19;
// and unstripped and stripped built by Go 1.23 (variants go1.23_plain and go1.23_stripped: the
// 1.20+ .gopclntab layout, the frame pointer pushed before the frame is allocated) and by Go 1.27
// (go1.27_*: a table whose textStart its linker left 0).
#include <signal.h>
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/testing/temp_dir.h"
#include "gtest/gtest.h"
#include "tests/e2e/golang/pprof_top.h"
#include "tests/e2e/harness.h"

namespace strata::e2e {
namespace {

// Strata's rate: many samples in a few seconds. Go's profiler keeps its default 100 Hz, where
// its shares are exact (above it drops samples unevenly); it samples every 10 ms of each
// thread's CPU time, so its shares have little noise.
constexpr int kHz = 499;
constexpr double kSeconds = 9;     // the workload's run
constexpr double kTolerance = 3;   // percentage points

// `go tool pprof -top -cum`'s rows (with the `go` that built the binary), and in *samples the
// profile's sample count.
std::vector<CumShare> PprofTopCum(const std::string& go, const std::string& binary,
                                  const std::string& profile, double* samples) {
  CommandResult r = RunCommand({go, "tool", "pprof", "-top", "-cum", binary, profile}, 60);
  return ParsePprofTopCum(r.output, samples);
}

struct StrataView {
  uint64_t total = 0;
  std::map<std::string, uint64_t> cum;  // samples of paths holding the function
  uint64_t truncated = 0;
  uint64_t complete_goroutine_truncated = 0;  // reach runtime.goexit yet marked truncated
  uint64_t reach_goexit = 0;
  uint64_t in_c = 0, in_c_complete = 0;  // cgo: C code (strata_c_spin) under asmcgocall
  uint64_t in_c_to_goexit = 0;             // ... of the complete, on to runtime.goexit
  // cgo: Go called back from C (main.goSpin), the stacks of it that reach the goroutine
  // that called C, and of those the ones through the C code that called back.
  uint64_t callback = 0, callback_complete = 0, callback_through_c = 0;
  std::string top_paths;  // for failure messages
};

StrataView Query(const std::string& address, const std::string& service) {
  StrataView v;
  v1::HotPathsResponse paths = QueryHotPaths(address, service);
  v.total = paths.total_samples();
  int listed = 0;
  for (const auto& p : paths.paths()) {
    const std::vector<std::string> names = FrameNames(p);
    const std::set<std::string> distinct(names.begin(), names.end());
    for (const std::string& n : distinct) v.cum[n] += p.samples();
    if (p.truncated()) v.truncated += p.samples();
    // The static C function is inlined into cgo's wrapper, _cgo_<hash>_Cfunc_strata_c_spin.
    if (std::any_of(names.begin(), names.end(), [](const std::string& n) {
          return n.find("strata_c_spin") != std::string::npos;
        })) {
      v.in_c += p.samples();
      // Complete: through asmcgocall on to the goroutine's root while the goroutine is still
      // in that call when the agent reads its state, else up to asmcgocall.
      if (!p.truncated() && (names.front() == "runtime.asmcgocall" ||
                             (names.front() == "runtime.goexit" &&
                              distinct.count("runtime.asmcgocall")))) {
        v.in_c_complete += p.samples();
        v.in_c_to_goexit += names.front() == "runtime.goexit" ? p.samples() : 0;
      }
    }
    if (distinct.count("main.goSpin")) {
      v.callback += p.samples();
      // Outermost first: the goroutine, its call into C, the C code, the callback.
      const auto at = [&](const std::string& n) {
        return std::find(names.begin(), names.end(), n) - names.begin();
      };
      const auto c_code = at("strata_c_calls_back");  // (not cgo's wrappers around it)
      const auto end = static_cast<std::ptrdiff_t>(names.size());
      if (!p.truncated() && names.front() == "runtime.goexit" &&
          at("main.callbackWorker") < at("runtime.cgocallback") &&
          at("runtime.cgocallback") < at("main.goSpin")) {
        v.callback_complete += p.samples();
        if (at("main.callbackWorker") < at("runtime.asmcgocall") &&
            at("runtime.asmcgocall") < c_code && c_code < at("runtime.cgocallback") &&
            c_code < end) {
          v.callback_through_c += p.samples();
        }
      }
    }
    if (distinct.count("runtime.goexit")) {
      v.reach_goexit += p.samples();
      if (p.truncated()) v.complete_goroutine_truncated += p.samples();
    }
    // STRATA_GO_E2E_VERBOSE=1: the stacks outside the goroutines (runtime work on g0).
    if (!distinct.count("runtime.goexit") && getenv("STRATA_GO_E2E_VERBOSE")) {
      std::cout << "other " << p.samples() << (p.truncated() ? " [t] " : " ")
                << absl::StrJoin(names, ";") << "\n";
    }
    if (listed++ < 15) {
      absl::StrAppend(&v.top_paths, p.samples(), p.truncated() ? " [t] " : " ",
                      absl::StrJoin(names, ";"), "\n");
    }
  }
  return v;
}

class GoProfileTest : public ::testing::TestWithParam<std::string> {
 protected:
  strata::testing::TempDir dir_{"strata_go_e2e"};
};

TEST_P(GoProfileTest, AgreesWithRuntimePprof) {
  const std::string variant = GetParam();
  const std::string binary = std::string(STRATA_GO_DIR) + "/go_workload_" + variant;
  // "goVERSION_..." variants were built by that release's toolchain, the others by Debian's.
  const std::string version =
      variant.rfind("go", 0) == 0 ? variant.substr(2, variant.find('_') - 2) : "";
  const std::string go = version.empty()    ? STRATA_GO
                         : version == "1.23" ? STRATA_GO_1_23
                         : version == "1.27" ? STRATA_GO_1_27
                                             : "";
  if (go.empty()) {
    GTEST_SKIP() << "no Go " << version << " toolchain: not in STRATA_GO_VERSIONS, or "
                 << "deploy/cross/make-go-root.sh could not fetch it (CMake's output)";
  }
  struct stat st;
  if (stat(binary.c_str(), &st) != 0) GTEST_SKIP() << binary << " not built";
  const bool stripped = variant.size() >= 8 && variant.substr(variant.size() - 8) == "stripped";
  std::string service = "go-" + variant;
  std::replace(service.begin(), service.end(), '.', '-');
  const std::string profile = dir_.File("cpu.pprof");
  ServerProcess server(dir_.File("data"), dir_.File("server.log"));
  ASSERT_GT(server.port(), 0) << server.process().Output();
  ChildProcess workload({binary, "-seconds", absl::StrCat(kSeconds), "-cpuprofile", profile,
                         "-switches"},
                        dir_.File("workload.log"), {{"STRATA_SERVICE", service}});
  ASSERT_TRUE(workload.WaitForOutput("ready", 30)) << workload.Output();
  ChildProcess agent({BinPath("strata-agent"), "--server", server.address(), "--pid",
                      std::to_string(workload.pid()), "--frequency", absl::StrCat(kHz),
                      "--interval", "1", "--spool-dir", "none"},
                     dir_.File("agent.log"));
  ASSERT_TRUE(agent.WaitForOutput(absl::StrCat("profiling pid ", workload.pid()), 30))
      << agent.Output();
  // The work (and Go's own profile) starts now that the agent samples it.
  ASSERT_EQ(kill(workload.pid(), SIGUSR1), 0);
  ASSERT_EQ(workload.Wait(kSeconds + 60), 0) << workload.Output();
  const double agent_cpu_s = ProcessCpuSeconds(agent.pid());
  EXPECT_EQ(agent.Stop(SIGTERM, 15), 0) << agent.Output();

  double pprof_samples = 0;
  const std::vector<CumShare> pprof = PprofTopCum(go, binary, profile, &pprof_samples);
  ASSERT_GE(pprof.size(), 3u) << "no pprof output";
  ASSERT_GT(pprof_samples, 0) << "no total in pprof's output";
  // The share of the process's CPU time (while the profile ran) that pprof's profile holds.
  std::smatch process_cpu;
  const std::string workload_out = workload.Output();
  ASSERT_TRUE(std::regex_search(workload_out, process_cpu, std::regex(R"(process cpu (\d+))")))
      << workload_out;
  const double coverage = pprof_samples / 100 / (std::stod(process_cpu[1]) / 1e9);
  const StrataView strata = Query(server.address(), service);
  ASSERT_GT(strata.total, 200u) << agent.Output();
  std::string report;
  for (size_t i = 0; i < 3; ++i) {
    // pprof shows inlined calls as functions of their own; Strata's hot paths name the
    // functions that hold the code.
    const std::string name = std::regex_replace(pprof[i].function, std::regex(R"( \(inline\)$)"), "");
    const auto it = strata.cum.find(name);
    const double ours = 100.0 * (it == strata.cum.end() ? 0 : it->second) / strata.total;
    absl::StrAppend(&report, name, ": strata ", ours, "% pprof ", pprof[i].percent, "%\n");
    // pprof samples at 100 Hz: a few hundred samples, whose share has a standard error of
    // about 2.5 points. Beyond kTolerance, allow twice that error (Strata's, from thousands
    // of samples, is small).
    const double p = pprof[i].percent / 100;
    const double pprof_error = 100 * std::sqrt(p * (1 - p) / pprof_samples);
    EXPECT_LE(DistanceFromPprofShare(ours, pprof[i].percent, coverage),
              kTolerance + 2 * pprof_error)
        << name << ": strata " << ours << "%, pprof " << pprof[i].percent << "% of "
        << 100 * coverage << "% of the process's CPU time\n" << strata.top_paths;
  }
  for (size_t i = 3; i < pprof.size() && i < 25; ++i) {
    const std::string name = std::regex_replace(pprof[i].function, std::regex(R"( \(inline\)$)"), "");
    const auto it = strata.cum.find(name);
    absl::StrAppend(&report, "  ", name, ": strata ",
                    100.0 * (it == strata.cum.end() ? 0 : it->second) / strata.total, "% pprof ",
                    pprof[i].percent, "%\n");
  }
  // The goroutines whose CPU is past a stack switch: allocating (GC assists, spans from the
  // heap: on the system stack) and, with cgo, Go called back from C. pprof follows those
  // switches; so must Strata.
  for (const std::string name : {"main.allocWorker", "main.callbackWorker"}) {
    if (name == "main.callbackWorker" && variant != "cgo") continue;
    double theirs = 0;
    for (const CumShare& row : pprof) {
      if (row.function == name) theirs = row.percent;
    }
    const auto it = strata.cum.find(name);
    const double ours = 100.0 * (it == strata.cum.end() ? 0 : it->second) / strata.total;
    absl::StrAppend(&report, name, ": strata ", ours, "% pprof ", theirs, "%\n");
    const double p = theirs / 100;
    const double pprof_error = 100 * std::sqrt(p * (1 - p) / pprof_samples);
    EXPECT_GT(theirs, 2) << name << " has too little CPU to compare";
    EXPECT_LE(DistanceFromPprofShare(ours, theirs, coverage), kTolerance + 2 * pprof_error)
        << name << ": strata " << ours << "%, pprof " << theirs << "% of " << 100 * coverage
        << "% of the process's CPU time\n" << strata.top_paths;
  }
  // The goroutines' own CPU times (each runs locked to a thread), for the record.
  std::smatch cpu;
  ASSERT_TRUE(std::regex_search(workload_out, cpu,
                                std::regex(R"(cpu hash (\d+) \d+ \d+ sort (\d+))")))
      << workload_out;
  const double hash = std::stod(cpu[1]), sort = std::stod(cpu[2]);
  const double hash_share = 100 * hash / (hash + sort);
  const double strata_hash = static_cast<double>(strata.cum.count("main.hashWorker") ? strata.cum.at("main.hashWorker") : 0);
  const double strata_sort = static_cast<double>(strata.cum.count("main.sortAndEncode") ? strata.cum.at("main.sortAndEncode") : 0);
  const double strata_hash_share = 100 * strata_hash / std::max(1.0, strata_hash + strata_sort);
  absl::StrAppend(&report, "  thread CPU time: hashing ", hash_share,
                  "% of the two goroutines', strata ", strata_hash_share, "%\n");
  absl::StrAppend(&report, "  pprof's profile holds ", 100 * coverage,
                  "% of the process's CPU time\n");
  // For the record only: the runtime's own goroutines (GC workers) and stacks that stay on
  // g0 (the scheduler) are in neither, so this split is not checked.
  // Incremental unwinding works on Go stacks: outer frames are reused sample after sample.
  std::smatch unwinding;
  const std::string agent_log = agent.Output();
  ASSERT_TRUE(std::regex_search(agent_log, unwinding,
                                std::regex(R"(unwinding \((\w+)\): (\d+) frames walked, (\d+) reused, (\d+) verification)")))
      << agent_log;
  absl::StrAppend(&report, "  unwinding (", unwinding[1].str(), "): ", unwinding[2].str(),
                  " frames walked, ", unwinding[3].str(), " reused, ", unwinding[4].str(),
                  " verification failures\n");
  EXPECT_GT(std::stoull(unwinding[3]), 0u) << agent_log;
  // Stack switches crossed onto the goroutine's (or the C caller's) stack.
  std::smatch crossings;
  if (std::regex_search(agent_log, crossings,
                        std::regex(R"(stack switches: (\d+) crossed, (\d+) not crossed)"))) {
    absl::StrAppend(&report, "  stack switches: ", crossings[1].str(), " crossed, ",
                    crossings[2].str(), " not crossed\n");
  }
  if (getenv("STRATA_GO_E2E_VERBOSE")) {
    std::istringstream lines(agent_log);
    for (std::string line; std::getline(lines, line);) {
      if (line.find("DEBUG") != std::string::npos) std::cout << line << "\n";
    }
  }
  std::cout << "[ " << variant << " ] " << strata.total << " samples, truncated "
            << strata.truncated << ", reaching runtime.goexit " << strata.reach_goexit << "\n"
            << report << "  " << AgentCostReport(agent_cpu_s, agent_log) << "\n";
  EXPECT_EQ(strata.complete_goroutine_truncated, 0u) << strata.top_paths;
  // Most samples are of the workload's goroutines, whose stacks end at runtime.goexit; the
  // rest is the runtime's own work on the system stack: the scheduler, and the GC's mark
  // workers, which leave the system stack and park before the agent reads where they came
  // from (their stacks end at runtime.systemstack, complete).
  EXPECT_GT(strata.reach_goexit, strata.total * 7 / 10) << strata.top_paths;
  EXPECT_LT(strata.truncated, strata.total / 10) << strata.top_paths;
  if (variant == "cgo") {
    // C frames unwind with the C code's CFI up to asmcgocall, and on from there on the
    // goroutine's stack that called C while that call lasts (a short call like this one has
    // returned by the time the agent reads: those end at asmcgocall, complete).
    std::cout << "[ cgo ] C code: " << strata.in_c << " samples, " << strata.in_c_complete
              << " of them complete, " << strata.in_c_to_goexit
              << " through runtime.asmcgocall to runtime.goexit\n";
    EXPECT_GT(strata.in_c, 0u) << strata.top_paths;
    // A few tens of samples: a sample or two caught switching stacks is not a trend.
    EXPECT_GE(strata.in_c_complete + 3, strata.in_c * 9 / 10) << strata.top_paths;
    // Go called back from C: under runtime.cgocallback, the goroutine that called C. The C
    // code that called back lies between where the callback still ran when the agent read
    // g0's state; else the stack goes on as Go's own traceback does, without it.
    std::cout << "[ cgo ] callbacks: " << strata.callback << " samples, "
              << strata.callback_complete << " of them complete to runtime.goexit, "
              << strata.callback_through_c << " through the C code that called back\n";
    EXPECT_GT(strata.callback, 0u) << strata.top_paths;
    EXPECT_GE(strata.callback_complete + 3, strata.callback * 9 / 10) << strata.top_paths;
    EXPECT_GT(strata.callback_through_c, 0u) << strata.top_paths;
  }

  // strata quality counts the Go binary's frames as Go, and nearly all of them are.
  {
    auto stub = v1::Query::NewStub(server.Channel());
    grpc::ClientContext context;
    v1::QualityRequest request;
    request.mutable_filter()->set_service(service);
    v1::QualityResponse quality;
    ASSERT_TRUE(stub->Quality(&context, request, &quality).ok());
    uint64_t go_frames = 0;
    for (const v1::FrameKindCount& k : quality.frames_by_kind()) {
      if (k.kind() == "go") go_frames = k.frames();
    }
    std::cout << "[ " << variant << " ] quality: " << go_frames << " Go frames of "
              << quality.frames() << "\n";
    EXPECT_GT(go_frames, quality.frames() * 8 / 10) << quality.ShortDebugString();
  }

  if (!stripped) return;
  // Lines and inlined calls from the stripped binary's .gopclntab on the server: uploaded
  // after the samples (known by its Go build ID), it gives them file:line and inline frames.
  CommandResult upload = RunCommand({BinPath("strata"), "--server", server.address(),
                                     "debuginfo", "upload", binary});
  ASSERT_EQ(upload.exit_code, 0) << upload.output;
  auto stub = v1::Query::NewStub(server.Channel());
  grpc::ClientContext context;
  v1::TopRequest request;
  request.mutable_filter()->set_service(service);
  request.set_by_line(true);
  request.set_limit(1000);
  v1::TopResponse response;
  ASSERT_TRUE(stub->Top(&context, request, &response).ok());
  uint64_t with_line = 0, in_block = 0, inlined = 0;
  std::string lines;
  for (const v1::LineStat& l : response.lines()) {
    if (l.frames_size() == 0 || l.frames(0).line() == 0) continue;
    with_line += l.self();
    // crypto/sha256.block (Go 1.19-1.23), crypto/internal/fips140/sha256.blockSHANI and its
    // kin (1.24+), in the package's sha256block_amd64.s.
    const v1::Frame& leaf = l.frames(0);
    if (absl::StrContains(leaf.function(), "sha256.block") &&
        absl::EndsWith(leaf.file(), "/sha256block_amd64.s")) {
      in_block += l.self();
    }
    for (const v1::Frame& f : l.frames()) inlined += f.inlined() ? l.self() : 0;
    if (lines.size() < 4000) absl::StrAppend(&lines, l.ShortDebugString(), "\n");
  }
  std::cout << "[ " << variant << " ] by line: " << with_line << " of " << response.total_samples()
            << " samples with a line, " << in_block << " in sha256block_amd64.s, " << inlined
            << " in inlined calls\n";
  EXPECT_GT(with_line, response.total_samples() * 9 / 10) << lines;
  EXPECT_GT(in_block, response.total_samples() / 4) << lines;
  EXPECT_GT(inlined, 0u) << lines;
}

INSTANTIATE_TEST_SUITE_P(Variants, GoProfileTest,
                         ::testing::Values("plain", "stripped", "cgo", "go1.23_plain",
                                           "go1.23_stripped", "go1.27_plain", "go1.27_stripped"),
                         [](const auto& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), '.', '_');
                           return name;
                         });

}  // namespace
}  // namespace strata::e2e
