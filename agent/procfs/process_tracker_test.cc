#include "agent/procfs/process_tracker.h"

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <optional>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "agent/procfs/procfs.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "common/testing/emulation.h"

namespace strata::agent::procfs {
namespace {

using ::testing::Contains;
using ::testing::IsEmpty;

const TrackedProcess* FindPid(const std::vector<TrackedProcess>& list, pid_t pid) {
  auto it = std::find_if(list.begin(), list.end(),
                         [pid](const TrackedProcess& p) { return p.pid == pid; });
  return it == list.end() ? nullptr : &*it;
}

// Spawns `sleep 30 <extra_args...>` (sleep sums its arguments) and waits until /proc shows the exec'd image.
pid_t SpawnSleep(const std::vector<std::string>& extra_args) {
  std::vector<std::string> args = {"sleep", "30"};
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t child = 0;
  if (posix_spawnp(&child, "sleep", nullptr, nullptr, argv.data(), environ) != 0) return -1;
  for (int i = 0; i < 1000; ++i) {
    if (ReadCommandLine(child).value_or(std::vector<std::string>{}) == args) break;
    usleep(1000);
  }
  return child;
}

void KillAndReap(pid_t pid) {
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
}

TEST(ProcessTrackerTest, ReportsStartedAndExitedTargetsOnce) {
  // A unique argument, so that no other process matches the rule.
  const std::string marker = absl::StrCat("0.", getpid());
  ProcessTracker tracker(
      ServiceMatcher::Create({{"sleepers", absl::StrCat("^sleep 30 ", marker, "$")}}).value());
  ProcessChanges initial = tracker.Rescan().value();
  EXPECT_EQ(FindPid(initial.added, getpid()), nullptr);  // never itself

  pid_t child = SpawnSleep({marker});
  ASSERT_GT(child, 0);
  ProcessChanges changes = tracker.Rescan().value();
  const TrackedProcess* added = FindPid(changes.added, child);
  ASSERT_NE(added, nullptr);
  EXPECT_EQ(added->service, "sleepers");
  EXPECT_EQ(ExecutableBasename(added->executable), "sleep");
  EXPECT_EQ(added->comm, "sleep");
  EXPECT_EQ(added->command_line.back(), marker);
  EXPECT_EQ(added->start_time, ReadStartTime(child).value());
  EXPECT_THAT(added->threads, ::testing::ElementsAre(child));
  EXPECT_TRUE(tracker.targets().contains(child));

  // Nothing changed for it: not reported again.
  changes = tracker.Rescan().value();
  EXPECT_EQ(FindPid(changes.added, child), nullptr);
  EXPECT_EQ(FindPid(changes.removed, child), nullptr);

  KillAndReap(child);
  changes = tracker.Rescan().value();
  const TrackedProcess* removed = FindPid(changes.removed, child);
  ASSERT_NE(removed, nullptr);
  EXPECT_EQ(removed->service, "sleepers");
  EXPECT_FALSE(tracker.targets().contains(child));
  changes = tracker.Rescan().value();
  EXPECT_EQ(FindPid(changes.removed, child), nullptr);
}

TEST(ProcessTrackerTest, EnvironmentVariableMakesATarget) {
  STRATA_SKIP_UNDER_QEMU_USER();  // the spawned host `sleep` is not a guest process
  ProcessTracker tracker(ServiceMatcher::Create({}).value());
  tracker.Rescan().value();
  char arg0[] = "sleep";
  char arg1[] = "30";
  char* argv[] = {arg0, arg1, nullptr};
  std::string env = absl::StrCat("STRATA_SERVICE=env-svc-", getpid());
  char* envp[] = {env.data(), nullptr};
  pid_t child = 0;
  ASSERT_EQ(posix_spawnp(&child, "sleep", nullptr, nullptr, argv, envp), 0);
  // Up to 20 s of wall time: on a loaded machine the exec can take a while.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  std::string executable;
  while ((executable = ReadExecutable(child).value_or(""), ExecutableBasename(executable)) !=
             "sleep" &&
         std::chrono::steady_clock::now() < deadline) {
    usleep(1000);
  }
  ASSERT_EQ(ExecutableBasename(executable), "sleep") << "the child did not exec: " << executable;
  // The exe link changes early in exec, the arguments and environment later: a scan in
  // between leaves the process for the next scan, so allow a few.
  std::optional<TrackedProcess> added;
  for (int scan = 0; scan < 100 && !added; ++scan) {
    ProcessChanges changes = tracker.Rescan().value();
    if (const TrackedProcess* p = FindPid(changes.added, child)) added = *p;
    if (!added) usleep(20000);
  }
  ASSERT_TRUE(added.has_value()) << "environment: "
                                 << ReadEnvironValue(child, "STRATA_SERVICE")
                                        .value_or(std::nullopt)
                                        .value_or("(unset)");
  EXPECT_EQ(added->service, absl::StrCat("env-svc-", getpid()));
  KillAndReap(child);
}

TEST(ProcessTrackerTest, PinnedPidAndExecIsRemoveThenAdd) {
  // A child that waits for a byte on a pipe, then execs sleep: same pid and start time, new
  // executable.
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    char byte;
    close(pipe_fds[1]);
    if (read(pipe_fds[0], &byte, 1) == 1) {
      execlp("sleep", "sleep", "30", static_cast<char*>(nullptr));
    }
    _exit(1);
  }
  close(pipe_fds[0]);
  const std::string before = ReadExecutable(child).value();

  ProcessTracker tracker(ServiceMatcher::Create({}).value());
  ProcessChanges changes = tracker.Rescan().value();
  EXPECT_EQ(FindPid(changes.added, child), nullptr);  // no rule matches

  tracker.Track(child, "pinned");
  changes = tracker.Rescan().value();
  const TrackedProcess* added = FindPid(changes.added, child);
  ASSERT_NE(added, nullptr);
  EXPECT_EQ(added->service, "pinned");
  EXPECT_EQ(added->executable, before);

  ASSERT_EQ(write(pipe_fds[1], "x", 1), 1);
  close(pipe_fds[1]);
  for (int i = 0; i < 1000 && ReadExecutable(child).value_or(before) == before; ++i) usleep(1000);
  changes = tracker.Rescan().value();
  const TrackedProcess* removed = FindPid(changes.removed, child);
  ASSERT_NE(removed, nullptr);
  EXPECT_EQ(removed->executable, before);
  added = FindPid(changes.added, child);
  ASSERT_NE(added, nullptr);
  EXPECT_EQ(ExecutableBasename(added->executable), "sleep");
  EXPECT_EQ(added->service, "pinned");  // the pin follows the process through exec

  tracker.Untrack(child);
  changes = tracker.Rescan().value();
  EXPECT_NE(FindPid(changes.removed, child), nullptr);
  EXPECT_FALSE(tracker.targets().contains(child));
  KillAndReap(child);
}

TEST(ProcessTrackerTest, ReportsThreadsOfTrackedProcess) {
  ProcessTracker::Options options;
  options.exclude_self = false;
  ProcessTracker tracker(ServiceMatcher::Create({}).value(), options);
  tracker.Track(getpid(), "self");
  ProcessChanges changes = tracker.Rescan().value();
  ASSERT_NE(FindPid(changes.added, getpid()), nullptr);
  EXPECT_THAT(FindPid(changes.added, getpid())->threads, Contains(gettid()));

  std::atomic<pid_t> tid{0};
  std::atomic<bool> stop{false};
  std::thread worker([&] {
    tid = gettid();
    while (!stop) usleep(1000);
  });
  while (tid == 0) usleep(100);
  changes = tracker.Rescan().value();
  EXPECT_THAT(changes.threads_added, Contains(ThreadRef{getpid(), tid}));
  EXPECT_THAT(changes.threads_removed, IsEmpty());
  EXPECT_THAT(tracker.targets().at(getpid()).threads, Contains(tid.load()));

  stop = true;
  worker.join();
  // pthread_join returns when the kernel clears the thread's tid, which is before the task
  // leaves /proc (under qemu user mode the host thread can linger longer): scan until the
  // removal shows, for up to 10 s.
  std::vector<ThreadRef> removed, added;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  do {
    changes = tracker.Rescan().value();
    removed.insert(removed.end(), changes.threads_removed.begin(), changes.threads_removed.end());
    added.insert(added.end(), changes.threads_added.begin(), changes.threads_added.end());
    EXPECT_TRUE(changes.removed.empty() || FindPid(changes.removed, getpid()) == nullptr);
    if (!removed.empty()) break;
    usleep(10000);
  } while (std::chrono::steady_clock::now() < deadline);
  EXPECT_THAT(removed, Contains(ThreadRef{getpid(), tid}));
  EXPECT_THAT(added, IsEmpty());
}

}  // namespace
}  // namespace strata::agent::procfs
