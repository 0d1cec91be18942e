// Which processes the agent profiles: an agent given only explicit pids profiles exactly
// those, even when other processes on the host name themselves with STRATA_SERVICE (other
// services' processes used to be picked up and shipped too, e.g. another test's workload).
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "agent/core/profiler.h"
#include "agent/procfs/procfs.h"
#include "gtest/gtest.h"

namespace strata::agent {
namespace {

// Spawns a `sleep` with the one environment entry `name`=`value` and waits until it has
// exec'd (-1 if it never shows). It sleeps far longer than any test takes, so that it is still
// alive when a slow run (sanitizers, a loaded machine) looks at it; KillAndReap ends it.
pid_t SpawnSleeper(const std::string& name, const std::string& value) {
  char arg0[] = "sleep";
  char arg1[] = "600";
  char* argv[] = {arg0, arg1, nullptr};
  std::string env = absl::StrCat(name, "=", value);
  char* envp[] = {env.data(), nullptr};
  pid_t child = 0;
  if (posix_spawnp(&child, "sleep", nullptr, nullptr, argv, envp) != 0) return -1;
  // Up to 10 s: on a loaded machine the exec can take a while.
  for (int i = 0; i < 10000; ++i) {
    if (procfs::ExecutableBasename(procfs::ReadExecutable(child).value_or("")) == "sleep" &&
        procfs::ReadEnvironValue(child, name).value_or(std::nullopt)) {
      return child;
    }
    usleep(1000);
  }
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  return -1;
}

pid_t SpawnSelfNamed(const std::string& service) {
  return SpawnSleeper(std::string(procfs::kServiceEnvVar), service);
}

void KillAndReap(pid_t pid) {
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
}

bool Added(const procfs::ProcessChanges& changes, pid_t pid, std::string* service = nullptr) {
  auto it = std::find_if(changes.added.begin(), changes.added.end(),
                         [pid](const procfs::TrackedProcess& p) { return p.pid == pid; });
  if (it == changes.added.end()) return false;
  if (service != nullptr) *service = it->service;
  return true;
}

TEST(TargetMatcherTest, ExplicitPidsOnlyProfileThosePids) {
  const std::string suffix = absl::StrCat(getpid());
  const pid_t pinned = SpawnSelfNamed("pinned-" + suffix);
  const pid_t bystander = SpawnSelfNamed("bystander-" + suffix);
  ASSERT_GT(pinned, 0);
  ASSERT_GT(bystander, 0);

  ProfilerOptions options;
  options.pids = {pinned};
  auto matcher = MakeTargetMatcher(options);
  ASSERT_TRUE(matcher.ok()) << matcher.status();
  procfs::ProcessTracker tracker(*std::move(matcher));
  tracker.Track(pinned, "pinned-" + suffix);
  auto changes = tracker.Rescan();
  ASSERT_TRUE(changes.ok()) << changes.status();
  std::string service;
  EXPECT_TRUE(Added(*changes, pinned, &service));
  EXPECT_EQ(service, "pinned-" + suffix);
  EXPECT_FALSE(Added(*changes, bystander)) << "a process the agent was not asked to profile";
  EXPECT_EQ(tracker.targets().size(), 1u);

  KillAndReap(pinned);
  KillAndReap(bystander);
}

TEST(TargetMatcherTest, WithServiceRulesSelfNamedProcessesAreDiscovered) {
  const std::string service = absl::StrCat("self-named-", getpid());
  const pid_t child = SpawnSelfNamed(service);
  ASSERT_GT(child, 0);

  ProfilerOptions options;
  options.service_rules = {{"nothing", "^no-such-executable-anywhere$"}};
  auto matcher = MakeTargetMatcher(options);
  ASSERT_TRUE(matcher.ok()) << matcher.status();
  procfs::ProcessTracker tracker(*std::move(matcher));
  auto changes = tracker.Rescan();
  ASSERT_TRUE(changes.ok()) << changes.status();
  std::string found;
  EXPECT_TRUE(Added(*changes, child, &found));
  EXPECT_EQ(found, service);

  KillAndReap(child);
}

// --pid P with --service NAME=REGEX: P is named by the rule it matches (it used to fall back
// to its executable's name, so queries of NAME found nothing), and carries its labels.
TEST(TargetMatcherTest, ExplicitPidIsNamedByTheMatchingRuleAndLabelled) {
  const pid_t child = SpawnSleeper("STRATA_LABELS", "version=7, team=core");
  ASSERT_GT(child, 0);
  ProfilerOptions options;
  options.pids = {child};
  // Both rules match the child (the first by executable, the second by command line); the
  // first wins. Neither matches much else: a rule matching every process on the host makes the
  // agent profile them all, which under sanitizers takes longer than a test should.
  options.service_rules = {{"napper", "^sleep$"}, {"other", "^sleep 600$"}};
  ContextGraph graph(1);
  auto profiler = Profiler::Create(options, &graph);
  ASSERT_TRUE(profiler.ok()) << profiler.status();
  ASSERT_TRUE((*profiler)->Poll(absl::Milliseconds(10)).ok());
  bool found = false;
  for (const v1::Target& t : (*profiler)->targets()) {
    if (t.pid() != static_cast<uint32_t>(child)) continue;
    found = true;
    EXPECT_EQ(t.service(), "napper");
    EXPECT_EQ(t.labels().at("version"), "7");
    EXPECT_EQ(t.labels().at("team"), "core");
    EXPECT_EQ(t.labels().count("build_id"), 1u);  // Debian's sleep has a GNU build ID
  }
  EXPECT_TRUE(found);
  profiler->reset();
  KillAndReap(child);
}

}  // namespace
}  // namespace strata::agent
