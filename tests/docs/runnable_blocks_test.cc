#include "tests/docs/runnable_blocks.h"

#include "gtest/gtest.h"

namespace strata::docs {
namespace {

TEST(RunnableBlocksTest, InfoStringNamesShellAndRunnable) {
  EXPECT_TRUE(IsRunnableInfoString("sh runnable"));
  EXPECT_TRUE(IsRunnableInfoString("bash  runnable"));
  EXPECT_FALSE(IsRunnableInfoString("sh"));
  EXPECT_FALSE(IsRunnableInfoString("runnable"));
  EXPECT_FALSE(IsRunnableInfoString("python runnable"));
  EXPECT_FALSE(IsRunnableInfoString("shell-runnable"));
  EXPECT_FALSE(IsRunnableInfoString(""));
}

TEST(RunnableBlocksTest, ExtractsRunnableBlocksWithTheirFenceLines) {
  const char* markdown =
      "# Title\n"                      // 1
      "```sh\n"                        // 2
      "rm -rf /\n"                     // 3: not runnable
      "```\n"                          // 4
      "```sh runnable\n"               // 5
      "strata services\n"              // 6
      "strata top --service demo\n"    // 7
      "```\n"                          // 8
      "  ```bash runnable\n"           // 9: indented, as in a list item
      "  echo ok\n"                    // 10
      "  ```\n";                       // 11
  auto blocks = ExtractRunnableBlocks("docs/x.md", markdown);
  ASSERT_TRUE(blocks.ok()) << blocks.status();
  ASSERT_EQ(blocks->size(), 2u);
  EXPECT_EQ((*blocks)[0].file, "docs/x.md");
  EXPECT_EQ((*blocks)[0].line, 5);
  EXPECT_EQ((*blocks)[0].script, "strata services\nstrata top --service demo\n");
  EXPECT_EQ((*blocks)[1].line, 9);
  EXPECT_EQ((*blocks)[1].script, "  echo ok\n");
}

TEST(RunnableBlocksTest, ALongerFenceHoldsShorterOnes) {
  const char* markdown =
      "````sh runnable\n"
      "cat <<'EOF'\n"
      "```\n"
      "EOF\n"
      "````\n";
  auto blocks = ExtractRunnableBlocks("a.md", markdown);
  ASSERT_TRUE(blocks.ok()) << blocks.status();
  ASSERT_EQ(blocks->size(), 1u);
  EXPECT_EQ((*blocks)[0].script, "cat <<'EOF'\n```\nEOF\n");
}

TEST(RunnableBlocksTest, AnUnclosedFenceIsAnErrorAtItsLine) {
  auto blocks = ExtractRunnableBlocks("a.md", "text\n\n```sh runnable\nstrata services\n");
  ASSERT_FALSE(blocks.ok());
  EXPECT_EQ(blocks.status().message(), "a.md:3: code block never closed");
}

}  // namespace
}  // namespace strata::docs
