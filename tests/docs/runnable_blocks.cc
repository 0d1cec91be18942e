#include "tests/docs/runnable_blocks.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace strata::docs {
namespace {

// Debian's Abseil has its own string_view; the header speaks std's.
absl::string_view Absl(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// The number of backticks a line starts with after its indentation, and what follows them.
size_t FenceLength(absl::string_view line, absl::string_view* rest) {
  line = absl::StripLeadingAsciiWhitespace(line);
  size_t n = 0;
  while (n < line.size() && line[n] == '`') ++n;
  *rest = line.substr(n);
  return n;
}

}  // namespace

bool IsRunnableInfoString(std::string_view info) {
  std::vector<absl::string_view> words =
      absl::StrSplit(Absl(info), absl::ByAnyChar(" \t"), absl::SkipEmpty());
  if (words.empty() || (words[0] != "sh" && words[0] != "bash")) return false;
  return std::find(words.begin() + 1, words.end(), "runnable") != words.end();
}

absl::StatusOr<std::vector<RunnableBlock>> ExtractRunnableBlocks(std::string_view file,
                                                                 std::string_view markdown) {
  std::vector<RunnableBlock> blocks;
  std::vector<absl::string_view> lines = absl::StrSplit(Absl(markdown), '\n');
  size_t fence = 0;  // the open fence's length; 0 outside a block
  int fence_line = 0;
  bool runnable = false;
  std::string script;
  for (size_t i = 0; i < lines.size(); ++i) {
    const absl::string_view line = lines[i];
    absl::string_view rest;
    const size_t ticks = FenceLength(line, &rest);
    if (fence == 0) {
      if (ticks < 3) continue;
      fence = ticks;
      fence_line = static_cast<int>(i) + 1;
      const absl::string_view info = absl::StripAsciiWhitespace(rest);
      runnable = IsRunnableInfoString(std::string_view(info.data(), info.size()));
      script.clear();
      continue;
    }
    if (ticks >= fence && absl::StripAsciiWhitespace(rest).empty()) {
      if (runnable) blocks.push_back({std::string(file), fence_line, script});
      fence = 0;
      continue;
    }
    if (runnable) absl::StrAppend(&script, line, "\n");
  }
  if (fence != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(Absl(file), ":", fence_line, ": code block never closed"));
  }
  return blocks;
}

absl::StatusOr<std::vector<RunnableBlock>> FindRunnableBlocks(const std::string& source_root) {
  namespace fs = std::filesystem;
  const fs::path root(source_root);
  std::vector<fs::path> files{root / "README.md"};
  std::error_code ec;
  for (fs::recursive_directory_iterator it(root / "docs", ec), end; !ec && it != end;
       it.increment(ec)) {
    if (it->is_regular_file() && it->path().extension() == ".md") files.push_back(it->path());
  }
  if (ec) return absl::NotFoundError(absl::StrCat((root / "docs").string(), ": ", ec.message()));
  std::sort(files.begin() + 1, files.end());
  std::vector<RunnableBlock> all;
  for (const fs::path& path : files) {
    std::ifstream in(path);
    if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path.string()));
    std::stringstream text;
    text << in.rdbuf();
    auto blocks = ExtractRunnableBlocks(path.lexically_relative(root).string(), text.str());
    if (!blocks.ok()) return blocks.status();
    all.insert(all.end(), blocks->begin(), blocks->end());
  }
  return all;
}

}  // namespace strata::docs
