// Splitting std::string_view text without copies. absl::StrSplit would do, but Debian's
// Abseil has its own string_view type, so every call site would convert both ways.
#ifndef STRATA_COMMON_BASE_SPLIT_H_
#define STRATA_COMMON_BASE_SPLIT_H_

#include <string_view>
#include <vector>

namespace strata::base {

// The pieces of `s` between occurrences of `sep`, empty ones included ("a,,b" has three;
// "" has one, empty). The views point into `s`.
inline std::vector<std::string_view> Split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  size_t start = 0;
  for (;;) {
    const size_t at = s.find(sep, start);
    out.push_back(s.substr(start, at == std::string_view::npos ? std::string_view::npos
                                                                : at - start));
    if (at == std::string_view::npos) return out;
    start = at + 1;
  }
}

}  // namespace strata::base

#endif  // STRATA_COMMON_BASE_SPLIT_H_
