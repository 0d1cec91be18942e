// JIT code end to end: node --perf-basic-prof runs a hot JavaScript function, the real
// strata-agent samples it and names its frames from the perf map (/tmp/perf-PID.map), the real
// strata-server stores them, and its queries and the CLI show the function as JIT code.
#include <linux/perf_event.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/testing/temp_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/e2e/harness.h"

namespace strata::e2e {
namespace {

using ::testing::HasSubstr;

constexpr char kHot[] = "strataHotLoop";

// The hot function is pure arithmetic that V8 optimizes into JIT code; each call runs for
// tens of milliseconds, so its caller stays cold and does not inline it. The script stops by
// itself should the test not get to it.
constexpr char kScript[] = R"(
'use strict';
function strataHotLoop(iterations) {
  let s = 0;
  for (let i = 0; i < iterations; i++) s = (s * 31 + i) % 1000003;
  return s;
}
const stopAt = Date.now() + 300 * 1000;
let sink = 0;
console.log('ready');
while (Date.now() < stopAt) sink += strataHotLoop(10 * 1000 * 1000);
console.log('done', sink);
)";

std::string FindNode() {
  const char* path = getenv("PATH");
  for (const auto dir : absl::StrSplit(path != nullptr ? path : "/usr/bin:/bin", ':')) {
    const std::string candidate = absl::StrCat(dir, "/node");
    if (!dir.empty() && access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

// Why this process may not open a CPU-clock perf event on itself ("" when it may).
std::string PerfEventsRefused() {
  perf_event_attr attr;
  std::memset(&attr, 0, sizeof attr);
  attr.size = sizeof attr;
  attr.type = PERF_TYPE_SOFTWARE;
  attr.config = PERF_COUNT_SW_CPU_CLOCK;
  attr.sample_period = 1000000;
  attr.exclude_kernel = 1;
  attr.disabled = 1;
  const long fd = syscall(SYS_perf_event_open, &attr, 0, -1, -1, 0);
  if (fd < 0) return absl::StrCat("perf_event_open: ", std::strerror(errno));
  close(static_cast<int>(fd));
  return "";
}

TEST(JitE2eTest, NodeHotFunctionIsNamedFromItsPerfMapAndUnwound) {
  const std::string node = FindNode();
  if (node.empty()) GTEST_SKIP() << "node is not installed (Debian package nodejs)";
  if (const std::string why = PerfEventsRefused(); !why.empty()) {
    GTEST_SKIP() << "perf events are refused here: " << why;
  }
  strata::testing::TempDir dir("strata_jit_e2e");
  {
    std::ofstream script(dir.File("hot.js"));
    script << kScript;
  }
  ServerProcess server(dir.File("data"), dir.File("server.log"));
  ASSERT_GT(server.port(), 0) << server.process().Output();
  const std::string service = absl::StrCat("jit-node-", getpid());
  ChildProcess js({node, "--perf-basic-prof", dir.File("hot.js")}, dir.File("node.log"),
                  {{"STRATA_SERVICE", service}});
  // The map is the process's own /tmp file, not the test's: remove it whatever happens.
  const std::string perf_map = absl::StrCat("/tmp/perf-", js.pid(), ".map");
  struct Unlink {
    std::string path;
    ~Unlink() { std::remove(path.c_str()); }
  } unlink_map{perf_map};
  ASSERT_TRUE(js.WaitForOutput("ready", 60)) << js.Output();

  ChildProcess agent({BinPath("strata-agent"), "--server", server.address(), "--pid",
                      std::to_string(js.pid()), "--interval", "1", "--stack-bytes", "64512",
                      "--spool-dir", "none"},
                     dir.File("agent.log"));
  ASSERT_TRUE(agent.WaitForOutput(absl::StrCat("profiling pid ", js.pid()), 60))
      << agent.Output();
  // 99 Hz on the one busy thread: ~4 s of its CPU. A loaded 2-core machine gives it less.
  constexpr uint64_t kWanted = 400;
  const absl::Time deadline = absl::Now() + absl::Seconds(150);
  while (ServiceTotal(server.address(), service) < kWanted && absl::Now() < deadline &&
         js.running() && agent.running()) {
    absl::SleepFor(absl::Milliseconds(250));
  }
  const uint64_t stored = ServiceTotal(server.address(), service);
  EXPECT_GE(stored, kWanted) << "node: " << js.Output() << "\nagent:\n" << agent.Output();
  EXPECT_EQ(agent.Stop(SIGTERM, 30), 0) << agent.Output();
  js.Stop(SIGKILL);
  ASSERT_GT(stored, 0u);

  v1::HotPathsResponse paths = QueryHotPaths(server.address(), service);
  const double total = static_cast<double>(paths.total_samples());
  ASSERT_GT(total, 0);
  // Samples with the hot function on the stack; of those, the ones unwound through it into
  // code outside JIT memory (a module's frames beyond it: the unwinder went on by frame
  // pointers).
  uint64_t hot = 0, beyond = 0;
  std::vector<std::string> modules;
  for (const v1::HotPath& p : paths.paths()) {
    int at = -1;
    for (int i = 0; i < p.frames_size(); ++i) {
      if (p.frames(i).function().find(kHot) != std::string::npos) {
        at = i;
        if (std::find(modules.begin(), modules.end(), p.frames(i).module()) == modules.end()) {
          modules.push_back(p.frames(i).module());
        }
      }
    }
    if (at < 0) continue;
    hot += p.samples();
    for (int i = 0; i < at; ++i) {  // outermost first: the callers
      if (!p.frames(i).module().starts_with("[")) {
        beyond += p.samples();
        break;
      }
    }
  }
  std::string top;
  for (int i = 0; i < std::min(paths.paths_size(), 5); ++i) {
    absl::StrAppend(&top, paths.paths(i).samples(), ": ",
                    absl::StrJoin(paths.paths(i).frames(), " > ",
                                  [](std::string* out, const v1::Frame& f) {
                                    absl::StrAppend(out, f.function(), " (", f.module(), ")");
                                  }),
                    "\n");
  }
  EXPECT_GE(hot / total, 0.2) << hot << " of " << total << " samples in " << kHot
                              << "; hottest paths:\n" << top;
  ASSERT_FALSE(modules.empty()) << top;
  for (const std::string& m : modules) {
    EXPECT_TRUE(m.starts_with("[jit:") && m.ends_with(".map]")) << m;
  }
  EXPECT_GE(beyond, hot / 2) << "JIT frames not unwound through; hottest paths:\n" << top;

  // The CLI shows the function too, as JIT code.
  CommandResult cli = RunCommand({BinPath("strata"), "--server", server.address(), "top", "-s",
                                  service, "--sort", "total", "--since", "1h", "-n", "50"},
                                 60);
  EXPECT_EQ(cli.exit_code, 0) << cli.output;
  EXPECT_THAT(cli.output, HasSubstr(kHot));
}

}  // namespace
}  // namespace strata::e2e
