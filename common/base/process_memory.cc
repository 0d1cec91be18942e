#include "common/base/process_memory.h"

#include <malloc.h>

#include <climits>

#include "absl/strings/str_cat.h"

namespace strata::base {

absl::Status RetainFreedMemory(size_t mmap_threshold_bytes, size_t trim_threshold_bytes) {
  if (mmap_threshold_bytes > INT_MAX || trim_threshold_bytes > INT_MAX) {
    return absl::InvalidArgumentError("malloc thresholds above 2 GiB");
  }
  // mallopt returns 1 on success. Setting either turns off glibc's own adjustment of both.
  if (mallopt(M_MMAP_THRESHOLD, static_cast<int>(mmap_threshold_bytes)) != 1) {
    return absl::InternalError(absl::StrCat("mallopt(M_MMAP_THRESHOLD, ", mmap_threshold_bytes,
                                            ") refused"));
  }
  if (mallopt(M_TRIM_THRESHOLD, static_cast<int>(trim_threshold_bytes)) != 1) {
    return absl::InternalError(absl::StrCat("mallopt(M_TRIM_THRESHOLD, ", trim_threshold_bytes,
                                            ") refused"));
  }
  return absl::OkStatus();
}

}  // namespace strata::base
