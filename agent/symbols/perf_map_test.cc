// Perf map parsing and its table (from strings), and the incremental reading of a file that
// grows, is replaced or shrinks.
#include "agent/symbols/perf_map.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace strata::agent::symbols {
namespace {

TEST(PerfMapTest, ParsesLines) {
  PerfMapLine l;
  ASSERT_TRUE(ParsePerfMapLine("7fef0c006180 2c4 JS:*strataHotLoop /tmp/a.js:1:23", &l));
  EXPECT_EQ(l.start, 0x7fef0c006180u);
  EXPECT_EQ(l.size, 0x2c4u);
  EXPECT_EQ(l.name, "JS:*strataHotLoop /tmp/a.js:1:23");

  ASSERT_TRUE(ParsePerfMapLine("0x1000 0X20 Lcom/example/Foo;.bar(I)V\r", &l));
  EXPECT_EQ(l.start, 0x1000u);
  EXPECT_EQ(l.size, 0x20u);
  EXPECT_EQ(l.name, "Lcom/example/Foo;.bar(I)V");

  ASSERT_TRUE(ParsePerfMapLine("  AbC0\t10\t  name with  blanks  ", &l));
  EXPECT_EQ(l.start, 0xabc0u);
  EXPECT_EQ(l.size, 0x10u);
  EXPECT_EQ(l.name, "name with  blanks");

  ASSERT_TRUE(ParsePerfMapLine("ffffffffffffff00 ff last", &l));
  EXPECT_EQ(l.start + l.size, ~uint64_t{0});

  for (const char* bad : {"", "   ", "1000", "1000 10", "1000 10   ", "zz 10 name", "1000 zz name",
                          "1000 0 empty", "0x 10 name", "1000x 10 name", "1000 10x name",
                          "ffffffffffffffff 2 wraps", "ffffffffffffff00 100 wraps", "10000000000000000 1 too_wide"}) {
    EXPECT_FALSE(ParsePerfMapLine(bad, &l)) << "'" << bad << "'";
  }
}

TEST(PerfMapTest, AddTextTakesCompleteLinesOnly) {
  PerfMap map;
  const std::string text = "1000 10 a\nbogus line\n2000 20 b\n3000 3";
  const size_t used = map.AddText(text);
  EXPECT_EQ(used, text.rfind('\n') + 1);
  EXPECT_EQ(map.size(), 2u);
  // The caller hands the unfinished line in again, completed.
  EXPECT_EQ(map.AddText(text.substr(used) + "0 c\n"), 10u);
  PerfMap::Symbol s;
  ASSERT_TRUE(map.Lookup(0x3020, &s));
  EXPECT_EQ(s.name, "c");
  EXPECT_EQ(s.start, 0x3000u);
  EXPECT_EQ(s.end, 0x3030u);
  ASSERT_TRUE(map.Lookup(0x1000, &s));
  EXPECT_EQ(s.name, "a");
  ASSERT_TRUE(map.Lookup(0x100f, &s));
  EXPECT_FALSE(map.Lookup(0x1010, &s));
  EXPECT_FALSE(map.Lookup(0xfff, &s));
  EXPECT_FALSE(map.Lookup(0, &s));
  EXPECT_EQ(map.AddText("no newline"), 0u);
}

// Code memory is reused: the latest entry covering an address wins, and the older entries
// keep what nothing newer covers (with their own start).
TEST(PerfMapTest, LaterEntriesWin) {
  PerfMap map;
  map.AddText("1000 100 old\n");
  map.AddText("1040 20 inside\n");  // splits "old"
  PerfMap::Symbol s;
  ASSERT_TRUE(map.Lookup(0x103f, &s));
  EXPECT_EQ(s.name, "old");
  ASSERT_TRUE(map.Lookup(0x1040, &s));
  EXPECT_EQ(s.name, "inside");
  EXPECT_EQ(s.start, 0x1040u);
  ASSERT_TRUE(map.Lookup(0x1060, &s));
  EXPECT_EQ(s.name, "old");
  EXPECT_EQ(s.start, 0x1000u) << "the tail of a cut entry is still that function";
  EXPECT_EQ(map.size(), 3u);

  map.AddText("0f80 90 head\n");  // covers the start of "old"
  ASSERT_TRUE(map.Lookup(0x100f, &s));
  EXPECT_EQ(s.name, "head");
  ASSERT_TRUE(map.Lookup(0x1010, &s));
  EXPECT_EQ(s.name, "old");

  map.AddText("1030 100 across\n");  // the rest of "old", all of "inside", "old"'s tail
  for (uint64_t a : {0x1030u, 0x1040u, 0x1080u, 0x10ffu, 0x112fu}) {
    ASSERT_TRUE(map.Lookup(a, &s)) << a;
    EXPECT_EQ(s.name, "across") << a;
  }
  ASSERT_TRUE(map.Lookup(0x102f, &s));
  EXPECT_EQ(s.name, "old");
  EXPECT_FALSE(map.Lookup(0x1130, &s));

  map.AddText("1030 100 same range again\n");
  ASSERT_TRUE(map.Lookup(0x1030, &s));
  EXPECT_EQ(s.name, "same range again");
  EXPECT_EQ(map.size(), 3u);  // head, old (0x1010..0x1030), the latest
}

TEST(PerfMapTest, EntriesAreBounded) {
  PerfMap map;
  std::string text;
  for (size_t i = 0; i < PerfMap::kMaxEntries + 10; ++i) {
    absl::StrAppend(&text, absl::Hex(0x100000 + 16 * i), " 10 f", i, "\n");
  }
  map.AddText(text);
  EXPECT_LE(map.size(), PerfMap::kMaxEntries);
  EXPECT_EQ(map.resets(), 1u);
  PerfMap::Symbol s;
  const size_t last = PerfMap::kMaxEntries + 9;
  ASSERT_TRUE(map.Lookup(0x100000 + 16 * last, &s)) << "the newest entries are kept";
  EXPECT_EQ(s.name, absl::StrCat("f", last));
}

class PerfMapFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/strata_perf_map_test.XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
    path_ = dir_ + "/perf-1.map";
  }
  void TearDown() override {
    std::remove(path_.c_str());
    std::remove((path_ + ".new").c_str());
    rmdir(dir_.c_str());
  }
  void Append(const std::string& text) {
    std::ofstream out(path_, std::ios::app | std::ios::binary);
    out << text;
  }
  std::string dir_, path_;
};

TEST_F(PerfMapFileTest, ReadsOnlyWhatWasAppended) {
  PerfMapFile file(path_, "/tmp/perf-1.map");
  EXPECT_FALSE(file.Update().ok()) << "no file yet";
  EXPECT_FALSE(file.exists());
  Append("1000 10 a\n2000 10 b\n30");
  ASSERT_TRUE(file.Update().ok());
  EXPECT_EQ(file.map().size(), 2u);
  const uint64_t read = file.bytes_read();
  ASSERT_TRUE(file.Update().ok());
  EXPECT_EQ(file.bytes_read(), read) << "unchanged: not read again";

  Append("00 10 c\n1000 10 a2\n");
  ASSERT_TRUE(file.Update().ok());
  PerfMap::Symbol s;
  ASSERT_TRUE(file.map().Lookup(0x3005, &s));
  EXPECT_EQ(s.name, "c");
  ASSERT_TRUE(file.map().Lookup(0x1005, &s));
  EXPECT_EQ(s.name, "a2");
  EXPECT_EQ(file.map().size(), 3u);
  EXPECT_LT(file.bytes_read(), read + 30) << "only the tail (and the unfinished line) again";

  // A line longer than a read is skipped, the next one is not.
  Append(std::string(200000, 'x') + "\n4000 10 d\n");
  ASSERT_TRUE(file.Update().ok());
  ASSERT_TRUE(file.map().Lookup(0x4000, &s));
  EXPECT_EQ(s.name, "d");
}

TEST_F(PerfMapFileTest, StartsOverWhenReplacedOrTruncated) {
  PerfMapFile file(path_, "/tmp/perf-1.map");
  Append("1000 10 a\n2000 10 b\n");
  ASSERT_TRUE(file.Update().ok());
  ASSERT_EQ(file.map().size(), 2u);
  {
    std::ofstream out(path_ + ".new", std::ios::binary);
    out << "5000 10 e\n";
  }
  ASSERT_EQ(rename((path_ + ".new").c_str(), path_.c_str()), 0);
  ASSERT_TRUE(file.Update().ok());
  PerfMap::Symbol s;
  EXPECT_FALSE(file.map().Lookup(0x1000, &s));
  ASSERT_TRUE(file.map().Lookup(0x5000, &s));
  EXPECT_EQ(s.name, "e");

  ASSERT_EQ(truncate(path_.c_str(), 0), 0);
  Append("6000 8 f\n");
  ASSERT_TRUE(file.Update().ok());
  EXPECT_FALSE(file.map().Lookup(0x5000, &s));
  ASSERT_TRUE(file.map().Lookup(0x6000, &s));
  EXPECT_EQ(s.name, "f");
}

// HotSpot writes each map it is asked for over the last one, in place: the file grows, but what
// it holds before the old end is new too.
TEST_F(PerfMapFileTest, StartsOverWhenWrittenAnewInPlace) {
  PerfMapFile file(path_, "/tmp/perf-1.map");
  Append("0x1000 0x10 long A.a(long)\n0x2000 0x10 long A.b(long)\n");
  ASSERT_TRUE(file.Update().ok());
  ASSERT_EQ(file.map().size(), 2u);
  {
    std::ofstream out(path_, std::ios::trunc | std::ios::binary);  // same inode
    out << "0x1000 0x10 long A.a(long)\n0x1800 0x10 void A.lambda$main$0(long)\n"
           "0x2000 0x10 long A.b(long)\n0x3000 0x10 long A.c(long)\n";
  }
  ASSERT_TRUE(file.Update().ok());
  PerfMap::Symbol s;
  ASSERT_TRUE(file.map().Lookup(0x1805, &s));
  EXPECT_EQ(s.name, "void A.lambda$main$0(long)");
  ASSERT_TRUE(file.map().Lookup(0x3005, &s));
  EXPECT_EQ(s.name, "long A.c(long)");
  EXPECT_EQ(file.map().size(), 4u);

  // An append after it is still read as one.
  const uint64_t read = file.bytes_read();
  Append("0x4000 0x10 long A.d(long)\n");
  ASSERT_TRUE(file.Update().ok());
  EXPECT_EQ(file.map().size(), 5u);
  EXPECT_LT(file.bytes_read(), read + 40) << "only the appended line";
}

// A FIFO at the path (any local user can make one in the target's /tmp): refused at once, not
// an open that waits for a writer.
TEST_F(PerfMapFileTest, RefusesAFifoWithoutWaiting) {
  ASSERT_EQ(mkfifo(path_.c_str(), 0600), 0);
  PerfMapFile file(path_, "/tmp/perf-1.map");
  const absl::Status status = file.Update();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_EQ(file.map().size(), 0u);
}

// A sparse file of gigabytes costs its writer nothing: each call reads a bounded share, and
// the entries after the hole arrive over the next calls.
TEST_F(PerfMapFileTest, ReadsAHugeFileABoundedShareAtATime) {
  Append("1000 10 a\n");
  const uint64_t hole_end = 2 * PerfMapFile::kMaxBytesPerUpdate + 4096;
  ASSERT_EQ(truncate(path_.c_str(), static_cast<off_t>(hole_end)), 0);
  Append("\n2000 10 b\n");
  PerfMapFile file(path_, "/tmp/perf-1.map");
  PerfMap::Symbol s;
  int calls = 0;
  while (!file.map().Lookup(0x2000, &s) && calls < 10) {
    const uint64_t before = file.bytes_read();
    ASSERT_TRUE(file.Update().ok());
    EXPECT_LE(file.bytes_read() - before, PerfMapFile::kMaxBytesPerUpdate + 64 * 1024);
    ++calls;
  }
  EXPECT_EQ(calls, 3);
  EXPECT_EQ(s.name, "b");
  ASSERT_TRUE(file.map().Lookup(0x1000, &s));
  const uint64_t read = file.bytes_read();
  ASSERT_TRUE(file.Update().ok());
  EXPECT_EQ(file.bytes_read(), read) << "read to its end: not read again";
}

TEST(PerfMapPathsTest, OwnProcess) {
  const PerfMapPaths paths = PerfMapPathsOf(getpid());
  EXPECT_EQ(paths.map_path, absl::StrCat("/tmp/perf-", getpid(), ".map"));
  EXPECT_EQ(paths.open_path, absl::StrCat("/proc/", getpid(), "/root/tmp/perf-", getpid(), ".map"));
}

}  // namespace
}  // namespace strata::agent::symbols
