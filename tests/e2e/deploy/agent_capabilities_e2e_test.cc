// The capabilities deploy/systemd/strata-agent.service grants the agent, proven by running the
// real strata-agent with exactly those (setpriv: another uid, ambient and bounding sets, no new
// privileges) against processes of a third uid, with a real strata-server on loopback:
//  - with the unit's set, samples of the other user's demo arrive with whole, named stacks,
//    although its executable sits in a directory only its owner may read;
//  - without CAP_SYS_PTRACE the agent cannot see the process at all;
//  - without CAP_DAC_READ_SEARCH every sample is cut to one frame (the ELF is unreadable);
//  - without CAP_IPC_LOCK a process with many threads cannot be profiled per thread (perf ring
//    buffers are locked memory), where RLIMIT_MEMLOCK is small enough for that to show; per CPU
//    (the default) the rings follow the CPUs instead, but a host with many CPUs needs it too.
//  - without CAP_PERFMON, where kernel.perf_event_paranoid > 1, the kernel refuses kernel-mode
//    events, and without CAP_SYSLOG it hides /proc/kallsyms addresses: either way the agent
//    says once that kernel stacks are off and profiles user stacks. The test says which
//    applies.
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/e2e/harness.h"

namespace strata::e2e {
namespace {

using ::testing::HasSubstr;

// Users that exist only as numbers: the agent's (like the unit's DynamicUser) and the
// target's. Neither is root, and they differ.
constexpr int kAgentUid = 61701;
constexpr int kTargetUid = 61702;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// "CAP_SYS_PTRACE CAP_DAC_READ_SEARCH ..." from the unit's AmbientCapabilities= line.
std::vector<std::string> UnitCapabilities() {
  for (absl::string_view line : absl::StrSplit(ReadFile(STRATA_AGENT_UNIT), '\n')) {
    if (absl::ConsumePrefix(&line, "AmbientCapabilities=")) {
      return absl::StrSplit(line, ' ', absl::SkipEmpty());
    }
  }
  return {};
}

// setpriv's spelling: "+sys_ptrace,+dac_read_search".
std::string SetprivCaps(const std::vector<std::string>& caps) {
  std::vector<std::string> out;
  for (std::string c : caps) {
    absl::string_view v = c;
    absl::ConsumePrefix(&v, "CAP_");
    out.push_back("+" + absl::AsciiStrToLower(v));
  }
  return absl::StrJoin(out, ",");
}

std::vector<std::string> Without(std::vector<std::string> caps, const std::string& cap) {
  caps.erase(std::remove(caps.begin(), caps.end(), cap), caps.end());
  return caps;
}

uint64_t CapabilityBit(const std::string& cap) {
  static const std::pair<const char*, int> kBits[] = {
      {"CAP_DAC_READ_SEARCH", 2}, {"CAP_IPC_LOCK", 14}, {"CAP_SYS_PTRACE", 19},
      {"CAP_SYS_ADMIN", 21},      {"CAP_SYSLOG", 34},   {"CAP_PERFMON", 38},
      {"CAP_BPF", 39}};
  for (const auto& [name, bit] : kBits) {
    if (cap == name) return uint64_t{1} << bit;
  }
  ADD_FAILURE() << "unknown capability " << cap;
  return 0;
}

std::vector<std::string> AsUser(int uid, std::vector<std::string> argv) {
  std::vector<std::string> out{"/usr/bin/setpriv", absl::StrCat("--reuid=", uid),
                               absl::StrCat("--regid=", uid), "--clear-groups", "--"};
  out.insert(out.end(), argv.begin(), argv.end());
  return out;
}

// The agent as the unit runs it: its own uid, only `caps` (ambient, inheritable and bounding),
// no new privileges.
std::vector<std::string> AgentWith(const std::vector<std::string>& caps,
                                   std::vector<std::string> agent_argv) {
  const std::string set = caps.empty() ? "-all" : "-all," + SetprivCaps(caps);
  std::vector<std::string> out{"/usr/bin/setpriv",
                               absl::StrCat("--reuid=", kAgentUid),
                               absl::StrCat("--regid=", kAgentUid),
                               "--clear-groups",
                               "--inh-caps=" + set,
                               "--ambient-caps=" + set,
                               "--bounding-set=" + set,
                               "--no-new-privs",
                               "--"};
  out.insert(out.end(), agent_argv.begin(), agent_argv.end());
  return out;
}

// A status line's value, e.g. "CapEff" -> "000000c000080004".
std::string StatusField(pid_t pid, const std::string& field) {
  for (absl::string_view line :
       absl::StrSplit(ReadFile(absl::StrCat("/proc/", pid, "/status")), '\n')) {
    if (absl::ConsumePrefix(&line, field + ":")) return std::string(absl::StripAsciiWhitespace(line));
  }
  return "";
}

int PerfEventParanoid() {
  int v = 0;
  (void)absl::SimpleAtoi(absl::StripAsciiWhitespace(ReadFile("/proc/sys/kernel/perf_event_paranoid")), &v);
  return v;
}

// From the agent's "stopping: N samples, F frames, T truncated, ..." line.
struct UnwindCounts {
  uint64_t samples = 0, truncated = 0;
};
UnwindCounts Counts(const std::string& log) {
  UnwindCounts c;
  const size_t at = log.find("stopping: ");
  if (at == std::string::npos) return c;
  std::vector<std::string> words = absl::StrSplit(log.substr(at, 120), ' ');
  if (words.size() < 7) return c;
  (void)absl::SimpleAtoi(words[1], &c.samples);
  (void)absl::SimpleAtoi(words[5], &c.truncated);
  return c;
}

class AgentCapabilitiesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root to switch users and grant capabilities";
    if (access("/usr/bin/setpriv", X_OK) != 0) GTEST_SKIP() << "setpriv (util-linux) missing";
    caps_ = UnitCapabilities();
    ASSERT_FALSE(caps_.empty()) << "no AmbientCapabilities= in " << STRATA_AGENT_UNIT;
    // A container may hold fewer capabilities than a host's root: none can be granted then.
    uint64_t bounding = 0;
    ASSERT_TRUE(absl::SimpleHexAtoi(StatusField(getpid(), "CapBnd"), &bounding));
    for (const std::string& c : caps_) {
      if ((bounding & CapabilityBit(c)) == 0) {
        GTEST_SKIP() << c << " is not in this process's bounding set (a restricted container?)";
      }
    }
    std::printf("unit capabilities: %s; perf_event_paranoid %d\n",
                absl::StrJoin(caps_, " ").c_str(), PerfEventParanoid());
    // The demo's executable where only its owner may read it, as in a locked-down host or a
    // container's root.
    private_dir_ = dir_.File("target-private");
    std::filesystem::create_directories(private_dir_);
    demo_bin_ = private_dir_ + "/demo_service";
    std::filesystem::copy_file(BinPath("demo_service"), demo_bin_);
    ASSERT_EQ(chown(private_dir_.c_str(), kTargetUid, kTargetUid), 0);
    ASSERT_EQ(chown(demo_bin_.c_str(), kTargetUid, kTargetUid), 0);
    ASSERT_EQ(chmod(private_dir_.c_str(), 0700), 0);
    ASSERT_EQ(chmod(demo_bin_.c_str(), 0700), 0);
    chmod(dir_.path().c_str(), 0755);

    server_ = std::make_unique<ServerProcess>(dir_.File("data"), dir_.File("server.log"));
    ASSERT_GT(server_->port(), 0) << server_->process().Output();
    demo_ = std::make_unique<ChildProcess>(AsUser(kTargetUid, {demo_bin_}), dir_.File("demo.log"),
                                           std::map<std::string, std::string>{{"STRATA_SERVICE", "demo"}});
    ASSERT_TRUE(demo_->WaitForOutput("ready", 30)) << demo_->Output();
  }

  // Runs the agent for `seconds` on `pid` with `caps`; returns its log.
  std::string RunAgent(const std::vector<std::string>& caps, pid_t pid, const std::string& name,
                       int seconds, bool check_caps = false,
                       const std::vector<std::string>& extra_args = {}) {
    std::vector<std::string> argv = {BinPath("strata-agent"), "--server", server_->address(),
                                     "--pid", std::to_string(pid), "--interval", "1",
                                     "--spool-dir", "none", "--agent-id", name};
    argv.insert(argv.end(), extra_args.begin(), extra_args.end());
    ChildProcess agent(AgentWith(caps, argv), dir_.File(name + ".log"));
    std::this_thread::sleep_for(std::chrono::seconds(1));
    if (check_caps) {
      // The agent process itself: the other uid, and effective capabilities exactly the set.
      uint64_t want = 0;
      for (const std::string& c : caps) want |= CapabilityBit(c);
      uint64_t eff = 0, bnd = 0;
      EXPECT_TRUE(absl::SimpleHexAtoi(StatusField(agent.pid(), "CapEff"), &eff));
      EXPECT_TRUE(absl::SimpleHexAtoi(StatusField(agent.pid(), "CapBnd"), &bnd));
      EXPECT_EQ(eff, want) << StatusField(agent.pid(), "CapEff");
      EXPECT_EQ(bnd, want) << StatusField(agent.pid(), "CapBnd");
      EXPECT_THAT(StatusField(agent.pid(), "Uid"), HasSubstr(std::to_string(kAgentUid)));
      EXPECT_EQ(StatusField(agent.pid(), "NoNewPrivs"), "1");
    }
    std::this_thread::sleep_for(std::chrono::seconds(seconds));
    agent.Stop(SIGTERM, 15);
    return agent.Output();
  }

  strata::testing::TempDir dir_{"strata_agent_caps"};
  std::vector<std::string> caps_;
  std::string private_dir_, demo_bin_;
  std::unique_ptr<ServerProcess> server_;
  std::unique_ptr<ChildProcess> demo_;
};

TEST_F(AgentCapabilitiesTest, UnitCapabilitiesAreSufficientAndEachIsNeeded) {
  // Sufficient: samples of another user's process, whole stacks, at the server.
  const std::string log = RunAgent(caps_, demo_->pid(), "caps-unit", 8, /*check_caps=*/true);
  ASSERT_THAT(log, HasSubstr("profiling pid")) << log;
  EXPECT_THAT(log, HasSubstr("kernel stacks on")) << log;
  v1::HotPathsResponse paths = QueryHotPaths(server_->address(), "demo");
  EXPECT_GT(paths.total_samples(), 100u) << log;
  uint64_t named = 0;
  for (const auto& p : paths.paths()) {
    if (ClassifyDemoPath(UserFrameNames(p)) != DemoPath::kOther) named += p.samples();
  }
  EXPECT_GT(named, paths.total_samples() / 2) << "stacks were not unwound and named\n" << log;
  std::printf("with the unit's capabilities: %llu samples, %llu on the demo's named paths\n",
              static_cast<unsigned long long>(paths.total_samples()),
              static_cast<unsigned long long>(named));

  // Without CAP_SYS_PTRACE: the other user's process is invisible.
  const std::string no_ptrace =
      RunAgent(Without(caps_, "CAP_SYS_PTRACE"), demo_->pid(), "caps-no-ptrace", 2);
  EXPECT_THAT(no_ptrace, HasSubstr("Permission denied")) << no_ptrace;

  // Without CAP_DAC_READ_SEARCH: the executable cannot be read; every sample is one frame.
  const std::string no_dac =
      RunAgent(Without(caps_, "CAP_DAC_READ_SEARCH"), demo_->pid(), "caps-no-dac", 4);
  EXPECT_THAT(no_dac, HasSubstr("profiling pid")) << no_dac;
  const UnwindCounts with = Counts(log), without = Counts(no_dac);
  ASSERT_GT(with.samples, 0u) << log;
  ASSERT_GT(without.samples, 0u) << no_dac;
  // A sample that starts in a readable library (libc) still stops at the demo's own code.
  EXPECT_GT(without.truncated, without.samples * 9 / 10) << no_dac;
  EXPECT_LT(with.truncated, with.samples / 10) << log;
  std::printf("truncated stacks: %llu of %llu with the unit's capabilities, %llu of %llu "
              "without CAP_DAC_READ_SEARCH\n",
              static_cast<unsigned long long>(with.truncated),
              static_cast<unsigned long long>(with.samples),
              static_cast<unsigned long long>(without.truncated),
              static_cast<unsigned long long>(without.samples));
}

TEST_F(AgentCapabilitiesTest, WithoutPerfmonOrSyslogKernelStacksAreOffAndSaidOnce) {
  if (PerfEventParanoid() <= 1) {
    GTEST_SKIP() << "kernel.perf_event_paranoid <= 1 allows kernel-mode events and kallsyms "
                    "addresses to everyone";
  }
  for (const char* cap : {"CAP_PERFMON", "CAP_SYSLOG"}) {
    const std::string name = absl::AsciiStrToLower(absl::StrCat("caps-no-", cap + 4));
    const std::string log = RunAgent(Without(caps_, cap), demo_->pid(), name, 3);
    EXPECT_THAT(log, HasSubstr("profiling pid")) << log;
    size_t said = 0;
    for (size_t at = log.find("kernel stacks off"); at != std::string::npos;
         at = log.find("kernel stacks off", at + 1)) {
      ++said;
    }
    EXPECT_EQ(said, 1u) << cap << "\n" << log;
    EXPECT_GT(Counts(log).samples, 0u) << log;
    // Asked for explicitly, the refusal is an error that says what is missing.
    const std::string on = RunAgent(Without(caps_, cap), demo_->pid(), name + "-on", 1, false,
                                    {"--kernel-stacks", "on"});
    EXPECT_THAT(on, HasSubstr(std::string(cap) == "CAP_PERFMON" ? "CAP_PERFMON" : "CAP_SYSLOG"))
        << on;
    EXPECT_THAT(on, ::testing::Not(HasSubstr("profiling pid"))) << on;
  }
}

TEST_F(AgentCapabilitiesTest, ManyThreadsNeedIpcLock) {
  constexpr int kThreads = 120;  // 120 perf rings of 132 KiB: 15.5 MiB locked
  ChildProcess many(AsUser(kTargetUid, {STRATA_IDLE_THREADS_BIN, std::to_string(kThreads), "60"}),
                    dir_.File("many.log"));
  ASSERT_TRUE(many.WaitForOutput("ready", 30)) << many.Output();
  const std::vector<std::string> per_thread = {"--sampling", "per-thread"};
  const std::string log = RunAgent(caps_, many.pid(), "caps-many", 3, false, per_thread);
  EXPECT_THAT(log, HasSubstr(absl::StrCat(kThreads + 2, " threads"))) << log;
  EXPECT_THAT(log, ::testing::Not(HasSubstr("mmap of perf ring"))) << log;

  rlimit memlock{};
  getrlimit(RLIMIT_MEMLOCK, &memlock);
  const uint64_t needed = uint64_t{kThreads} * 132 * 1024;
  if (memlock.rlim_cur == RLIM_INFINITY || memlock.rlim_cur + 516 * 1024 >= needed) {
    std::printf("RLIMIT_MEMLOCK is large enough here (%llu bytes): CAP_IPC_LOCK not exercised\n",
                static_cast<unsigned long long>(memlock.rlim_cur));
    return;
  }
  const std::string no_lock =
      RunAgent(Without(caps_, "CAP_IPC_LOCK"), many.pid(), "caps-no-lock", 2, false, per_thread);
  EXPECT_THAT(no_lock, HasSubstr("mmap of perf ring")) << no_lock;
}

}  // namespace
}  // namespace strata::e2e
