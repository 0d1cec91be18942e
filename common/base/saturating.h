// Saturating arithmetic for sample counts. Counts from agents are bounded per context (see
// server/ingest), but totals accumulate without end (service totals, rollups, merged cells):
// they stop at UINT64_MAX instead of wrapping, so a total can be too small only once it is
// astronomically large, never wrong by wrapping to a small number.
#ifndef STRATA_COMMON_BASE_SATURATING_H_
#define STRATA_COMMON_BASE_SATURATING_H_

#include <cstdint>
#include <limits>

namespace strata::base {

inline uint64_t SaturatingAdd(uint64_t a, uint64_t b) {
  uint64_t sum;
  return __builtin_add_overflow(a, b, &sum) ? std::numeric_limits<uint64_t>::max() : sum;
}

// a += b, saturating.
inline void SaturatingAddTo(uint64_t& a, uint64_t b) { a = SaturatingAdd(a, b); }

}  // namespace strata::base

#endif  // STRATA_COMMON_BASE_SATURATING_H_
