// Reading `go tool pprof -top -cum`: the Go runtime's own CPU profile, which the Go end-to-end
// tests (x86-64, and MIPS64 under qemu) hold Strata's shares against.
#ifndef STRATA_TESTS_E2E_GOLANG_PPROF_TOP_H_
#define STRATA_TESTS_E2E_GOLANG_PPROF_TOP_H_

#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace strata::e2e {

struct CumShare {
  std::string function;
  double percent;
};

// The rows of `go tool pprof -top -cum`'s output (flat flat% sum% cum cum% name), a name's
// " (inline)" mark removed, and in *samples the profile's sample count: its total CPU time
// ("of 14.2s total", or "Total samples = 14.2s" with -symbolize=none) at the runtime's 100 Hz.
inline std::vector<CumShare> ParsePprofTopCum(const std::string& output, double* samples) {
  std::smatch total;
  *samples = 0;
  if (std::regex_search(output, total,
                        std::regex(R"((?:of|Total samples =) ([\d.]+)(m?s)(?: total)?)"))) {
    *samples = std::stod(total[1]) * (total[2] == "ms" ? 0.1 : 100);
  }
  static const std::regex kRow(R"(^\s*\S+\s+[\d.]+%\s+[\d.]+%\s+\S+\s+([\d.]+)%\s+(.+?)\s*$)");
  static const std::regex kInline(R"( \(inline\)$)");
  std::vector<CumShare> rows;
  std::istringstream lines(output);
  std::string line;
  while (std::getline(lines, line)) {
    std::smatch m;
    if (std::regex_match(line, m, kRow)) {
      rows.push_back({std::regex_replace(m[2].str(), kInline, ""), std::stod(m[1])});
    }
  }
  return rows;
}

// How far Strata's share `ours` of a function (percent) lies from the shares the function can
// have given pprof's `theirs`, when pprof's profile holds only `coverage` (0 to 1) of the
// process's CPU time: Go's profiler loses samples under CPU contention (13 % of them in one run
// with a busy process beside the workload on two cores), while perf events count all of it. The
// function's samples pprof kept lie between all of its time and all but what pprof missed,
// so its true share lies in [theirs * c, theirs * c + 100 * (1 - c)]; 0 inside.
inline double DistanceFromPprofShare(double ours, double theirs, double coverage) {
  const double c = coverage > 1 ? 1 : coverage;
  const double low = theirs * c, high = theirs * c + 100 * (1 - c);
  return ours < low ? low - ours : ours > high ? ours - high : 0;
}

}  // namespace strata::e2e

#endif  // STRATA_TESTS_E2E_GOLANG_PPROF_TOP_H_
