#include "common/base/escape.h"

#include "gtest/gtest.h"

namespace strata {
namespace {

TEST(EscapeForLogTest, EscapesAndBounds) {
  EXPECT_EQ(base::EscapeForLog("plain text"), "plain text");
  EXPECT_EQ(base::EscapeForLog("a\nb\x1b[31m\"\\"), "a\\x0ab\\x1b[31m\\x22\\x5c");
  EXPECT_EQ(base::EscapeForLog("\xc3\xa9"), "\\xc3\\xa9");
  EXPECT_EQ(base::EscapeForLog(std::string(1000, 'x'), 4), "xxxx...(1000 bytes)");
}

}  // namespace
}  // namespace strata
