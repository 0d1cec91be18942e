// Process-wide memory behaviour of the long-running server.
//
// glibc hands large freed blocks back to the kernel at once (each allocation above its mmap
// threshold is a mapping of its own, and the top of the heap is trimmed past 128 KiB), so a
// process that builds and drops tens of megabytes per request (a week's flame graph: stacks,
// paths, tree, JSON) pays for fresh zeroed pages on every request: 42 % of a warm 1 h flame
// graph's time was page faults. RetainFreedMemory raises both limits so that memory freed by one
// request is reused by the next; the process keeps up to `trim_threshold_bytes` of free heap
// per arena instead of returning it.
#ifndef STRATA_COMMON_BASE_PROCESS_MEMORY_H_
#define STRATA_COMMON_BASE_PROCESS_MEMORY_H_

#include <cstddef>

#include "absl/status/status.h"

namespace strata::base {

inline constexpr size_t kServerMmapThresholdBytes = size_t{32} << 20;
inline constexpr size_t kServerTrimThresholdBytes = size_t{128} << 20;

// Allocations below `mmap_threshold_bytes` come from the heap; free heap above
// `trim_threshold_bytes` is returned to the kernel. Call once at start-up, before threads
// allocate. An error if the C library refuses (the process then keeps its defaults).
absl::Status RetainFreedMemory(size_t mmap_threshold_bytes = kServerMmapThresholdBytes,
                               size_t trim_threshold_bytes = kServerTrimThresholdBytes);

}  // namespace strata::base

#endif  // STRATA_COMMON_BASE_PROCESS_MEMORY_H_
