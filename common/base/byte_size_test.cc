#include "common/base/byte_size.h"

#include "gtest/gtest.h"

namespace strata::base {
namespace {

TEST(ByteSizeTest, ParsesBinaryUnits) {
  EXPECT_EQ(*ParseByteSize("4096"), 4096u);
  EXPECT_EQ(*ParseByteSize("4096B"), 4096u);
  EXPECT_EQ(*ParseByteSize("64K"), 64u << 10);
  EXPECT_EQ(*ParseByteSize("64KiB"), 64u << 10);
  EXPECT_EQ(*ParseByteSize("512M"), 512u << 20);
  EXPECT_EQ(*ParseByteSize("512MB"), 512u << 20);
  EXPECT_EQ(*ParseByteSize("2GiB"), uint64_t{2} << 30);
  EXPECT_EQ(*ParseByteSize("1T"), uint64_t{1} << 40);
}

TEST(ByteSizeTest, RejectsGarbageAndOverflow) {
  for (const char* bad : {"", "M", "-1", "1.5G", "12X", "1 G", "99999999999999999999",
                          "17179869184G", "1GiBB"}) {
    EXPECT_FALSE(ParseByteSize(bad).ok()) << bad;
  }
}

}  // namespace
}  // namespace strata::base
