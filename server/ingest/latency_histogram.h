// A lock-free latency histogram with fixed buckets (100 us to 10 s), exported on /metrics in
// Prometheus' histogram format. Observe() is two relaxed atomic adds.
#ifndef STRATA_SERVER_INGEST_LATENCY_HISTOGRAM_H_
#define STRATA_SERVER_INGEST_LATENCY_HISTOGRAM_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace strata::server::ingest {

class LatencyHistogram {
 public:
  // Upper bounds of the buckets, microseconds; a last bucket takes the rest.
  static constexpr std::array<int64_t, 12> kBoundsUs = {
      100, 250, 500, 1'000, 2'500, 5'000, 10'000, 25'000, 100'000, 500'000, 2'000'000,
      10'000'000};

  void Observe(absl::Duration d) {
    const int64_t us = absl::ToInt64Microseconds(d);
    size_t b = 0;
    while (b < kBoundsUs.size() && us > kBoundsUs[b]) ++b;
    counts_[b].fetch_add(1, std::memory_order_relaxed);
    sum_us_.fetch_add(static_cast<uint64_t>(us < 0 ? 0 : us), std::memory_order_relaxed);
  }

  // Appends `name` as a Prometheus histogram in seconds.
  void AppendPrometheus(std::string* out, const char* name, const char* help) const {
    absl::StrAppend(out, "# HELP ", name, " ", help, "\n# TYPE ", name, " histogram\n");
    uint64_t cumulative = 0;
    for (size_t b = 0; b <= kBoundsUs.size(); ++b) {
      cumulative += counts_[b].load(std::memory_order_relaxed);
      const std::string le =
          b < kBoundsUs.size() ? absl::StrCat(kBoundsUs[b] / 1e6) : std::string("+Inf");
      absl::StrAppend(out, name, "_bucket{le=\"", le, "\"} ", cumulative, "\n");
    }
    absl::StrAppend(out, name, "_sum ", sum_us_.load(std::memory_order_relaxed) / 1e6, "\n",
                    name, "_count ", cumulative, "\n");
  }

 private:
  std::array<std::atomic<uint64_t>, kBoundsUs.size() + 1> counts_{};
  std::atomic<uint64_t> sum_us_{0};
};

}  // namespace strata::server::ingest

#endif  // STRATA_SERVER_INGEST_LATENCY_HISTOGRAM_H_
