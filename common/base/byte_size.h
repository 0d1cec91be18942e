// Human byte sizes for flags ("512MiB", "64M", "1G", "4096"): binary units (K, M, G, T with
// an optional "iB" or "B"), shared by the server's memory and message-size flags.
#ifndef STRATA_COMMON_BASE_BYTE_SIZE_H_
#define STRATA_COMMON_BASE_BYTE_SIZE_H_

#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"

namespace strata::base {

// Bytes; InvalidArgument (with an example of the syntax) on anything else or on overflow.
absl::StatusOr<uint64_t> ParseByteSize(std::string_view text);

}  // namespace strata::base

#endif  // STRATA_COMMON_BASE_BYTE_SIZE_H_
