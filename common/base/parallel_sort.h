// SortOnTwoThreads: std::sort of a large range, its halves sorted on two threads and merged.
//
// The server's long-range queries sort 100,000-entry arrays a few times each (stacks by
// weight, paths for the flame tree), one query at a time per caller, on machines of two
// cores or more. Below `min_parallel` entries the thread's start-up costs more than it saves
// and the caller's thread sorts alone. The result is std::sort's: with a strict total order,
// the same order.
#ifndef STRATA_COMMON_BASE_PARALLEL_SORT_H_
#define STRATA_COMMON_BASE_PARALLEL_SORT_H_

#include <algorithm>
#include <cstddef>
#include <iterator>
#include <system_error>
#include <thread>

namespace strata::base {

inline constexpr size_t kMinParallelSort = 32768;

template <typename RandomIt, typename Less>
void SortOnTwoThreads(RandomIt first, RandomIt last, Less less,
                      size_t min_parallel = kMinParallelSort) {
  const size_t n = static_cast<size_t>(std::distance(first, last));
  if (n < min_parallel || std::thread::hardware_concurrency() < 2) {
    std::sort(first, last, less);
    return;
  }
  const RandomIt mid = first + static_cast<std::ptrdiff_t>(n / 2);
  std::thread other;
  try {
    other = std::thread([first, mid, &less] { std::sort(first, mid, less); });
  } catch (const std::system_error&) {  // no thread to be had: sort here
    std::sort(first, last, less);
    return;
  }
  std::sort(mid, last, less);
  other.join();
  std::inplace_merge(first, mid, last, less);
}

}  // namespace strata::base

#endif  // STRATA_COMMON_BASE_PARALLEL_SORT_H_
