// The agent's two sampling scopes on one target with many idle threads, and discovery of a
// process started after the agent, end to end: real strata-server, strata-agent, the demo.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <optional>
#include <regex>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/testing/temp_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/e2e/harness.h"

namespace strata::e2e {
namespace {

using ::testing::HasSubstr;

constexpr int kIdleThreads = 200;

// The count the agent logs at exit: "sampling: N perf events, ...".
int PerfEvents(const std::string& agent_log) {
  std::smatch m;
  static const std::regex kLine(R"(sampling: (\d+) perf events)");
  return std::regex_search(agent_log, m, kLine) ? std::stoi(m[1]) : -1;
}

// Waits until the server holds at least `samples` of `service` (false after `timeout`).
bool WaitForSamples(const std::string& address, const std::string& service, uint64_t samples,
                    absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (ServiceTotal(address, service) < samples) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(250));
  }
  return true;
}

class SamplingScopeTest : public ::testing::TestWithParam<std::string> {
 protected:
  strata::testing::TempDir dir_{"strata_sampling_e2e"};
};

// Per CPU the agent holds one event per online CPU whatever the target's threads; per thread
// one per thread. Both see the demo's paths in the same proportions.
TEST_P(SamplingScopeTest, DemoWithIdleThreadsHasItsHotPaths) {
  const std::string scope = GetParam();
  ServerProcess server(dir_.File("data"), dir_.File("server.log"));
  ASSERT_GT(server.port(), 0) << server.process().Output();
  ChildProcess demo({BinPath("demo_service"), "--idle-threads", std::to_string(kIdleThreads)},
                    dir_.File("demo.log"), {{"STRATA_SERVICE", "demo"}});
  ASSERT_TRUE(demo.WaitForOutput("ready", 30)) << demo.Output();
  ChildProcess agent({BinPath("strata-agent"), "--server", server.address(), "--pid",
                      std::to_string(demo.pid()), "--sampling", scope, "--interval", "1",
                      "--spool-dir", "none"},
                     dir_.File("agent.log"));
  ASSERT_TRUE(agent.WaitForOutput(absl::StrCat("profiling pid ", demo.pid()), 30))
      << agent.Output();
  // ~200 samples a second with two busy threads; a loaded machine gives the demo less.
  EXPECT_TRUE(WaitForSamples(server.address(), "demo", 1500, absl::Seconds(90)))
      << ServiceTotal(server.address(), "demo") << " samples\n" << agent.Output();
  EXPECT_EQ(agent.Stop(SIGTERM, 15), 0) << agent.Output();
  demo.Stop(SIGTERM);
  const std::optional<DemoShares> truth = DemoSharesFrom(demo.Output());
  ASSERT_TRUE(truth.has_value()) << demo.Output();

  const int events = PerfEvents(agent.Output());
  if (scope == "per-cpu") {
    EXPECT_EQ(events, static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN))) << agent.Output();
    // As root the CPUs' events drop the other processes' samples (the server's, the
    // agent's own) before they are written: none reaches the agent.
    static const std::regex kDropped(
        R"((\d+) samples of other processes dropped \((\d+) in the kernel\))");
    const std::string log = agent.Output();
    std::smatch dropped;
    ASSERT_TRUE(std::regex_search(log, dropped, kDropped)) << log;
    if (geteuid() == 0) {
      EXPECT_EQ(dropped[1].str(), dropped[2].str()) << log;
    }
  } else {
    EXPECT_GE(events, kIdleThreads + 2) << agent.Output();
  }
  v1::HotPathsResponse paths = QueryHotPaths(server.address(), "demo");
  std::map<DemoPath, uint64_t> by_path;
  // The paths outside the three, for a failure to show what the rest of the profile was.
  std::string others;
  for (const auto& p : paths.paths()) {
    const DemoPath path = ClassifyDemoPath(UserFrameNames(p));
    by_path[path] += p.samples();
    if (path == DemoPath::kOther && others.size() < 4000) {
      absl::StrAppend(&others, p.samples(), " ", absl::StrJoin(FrameNames(p), ";"), "\n");
    }
  }
  const double total = static_cast<double>(paths.total_samples());
  ASSERT_GT(total, 0);
  const std::string context =
      absl::StrCat(total, " samples; the demo's own account: tokenize ", truth->tokenize,
                   " %, deflate ", truth->deflate, " %, fib ", truth->fib,
                   " %; other paths:\n", others, "agent log:\n", agent.Output());
  std::printf("%s: profile %.1f / %.1f / %.1f %% of %.0f samples, demo's account %.1f / %.1f / "
              "%.1f %% (tokenize / deflate / fib)\n",
              scope.c_str(), 100 * by_path[DemoPath::kTokenize] / total,
              100 * by_path[DemoPath::kDeflate] / total, 100 * by_path[DemoPath::kFib] / total,
              total, truth->tokenize, truth->deflate, truth->fib);
  // Against the demo's own account of its CPU time: a loaded machine moves the demo's split
  // (its three paths slow down unevenly), not the profile's agreement with it. 1,500 samples
  // put a 60 % share's standard error at 1.3 points.
  EXPECT_NEAR(100 * by_path[DemoPath::kTokenize] / total, truth->tokenize, 6) << context;
  EXPECT_NEAR(100 * by_path[DemoPath::kDeflate] / total, truth->deflate, 6) << context;
  EXPECT_NEAR(100 * by_path[DemoPath::kFib] / total, truth->fib, 6) << context;
}

INSTANTIATE_TEST_SUITE_P(Scopes, SamplingScopeTest, ::testing::Values("per-cpu", "per-thread"),
                         [](const auto& info) {
                           return info.param == "per-cpu" ? std::string("PerCpu")
                                                          : std::string("PerThread");
                         });

// A process that starts after the agent is found from the kernel's process events, and its
// threads (started after it was found) are sampled too, per thread. A stripped copy of its
// binary (the same build ID) profiled first does not leave it unnamed.
TEST(ProcessEventsDiscoveryTest, ProcessStartedLaterIsProfiledWithItsThreads) {
  strata::testing::TempDir dir("strata_discovery_e2e");
  ServerProcess server(dir.File("data"), dir.File("server.log"));
  ASSERT_GT(server.port(), 0) << server.process().Output();
  const std::string service = absl::StrCat("late-", getpid());
  ChildProcess agent({BinPath("strata-agent"), "--server", server.address(), "--service",
                      absl::StrCat(service, "=demo_service --idle-threads 3$"), "--sampling",
                      "per-thread", "--interval", "1", "--spool-dir", "none"},
                     dir.File("agent.log"));
  ASSERT_TRUE(agent.WaitForOutput("shipping to", 30)) << agent.Output();
  if (agent.Output().find("scanning /proc on a period") != std::string::npos) {
    GTEST_SKIP() << "the kernel's process events are not available here:\n" << agent.Output();
  }
  const std::string stripped = dir.File("demo_stripped");
  ASSERT_EQ(RunCommand({"/usr/bin/objcopy", "--strip-all", BinPath("demo_service"), stripped})
                .exit_code,
            0);
  const std::string stripped_service = absl::StrCat("stripped-", getpid());
  ChildProcess stripped_demo({stripped}, dir.File("stripped.log"),
                             {{"STRATA_SERVICE", stripped_service}});
  // Its samples are stored, so the agent has read its (symbol-less) module.
  ASSERT_TRUE(WaitForSamples(server.address(), stripped_service, 1, absl::Seconds(60)))
      << agent.Output();
  ChildProcess demo({BinPath("demo_service"), "--idle-threads", "3"}, dir.File("demo.log"));
  ASSERT_TRUE(demo.WaitForOutput("ready", 30)) << demo.Output();
  ASSERT_TRUE(agent.WaitForOutput(absl::StrCat("profiling pid ", demo.pid()), 30))
      << agent.Output();
  EXPECT_TRUE(WaitForSamples(server.address(), service, 500, absl::Seconds(90)))
      << agent.Output();
  EXPECT_EQ(agent.Stop(SIGTERM, 15), 0) << agent.Output();
  demo.Stop(SIGKILL);
  stripped_demo.Stop(SIGKILL);
  // Both busy threads (the main thread and the worker the demo starts after exec) and the
  // three idle ones got their events, whenever they started.
  EXPECT_GE(PerfEvents(agent.Output()), 5) << agent.Output();
  v1::HotPathsResponse paths = QueryHotPaths(server.address(), service);
  uint64_t main_thread = 0;
  for (const auto& p : paths.paths()) {
    const auto names = FrameNames(p);
    if (std::find(names.begin(), names.end(), "main") != names.end()) main_thread += p.samples();
  }
  std::string listed;  // what the query returned, for a failure's message
  for (int i = 0; i < paths.paths_size() && i < 20; ++i) {
    absl::StrAppend(&listed, paths.paths(i).samples(), paths.paths(i).truncated() ? " [t] " : " ",
                    absl::StrJoin(FrameNames(paths.paths(i)), ";"), "\n");
  }
  EXPECT_GT(main_thread, 0u) << paths.total_samples() << " samples in " << paths.paths_size()
                             << " paths:\n" << listed << agent.Output();
  EXPECT_GT(paths.total_samples() - main_thread, 0u) << "the worker thread was not sampled";
}

}  // namespace
}  // namespace strata::e2e
