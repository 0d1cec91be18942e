#include "server/query/line_diff.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace strata::server::query {
namespace {

// A line of `function` at `file`:`line`, inlined into `into` (at its line 7) when not empty.
v1::LineStat Line(const std::string& function, const std::string& file, uint32_t line,
                  uint64_t self, const std::string& into = "", const std::string& module = "/b") {
  v1::LineStat s;
  v1::Frame* f = s.add_frames();
  f->set_function(function);
  f->set_module(module);
  f->set_file(file);
  f->set_line(line);
  f->set_inlined(!into.empty());
  if (!into.empty()) {
    v1::Frame* outer = s.add_frames();
    outer->set_function(into);
    outer->set_module(module);
    outer->set_file(file);
    outer->set_line(7);
  }
  s.set_self(self);
  return s;
}

TEST(LineDiffTest, SharesOfEachProfileMatchedByFunctionFileAndLine) {
  v1::TopResponse base, now;
  base.set_total_samples(100);
  *base.add_lines() = Line("checksum_block", "w.cc", 40, 30);
  *base.add_lines() = Line("parse", "w.cc", 12, 60);
  *base.add_lines() = Line("mix", "w.cc", 3, 10, "checksum_block");
  base.set_unresolved_samples(4);
  // Twice as long a range; checksum_block's line doubled its work; a release's binary at
  // another path.
  now.set_total_samples(400);
  *now.add_lines() = Line("checksum_block", "w.cc", 40, 240, "", "/release-2/b");
  *now.add_lines() = Line("parse", "w.cc", 12, 120, "", "/release-2/b");
  *now.add_lines() = Line("mix", "w.cc", 3, 20, "checksum_block", "/release-2/b");
  *now.add_lines() = Line("fresh", "w.cc", 90, 20, "", "/release-2/b");
  now.add_unreachable_nodes("n2 (10.0.0.2:7000): down");
  base.add_unreachable_nodes("n2 (10.0.0.2:7000): down");

  v1::DiffResponse d = DiffLines(base, now, 3);
  EXPECT_EQ(d.base_total_samples(), 100u);
  EXPECT_EQ(d.total_samples(), 400u);
  EXPECT_EQ(d.base_unresolved_samples(), 4u);
  EXPECT_THAT(d.unreachable_nodes(), ::testing::ElementsAre("n2 (10.0.0.2:7000): down"));
  ASSERT_EQ(d.lines_size(), 3);  // the limit
  // As far each (ties in key order).
  EXPECT_EQ(d.lines(0).frames(0).function(), "checksum_block");  // 30 % -> 60 %
  EXPECT_EQ(d.lines(0).base_self(), 30u);
  EXPECT_EQ(d.lines(0).self(), 240u);
  EXPECT_DOUBLE_EQ(d.lines(0).self_delta_pct(), 30);
  EXPECT_EQ(d.lines(1).frames(0).function(), "parse");  // 60 % -> 30 %
  EXPECT_DOUBLE_EQ(d.lines(1).self_delta_pct(), -30);
  EXPECT_EQ(d.lines(2).frames(0).function(), "fresh");  // new: 0 % -> 5 %
  EXPECT_EQ(d.lines(2).base_self(), 0u);
  EXPECT_DOUBLE_EQ(d.lines(2).self_delta_pct(), 5);

  // The inlined line is its own row, with its chain; a line at another number is another row.
  *now.add_lines() = Line("checksum_block", "w.cc", 41, 4);
  d = DiffLines(base, now, 100);
  ASSERT_EQ(d.lines_size(), 5);
  bool inlined = false;
  for (const v1::LineDelta& l : d.lines()) {
    if (l.frames_size() == 2) {
      inlined = true;
      EXPECT_EQ(l.frames(1).function(), "checksum_block");
      EXPECT_DOUBLE_EQ(l.self_delta_pct(), -5);  // 10 % -> 5 %
    }
  }
  EXPECT_TRUE(inlined);
}

TEST(LineDiffTest, EmptyProfilesHaveNoShares) {
  v1::TopResponse base, now;
  *now.add_lines() = Line("parse", "w.cc", 12, 0);
  v1::DiffResponse d = DiffLines(base, now, 10);
  ASSERT_EQ(d.lines_size(), 1);
  EXPECT_DOUBLE_EQ(d.lines(0).self_delta_pct(), 0);
}

}  // namespace
}  // namespace strata::server::query
