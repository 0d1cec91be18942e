// Formatting helpers of the strata CLI: duration and timestamp parsing for --since/--from/
// --to, and aligned human-readable tables with percentages. Pure functions, unit-tested.
#ifndef STRATA_CLI_FORMAT_H_
#define STRATA_CLI_FORMAT_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/base/duration.h"

namespace strata::cli {

using base::ParseDuration;
// RFC 3339 ("2026-11-21T05:53:00Z", "2026-11-21T07:53:00+02:00", fractional seconds
// allowed) -> Unix milliseconds.
absl::StatusOr<int64_t> ParseRfc3339(std::string_view text);
// Unix milliseconds -> "2026-11-21T05:53:00Z".
std::string FormatRfc3339(int64_t unix_ms);
// As FormatRfc3339, with the milliseconds when there are any (ParseRfc3339 reads them back).
std::string FormatRfc3339Millis(int64_t unix_ms);

// 1234567 -> "1,234,567".
std::string WithThousands(uint64_t value);
// share of total as "59.9%"; "-" when total is 0.
std::string Percent(uint64_t part, uint64_t total);

// A table printed with columns padded to their widest cell, control characters in cells
// escaped (AppendTerminalSafe). Columns listed in `right_aligned` (by index) are right-aligned
// (numbers).
class Table {
 public:
  Table(std::vector<std::string> header, std::vector<size_t> right_aligned);
  void AddRow(std::vector<std::string> cells);
  std::string ToString() const;

 private:
  std::vector<std::string> header_;
  std::vector<size_t> right_aligned_;
  std::vector<std::vector<std::string>> rows_;
};

// Display width of UTF-8 text (code points; the CLI prints no wide characters).
size_t DisplayWidth(std::string_view text);

// Text from the server holds names that agents chose (functions, services, hosts, labels):
// written to a terminal as they are, control characters in them could move the cursor,
// rewrite the screen or the window's title. This writes `text` to `out` with every control
// character but \n, \t and \r (C0, DEL, and C1 as UTF-8's C2 80-9F) as \xNN. Text may come in
// pieces: `*held_c2` carries a C2 byte that ended the last piece.
void AppendTerminalSafe(std::string_view text, bool* held_c2, std::string* out);

}  // namespace strata::cli

#endif  // STRATA_CLI_FORMAT_H_
