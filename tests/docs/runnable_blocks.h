// tests/docs (strata::docs): the documentation's runnable examples. A fenced code block whose
// info string is `sh runnable` (or `bash runnable`) in README.md or docs/**/*.md holds
// commands the documentation promises work against a running server; docs_e2e_test runs every
// one of them. This header finds them in Markdown text; the blocks are plain values.
#ifndef STRATA_TESTS_DOCS_RUNNABLE_BLOCKS_H_
#define STRATA_TESTS_DOCS_RUNNABLE_BLOCKS_H_

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace strata::docs {

struct RunnableBlock {
  std::string file;    // the name the text was given under (relative to the source root)
  int line = 0;        // 1-based line of the opening fence
  std::string script;  // the block's lines, each ending in '\n'
};

// Whether a fence's info string (what follows the backticks) marks a runnable block: the
// language is `sh` or `bash` and one of the following words is `runnable`.
bool IsRunnableInfoString(std::string_view info);

// The runnable blocks of one Markdown text, in order. A fence opens at a line of three or more
// backticks (after any indentation) and closes at a line of at least as many backticks and
// nothing else; blocks of other languages are skipped whole. A fence that never closes is an
// error naming its line.
absl::StatusOr<std::vector<RunnableBlock>> ExtractRunnableBlocks(std::string_view file,
                                                                 std::string_view markdown);

// The runnable blocks of README.md and of every *.md under docs/ in `source_root`, files in
// path order, named relative to `source_root`.
absl::StatusOr<std::vector<RunnableBlock>> FindRunnableBlocks(const std::string& source_root);

}  // namespace strata::docs

#endif  // STRATA_TESTS_DOCS_RUNNABLE_BLOCKS_H_
