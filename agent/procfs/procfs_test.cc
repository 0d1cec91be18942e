#include "agent/procfs/procfs.h"

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <string>
#include <atomic>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "agent/procfs/service_matcher.h"
#include "common/testing/emulation.h"

extern char** environ;

namespace strata::agent::procfs {
namespace {

using ::testing::Contains;
using ::testing::ElementsAre;

constexpr std::string_view kSyntheticMaps =
    "55d0c0a00000-55d0c0a02000 r--p 00000000 08:01 1310742                    /usr/bin/cat\n"
    "55d0c0a02000-55d0c0a07000 r-xp 00002000 08:01 1310742                    /usr/bin/cat\n"
    "55d0c1b2e000-55d0c1b4f000 rw-p 00000000 00:00 0                          [heap]\n"
    "7f1c2a000000-7f1c2a021000 rw-p 00000000 00:00 0 \n"
    "7f1c2b000000-7f1c2b800000 rw-p 00000000 00:00 0\n"
    "7f1c2c000000-7f1c2c010000 r-xp 00001000 fd:02 42    /opt/my app/lib with spaces.so\n"
    "7f1c2d000000-7f1c2d004000 r-xp 00000000 08:01 77   /tmp/libgone.so (deleted)\n"
    "7f1c2e000000-7f1c2e001000 rw-s 00000000 00:05 1234 /dev/shm/ring\n"
    "7f1c2f000000-7f1c2f001000 rw-p 00000000 00:00 0    [anon:strata ring]\n"
    "7ffd5a1e0000-7ffd5a201000 rw-p 00000000 00:00 0                          [stack]\n"
    "ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0                  [vsyscall]";

TEST(ParseMapsTest, ParsesEveryFieldOfSyntheticMaps) {
  size_t skipped = 99;
  std::vector<Mapping> maps = ParseMaps(kSyntheticMaps, &skipped);
  EXPECT_EQ(skipped, 0u);
  ASSERT_EQ(maps.size(), 11u);

  EXPECT_EQ(maps[1].start, 0x55d0c0a02000u);
  EXPECT_EQ(maps[1].end, 0x55d0c0a07000u);
  EXPECT_EQ(maps[1].offset, 0x2000u);
  EXPECT_TRUE(maps[1].read);
  EXPECT_FALSE(maps[1].write);
  EXPECT_TRUE(maps[1].exec);
  EXPECT_FALSE(maps[1].shared);
  EXPECT_EQ(maps[1].dev_major, 8u);
  EXPECT_EQ(maps[1].dev_minor, 1u);
  EXPECT_EQ(maps[1].inode, 1310742u);
  EXPECT_EQ(maps[1].path, "/usr/bin/cat");
  EXPECT_TRUE(maps[1].IsFile());

  EXPECT_EQ(maps[2].path, "[heap]");
  EXPECT_FALSE(maps[2].IsFile());
  // Anonymous mappings, with and without the trailing padding space.
  EXPECT_EQ(maps[3].path, "");
  EXPECT_EQ(maps[3].inode, 0u);
  EXPECT_EQ(maps[4].path, "");
  EXPECT_FALSE(maps[4].IsFile());

  EXPECT_EQ(maps[5].path, "/opt/my app/lib with spaces.so");
  EXPECT_EQ(maps[5].dev_major, 0xfdu);
  EXPECT_EQ(maps[5].offset, 0x1000u);
  EXPECT_FALSE(maps[5].deleted);

  EXPECT_EQ(maps[6].path, "/tmp/libgone.so");
  EXPECT_TRUE(maps[6].deleted);

  EXPECT_TRUE(maps[7].shared);
  EXPECT_EQ(maps[8].path, "[anon:strata ring]");
  EXPECT_EQ(maps[9].path, "[stack]");

  EXPECT_EQ(maps[10].start, 0xffffffffff600000u);
  EXPECT_TRUE(maps[10].exec);
  EXPECT_FALSE(maps[10].read);
}

TEST(ParseMapsTest, SkipsMalformedLinesAndKeepsTheRest) {
  std::string text =
      "garbage\n"
      "1000-2000 r-xp 00000000 08:01 5 /ok/one\n"
      "3000-2000 r-xp 00000000 08:01 5 /end/before/start\n"
      "4000-5000 rwzp 00000000 08:01 5 /bad/perms\n"
      "4000-5000 r-xp 0000000g 08:01 5 /bad/offset\n"
      "4000-5000 r-xp 00000000 0801 5 /bad/dev\n"
      "4000-5000 r-xp 00000000 08:01 x /bad/inode\n"
      "4000-5000 r-x\n"
      "4000-\n"
      "\n"
      "6000-7000 r--p 00000000 08:01 6 /ok/two\n";
  size_t skipped = 0;
  std::vector<Mapping> maps = ParseMaps(text, &skipped);
  EXPECT_EQ(skipped, 8u);
  ASSERT_EQ(maps.size(), 2u);
  EXPECT_EQ(maps[0].path, "/ok/one");
  EXPECT_EQ(maps[1].path, "/ok/two");
  EXPECT_TRUE(ParseMaps("").empty());
}

TEST(FindMappingTest, FindsContainingMappingOnly) {
  std::vector<Mapping> maps = ParseMaps(kSyntheticMaps);
  const Mapping* m = FindMapping(maps, 0x55d0c0a02000);
  ASSERT_NE(m, nullptr);
  EXPECT_TRUE(m->exec);
  m = FindMapping(maps, 0x55d0c0a06fff);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->start, 0x55d0c0a02000u);
  EXPECT_EQ(FindMapping(maps, 0x55d0c0a07000), nullptr);  // gap before [heap]
  EXPECT_EQ(FindMapping(maps, 0x1000), nullptr);
  EXPECT_EQ(FindMapping({}, 0x1000), nullptr);
  m = FindMapping(maps, 0x7ffd5a200ff0);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->path, "[stack]");
}

TEST(ParseStatTest, StartTimeSurvivesHostileComm) {
  // Fields 3..21 then start time 987654 as field 22.
  std::string tail = " R 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 987654 1000 200\n";
  EXPECT_EQ(ParseStatStartTime("42 (cat)" + tail).value(), 987654u);
  EXPECT_EQ(ParseStatStartTime("42 (a) b) (c d 1 2 3)" + tail).value(), 987654u);
  EXPECT_FALSE(ParseStatStartTime("42 cat R 1 2").ok());
  EXPECT_FALSE(ParseStatStartTime("42 (cat) R 1 2 3").ok());
  EXPECT_FALSE(
      ParseStatStartTime("42 (cat) R 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 x 1").ok());
  EXPECT_FALSE(ParseStatStartTime("").ok());
}

TEST(NamespacePidTest, LastNSpidFieldOfStatus) {
  EXPECT_EQ(ParseNamespacePid("Name:\tjava\nPid:\t4242\nNSpid:\t4242\t17\t1\n"), 1);
  EXPECT_EQ(ParseNamespacePid("Pid:\t9\nNSpid:\t9\n"), 9);
  EXPECT_EQ(ParseNamespacePid("Pid:\t9\n"), std::nullopt);
  EXPECT_EQ(ParseNamespacePid("NSpid:\t9\tx\n"), std::nullopt);
  EXPECT_EQ(ParseNamespacePid("NSpid:\n"), std::nullopt);
  EXPECT_EQ(ReadNamespacePid(getpid()).value(), getpid());  // no pid namespace of its own
}

TEST(NulSeparatedTest, SplitsAndFindsEnvironment) {
  using namespace std::string_literals;
  EXPECT_THAT(SplitNulSeparated("a\0b c\0\0d\0"s), ElementsAre("a", "b c", "", "d"));
  EXPECT_THAT(SplitNulSeparated("last"s), ElementsAre("last"));
  EXPECT_TRUE(SplitNulSeparated("").empty());
  std::string env = "PATH=/bin\0STRATA_SERVICE_X=no\0STRATA_SERVICE=api=v2\0"s;
  EXPECT_EQ(FindEnvironValue(env, "STRATA_SERVICE").value_or("?"), "api=v2");
  EXPECT_EQ(FindEnvironValue(env, "PATH").value_or("?"), "/bin");
  EXPECT_FALSE(FindEnvironValue(env, "STRATA").has_value());
  EXPECT_FALSE(FindEnvironValue("", "PATH").has_value());
}

int FunctionInThisBinary() { return 7; }

TEST(LiveProcfsTest, ReadsOwnProcess) {
  STRATA_SKIP_UNDER_QEMU_USER();
  const pid_t self = getpid();
  std::vector<pid_t> pids = ListProcesses().value();
  EXPECT_THAT(pids, Contains(self));
  EXPECT_THAT(pids, Contains(1));

  char real_exe[PATH_MAX];
  ASSERT_NE(realpath("/proc/self/exe", real_exe), nullptr);
  EXPECT_EQ(ReadExecutable(self).value(), real_exe);
  std::vector<std::string> argv = ReadCommandLine(self).value();
  ASSERT_FALSE(argv.empty());
  EXPECT_EQ(argv[0], ::testing::internal::GetArgvs()[0]);
  EXPECT_EQ(ReadComm(self).value(), std::string(ExecutableBasename(real_exe)).substr(0, 15));

  uint64_t start = ReadStartTime(self).value();
  EXPECT_GT(start, 0u);
  EXPECT_EQ(ReadStartTime(self).value(), start);
  EXPECT_GE(ReadStartTime(self).value(), ReadStartTime(1).value());

  std::vector<Mapping> maps = ReadMappings(self).value();
  const Mapping* code = FindMapping(maps, reinterpret_cast<uintptr_t>(&FunctionInThisBinary));
  ASSERT_NE(code, nullptr);
  EXPECT_TRUE(code->exec);
  EXPECT_EQ(code->path, real_exe);
  int local = 0;
  const Mapping* stack = FindMapping(maps, reinterpret_cast<uintptr_t>(&local));
  ASSERT_NE(stack, nullptr);
  EXPECT_EQ(stack->path, "[stack]");
  EXPECT_TRUE(stack->write);
}

TEST(LiveProcfsTest, ListsThreadsAsTheyComeAndGo) {
  const pid_t self = getpid();
  EXPECT_THAT(ListThreads(self).value(), Contains(gettid()));
  std::atomic<pid_t> tid{0};
  std::atomic<bool> stop{false};
  std::thread worker([&] {
    tid = gettid();
    while (!stop) std::this_thread::yield();
  });
  while (tid == 0) std::this_thread::yield();
  EXPECT_THAT(ListThreads(self).value(), Contains(tid.load()));
  stop = true;
  worker.join();
  // join() returns when the thread clears its tid; its /proc entry can outlive that briefly
  // (noticeably under emulation).
  for (int i = 0; i < 200 && ::testing::Value(ListThreads(self).value(), Contains(tid.load()));
       ++i) {
    usleep(10'000);
  }
  EXPECT_THAT(ListThreads(self).value(), ::testing::Not(Contains(tid.load())));
}

TEST(LiveProcfsTest, ReadsEnvironmentOfAnotherProcess) {
  char arg0[] = "sleep";
  char arg1[] = "600";  // killed below; alive however slow the run
  char* argv[] = {arg0, arg1, nullptr};
  char env0[] = "STRATA_SERVICE=checkout";
  char env1[] = "OTHER=1";
  char* envp[] = {env0, env1, nullptr};
  pid_t child = 0;
  ASSERT_EQ(posix_spawnp(&child, "sleep", nullptr, nullptr, argv, envp), 0);
  // Until exec completes, /proc shows the parent's image; wait for the new one (up to 20 s:
  // under sanitizers on a loaded machine the exec can take seconds).
  for (int i = 0; i < 10000 && ReadCommandLine(child).value_or(std::vector<std::string>{}) !=
                                   std::vector<std::string>{"sleep", "600"};
       ++i) {
    usleep(2000);
  }
  EXPECT_EQ(ReadEnvironValue(child, "STRATA_SERVICE").value().value_or("?"), "checkout");
  EXPECT_FALSE(ReadEnvironValue(child, "HOME").value().has_value());
  EXPECT_EQ(ExecutableBasename(ReadExecutable(child).value()), "sleep");
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  // Reaped: every reader reports NotFound.
  EXPECT_EQ(ReadStartTime(child).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ReadMappings(child).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ReadExecutable(child).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ListThreads(child).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace strata::agent::procfs
