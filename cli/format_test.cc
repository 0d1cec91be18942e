#include "cli/format.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace strata::cli {
namespace {

TEST(FormatTest, ParsesDurations) {
  EXPECT_EQ(*ParseDuration("30s"), 30'000);
  EXPECT_EQ(*ParseDuration("10m"), 600'000);
  EXPECT_EQ(*ParseDuration("1h30m"), 5'400'000);
  EXPECT_EQ(*ParseDuration("7d"), 604'800'000);
  EXPECT_EQ(*ParseDuration("250ms"), 250);
  for (const char* bad : {"", "10", "m", "10x", "-5m", "0s", "1.5h", "99999999999999d"}) {
    EXPECT_FALSE(ParseDuration(bad).ok()) << bad;
  }
}

TEST(FormatTest, ParsesRfc3339) {
  EXPECT_EQ(*ParseRfc3339("1970-01-01T00:00:00Z"), 0);
  EXPECT_EQ(*ParseRfc3339("2026-11-21T05:53:00Z"), 1795240380000);
  EXPECT_EQ(*ParseRfc3339("2026-11-21T07:53:00+02:00"), 1795240380000);
  EXPECT_EQ(*ParseRfc3339("2026-11-21T05:53:00.25Z"), 1795240380250);
  EXPECT_EQ(FormatRfc3339(1795240380000), "2026-11-21T05:53:00Z");
  for (const char* bad : {"2026-11-21", "2026-11-21T05:53:00", "2026-13-01T00:00:00Z",
                          "2026-11-21T05:53:00+2", "yesterday", "2026-11-21T05:53:00Zjunk"}) {
    EXPECT_FALSE(ParseRfc3339(bad).ok()) << bad;
  }
  // A zone missing is said so; anything else after the seconds is named.
  EXPECT_THAT(std::string(ParseRfc3339("2026-11-21T05:53:00").status().message()),
              ::testing::HasSubstr("needs a zone"));
  const absl::Status extra = ParseRfc3339("2026-12-06T05:15:50:00Z").status();
  EXPECT_THAT(std::string(extra.message()), ::testing::HasSubstr("':00Z' after the seconds"));
}

TEST(FormatTest, NumbersAndPercentages) {
  EXPECT_EQ(WithThousands(0), "0");
  EXPECT_EQ(WithThousands(999), "999");
  EXPECT_EQ(WithThousands(1234567), "1,234,567");
  EXPECT_EQ(Percent(1, 3), "33.3%");
  EXPECT_EQ(Percent(1, 0), "-");
}

TEST(FormatTest, TableAlignsColumns) {
  Table t({"N", "NAME"}, {0});
  t.AddRow({"5", "a > b"});
  t.AddRow({"1,000", "x"});
  EXPECT_EQ(t.ToString(),
            "    N  NAME\n"
            "    5  a > b\n"
            "1,000  x\n");
  // A name with control characters is padded as it is shown, escaped.
  Table named({"NAME", "N"}, {1});
  named.AddRow({"esc\x1b[31m", "1"});
  named.AddRow({"plain", "2"});
  EXPECT_EQ(named.ToString(),
            "NAME         N\n"
            "esc\\x1b[31m  1\n"
            "plain        2\n");
}

// Names an agent chose cannot drive the terminal: control characters (C0 but newline, tab and
// carriage return; DEL; C1 as UTF-8) are written as \xNN, other text as it is, in pieces too.
TEST(FormatTest, TerminalSafeTextEscapesControlCharacters) {
  auto safe = [](std::vector<std::string_view> pieces) {
    std::string out;
    bool held_c2 = false;
    for (std::string_view p : pieces) AppendTerminalSafe(p, &held_c2, &out);
    return out;
  };
  EXPECT_EQ(safe({"main\x1b]0;owned\x07 > f\n"}), "main\\x1b]0;owned\\x07 > f\n");
  EXPECT_EQ(safe({"a\tb\r\n\x7f"}), "a\tb\r\n\\x7f");
  EXPECT_EQ(safe({"caf\xc3\xa9 \xc2\xb5s"}), "caf\xc3\xa9 \xc2\xb5s");  // é, µ kept
  EXPECT_EQ(safe({"x\xc2", "\x9b" "2J"}), "x\\xc2\\x9b2J");              // CSI, split
  EXPECT_EQ(safe({"x\xc2", "\xb5"}), "x\xc2\xb5");
}

}  // namespace
}  // namespace strata::cli
