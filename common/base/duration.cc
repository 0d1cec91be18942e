#include "common/base/duration.h"

#include "absl/strings/str_cat.h"

namespace strata::base {

absl::StatusOr<int64_t> ParseDuration(std::string_view text) {
  if (text.empty()) return absl::InvalidArgumentError("empty duration");
  int64_t total = 0;
  size_t i = 0;
  while (i < text.size()) {
    if (text[i] < '0' || text[i] > '9') {
      return absl::InvalidArgumentError(
          absl::StrCat("invalid duration '", std::string(text), "': expected a number at '", std::string(text.substr(i)),
                       "' (examples: 30s, 10m, 1h30m, 7d)"));
    }
    int64_t n = 0;
    while (i < text.size() && text[i] >= '0' && text[i] <= '9') {
      n = n * 10 + (text[i] - '0');
      if (n > (int64_t{1} << 40)) return absl::InvalidArgumentError("duration too large");
      ++i;
    }
    size_t unit_end = i;
    while (unit_end < text.size() && (text[unit_end] < '0' || text[unit_end] > '9')) ++unit_end;
    std::string_view unit = text.substr(i, unit_end - i);
    int64_t scale;
    if (unit == "ms") scale = 1;
    else if (unit == "s") scale = 1000;
    else if (unit == "m") scale = 60'000;
    else if (unit == "h") scale = 3'600'000;
    else if (unit == "d") scale = 86'400'000;
    else if (unit == "w") scale = 7 * 86'400'000LL;
    else {
      return absl::InvalidArgumentError(absl::StrCat(
          "invalid duration '", std::string(text), "': unknown unit '", std::string(unit), "' (use ms, s, m, h, d or w)"));
    }
    total += n * scale;
    i = unit_end;
  }
  if (total <= 0) return absl::InvalidArgumentError(absl::StrCat("duration '", std::string(text), "' is zero"));
  return total;
}

absl::StatusOr<int64_t> ParseRetention(std::string_view text) {
  if (text == "0") return 0;
  return ParseDuration(text);
}

}  // namespace strata::base
