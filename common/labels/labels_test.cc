#include "common/labels/labels.h"

#include <cstring>
#include <random>
#include <string>

#include "gtest/gtest.h"

namespace strata::labels {
namespace {

TEST(LabelsTest, ParsesAndNormalizesLists) {
  auto set = ParseLabelList(" version=1.4.2, region=eu-west ,version=1.4.3");
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_EQ(*set, (LabelSet{{"region", "eu-west"}, {"version", "1.4.3"}}));
  EXPECT_EQ(ToString(*set), "region=eu-west,version=1.4.3");
  EXPECT_TRUE(ParseLabelList("").ok());
  EXPECT_TRUE(ParseLabelList("app.kubernetes.io/name=checkout").ok());
  for (const char* bad : {"novalue", "=v", "1key=v", "k y=v", "k=a\x01", "k=a,=b"}) {
    EXPECT_FALSE(ParseLabelList(bad).ok()) << bad;
  }
  EXPECT_FALSE(ParseLabelList("k=" + std::string(kMaxValueBytes + 1, 'x')).ok());
  EXPECT_FALSE(ParseLabelList(std::string(kMaxKeyBytes + 1, 'k') + "=v").ok());
}

TEST(LabelsTest, MergeOverridesAndEmptyValuesRemove) {
  LabelSet base{{"env", "prod"}, {"region", "eu"}};
  LabelSet overlay{{"region", ""}, {"version", "2"}};
  EXPECT_EQ(Merge(base, overlay), (LabelSet{{"env", "prod"}, {"version", "2"}}));
  EXPECT_EQ(Merge(base, {{"env", "canary"}}), (LabelSet{{"env", "canary"}, {"region", "eu"}}));
}

TEST(LabelsTest, EncodeRoundTrips) {
  LabelSet set{{"a", "1"}, {"b", "x y*z"}};
  auto decoded = Decode(Encode(set));
  ASSERT_TRUE(decoded.ok());
  EXPECT_EQ(*decoded, set);
  EXPECT_EQ(Encode({}), "");
  EXPECT_TRUE(Decode("").ok());
  for (const char* bad : {"a", "b=1\na=2", "a=1\na=2", "a=", "=1", "a=1\n"}) {
    EXPECT_FALSE(Decode(bad).ok()) << bad;
  }
}

TEST(LabelsTest, Glob) {
  EXPECT_TRUE(GlobMatch("eu-*", "eu-west"));
  EXPECT_TRUE(GlobMatch("*", ""));
  EXPECT_TRUE(GlobMatch("a*b*c", "aXbYbZc"));
  EXPECT_TRUE(GlobMatch("1.4.2", "1.4.2"));
  EXPECT_FALSE(GlobMatch("1.4.2", "1.4.20"));
  EXPECT_FALSE(GlobMatch("eu-*", "us-east"));
  EXPECT_FALSE(GlobMatch("a*b", "ac"));
  EXPECT_TRUE(GlobMatch("**a", "bbba"));
  EXPECT_FALSE(GlobMatch("", "x"));
  EXPECT_FALSE(GlobMatch("a*a", "a"));  // the first and last pieces may not overlap
  EXPECT_FALSE(GlobMatch("ab*ba", "aba"));
  EXPECT_TRUE(GlobMatch("*ab*ab*", "abab"));
}

// Plain backtracking over every way the stars could split the text.
bool GlobByBacktracking(std::string_view p, std::string_view t) {
  if (p.empty()) return t.empty();
  if (p[0] == '*') {
    for (size_t skip = 0; skip <= t.size(); ++skip) {
      if (GlobByBacktracking(p.substr(1), t.substr(skip))) return true;
    }
    return false;
  }
  return !t.empty() && p[0] == t[0] && GlobByBacktracking(p.substr(1), t.substr(1));
}

TEST(LabelsTest, GlobAgreesWithBacktracking) {
  std::mt19937 rng(7);
  auto random = [&](const char* alphabet, size_t max) {
    std::string out(rng() % (max + 1), ' ');
    for (char& c : out) c = alphabet[rng() % std::strlen(alphabet)];
    return out;
  };
  for (int i = 0; i < 50'000; ++i) {
    const std::string pattern = random("ab*", 7), text = random("ab", 9);
    ASSERT_EQ(GlobMatch(pattern, text), GlobByBacktracking(pattern, text))
        << "'" << pattern << "' against '" << text << "'";
  }
}

TEST(LabelsTest, SelectorsHaveAtMostSixtyFourTerms) {
  std::string terms = "k0=v";
  for (size_t i = 1; i < Selector::kMaxTerms; ++i) terms += ",k" + std::to_string(i) + "=v*";
  EXPECT_TRUE(Selector::Parse(terms).ok());
  const absl::Status more = Selector::Parse(terms + ",k=v").status();
  EXPECT_EQ(more.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(more.message(), "label selector has 65 terms; at most 64");
}

TEST(LabelsTest, Selectors) {
  LabelSet v1{{"region", "eu-west"}, {"version", "1.4.2"}};
  LabelSet v2{{"canary", "true"}, {"region", "us-east"}, {"version", "2"}};
  LabelSet none;
  auto s = Selector::Parse("version=1.4.2, region=eu-*");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->ToString(), "version=1.4.2,region=eu-*");
  EXPECT_TRUE(s->Matches(v1));
  EXPECT_FALSE(s->Matches(v2));
  EXPECT_FALSE(s->Matches(none));
  auto ne = Selector::Parse("canary!=true");
  ASSERT_TRUE(ne.ok());
  EXPECT_TRUE(ne->Matches(v1));
  EXPECT_FALSE(ne->Matches(v2));
  EXPECT_TRUE(ne->Matches(none));  // a missing label reads as empty
  auto absent = Selector::Parse("region=");
  ASSERT_TRUE(absent.ok());
  EXPECT_TRUE(absent->Matches(none));
  EXPECT_FALSE(absent->Matches(v1));
  auto all = Selector::Parse("  ");
  ASSERT_TRUE(all.ok());
  EXPECT_TRUE(all->empty());
  EXPECT_TRUE(all->Matches(v2));
  for (const char* bad : {"version", "=1", "!=1", "9v=1", "a=1,,b=2", "a=\x7f"}) {
    EXPECT_FALSE(Selector::Parse(bad).ok()) << bad;
  }
}

}  // namespace
}  // namespace strata::labels
