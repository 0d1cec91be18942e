#include "common/base/crc32c.h"

#include <string>

#include "gtest/gtest.h"

namespace strata::base {
namespace {

// Check values from RFC 3720 (iSCSI), appendix B.4.
TEST(Crc32cTest, KnownValues) {
  EXPECT_EQ(Crc32c(""), 0u);
  EXPECT_EQ(Crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(Crc32c(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(Crc32c(std::string(32, '\xff')), 0x62A8AB43u);
}

TEST(Crc32cTest, ContinuesAcrossPieces) {
  EXPECT_EQ(Crc32c("56789", Crc32c("1234")), Crc32c("123456789"));
}

}  // namespace
}  // namespace strata::base
