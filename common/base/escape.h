// Client-supplied text made safe to log or echo: bounded in length, with control bytes,
// quotes, backslashes and bytes outside printable ASCII written as \xNN, so a hostile
// client can neither flood the log nor forge lines or terminal escapes in it.
#ifndef STRATA_COMMON_BASE_ESCAPE_H_
#define STRATA_COMMON_BASE_ESCAPE_H_

#include <cstddef>
#include <string>
#include <string_view>

namespace strata::base {

// At most `max_bytes` of `s`, escaped; longer input ends with "...(N bytes)".
std::string EscapeForLog(std::string_view s, size_t max_bytes = 200);

// Strict UTF-8 (no overlongs, surrogates or code points above U+10FFFF): what protobuf strings
// and JSON require of client-supplied text.
bool IsValidUtf8(std::string_view s);

}  // namespace strata::base

#endif  // STRATA_COMMON_BASE_ESCAPE_H_
