#include "agent/python/line_table.h"

#include <string>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"

namespace strata::agent::python {
namespace {

using std::string_literals::operator""s;

struct Range {
  int start, end, line;
};

// Every byte offset of every range maps to its line.
void ExpectRanges(LineTableFormat format, const std::string& table, int first_line,
                  const std::vector<Range>& ranges) {
  for (const Range& r : ranges) {
    for (int offset = r.start; offset < r.end; ++offset) {
      EXPECT_EQ(LineForOffset(format, table, first_line, offset), r.line) << "offset " << offset;
    }
  }
}

// The tables CPython compiled for the same function, with the (start, end, line) ranges the
// interpreter itself reports for them (dis.findlinestarts before 3.10, co_lines() since):
//   def sample(n):            # line 2
//       total = 0
//       for i in range(n):
//           if i % 3 == 0:
//               total += i
//           else:
//               total -= 1
//       return total
TEST(LineTableTest, LnotabOf38And39) {
  const std::string table = "\x00\x01\x04\x01\x0c\x01\x0c\x01\x0a\x02\x0a\x01"s;
  ExpectRanges(LineTableFormat::kLnotab, table, 2,
               {{0, 4, 3}, {4, 16, 4}, {16, 28, 5}, {28, 38, 6}, {38, 48, 8}, {48, 52, 9}});
}

TEST(LineTableTest, LinetableOf310) {
  const std::string table = "\x04\x01\x0c\x01\x0c\x01\x0a\x01\x0a\x02\x04\x01"s;
  ExpectRanges(LineTableFormat::kLinetable310, table, 2,
               {{0, 4, 3}, {4, 16, 4}, {16, 28, 5}, {28, 38, 6}, {38, 48, 8}, {48, 52, 9}});
  EXPECT_EQ(LineForOffset(LineTableFormat::kLinetable310, table, 2, 52), -1);  // past the end
}

TEST(LineTableTest, LocationsOf311) {
  const std::string table =
      "\x80\x00\xd8\x0c\x0d\x80\x45\xdd\x0d\x12\x90\x31\x89\x58\x8c\x58\xf0\x00\x04\x05\x17\xf0"
      "\x00\x04\x05\x17\x88\x01\xd8\x0b\x0c\x88\x71\x89\x35\x90\x41\x8a\x3a\x88\x3a\xd8\x0c\x11"
      "\x90\x51\x89\x4a\x88\x45\x88\x45\xe0\x0c\x11\x90\x51\x89\x4a\x88\x45\x88\x45\xd8\x0b\x10"
      "\x80\x4c"s;
  ExpectRanges(LineTableFormat::kLocations311, table, 2,
               {{0, 2, 2}, {2, 6, 3}, {6, 40, 4}, {40, 58, 5}, {58, 70, 6}, {70, 82, 8},
                {82, 86, 9}});
}

TEST(LineTableTest, LocationsOf312And313) {
  const std::string t312 =
      "\x80\x00\xd8\x0c\x0d\x80\x45\xdc\x0d\x12\x90\x31\x8b\x58\xf2\x00\x04\x05\x17\x88\x01\xd8"
      "\x0b\x0c\x88\x71\x89\x35\x90\x41\x8a\x3a\xd8\x0c\x11\x90\x51\x89\x4a\x89\x45\xe0\x0c\x11"
      "\x90\x51\x89\x4a\x89\x45\xf0\x09\x04\x05\x17\xf0\x0a\x00\x0c\x11\x80\x4c"s;
  ExpectRanges(LineTableFormat::kLocations311, t312, 2,
               {{0, 2, 2}, {2, 6, 3}, {6, 34, 4}, {34, 50, 5}, {50, 62, 6}, {62, 74, 8},
                {74, 76, 4}, {76, 80, 9}});
  const std::string t313 =
      "\x80\x00\xd8\x0c\x0d\x80\x45\xdc\x0d\x12\x90\x31\x8e\x58\x88\x01\xd8\x0b\x0c\x88\x71\x89"
      "\x35\x90\x41\x8b\x3a\xd8\x0c\x11\x89\x4a\x8a\x45\xe0\x0c\x11\x90\x51\x89\x4a\x8a\x45\xf1"
      "\x09\x00\x0e\x16\xf0\x0a\x00\x0c\x11\x80\x4c"s;
  ExpectRanges(LineTableFormat::kLocations311, t313, 2,
               {{0, 2, 2}, {2, 6, 3}, {6, 34, 4}, {34, 52, 5}, {52, 64, 6}, {64, 78, 8},
                {78, 82, 4}, {82, 86, 9}});
}

// Hand-made entries for the forms the real tables above do not all use.
TEST(LineTableTest, LocationForms) {
  // code 13 (no columns), line +5 (svarint 10), 1 unit; code 15 (none), 2 units;
  // code 14 (long): line -3 (svarint 7), end line, columns, 1 unit; code 11 (one line +1);
  // code 0 (short form, same line), 4 units; code 13 with a two-byte varint: +40 (80 =
  // 0x50: 0x40|0x10, then 0x01).
  const std::string table = "\xe8\x0a"           // +5 -> 15, [0, 2)
                            "\xf9"               // none, [2, 6)
                            "\xf0\x07\x00\x01\x02"  // -3 -> 12, [6, 8)
                            "\xd8\x01\x02"       // +1 -> 13, [8, 10)
                            "\x83\x00"           // same -> 13, [10, 18)
                            "\xe8\x50\x01"s;     // +40 -> 53, [18, 20)
  ExpectRanges(LineTableFormat::kLocations311, table, 10,
               {{0, 2, 15}, {2, 6, -1}, {6, 8, 12}, {8, 10, 13}, {10, 18, 13}, {18, 20, 53}});
  EXPECT_EQ(LineForOffset(LineTableFormat::kLocations311, table, 10, 20), -1);
}

TEST(LineTableTest, LnotabNegativeDeltasAnd310NoLine) {
  // 3.8: line -2 after 6 bytes (a loop's back edge), then +4.
  const std::string lnotab = "\x00\x03\x06\xfe\x04\x04"s;
  ExpectRanges(LineTableFormat::kLnotab, lnotab, 1, {{0, 6, 4}, {6, 10, 2}, {10, 30, 6}});
  // 3.10: 4 bytes at +1, 2 bytes without a line, 0-length entry +3 (skipped but counted),
  // 6 bytes at +1.
  const std::string linetable = "\x04\x01\x02\x80\x00\x03\x06\x01"s;
  ExpectRanges(LineTableFormat::kLinetable310, linetable, 1,
               {{0, 4, 2}, {4, 6, -1}, {6, 12, 6}});
}

TEST(LineTableTest, NotStartedAndMalformed) {
  EXPECT_EQ(LineForOffset(LineTableFormat::kLocations311, "", 7, -2), 7);
  EXPECT_EQ(LineForOffset(LineTableFormat::kLocations311, "", 7, 0), -1);
  // An operand where an entry must start, a varint running off the end, odd-length tables.
  EXPECT_EQ(LineForOffset(LineTableFormat::kLocations311, "\x05\x80"s, 1, 0), -1);
  EXPECT_EQ(LineForOffset(LineTableFormat::kLocations311, "\xe8\x7f"s, 1, 4), -1);
  EXPECT_EQ(LineForOffset(LineTableFormat::kLinetable310, "\x04"s, 1, 0), -1);
  EXPECT_EQ(LineForOffset(LineTableFormat::kLnotab, "\x04"s, 1, 8), 1);
}

}  // namespace
}  // namespace strata::agent::python
