// Wall-clock time in the units the project stores and ships: Unix milliseconds. One definition,
// so every component (windows, retention, queries, the CLI) reads the same clock the same way.
#ifndef STRATA_COMMON_BASE_CLOCK_H_
#define STRATA_COMMON_BASE_CLOCK_H_

#include <chrono>
#include <cstdint>

namespace strata::base {

// Milliseconds since the Unix epoch (system clock: comparable across hosts and restarts).
inline int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace strata::base

#endif  // STRATA_COMMON_BASE_CLOCK_H_
