// Python frames end to end: Debian's /usr/bin/python3.11, and the python3.14 and python3.15 of
// Debian unstable that deploy/cross/make-python-next-root.sh unpacks into the build (run
// through their own loader), run python_workload.py (two threads, a nested call chain, a
// generator, a coroutine; each function measures its own CPU time), the real strata-agent
// reads its interpreter's frames, the real strata-server stores them.
// Each function's share of the profile must match the share the workload measured in the
// same window within 3 points, and no eval-loop frame may be left on a stack that got
// Python frames.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/testing/temp_dir.h"
#include "gtest/gtest.h"
#include "strata/v1/query.grpc.pb.h"
#include "tests/e2e/harness.h"

namespace strata::e2e {
namespace {

// An interpreter to profile: the command that runs a script with it, and where its standard
// library lies.
struct Interpreter {
  std::vector<std::string> command;
  std::string stdlib;
  std::string missing;  // why it cannot run here, or empty
};

Interpreter InterpreterFor(const std::string& version) {
  Interpreter python;
  if (version == "3.11") {
    python.command = {"/usr/bin/python3.11"};
    python.stdlib = "/usr/lib/python3.11/";
  } else {
    const std::string root = STRATA_PYTHON_NEXT_ROOT;
    python.command = {root + "/usr/lib64/ld-linux-x86-64.so.2", "--library-path",
                      root + "/usr/lib/x86_64-linux-gnu", root + "/usr/bin/python" + version};
    python.stdlib = root + "/usr/lib/python" + version + "/";
  }
  if (!std::filesystem::exists(python.command.back())) {
    python.missing = absl::StrCat(python.command.back(), " is not there (",
                                  version == "3.11" ? "apt-get install python3.11"
                                                    : "deploy/cross/make-python-next-root.sh",
                                  ")");
  }
  return python;
}
constexpr char kEvalLoop[] = "_PyEval_EvalFrameDefault";
const std::vector<std::string> kFunctions = {"deep_leaf", "squares", "crunch", "plain_work"};

// The workload's last complete "acct name=seconds ..." line in `output` (the one it is
// writing may be cut short).
std::map<std::string, double> LastAccounting(const std::string& output) {
  std::map<std::string, double> acct;
  const size_t end = output.rfind('\n');
  if (end == std::string::npos) return acct;
  const size_t at = output.rfind("acct ", end);
  if (at == std::string::npos) return acct;
  const std::string line = output.substr(at + 5, output.find('\n', at) - at - 5);
  for (absl::string_view field : absl::StrSplit(line, ' ', absl::SkipEmpty())) {
    std::vector<std::string> kv = absl::StrSplit(field, '=');
    double v;
    if (kv.size() == 2 && absl::SimpleAtod(kv[1], &v)) acct[kv[0]] = v;
  }
  return acct;
}

std::string PathText(const v1::HotPath& p) {
  return absl::StrCat(p.samples(), ": ",
                      absl::StrJoin(p.frames(), " > ", [](std::string* out, const v1::Frame& f) {
                        absl::StrAppend(out, f.function());
                      }));
}

// (CPython version, --python-capture): auto (frames copied at each sample where the kernel
// allows: as root here), off (read from the target's memory after each sample, each waking the
// agent).
class PythonE2eTest
    : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(PythonE2eTest, FunctionSharesMatchTheWorkloadsOwnAccounting) {
  const auto& [version, capture] = GetParam();
  const Interpreter interpreter = InterpreterFor(version);
  if (!interpreter.missing.empty()) GTEST_SKIP() << interpreter.missing;
  strata::testing::TempDir dir("strata_python_e2e");
  ServerProcess server(dir.File("data"), dir.File("server.log"));
  ASSERT_GT(server.port(), 0) << server.process().Output();
  const std::string service = absl::StrCat("python-", getpid());
  std::vector<std::string> command = interpreter.command;
  command.insert(command.end(), {STRATA_PYTHON_WORKLOAD, "120"});
  ChildProcess python(command, dir.File("python.log"), {{"STRATA_SERVICE", service}});
  // Until its first complete accounting line.
  const absl::Time started = absl::Now();
  while (!LastAccounting(python.Output()).contains("process") && python.running() &&
         absl::Now() < started + absl::Seconds(60)) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_TRUE(LastAccounting(python.Output()).contains("process")) << python.Output();

  ChildProcess agent({BinPath("strata-agent"), "--server", server.address(), "--pid",
                      std::to_string(python.pid()), "--interval", "1", "--frequency", "499",
                      "--spool-dir", "none", "--python-capture", capture},
                     dir.File("agent.log"));
  ASSERT_TRUE(agent.WaitForOutput(absl::StrCat("profiling pid ", python.pid()), 60))
      << agent.Output();
  std::map<std::string, double> before = LastAccounting(python.Output());
  ASSERT_TRUE(before.contains("process")) << python.Output();
  for (const std::string& fn : kFunctions) ASSERT_TRUE(before.contains(fn)) << python.Output();
  // Until the workload used ~10 s of CPU in the window (the GIL lets it use about one CPU;
  // ~5000 samples at 499 Hz: the sampling error of a 25% share is about 0.6 points),
  // at most 60 s on a loaded machine.
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (absl::Now() < deadline && python.running() && agent.running() &&
         LastAccounting(python.Output())["process"] - before.at("process") < 10) {
    absl::SleepFor(absl::Milliseconds(200));
  }
  std::map<std::string, double> after = LastAccounting(python.Output());
  ASSERT_TRUE(after.contains("process")) << python.Output();
  for (const std::string& fn : kFunctions) ASSERT_TRUE(after.contains(fn)) << python.Output();
  const double agent_cpu_s = ProcessCpuSeconds(agent.pid());
  EXPECT_EQ(agent.Stop(SIGTERM, 30), 0) << agent.Output();
  python.Stop(SIGKILL);

  v1::HotPathsResponse paths = QueryHotPaths(server.address(), service);
  const double total = static_cast<double>(paths.total_samples());
  ASSERT_GE(total, 1000) << agent.Output();
  std::map<std::string, uint64_t> on_stack;  // samples with the function on the stack
  uint64_t with_python = 0, stale = 0, chain = 0, eval_left = 0;
  std::string top;
  for (int i = 0; i < paths.paths_size(); ++i) {
    const v1::HotPath& p = paths.paths(i);
    if (i < 12) absl::StrAppend(&top, PathText(p), "\n");
    bool python_frames = false, eval = false;
    std::vector<std::string> names;
    for (const v1::Frame& f : p.frames()) {
      names.push_back(f.function());
      eval |= f.function() == kEvalLoop;
      if (f.kind() != v1::FRAME_PYTHON) continue;
      python_frames = true;
      const std::string workload = absl::StrCat("[python:", STRATA_PYTHON_WORKLOAD, "]");
      EXPECT_TRUE(f.module() == workload ||
                  f.module().starts_with("[python:" + interpreter.stdlib))
          << f.module() << " of " << f.function() << " in " << PathText(p);
    }
    for (const std::string& fn : kFunctions) {
      if (std::find(names.begin(), names.end(), fn) != names.end()) on_stack[fn] += p.samples();
    }
    const std::string joined = absl::StrJoin(names, ">");
    if (joined.find("chain_outer>chain_middle>deep_leaf") != std::string::npos) {
      chain += p.samples();
    }
    with_python += python_frames ? p.samples() : 0;
    stale += !python_frames && eval ? p.samples() : 0;
    if (python_frames && eval) {
      eval_left += p.samples();
      ADD_FAILURE() << "eval-loop frame left beside Python frames: " << PathText(p);
    }
  }
  EXPECT_EQ(eval_left, 0u);
  const double window = after.at("process") - before.at("process");
  ASSERT_GT(window, 5) << python.Output();
  std::string report = absl::StrCat(
      "window ", window, " s of CPU, ", total, " samples, ", with_python,
      " with Python frames, ", stale, " with eval-loop frames only; agent CPU ", agent_cpu_s,
      " s (", agent_cpu_s * 1e6 / total, " us per sample, start-up included)\n");
  for (const std::string& fn : kFunctions) {
    const double measured = (after.at(fn) - before.at(fn)) / window;
    const double profiled = static_cast<double>(on_stack[fn]) / total;
    absl::StrAppend(&report, fn, ": profile ", profiled * 100, "%, workload ", measured * 100,
                    "%\n");
    EXPECT_NEAR(profiled, measured, 0.03) << fn;
  }
  std::fprintf(stderr, "%s%s\n", report.c_str(),
               AgentCostReport(agent_cpu_s, agent.Output()).c_str());
  std::fprintf(stderr, "hottest paths:\n%s", top.c_str());
  EXPECT_GT(chain, 0u) << "no nested chain_outer > chain_middle > deep_leaf path\n" << top;
  EXPECT_LT(static_cast<double>(stale) / total, 0.1) << report;

  // The agent's counters reached the server: Python frames read, stale stacks counted.
  auto stub = v1::Query::NewStub(server.Channel());
  v1::QualityRequest request;
  request.mutable_filter()->set_service(service);
  grpc::ClientContext context;
  v1::QualityResponse quality;
  ASSERT_TRUE(stub->Quality(&context, request, &quality).ok());
  EXPECT_GT(quality.python_frames(), with_python);
  EXPECT_NEAR(static_cast<double>(quality.python_stale()), static_cast<double>(stale),
              0.01 * total + 5)
      << report;
  // Lines: deep_leaf's samples at its loop (lines 24-25 of the workload).
  v1::TopRequest by_line;
  by_line.mutable_filter()->set_service(service);
  by_line.set_by_line(true);
  by_line.set_limit(1000);
  grpc::ClientContext line_context;
  v1::TopResponse lines;
  ASSERT_TRUE(stub->Top(&line_context, by_line, &lines).ok());
  uint64_t loop_lines = 0, deep_leaf_lines = 0;
  for (const v1::LineStat& l : lines.lines()) {
    if (l.frames_size() == 0 || l.frames(0).function() != "deep_leaf") continue;
    EXPECT_EQ(l.frames(0).file(), STRATA_PYTHON_WORKLOAD);
    deep_leaf_lines += l.self();
    loop_lines += l.frames(0).line() == 24 || l.frames(0).line() == 25 ? l.self() : 0;
  }
  EXPECT_GT(deep_leaf_lines, 0u);
  EXPECT_GE(loop_lines, deep_leaf_lines * 9 / 10);
  // From the stacks, each Python line with the interpreter's code it runs (language_self):
  // deep_leaf's loop again, and the Python lines nearly every sample.
  by_line.set_language_self(true);
  grpc::ClientContext self_context;
  v1::TopResponse self_lines;
  ASSERT_TRUE(stub->Top(&self_context, by_line, &self_lines).ok());
  uint64_t in_python = 0, without_line = 0, self_deep_leaf = 0, self_loop = 0;
  for (const v1::LineStat& l : self_lines.lines()) {
    if (l.frames_size() == 0 || l.frames(0).kind() != v1::FRAME_PYTHON) continue;
    in_python += l.self();
    if (l.frames(0).line() == 0) without_line += l.self();
    if (l.frames(0).function() != "deep_leaf") continue;
    self_deep_leaf += l.self();
    self_loop += l.frames(0).line() == 24 || l.frames(0).line() == 25 ? l.self() : 0;
  }
  std::fprintf(stderr, "lines: deep_leaf %llu as the leaf, %llu with what it calls; Python %llu "
               "of %llu\n", static_cast<unsigned long long>(deep_leaf_lines),
               static_cast<unsigned long long>(self_deep_leaf),
               static_cast<unsigned long long>(in_python),
               static_cast<unsigned long long>(self_lines.total_samples()));
  EXPECT_GE(self_deep_leaf, deep_leaf_lines * 19 / 20);
  EXPECT_GE(self_loop, self_deep_leaf * 9 / 10);
  EXPECT_GT(in_python, self_lines.total_samples() * 7 / 10) << self_lines.ShortDebugString();
  // A Python leaf in a window without its leaf addresses, now and then.
  EXPECT_LT(without_line, in_python / 50 + 5) << self_lines.ShortDebugString();

  // strata quality says it too.
  CommandResult cli = RunCommand({BinPath("strata"), "--server", server.address(), "quality",
                                  "-s", service, "--since", "1h"},
                                 60);
  EXPECT_EQ(cli.exit_code, 0) << cli.output;
  EXPECT_NE(cli.output.find("frames read from interpreters"), std::string::npos) << cli.output;

  const std::string log = agent.Output();
  if (const size_t at = log.find("python: "); at != std::string::npos) {
    std::fprintf(stderr, "agent: %s\n", log.substr(at, log.find('\n', at) - at).c_str());
  }
  // Copied at the sample wherever the agent may load BPF programs (root here): the threads
  // are registered when the agent finds the process, before their first samples.
  if (capture == "auto" && geteuid() == 0) {
    ASSERT_NE(log.find("python frames: copied at each sample"), std::string::npos) << log;
    const size_t at = log.find(" copied at the sample, ");
    ASSERT_NE(at, std::string::npos) << log;
    uint64_t copied = 0;
    ASSERT_TRUE(absl::SimpleAtoi(log.substr(log.rfind(' ', at - 1) + 1,
                                            at - log.rfind(' ', at - 1) - 1),
                                 &copied))
        << log;
    EXPECT_GE(copied, with_python * 98 / 100) << log;
  }
}

// 3.14 both ways and 3.15 in the default mode: their frames are read as 3.13's are, with their
// own offsets, and most of their eval loop is found from the stacks (no symbol names it).
INSTANTIATE_TEST_SUITE_P(Capture, PythonE2eTest,
                         ::testing::Values(std::tuple("3.11", "auto"), std::tuple("3.11", "off"),
                                           std::tuple("3.14", "auto"), std::tuple("3.14", "off"),
                                           std::tuple("3.15", "auto")),
                         [](const auto& info) {
                           std::string name = absl::StrCat("python", std::get<0>(info.param),
                                                           "_", std::get<1>(info.param));
                           std::replace(name.begin(), name.end(), '.', '_');
                           return name;
                         });

}  // namespace
}  // namespace strata::e2e
