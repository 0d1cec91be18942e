// Verdicts from comparisons: the largest relative move of a significant share (self, else
// total) decides, among the moves as large as the comparison detects.
#include "server/regress/verdict.h"

#include <tuple>

#include "gtest/gtest.h"

namespace strata::server::regress {
namespace {

v1::FunctionComparison Row(const char* name, double base, double cand, bool significant) {
  v1::FunctionComparison f;
  f.mutable_function()->set_function(name);
  f.mutable_function()->set_module("/bin/svc");
  v1::CompareEstimate* self = f.mutable_self();
  self->set_share_baseline(base);
  self->set_share_candidate(cand);
  self->set_delta(cand - base);
  self->set_relative(base == 0 ? 0 : 100 * (cand - base) / base);
  self->set_significant(significant);
  self->set_tested(true);
  self->set_min_detectable(0.5 + base / 100);
  return f;
}

// Gives `f` per-request figures.
v1::FunctionComparison WithPerRequest(v1::FunctionComparison f, double base, double cand,
                                      bool significant, double min_detectable) {
  v1::PerRequestEstimate* r = f.mutable_self()->mutable_per_request();
  r->set_baseline(base);
  r->set_candidate(cand);
  r->set_delta(cand - base);
  r->set_relative(100 * (cand - base) / base);
  r->set_significant(significant);
  r->set_tested(true);
  r->set_min_detectable(min_detectable);
  return f;
}

TEST(VerdictTest, TheLargestRelativeMoveDecides) {
  v1::CompareResponse c;
  c.set_baseline_units(3);
  c.set_candidate_units(4);
  // checksum got 30 % slower: its share rises; everything else's falls a little.
  *c.add_functions() = Row("parse", 60, 55, true);         // -8 %
  *c.add_functions() = Row("checksum", 20, 26, true);      // +30 %
  *c.add_functions() = Row("idle", 20, 19, false);
  v1::ReleaseVerdict v = VerdictOf(c);
  EXPECT_EQ(v.state(), v1::ReleaseVerdict::REGRESSED);
  ASSERT_EQ(v.functions_size(), 2);
  EXPECT_EQ(v.functions(0).name(), "checksum");  // |delta| 6 before 5
  EXPECT_EQ(v.functions(1).name(), "parse");
  EXPECT_TRUE(v.functions(0).self());
  EXPECT_EQ(v.baseline_units(), 3u);
  // The median of 1.1 (parse, 60 %), 0.7 and 0.7 weighted by share.
  EXPECT_DOUBLE_EQ(v.min_detectable(), 1.1);

  // checksum got slower and took its share from parse, a larger function: the cause comes
  // first, not the larger fall.
  v1::CompareResponse took;
  *took.add_functions() = Row("parse", 57, 43, true);     // -25 %, -14 points
  *took.add_functions() = Row("checksum", 43, 56, true);  // +30 %, +13 points
  *took.add_functions() = Row("crc", 10, 11.5, true);     // +15 %
  v = VerdictOf(took);
  EXPECT_EQ(v.state(), v1::ReleaseVerdict::REGRESSED);
  ASSERT_EQ(v.functions_size(), 3);
  EXPECT_EQ(v.functions(0).name(), "checksum");
  EXPECT_EQ(v.functions(1).name(), "parse");
  EXPECT_EQ(v.functions(2).name(), "crc");

  // parse got faster: its share falls most, relatively.
  v1::CompareResponse faster;
  *faster.add_functions() = Row("parse", 20, 10, true);     // -50 %
  *faster.add_functions() = Row("checksum", 40, 48, true);  // +20 %
  EXPECT_EQ(VerdictOf(faster).state(), v1::ReleaseVerdict::IMPROVED);

  v1::CompareResponse same;
  *same.add_functions() = Row("parse", 20, 21, false);
  EXPECT_EQ(VerdictOf(same).state(), v1::ReleaseVerdict::UNCHANGED);
  EXPECT_EQ(VerdictOf(same).functions_size(), 0);

  v1::CompareResponse thin;
  thin.set_not_enough_data(true);
  thin.set_window_s(60);  // a host's minutes were the units
  EXPECT_EQ(VerdictOf(thin).state(), v1::ReleaseVerdict::NOT_ENOUGH_DATA);
  EXPECT_EQ(VerdictOf(thin).window_s(), 60u);

  // A function new in the candidate has no relative change: it is the cause.
  v1::CompareResponse added;
  *added.add_functions() = Row("parse", 50, 40, true);
  *added.add_functions() = Row("new_path", 0, 10, true);
  EXPECT_EQ(VerdictOf(added).state(), v1::ReleaseVerdict::REGRESSED);
}

// Dozens of small functions with MDEs of a fraction of a point do not make an "unchanged"
// read as measured while the hot function's change could still be 12 points.
TEST(VerdictTest, TheMdeIsThatOfTheFunctionsHoldingTheSamples) {
  v1::CompareResponse c;
  v1::FunctionComparison hot = Row("func_b", 27, 43, false);
  hot.mutable_self()->set_min_detectable(12.1);
  *c.add_functions() = hot;
  *c.add_functions() = Row("func_a", 20, 17, false);
  *c.add_functions() = Row("func_c", 50, 38, false);
  for (int i = 0; i < 40; ++i) *c.add_functions() = Row("entry_SYSCALL_64", 0.1, 0.1, false);
  const v1::ReleaseVerdict v = VerdictOf(c);
  EXPECT_EQ(v.state(), v1::ReleaseVerdict::UNCHANGED);
  EXPECT_DOUBLE_EQ(v.min_detectable(), 1.0);  // func_c's, the middle of the samples
  c.mutable_functions(2)->mutable_self()->set_min_detectable(9);
  EXPECT_DOUBLE_EQ(VerdictOf(c).min_detectable(), 9);  // not 0.501, the plain median's
}

TEST(VerdictTest, ASmallFunctionsLargeRelativeMoveDoesNotOutweighAMaterialOne) {
  // checksum_block doubled its work (+17 pt); a kernel entry path, a fraction of a point, fell
  // by more relatively and was significant too. Measured on three hosts.
  v1::CompareResponse c;
  *c.add_functions() = Row("checksum_block", 34.1, 51.5, true);           // +51 %
  *c.add_functions() = Row("parse_input", 39.0, 29.8, true);              // -24 %
  *c.add_functions() = Row("irqentry_exit_to_user_mode", 0.27, 0.10, true);  // -64 %
  v1::ReleaseVerdict v = VerdictOf(c);
  EXPECT_EQ(v.state(), v1::ReleaseVerdict::REGRESSED) << v.DebugString();
  ASSERT_EQ(v.functions_size(), 3);
  EXPECT_EQ(v.functions(0).name(), "checksum_block");

  // With no move as large as the comparison detects, the largest relative one still decides.
  v1::CompareResponse small;
  *small.add_functions() = Row("parse_input", 39.0, 38.8, true);              // -0.5 %
  *small.add_functions() = Row("irqentry_exit_to_user_mode", 0.10, 0.27, true);  // +170 %
  EXPECT_EQ(VerdictOf(small).state(), v1::ReleaseVerdict::REGRESSED);
}

// Measured: checksum_block doubled its work, and only its total share passed its test (its
// self share, the same figures for a leaf, did not). parse_input's self share fell, as every
// other function's does when one takes more: the release regressed; it did not improve.
TEST(VerdictTest, ALeafWhoseTotalAloneRoseSignificantlyIsTheCause) {
  v1::CompareResponse c;
  v1::FunctionComparison checksum = Row("checksum_block", 35.4, 51.7, false);
  *checksum.mutable_total() = Row("checksum_block", 35.4, 51.7, true).self();
  *c.add_functions() = checksum;
  *c.add_functions() = Row("parse_input", 39.9, 29.2, true);  // -26.8 %
  v1::ReleaseVerdict v = VerdictOf(c);
  EXPECT_EQ(v.state(), v1::ReleaseVerdict::REGRESSED) << v.DebugString();
  ASSERT_EQ(v.functions_size(), 2);
  EXPECT_EQ(v.functions(0).name(), "checksum_block");
  EXPECT_FALSE(v.functions(0).self());
}

TEST(VerdictTest, ThePlanBecomesACompareRequest) {
  ComparisonPlan plan{"svc", "version=1", "version=2", 10, 90, 50, 90};
  plan.one_host_windows = true;
  plan.window_s = 60;
  v1::CompareRequest r = CompareRequestFor(plan, 0.01);
  EXPECT_FALSE(r.windows_independent());
  EXPECT_TRUE(r.one_host_windows());
  EXPECT_TRUE(r.language_self());
  EXPECT_EQ(r.window_s(), 60u);
  EXPECT_EQ(r.service(), "svc");
  EXPECT_EQ(r.baseline().selector(), "version=1");
  EXPECT_EQ(r.baseline().range().from_ms(), 10);
  EXPECT_EQ(r.candidate().selector(), "version=2");
  EXPECT_EQ(r.candidate().range().from_ms(), 50);
  EXPECT_EQ(r.candidate().range().to_ms(), 90);
  EXPECT_DOUBLE_EQ(r.fdr(), 0.01);
  // Its lines: the same two selections, by line, counted the same way.
  v1::DiffRequest lines = WhichLinesRequestFor(plan);
  EXPECT_TRUE(lines.by_line());
  EXPECT_TRUE(lines.language_self());
  EXPECT_EQ(lines.base().ShortDebugString(), r.baseline().ShortDebugString());
  EXPECT_EQ(lines.filter().ShortDebugString(), r.candidate().ShortDebugString());
}

TEST(VerdictTest, PerRequestFiguresDecideWhereTheComparisonHasThem) {
  // Shares do not move; every function's CPU per request falls (more requests per CPU
  // second): IMPROVED, in the comparison's unit.
  v1::CompareResponse c;
  c.set_per_request_unit("ms CPU/request");
  for (auto [name, base, cand] :
       {std::tuple{"parse", 2.0, 1.5}, std::tuple{"checksum", 1.0, 0.8}}) {
    *c.add_functions() = WithPerRequest(Row(name, 50, 50, false), base, cand, true, 0.1);
  }
  v1::ReleaseVerdict v = VerdictOf(c);
  EXPECT_EQ(v.state(), v1::ReleaseVerdict::IMPROVED);
  EXPECT_EQ(v.unit(), "ms CPU/request");
  ASSERT_EQ(v.functions_size(), 2);
  EXPECT_EQ(v.functions(0).name(), "parse");
  EXPECT_DOUBLE_EQ(v.functions(0).baseline_share(), 2.0);
  EXPECT_DOUBLE_EQ(v.min_detectable(), 0.1);

  // Without them, the same comparison is decided on shares: unchanged.
  c.clear_per_request_unit();
  EXPECT_EQ(VerdictOf(c).state(), v1::ReleaseVerdict::UNCHANGED);
  EXPECT_EQ(VerdictOf(c).unit(), "");
}

// Measured: checksum_block doubled its work (+17 pt of the samples, q 1e-7), while its CPU
// per request, +83 %, did not pass its test (a scraped request count divides every window).
// The shares decide, and the verdict says they did.
TEST(VerdictTest, SharesDecideWherePerRequestFiguresFindNoChange) {
  v1::CompareResponse c;
  c.set_per_request_unit("ms CPU/request");
  *c.add_functions() =
      WithPerRequest(Row("checksum_block", 34.5, 51.9, true), 0.067, 0.123, false, 0.04);
  *c.add_functions() =
      WithPerRequest(Row("parse_input", 40.1, 30.2, true), 0.078, 0.072, false, 0.04);
  v1::ReleaseVerdict v = VerdictOf(c);
  EXPECT_EQ(v.state(), v1::ReleaseVerdict::REGRESSED) << v.DebugString();
  EXPECT_EQ(v.unit(), "");  // shares
  ASSERT_GE(v.functions_size(), 1);
  EXPECT_EQ(v.functions(0).name(), "checksum_block");
  EXPECT_DOUBLE_EQ(v.functions(0).baseline_share(), 34.5);
}

}  // namespace
}  // namespace strata::server::regress
