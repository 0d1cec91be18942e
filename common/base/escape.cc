#include "common/base/escape.h"

#include "absl/strings/str_cat.h"

namespace strata::base {

std::string EscapeForLog(std::string_view s, size_t max_bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  const size_t n = std::min(s.size(), max_bytes);
  out.reserve(n + 16);
  for (size_t i = 0; i < n; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\' && c != '"') {
      out.push_back(static_cast<char>(c));
    } else {
      out += "\\x";
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  if (s.size() > n) absl::StrAppend(&out, "...(", s.size(), " bytes)");
  return out;
}

}  // namespace strata::base
