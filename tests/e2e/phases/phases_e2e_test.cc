// Phase changes end to end: a workload that switches its hot path halfway, profiled by the
// real agent into the real server; `strata phases` reports the switch and `strata top` points
// at it in its header.
#include <signal.h>

#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/e2e/harness.h"

namespace strata::e2e {
namespace {

using ::testing::HasSubstr;

TEST(PhasesTest, HotPathSwitchIsReported) {
  strata::testing::TempDir dir("strata_e2e_phases");
  ServerProcess server(dir.File("data"), dir.File("server.log"));
  ASSERT_GT(server.port(), 0) << server.process().Output();
  // tokenize ~60 % for 12 s, then ~5 % while deflate_block rises to ~85 %.
  // One serving thread: with two, a starved thread shifts samples between two stacks that
  // differ only in their thread root, which is a real (scheduling) change of hot contexts.
  ChildProcess demo({BinPath("demo_service"), "--threads", "1", "--switch-after", "12"},
                    dir.File("demo.log"),
                    {{"STRATA_SERVICE", "phased"}});
  ASSERT_TRUE(demo.WaitForOutput("ready", 30)) << demo.Output();
  ChildProcess agent({BinPath("strata-agent"), "--server", server.address(), "--pid",
                      std::to_string(demo.pid()), "--interval", "1", "--spool-dir",
                      dir.File("spool")},
                     dir.File("agent.log"));
  // The server ranks a window's hot contexts when the window closes, against the two windows
  // before it: the switch (12 s in) is seen once the window after it closed, at the latest
  // 32 s in (10 s windows) plus the first batch of the next window.
  std::this_thread::sleep_for(std::chrono::seconds(34));
  EXPECT_EQ(agent.Stop(SIGTERM, 15), 0) << agent.Output();
  demo.Stop(SIGKILL);

  // A heavily loaded machine delays batches: windows still open close on the server's timer
  // (10 s after they end).
  CommandResult phases;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(25);
  do {
    phases = RunCommand({BinPath("strata"), "--server", server.address(), "phases", "--service",
                         "phased", "--since", "10m"});
    if (phases.output.find("): 0") == std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::seconds(1));
  } while (std::chrono::steady_clock::now() < deadline);
  EXPECT_EQ(phases.exit_code, 0) << phases.output;
  EXPECT_THAT(phases.output, ::testing::Not(HasSubstr("Phase changes of phased (last 10m): 0")))
      << phases.output << server.process().Output();
  EXPECT_THAT(phases.output, HasSubstr("rose")) << phases.output;
  EXPECT_THAT(phases.output, HasSubstr("compress_response > deflate_block")) << phases.output;
  EXPECT_THAT(phases.output, HasSubstr("parse_request > tokenize")) << phases.output;

  CommandResult top = RunCommand({BinPath("strata"), "--server", server.address(), "top",
                                  "--service", "phased", "--since", "10m"});
  EXPECT_EQ(top.exit_code, 0) << top.output;
  EXPECT_THAT(top.output, HasSubstr("Phase change at ")) << top.output;
  EXPECT_THAT(top.output, HasSubstr("deflate_block rose, tokenize fell")) << top.output;

  CommandResult json = RunCommand({BinPath("strata"), "--server", server.address(), "--json",
                                   "phases", "--service", "phased", "--since", "10m"});
  EXPECT_EQ(json.exit_code, 0);
  EXPECT_THAT(json.output, HasSubstr("\"rose\""));

}

TEST(PhasesTest, SteadyWorkloadReportsNoPhaseChange) {
  strata::testing::TempDir dir("strata_e2e_steady");
  ServerProcess server(dir.File("data"), dir.File("server.log"));
  ASSERT_GT(server.port(), 0) << server.process().Output();
  ChildProcess demo({BinPath("demo_service"), "--threads", "1"}, dir.File("demo.log"),
                    {{"STRATA_SERVICE", "steady"}});
  ASSERT_TRUE(demo.WaitForOutput("ready", 30)) << demo.Output();
  ChildProcess agent({BinPath("strata-agent"), "--server", server.address(), "--pid",
                      std::to_string(demo.pid()), "--interval", "1", "--spool-dir",
                      dir.File("spool")},
                     dir.File("agent.log"));
  std::this_thread::sleep_for(std::chrono::seconds(24));
  EXPECT_EQ(agent.Stop(SIGTERM, 15), 0) << agent.Output();
  // Every window is ranked once it closes: the last one 10 s after it ended.
  std::this_thread::sleep_for(std::chrono::seconds(12));
  CommandResult phases = RunCommand({BinPath("strata"), "--server", server.address(), "phases",
                                     "--service", "steady", "--since", "10m"});
  EXPECT_EQ(phases.exit_code, 0) << phases.output;
  EXPECT_THAT(phases.output, HasSubstr("Phase changes of steady (last 10m): 0")) << phases.output;
}

}  // namespace
}  // namespace strata::e2e
