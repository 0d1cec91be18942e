// Phase changes end to end: a workload that switches its hot path halfway, profiled by the
// real agent into the real server; `strata phases` reports the switch, `strata top` points
// at it in its header, and `strata regressions` shows the server's comparison of before with
// after.
#include <signal.h>

#include <chrono>
#include <cstdint>
#include <thread>
#include <utility>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/e2e/harness.h"

namespace strata::e2e {
namespace {

using ::testing::HasSubstr;

// The window span [first_ms, last_ms) of `service`'s samples on the server; {0, 0} while it
// has none.
std::pair<int64_t, int64_t> ServiceSpan(const std::string& address, const std::string& service) {
  auto stub = v1::Query::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::ListServicesResponse resp;
  if (!stub->ListServices(&ctx, v1::ListServicesRequest(), &resp).ok()) return {0, 0};
  for (const auto& s : resp.services()) {
    if (s.name() == service) return {s.first_ms(), s.last_ms()};
  }
  return {0, 0};
}

// Samples of the demo's tokenize and deflate_block stacks (those without kernel frames: the
// contexts the server ranks) in the window starting at `window_ms`; zeros if the call fails.
struct WindowSamples {
  uint64_t tokenize = 0;
  uint64_t deflate = 0;
};
WindowSamples SamplesIn(const std::string& address, const std::string& service,
                        int64_t window_ms) {
  auto stub = v1::Query::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::HotPathsRequest req;
  req.mutable_filter()->set_service(service);
  req.mutable_filter()->mutable_range()->set_from_ms(window_ms);
  req.mutable_filter()->mutable_range()->set_to_ms(window_ms + 1);  // that window only
  req.set_limit(1000);
  v1::HotPathsResponse resp;
  WindowSamples out;
  if (!stub->HotPaths(&ctx, req, &resp).ok()) return out;
  for (const auto& path : resp.paths()) {
    const DemoPath kind = ClassifyDemoPath(UserFrameNames(path));
    if (kind == DemoPath::kTokenize) out.tokenize += path.samples();
    if (kind == DemoPath::kDeflate) out.deflate += path.samples();
  }
  return out;
}

TEST(PhasesTest, HotPathSwitchIsReported) {
  strata::testing::TempDir dir("strata_e2e_phases");
  // Phase changes are compared every second: per host and 10 s window, the two minutes
  // before with the time after.
  ServerProcess server(dir.File("data"), dir.File("server.log"),
                       {"--regression-interval", "1s", "--regression-phase-unit", "10s",
                        "--regression-lookback", "2m"});
  ASSERT_GT(server.port(), 0) << server.process().Output();
  // tokenize ~60 % until SIGUSR1, then ~5 % while deflate_block rises to ~85 %.
  // One serving thread: with two, a starved thread shifts samples between two stacks that
  // differ only in their thread root, which is a real (scheduling) change of hot contexts.
  ChildProcess demo({BinPath("demo_service"), "--threads", "1"}, dir.File("demo.log"),
                    {{"STRATA_SERVICE", "phased"}});
  ASSERT_TRUE(demo.WaitForOutput("ready", 30)) << demo.Output();
  // 499 Hz: one window's counts decide the switch (below), and where the demo gets a tenth of
  // a core, 99 Hz leaves it ~6 tokenize samples a window after the switch: too few for the
  // order-of-magnitude test against ~100 deflate_block samples to come out the same each run.
  ChildProcess agent({BinPath("strata-agent"), "--server", server.address(), "--pid",
                      std::to_string(demo.pid()), "--interval", "1", "--frequency", "499",
                      "--spool-dir", dir.File("spool")},
                     dir.File("agent.log"));
  // The server ranks a window's contexts with more than 50 samples (hot_threshold) when the
  // window closes, against the rankings of the two windows before it. The agent's first
  // window is partial (it starts mid-window, late on a loaded machine), so tokenize may not
  // be ranked in it; switching at a fixed time after the start could leave the first phase
  // unranked, and the switch unseen. The demo switches once the server holds a whole window
  // in which tokenize was ranked, right after it: the first whole window after the switch is
  // compared with that one.
  constexpr int64_t kWindowMs = 10'000;
  constexpr uint64_t kHotThreshold = 50;  // server/aggregate AggregatorOptions::hot_threshold
  // Per window: tokenize and deflate_block samples, for failure messages.
  auto windows = [&] {
    const auto [first_ms, last_ms] = ServiceSpan(server.address(), "phased");
    std::string out;
    for (int64_t w = first_ms; w != 0 && w < last_ms; w += kWindowMs) {
      const WindowSamples n = SamplesIn(server.address(), "phased", w);
      out += std::to_string(w) + ": tokenize " + std::to_string(n.tokenize) + ", deflate_block " +
             std::to_string(n.deflate) + "\n";
    }
    return out;
  };
  // Two such windows: the comparison of before with after (below) takes each window as a
  // unit, and with fewer than three before it could only tell a very large change.
  const auto ranked_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  int64_t checked_ms = 0;
  int ranked = 0;
  for (;;) {
    const auto [first_ms, last_ms] = ServiceSpan(server.address(), "phased");
    // The newest complete window: a batch of the window after it has arrived.
    const int64_t complete_ms = last_ms - 2 * kWindowMs;
    if (first_ms != 0 && complete_ms > first_ms && complete_ms != checked_ms) {
      checked_ms = complete_ms;
      if (SamplesIn(server.address(), "phased", complete_ms).tokenize > kHotThreshold &&
          ++ranked == 2) {
        break;
      }
    }
    ASSERT_LT(std::chrono::steady_clock::now(), ranked_deadline)
        << "no whole window with tokenize ranked: " << first_ms << " .. " << last_ms << "\n"
        << windows() << agent.Output();
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  ASSERT_EQ(kill(demo.pid(), SIGUSR1), 0);

  // The switch is seen when the first whole window after it closes (20 s after the switch at
  // the latest): on the next batch, or on the server's timer 10 s after the window ended.
  CommandResult phases;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(90);
  do {
    phases = RunCommand({BinPath("strata"), "--server", server.address(), "phases", "--service",
                         "phased", "--since", "10m"});
    if (phases.exit_code == 0 && phases.output.find("): 0") == std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::seconds(1));
  } while (std::chrono::steady_clock::now() < deadline);
  // Compared by the server without being asked, like a release: the time from the change on
  // against the time before, deflate_block's share risen significantly once a few windows
  // after the change are in.
  CommandResult regressions;
  const auto verdict_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  do {
    regressions = RunCommand({BinPath("strata"), "--server", server.address(), "regressions",
                              "--service", "phased"});
    if (regressions.output.find("REGRESSED") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  } while (std::chrono::steady_clock::now() < verdict_deadline);
  CommandResult verdicts = RunCommand({BinPath("strata"), "--server", server.address(), "--json",
                                       "regressions", "--service", "phased", "--all"});
  EXPECT_EQ(regressions.exit_code, 0) << regressions.output;
  EXPECT_THAT(regressions.output, HasSubstr("REGRESSED")) << regressions.output << verdicts.output;
  EXPECT_THAT(regressions.output, HasSubstr("deflate_block")) << regressions.output;
  EXPECT_THAT(verdicts.output, HasSubstr("\"PHASE\"")) << verdicts.output;
  EXPECT_EQ(agent.Stop(SIGTERM, 15), 0) << agent.Output();
  demo.Stop(SIGKILL);
  EXPECT_EQ(phases.exit_code, 0) << phases.output;
  EXPECT_THAT(phases.output, ::testing::Not(HasSubstr("Phase changes of phased (last 10m): 0")))
      << phases.output << "switched after window " << checked_ms << ":\n"
      << windows() << server.process().Output();
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
