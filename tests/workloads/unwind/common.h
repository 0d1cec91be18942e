// Shared by the unwinding workloads: a run-time budget from argv and a CPU-burning leaf the
// optimizer cannot remove.
#ifndef STRATA_TESTS_WORKLOADS_UNWIND_COMMON_H_
#define STRATA_TESTS_WORKLOADS_UNWIND_COMMON_H_

#include <chrono>
#include <cstdint>
#include <cstdlib>

namespace workload {

inline volatile uint64_t g_sink = 0;

// Seconds to run: argv[1], default 2.
inline double Seconds(int argc, char** argv) { return argc > 1 ? std::atof(argv[1]) : 2.0; }

class Deadline {
 public:
  explicit Deadline(double seconds)
      : end_(std::chrono::steady_clock::now() +
             std::chrono::microseconds(static_cast<int64_t>(seconds * 1e6))) {}
  bool passed() const { return std::chrono::steady_clock::now() >= end_; }

 private:
  std::chrono::steady_clock::time_point end_;
};

__attribute__((noinline)) inline uint64_t Burn(uint64_t n, uint64_t seed) {
  uint64_t x = seed | 1;
  for (uint64_t i = 0; i < n; ++i) x = x * 6364136223846793005ull + 1442695040888963407ull;
  g_sink = g_sink + x;
  return x;
}

}  // namespace workload

#endif  // STRATA_TESTS_WORKLOADS_UNWIND_COMMON_H_
