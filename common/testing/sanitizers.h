// Whether the code runs under a sanitizer (ASan, TSan), for randomized tests that scale their
// trials down there: instrumented code at -O0 runs 30-80 times slower than the regular build,
// which runs every trial, and the sanitizer build's fuzz targets search the same decoders with
// coverage feedback.
#ifndef STRATA_COMMON_TESTING_SANITIZERS_H_
#define STRATA_COMMON_TESTING_SANITIZERS_H_

#include <algorithm>

namespace strata::testing {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif
#else
inline constexpr bool kSanitized = false;
#endif

// `n` trials of a randomized test, or a tenth of them (at least one) under a sanitizer.
constexpr int Trials(int n) { return kSanitized ? std::max(1, n / 10) : n; }

}  // namespace strata::testing

#endif  // STRATA_COMMON_TESTING_SANITIZERS_H_
