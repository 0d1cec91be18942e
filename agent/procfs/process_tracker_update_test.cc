// ProcessTracker::Update() over hand-made event batches naming real child processes: the
// kernel's process connector is not needed here (process_events_test.cc drives it live).

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "agent/procfs/process_tracker.h"
#include "agent/procfs/procfs.h"
#include "common/testing/emulation.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace strata::agent::procfs {
namespace {

using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::Not;

const TrackedProcess* FindPid(const std::vector<TrackedProcess>& list, pid_t pid) {
  auto it = std::find_if(list.begin(), list.end(),
                         [pid](const TrackedProcess& p) { return p.pid == pid; });
  return it == list.end() ? nullptr : &*it;
}

size_t CountPid(const std::vector<TrackedProcess>& list, pid_t pid) {
  return std::count_if(list.begin(), list.end(),
                       [pid](const TrackedProcess& p) { return p.pid == pid; });
}

uint64_t NowNs() {
  timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return static_cast<uint64_t>(now.tv_sec) * 1000000000 + static_cast<uint64_t>(now.tv_nsec);
}

ProcessEvent Event(ProcessEventType type, pid_t pid, pid_t tid = 0) {
  return ProcessEvent{type, pid, tid == 0 ? pid : tid, NowNs()};
}

ProcessEventBatch Batch(std::vector<ProcessEvent> events) {
  ProcessEventBatch batch;
  batch.events = std::move(events);
  return batch;
}

// Waits up to 10 s for `condition`.
template <typename F>
bool WaitFor(F condition) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!condition()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    usleep(1000);
  }
  return true;
}

// Spawns `sleep 30 <marker>` with `envp` and waits until /proc shows the exec'd arguments.
pid_t SpawnSleep(const std::string& marker, char* const* envp = environ) {
  std::vector<std::string> args = {"sleep", "30", marker};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t child = 0;
  if (posix_spawnp(&child, "sleep", nullptr, nullptr, argv.data(), envp) != 0) return -1;
  WaitFor([&] { return ReadCommandLine(child).value_or(std::vector<std::string>{}) == args; });
  return child;
}

void KillAndReap(pid_t pid) {
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
}

// A rule that only `sleep 30 <marker>` matches.
std::string Marker() {
  static int counter = 0;
  return absl::StrCat("0.", getpid(), ++counter);
}

ServiceMatcher SleepersMatcher(const std::string& marker) {
  return ServiceMatcher::Create({{"sleepers", absl::StrCat("^sleep 30 ", marker, "$")}}).value();
}

TEST(ProcessTrackerUpdateTest, ScansEverythingBeforeTheFirstRescan) {
  const std::string marker = Marker();
  pid_t child = SpawnSleep(marker);
  ASSERT_GT(child, 0);
  ProcessTracker tracker(SleepersMatcher(marker));
  // No baseline yet: the empty batch cannot be applied, a full scan finds the child.
  ProcessChanges changes = tracker.Update(ProcessEventBatch()).value();
  EXPECT_NE(FindPid(changes.added, child), nullptr);
  KillAndReap(child);
}

TEST(ProcessTrackerUpdateTest, StartedProcessIsAddedOnceAndExitRemovesIt) {
  const std::string marker = Marker();
  ProcessTracker tracker(SleepersMatcher(marker));
  tracker.Rescan().value();
  pid_t child = SpawnSleep(marker);
  ASSERT_GT(child, 0);

  // Nothing names the child: Update() does not look at it.
  EXPECT_TRUE(tracker.Update(ProcessEventBatch()).value().empty());

  // The kernel may queue the exec before the fork; either order adds it once.
  ProcessChanges changes = tracker
                               .Update(Batch({Event(ProcessEventType::kExec, child),
                                              Event(ProcessEventType::kProcessStarted, child)}))
                               .value();
  ASSERT_EQ(CountPid(changes.added, child), 1u);
  EXPECT_THAT(changes.removed, IsEmpty());
  const TrackedProcess* added = FindPid(changes.added, child);
  EXPECT_EQ(added->service, "sleepers");
  EXPECT_EQ(ExecutableBasename(added->executable), "sleep");
  EXPECT_EQ(added->command_line.back(), marker);
  EXPECT_EQ(added->start_time, ReadStartTime(child).value());
  EXPECT_THAT(added->threads, ElementsAre(child));
  EXPECT_TRUE(tracker.targets().contains(child));

  // A late fork event changes nothing; neither does an exec the last read already saw.
  ProcessEvent stale_exec = Event(ProcessEventType::kExec, child);
  stale_exec.timestamp_ns = 1;
  EXPECT_TRUE(tracker.Update(Batch({Event(ProcessEventType::kProcessStarted, child), stale_exec}))
                  .value()
                  .empty());

  KillAndReap(child);
  changes = tracker.Update(Batch({Event(ProcessEventType::kProcessExited, child)})).value();
  ASSERT_NE(FindPid(changes.removed, child), nullptr);
  EXPECT_EQ(FindPid(changes.removed, child)->service, "sleepers");
  EXPECT_FALSE(tracker.targets().contains(child));
  EXPECT_TRUE(
      tracker.Update(Batch({Event(ProcessEventType::kProcessExited, child)})).value().empty());
}

TEST(ProcessTrackerUpdateTest, StartAndExitInOneBatchIsNoChange) {
  const std::string marker = Marker();
  ProcessTracker tracker(SleepersMatcher(marker));
  tracker.Rescan().value();
  pid_t child = SpawnSleep(marker);
  ASSERT_GT(child, 0);
  KillAndReap(child);
  ProcessChanges changes = tracker
                               .Update(Batch({Event(ProcessEventType::kProcessStarted, child),
                                              Event(ProcessEventType::kExec, child),
                                              Event(ProcessEventType::kProcessExited, child)}))
                               .value();
  EXPECT_TRUE(changes.empty());
  EXPECT_FALSE(tracker.targets().contains(child));
}

TEST(ProcessTrackerUpdateTest, ZombieCountsAsExited) {
  const std::string marker = Marker();
  ProcessTracker tracker(SleepersMatcher(marker));
  tracker.Rescan().value();
  pid_t child = SpawnSleep(marker);
  ASSERT_GT(child, 0);
  ASSERT_NE(
      FindPid(tracker.Update(Batch({Event(ProcessEventType::kExec, child)})).value().added, child),
      nullptr);

  // Killed but not reaped: a zombie, still in /proc. Nothing would tell when it is reaped.
  kill(child, SIGKILL);
  ASSERT_TRUE(WaitFor([&] {
    siginfo_t info{};
    return waitid(P_PID, child, &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == child;
  }));
  ProcessChanges changes =
      tracker.Update(Batch({Event(ProcessEventType::kProcessExited, child)})).value();
  EXPECT_NE(FindPid(changes.removed, child), nullptr);
  EXPECT_FALSE(tracker.targets().contains(child));
  waitpid(child, nullptr, 0);
}

TEST(ProcessTrackerUpdateTest, ExecDecidesAndTheImageAlreadyReadIsNoNews) {
  // A child that waits for a byte on a pipe, then execs `sleep 30 <marker>`: its fork image
  // (this test binary) does not match, the exec'd one does.
  const std::string marker = Marker();
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  ProcessTracker tracker(SleepersMatcher(marker));
  tracker.Rescan().value();
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    char byte;
    close(pipe_fds[1]);
    if (read(pipe_fds[0], &byte, 1) == 1) {
      execlp("sleep", "sleep", "30", marker.c_str(), static_cast<char*>(nullptr));
    }
    _exit(1);
  }
  close(pipe_fds[0]);
  EXPECT_TRUE(
      tracker.Update(Batch({Event(ProcessEventType::kProcessStarted, child)})).value().empty());
  EXPECT_FALSE(tracker.targets().contains(child));

  ASSERT_EQ(write(pipe_fds[1], "x", 1), 1);
  close(pipe_fds[1]);
  ASSERT_TRUE(WaitFor([&] {
    return ReadCommandLine(child).value_or(std::vector<std::string>{}) ==
           std::vector<std::string>{"sleep", "30", marker};
  }));
  ProcessChanges changes = tracker.Update(Batch({Event(ProcessEventType::kExec, child)})).value();
  ASSERT_NE(FindPid(changes.added, child), nullptr);
  EXPECT_EQ(FindPid(changes.removed, child), nullptr);  // it was no target before

  // An exec event stamped after the read, for the image that read already saw (same
  // executable, same arguments): /proc shows a new image before the kernel stamps its exec
  // event, so a read can fall in between. The target stays as it is.
  changes = tracker.Update(Batch({Event(ProcessEventType::kExec, child)})).value();
  EXPECT_TRUE(changes.empty());
  EXPECT_TRUE(tracker.targets().contains(child));
  KillAndReap(child);
}

TEST(ProcessTrackerUpdateTest, PinsTakeEffectAtTheNextUpdate) {
  // No STRATA_SERVICE matching: only pins are read. With it, any process on the host with an
  // empty environment (another test's child) is retried, and has_pending() stays true.
  ProcessTracker tracker(ServiceMatcher::Create({}, /*use_env_var=*/false).value());
  pid_t child = SpawnSleep(Marker());
  ASSERT_GT(child, 0);
  tracker.Rescan().value();
  EXPECT_FALSE(tracker.targets().contains(child));

  tracker.Track(child, "pinned");
  EXPECT_TRUE(tracker.has_pending());
  ProcessChanges changes = tracker.Update(ProcessEventBatch()).value();
  ASSERT_NE(FindPid(changes.added, child), nullptr);
  EXPECT_EQ(FindPid(changes.added, child)->service, "pinned");
  EXPECT_FALSE(tracker.has_pending());

  tracker.Untrack(child);
  changes = tracker.Update(ProcessEventBatch()).value();
  EXPECT_NE(FindPid(changes.removed, child), nullptr);
  EXPECT_FALSE(tracker.targets().contains(child));
  KillAndReap(child);
}

// `--pid` alone (no rules, no STRATA_SERVICE): other processes' events and /proc entries are
// not read, so a host busy with fork and exec costs the agent nothing in /proc reads.
TEST(ProcessTrackerUpdateTest, WithOnlyPinsOtherProcessesAreNeverRead) {
  ProcessTracker tracker(ServiceMatcher::Create({}, /*use_env_var=*/false).value());
  pid_t pinned = SpawnSleep(Marker());
  ASSERT_GT(pinned, 0);
  tracker.Track(pinned, "pinned");
  ProcessChanges changes = tracker.Rescan().value();
  ASSERT_NE(FindPid(changes.added, pinned), nullptr);
  EXPECT_EQ(tracker.processes_read(), 1u) << "the first scan read more than the pinned process";

  pid_t other = SpawnSleep(Marker());
  ASSERT_GT(other, 0);
  changes = tracker.Update(Batch({Event(ProcessEventType::kProcessStarted, other),
                                  Event(ProcessEventType::kExec, other),
                                  Event(ProcessEventType::kProcessExited, other)}))
                .value();
  EXPECT_TRUE(changes.empty());
  EXPECT_EQ(tracker.processes_read(), 1u);

  // The pinned process's own exit is still read and reported.
  KillAndReap(pinned);
  changes = tracker.Update(Batch({Event(ProcessEventType::kProcessExited, pinned)})).value();
  EXPECT_NE(FindPid(changes.removed, pinned), nullptr);
  EXPECT_EQ(tracker.processes_read(), 2u);
  EXPECT_TRUE(tracker.targets().empty());
  KillAndReap(other);
}

TEST(ProcessTrackerUpdateTest, UnsettledEvaluationIsRetriedABoundedNumberOfTimes) {
  STRATA_SKIP_UNDER_QEMU_USER();  // the spawned host `sleep` needs qemu's environment
  // An empty environment cannot be told from one caught in the middle of exec.
  ProcessTracker tracker(ServiceMatcher::Create({}).value());
  tracker.Rescan().value();
  char* empty_environment[] = {nullptr};
  pid_t child = SpawnSleep(Marker(), empty_environment);
  ASSERT_GT(child, 0);
  ProcessChanges changes = tracker.Update(Batch({Event(ProcessEventType::kExec, child)})).value();
  EXPECT_TRUE(changes.empty());
  EXPECT_TRUE(tracker.has_pending());
  int updates = 0;
  while (tracker.has_pending() && updates < 100) {
    EXPECT_TRUE(tracker.Update(ProcessEventBatch()).value().empty());
    ++updates;
  }
  EXPECT_FALSE(tracker.has_pending());
  EXPECT_LE(updates, 10);
  KillAndReap(child);
}

TEST(ProcessTrackerUpdateTest, ThreadEventsOfATarget) {
  ProcessTracker::Options options;
  options.exclude_self = false;
  ProcessTracker tracker(ServiceMatcher::Create({}).value(), options);
  tracker.Track(getpid(), "self");
  ASSERT_NE(FindPid(tracker.Rescan().value().added, getpid()), nullptr);
  const pid_t self = getpid();

  std::atomic<pid_t> tid{0};
  std::atomic<bool> stop{false};
  std::thread worker([&] {
    tid = gettid();
    while (!stop) usleep(1000);
  });
  ASSERT_TRUE(WaitFor([&] { return tid != 0; }));
  ProcessChanges changes =
      tracker.Update(Batch({Event(ProcessEventType::kThreadStarted, self, tid)})).value();
  EXPECT_THAT(changes.threads_added, ElementsAre(ThreadRef{self, tid}));
  EXPECT_THAT(changes.threads_removed, IsEmpty());
  EXPECT_THAT(tracker.targets().at(self).threads, Contains(tid.load()));
  // Said twice: reported once.
  EXPECT_TRUE(
      tracker.Update(Batch({Event(ProcessEventType::kThreadStarted, self, tid)})).value().empty());

  // A thread that started and exited within one batch, in either order, is no change.
  pid_t short_tid = 0;
  std::thread([&] { short_tid = gettid(); }).join();
  // Joined is not yet gone from /proc: wait for that, as the kernel's exit event would.
  ASSERT_TRUE(WaitFor([&] {
    std::vector<pid_t> threads = ListThreads(self).value_or(std::vector<pid_t>{});
    return std::find(threads.begin(), threads.end(), short_tid) == threads.end();
  }));
  EXPECT_TRUE(tracker
                  .Update(Batch({Event(ProcessEventType::kThreadStarted, self, short_tid),
                                 Event(ProcessEventType::kThreadExited, self, short_tid)}))
                  .value()
                  .empty());
  EXPECT_TRUE(tracker
                  .Update(Batch({Event(ProcessEventType::kThreadExited, self, short_tid),
                                 Event(ProcessEventType::kThreadStarted, self, short_tid)}))
                  .value()
                  .empty());
  EXPECT_THAT(tracker.targets().at(self).threads, Not(Contains(short_tid)));

  stop = true;
  worker.join();
  changes = tracker.Update(Batch({Event(ProcessEventType::kThreadExited, self, tid)})).value();
  EXPECT_THAT(changes.threads_removed, ElementsAre(ThreadRef{self, tid}));
  EXPECT_THAT(changes.threads_added, IsEmpty());
  EXPECT_TRUE(changes.removed.empty() && changes.added.empty());
  EXPECT_THAT(tracker.targets().at(self).threads, Not(Contains(tid.load())));
  EXPECT_TRUE(
      tracker.Update(Batch({Event(ProcessEventType::kThreadExited, self, tid)})).value().empty());
}

TEST(ProcessTrackerUpdateTest, OverflowFallsBackToAFullScan) {
  const std::string marker = Marker();
  ProcessTracker tracker(SleepersMatcher(marker));
  tracker.Rescan().value();
  pid_t child = SpawnSleep(marker);
  ASSERT_GT(child, 0);
  // The events about the child were lost: only a full scan can find it.
  ProcessEventBatch lost;
  lost.overflowed = true;
  ProcessChanges changes = tracker.Update(lost).value();
  EXPECT_NE(FindPid(changes.added, child), nullptr);
  KillAndReap(child);
}

}  // namespace
}  // namespace strata::agent::procfs
