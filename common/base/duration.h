// Human durations for flags ("30s", "10m", "1h30m", "7d", "2w", "500ms"), shared by the CLI
// (--since, --duration) and the server (retention flags). Pure functions.
#ifndef STRATA_COMMON_BASE_DURATION_H_
#define STRATA_COMMON_BASE_DURATION_H_

#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"

namespace strata::base {

// Milliseconds; errors (with an example of the syntax) on anything else, and on zero.
absl::StatusOr<int64_t> ParseDuration(std::string_view text);
// Like ParseDuration, but "0" is allowed and means "keep forever".
absl::StatusOr<int64_t> ParseRetention(std::string_view text);

}  // namespace strata::base

#endif  // STRATA_COMMON_BASE_DURATION_H_
