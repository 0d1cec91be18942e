// ProcessEvents against the live kernel, and ProcessTracker::Update() driven by it. Needs the
// process connector (initial pid namespace, CAP_NET_ADMIN): the tests skip with the reason where
// Open() says it is unavailable. Everything waits on conditions with deadlines; other processes
// on the machine add events of their own, so the checks look for ours among them.

#include "agent/procfs/process_events.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "agent/procfs/process_tracker.h"
#include "agent/procfs/procfs.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace strata::agent::procfs {
namespace {

using ::testing::Contains;

constexpr auto kDeadline = std::chrono::seconds(10);
constexpr char kChildEnv[] = "STRATA_PROCESS_EVENTS_TEST_CHILD";

// ---- A child process that starts and joins threads on request. ----
//
// The test binary runs itself with kChildEnv set; the child then never reaches main(). It reads
// commands from stdin: 's' starts a thread (which writes its tid to stdout and waits), 'j' ends
// and joins it (and writes its tid again); end of input exits.
void RunChild() {
  int wake[2];
  if (pipe(wake) != 0) _exit(2);
  std::thread worker;
  pid_t tid = 0;
  char command;
  while (read(0, &command, 1) == 1) {
    if (command == 's' && !worker.joinable()) {
      worker = std::thread([&] {
        tid = gettid();
        if (write(1, &tid, sizeof(tid)) != sizeof(tid)) _exit(3);
        char byte;
        if (read(wake[0], &byte, 1) != 1) _exit(4);
      });
    } else if (command == 'j' && worker.joinable()) {
      if (write(wake[1], "x", 1) != 1) _exit(5);
      worker.join();
      if (write(1, &tid, sizeof(tid)) != sizeof(tid)) _exit(6);
    }
  }
  _exit(0);
}

[[maybe_unused]] const bool kRunsAsChild = [] {
  if (getenv(kChildEnv) != nullptr) RunChild();
  return false;
}();

class ThreadedChild {
 public:
  // Runs this binary as a child with the command line "<exe> child <marker>".
  bool Spawn(const std::string& marker) {
    int to_child[2], from_child[2];
    if (pipe2(to_child, O_CLOEXEC) != 0 || pipe2(from_child, O_CLOEXEC) != 0) return false;
    std::string exe = ReadExecutable(getpid()).value_or("");
    std::vector<std::string> args = {exe, "child", marker};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::string env = absl::StrCat(kChildEnv, "=1");
    char* envp[] = {env.data(), nullptr};
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, to_child[0], 0);
    posix_spawn_file_actions_adddup2(&actions, from_child[1], 1);
    const int err = posix_spawn(&pid_, exe.c_str(), &actions, nullptr, argv.data(), envp);
    posix_spawn_file_actions_destroy(&actions);
    close(to_child[0]);
    close(from_child[1]);
    to_child_ = to_child[1];
    from_child_ = from_child[0];
    if (err != 0) pid_ = 0;
    return err == 0;
  }

  ~ThreadedChild() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      Reap();
    }
    if (to_child_ >= 0) close(to_child_);
    if (from_child_ >= 0) close(from_child_);
  }

  pid_t pid() const { return pid_; }
  // 's' or 'j'; the thread's tid, or 0 if the child did not answer in time.
  pid_t Command(char command) {
    if (write(to_child_, &command, 1) != 1) return 0;
    pollfd ready{from_child_, POLLIN, 0};
    if (poll(&ready, 1, static_cast<int>(std::chrono::milliseconds(kDeadline).count())) != 1) {
      return 0;
    }
    pid_t tid = 0;
    return read(from_child_, &tid, sizeof(tid)) == sizeof(tid) ? tid : 0;
  }
  // Closes its input, so it exits, and reaps it.
  void Quit() {
    close(to_child_);
    to_child_ = -1;
    Reap();
  }

 private:
  void Reap() {
    waitpid(pid_, nullptr, 0);
    pid_ = 0;
  }

  pid_t pid_ = 0;
  int to_child_ = -1;
  int from_child_ = -1;
};

// ---- Helpers ----

bool Has(const ProcessEventBatch& batch, ProcessEventType type, pid_t pid, pid_t tid) {
  return std::any_of(batch.events.begin(), batch.events.end(), [&](const ProcessEvent& e) {
    return e.type == type && e.pid == pid && e.tid == tid;
  });
}

const TrackedProcess* FindPid(const std::vector<TrackedProcess>& list, pid_t pid) {
  auto it = std::find_if(list.begin(), list.end(),
                         [pid](const TrackedProcess& p) { return p.pid == pid; });
  return it == list.end() ? nullptr : &*it;
}

void Append(ProcessChanges* all, ProcessChanges more) {
  for (auto& p : more.removed) all->removed.push_back(std::move(p));
  for (auto& p : more.added) all->added.push_back(std::move(p));
  all->threads_added.insert(all->threads_added.end(), more.threads_added.begin(),
                            more.threads_added.end());
  all->threads_removed.insert(all->threads_removed.end(), more.threads_removed.begin(),
                              more.threads_removed.end());
}

// Generates `count` comm-change events (setting this thread's name to itself).
void GenerateCommEvents(int count) {
  char name[17] = {};
  prctl(PR_GET_NAME, name);
  for (int i = 0; i < count; ++i) prctl(PR_SET_NAME, name);
}

class ProcessEventsTest : public ::testing::Test {
 protected:
  void SetUp() override { Open(ProcessEvents::Options()); }

  void Open(const ProcessEvents::Options& options) {
    events_.reset();
    absl::StatusOr<std::unique_ptr<ProcessEvents>> opened = ProcessEvents::Open(options);
    if (absl::IsPermissionDenied(opened.status()) || absl::IsUnavailable(opened.status())) {
      GTEST_SKIP() << "process connector unavailable here: " << opened.status();
    }
    ASSERT_TRUE(opened.ok()) << opened.status();
    events_ = *std::move(opened);
  }

  // Reads batches into `*all` until `done(*all)` or the deadline; false on timeout.
  bool ReadUntil(ProcessEventBatch* all,
                 const std::function<bool(const ProcessEventBatch&)>& done) {
    const auto deadline = std::chrono::steady_clock::now() + kDeadline;
    ProcessEventBatch batch;
    for (;;) {
      batch.Clear();
      absl::Status status = events_->Read(&batch);
      EXPECT_TRUE(status.ok()) << status;
      all->events.insert(all->events.end(), batch.events.begin(), batch.events.end());
      all->overflowed |= batch.overflowed;
      if (done(*all)) return true;
      if (!Wait(deadline)) return false;
    }
  }

  // Feeds events to `tracker` (Update()) and collects its changes into `*all` until `done(*all)`
  // or the deadline; false on timeout.
  bool UpdateUntil(ProcessTracker* tracker, ProcessChanges* all,
                   const std::function<bool(const ProcessChanges&)>& done) {
    const auto deadline = std::chrono::steady_clock::now() + kDeadline;
    ProcessEventBatch batch;
    for (;;) {
      batch.Clear();
      absl::Status status = events_->Read(&batch);
      EXPECT_TRUE(status.ok()) << status;
      absl::StatusOr<ProcessChanges> changes = tracker->Update(batch);
      EXPECT_TRUE(changes.ok()) << changes.status();
      if (changes.ok()) Append(all, *std::move(changes));
      if (done(*all)) return true;
      if (!Wait(deadline)) return false;
    }
  }

  // Waits for the fd to be readable (at most 100 ms, so that unsettled processes are retried);
  // false once the deadline has passed.
  bool Wait(std::chrono::steady_clock::time_point deadline) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd ready{events_->fd(), POLLIN, 0};
    poll(&ready, 1, static_cast<int>(std::min<int64_t>(left.count(), 100)));
    return true;
  }

  std::unique_ptr<ProcessEvents> events_;
};

TEST_F(ProcessEventsTest, ForkExecAndExitOfAChild) {
  char arg0[] = "/bin/sleep";
  char arg1[] = "30";
  char* argv[] = {arg0, arg1, nullptr};
  pid_t child = 0;
  ASSERT_EQ(posix_spawn(&child, "/bin/sleep", nullptr, nullptr, argv, environ), 0);

  ProcessEventBatch all;
  EXPECT_TRUE(ReadUntil(&all, [&](const ProcessEventBatch& b) {
    return Has(b, ProcessEventType::kProcessStarted, child, child) &&
           Has(b, ProcessEventType::kExec, child, child);
  })) << "overflowed: " << all.overflowed;
  EXPECT_FALSE(Has(all, ProcessEventType::kThreadStarted, child, child));
  for (const ProcessEvent& e : all.events) {
    if (e.pid == child) {
      EXPECT_GT(e.timestamp_ns, 0u);
    }
  }

  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  EXPECT_TRUE(ReadUntil(&all, [&](const ProcessEventBatch& b) {
    return Has(b, ProcessEventType::kProcessExited, child, child);
  })) << "overflowed: " << all.overflowed;
  EXPECT_FALSE(Has(all, ProcessEventType::kThreadExited, child, child));
}

TEST_F(ProcessEventsTest, ThreadStartAndExit) {
  pid_t tid = 0;
  std::thread([&] { tid = gettid(); }).join();
  ASSERT_NE(tid, getpid());

  ProcessEventBatch all;
  EXPECT_TRUE(ReadUntil(&all, [&](const ProcessEventBatch& b) {
    return Has(b, ProcessEventType::kThreadStarted, getpid(), tid) &&
           Has(b, ProcessEventType::kThreadExited, getpid(), tid);
  })) << "overflowed: " << all.overflowed;
  EXPECT_FALSE(Has(all, ProcessEventType::kProcessStarted, tid, tid));
  EXPECT_FALSE(Has(all, ProcessEventType::kProcessExited, getpid(), getpid()));
}

// A small queue: about 150 events fit.
ProcessEvents::Options SmallQueue(bool filter) {
  ProcessEvents::Options options;
  options.receive_buffer_bytes = 64 << 10;
  options.filter_unused_events = filter;
  return options;
}

TEST_F(ProcessEventsTest, OverflowIsReportedAndEventsFlowAgain) {
  Open(SmallQueue(/*filter=*/false));
  if (IsSkipped() || HasFatalFailure()) return;
  GenerateCommEvents(20000);  // far beyond the queue, unread
  ProcessEventBatch batch;
  ASSERT_TRUE(events_->Read(&batch).ok());
  EXPECT_TRUE(batch.overflowed);
  EXPECT_GE(events_->overflows(), 1u);

  // Drained: new events arrive as before. Every process's events share this small unfiltered
  // queue, so a busy host can overflow it again before ours arrive: then try a new thread.
  bool seen = false;
  const auto deadline = std::chrono::steady_clock::now() + kDeadline;
  while (!seen && std::chrono::steady_clock::now() < deadline) {
    pid_t tid = 0;
    std::thread([&] { tid = gettid(); }).join();
    ProcessEventBatch all;
    ReadUntil(&all, [&](const ProcessEventBatch& b) {
      return b.overflowed || Has(b, ProcessEventType::kThreadExited, getpid(), tid);
    });
    seen = Has(all, ProcessEventType::kThreadExited, getpid(), tid);
  }
  EXPECT_TRUE(seen);
}

TEST_F(ProcessEventsTest, FilterDropsUnusedEventsInTheKernel) {
  // The same storm with the filter: the comm events never reach the queue. Every process's
  // fork and exit events still do, and on a busy host (other tests starting hundreds of
  // threads) they alone can fill these 150 places during a storm: then storm again. With the
  // comm events let through, every storm overflows the queue 130 times over.
  Open(SmallQueue(/*filter=*/true));
  if (IsSkipped() || HasFatalFailure()) return;
  bool overflowed = true;
  for (int storm = 0; storm < 5 && overflowed; ++storm) {
    ProcessEventBatch before;
    ASSERT_TRUE(events_->Read(&before).ok());  // an empty queue to start from
    GenerateCommEvents(20000);
    ProcessEventBatch batch;
    ASSERT_TRUE(events_->Read(&batch).ok());
    overflowed = batch.overflowed;
  }
  EXPECT_FALSE(overflowed);
}

TEST_F(ProcessEventsTest, WatchOnlyKeepsTheEventsOfTheWatchedProcesses) {
  ThreadedChild watched;
  ASSERT_TRUE(watched.Spawn("watched"));
  ASSERT_TRUE(events_->WatchOnly(std::vector<pid_t>{1, watched.pid()}).ok());
  // Unwatched: a thread of this process and a whole child process, started after the filter.
  pid_t own_thread = 0;
  std::thread([&] { own_thread = gettid(); }).join();
  char arg0[] = "/bin/true";
  char* argv[] = {arg0, nullptr};
  pid_t other = 0;
  ASSERT_EQ(posix_spawn(&other, "/bin/true", nullptr, nullptr, argv, environ), 0);
  waitpid(other, nullptr, 0);

  const pid_t started = watched.Command('s');
  ASSERT_NE(started, 0);
  ASSERT_EQ(watched.Command('j'), started);
  const pid_t pid = watched.pid();
  watched.Quit();
  ProcessEventBatch all;
  EXPECT_TRUE(ReadUntil(&all, [&](const ProcessEventBatch& b) {
    return Has(b, ProcessEventType::kThreadStarted, pid, started) &&
           Has(b, ProcessEventType::kThreadExited, pid, started) &&
           Has(b, ProcessEventType::kProcessExited, pid, pid);
  })) << "overflowed: " << all.overflowed;
  for (const ProcessEvent& e : all.events) {
    // Only events queued before the filter (the watched child's own fork and exec) may name
    // another process.
    if (e.pid == pid) continue;
    EXPECT_NE(e.pid, other) << "an unwatched process's event passed";
    EXPECT_NE(e.tid, own_thread) << "an unwatched thread's event passed";
  }

  // Every process's events again.
  ASSERT_TRUE(events_->WatchOnly(std::nullopt).ok());
  pid_t tid = 0;
  std::thread([&] { tid = gettid(); }).join();
  EXPECT_TRUE(ReadUntil(&all, [&](const ProcessEventBatch& b) {
    return Has(b, ProcessEventType::kThreadExited, getpid(), tid);
  })) << "overflowed: " << all.overflowed;
}

TEST_F(ProcessEventsTest, TrackerUpdateReportsWhatRescanWould) {
  const std::string marker = absl::StrCat("events-", getpid());
  auto matcher = [&] {
    return ServiceMatcher::Create({{"children", absl::StrCat(" child ", marker, "$")}}).value();
  };
  // Both trackers start from a full scan, after the events were opened (SetUp).
  ProcessTracker by_events(matcher());
  ProcessTracker by_scan(matcher());
  by_events.Rescan().value();
  by_scan.Rescan().value();

  ThreadedChild child;
  ASSERT_TRUE(child.Spawn(marker));
  const pid_t pid = child.pid();

  // Started: the fork image (this binary's arguments) does not match, the exec'd one does.
  ProcessChanges seen;
  ASSERT_TRUE(UpdateUntil(&by_events, &seen, [&](const ProcessChanges& c) {
    return FindPid(c.added, pid) != nullptr;
  }));
  ProcessChanges scanned = by_scan.Rescan().value();
  const TrackedProcess* from_events = FindPid(seen.added, pid);
  const TrackedProcess* from_scan = FindPid(scanned.added, pid);
  ASSERT_NE(from_scan, nullptr);
  EXPECT_EQ(from_events->start_time, from_scan->start_time);
  EXPECT_EQ(from_events->executable, from_scan->executable);
  EXPECT_EQ(from_events->command_line, from_scan->command_line);
  EXPECT_EQ(from_events->comm, from_scan->comm);
  EXPECT_EQ(from_events->service, "children");
  EXPECT_EQ(from_events->service, from_scan->service);
  EXPECT_EQ(from_events->threads, from_scan->threads);
  EXPECT_EQ(from_events->environment, from_scan->environment);

  // A new thread.
  const pid_t tid = child.Command('s');
  ASSERT_GT(tid, 0);
  ASSERT_TRUE(UpdateUntil(&by_events, &seen, [&](const ProcessChanges& c) {
    return std::find(c.threads_added.begin(), c.threads_added.end(), ThreadRef{pid, tid}) !=
           c.threads_added.end();
  }));
  scanned = by_scan.Rescan().value();
  EXPECT_THAT(scanned.threads_added, Contains(ThreadRef{pid, tid}));
  EXPECT_EQ(by_events.targets().at(pid).threads, by_scan.targets().at(pid).threads);

  // Its exit: the exit event comes once the thread has left /proc, so the scan sees it too.
  ASSERT_EQ(child.Command('j'), tid);
  ASSERT_TRUE(UpdateUntil(&by_events, &seen, [&](const ProcessChanges& c) {
    return std::find(c.threads_removed.begin(), c.threads_removed.end(), ThreadRef{pid, tid}) !=
           c.threads_removed.end();
  }));
  scanned = by_scan.Rescan().value();
  EXPECT_THAT(scanned.threads_removed, Contains(ThreadRef{pid, tid}));
  EXPECT_EQ(by_events.targets().at(pid).threads, by_scan.targets().at(pid).threads);

  // The process's exit.
  child.Quit();
  ASSERT_TRUE(UpdateUntil(&by_events, &seen, [&](const ProcessChanges& c) {
    return FindPid(c.removed, pid) != nullptr;
  }));
  scanned = by_scan.Rescan().value();
  EXPECT_NE(FindPid(scanned.removed, pid), nullptr);
  EXPECT_FALSE(by_events.targets().contains(pid));

  // Along the way each change was reported once: no exec seen twice, no churn.
  EXPECT_EQ(std::count_if(seen.added.begin(), seen.added.end(),
                          [&](const TrackedProcess& p) { return p.pid == pid; }),
            1);
  EXPECT_EQ(std::count_if(seen.removed.begin(), seen.removed.end(),
                          [&](const TrackedProcess& p) { return p.pid == pid; }),
            1);
  EXPECT_EQ(std::count(seen.threads_added.begin(), seen.threads_added.end(), ThreadRef{pid, tid}),
            1);
}

TEST_F(ProcessEventsTest, TrackerFallsBackToAFullScanOnOverflow) {
  const std::string marker = absl::StrCat("overflow-", getpid());
  ProcessTracker tracker(
      ServiceMatcher::Create({{"children", absl::StrCat(" child ", marker, "$")}}).value());
  tracker.Rescan().value();
  // Started before the subscription: no event will name it.
  ThreadedChild child;
  ASSERT_TRUE(child.Spawn(marker));
  ASSERT_TRUE([&] {
    const auto deadline = std::chrono::steady_clock::now() + kDeadline;
    while (ReadCommandLine(child.pid()).value_or(std::vector<std::string>{}).size() != 3) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      usleep(1000);
    }
    return true;
  }());

  Open(SmallQueue(/*filter=*/false));
  if (IsSkipped() || HasFatalFailure()) return;
  GenerateCommEvents(20000);
  ProcessEventBatch batch;
  ASSERT_TRUE(events_->Read(&batch).ok());
  ASSERT_TRUE(batch.overflowed);
  ProcessChanges changes = tracker.Update(batch).value();
  EXPECT_NE(FindPid(changes.added, child.pid()), nullptr);
}

}  // namespace
}  // namespace strata::agent::procfs
