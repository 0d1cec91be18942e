// compare_benchmark: the figures of the release comparison (server/compare), from one run with
// fixed seeds.
//
// Model. A service of `functions` functions with Zipf(1) self shares; the function under test
// (key 0) has its own share (2, 10 or 30 %), the others share the rest by Zipf. Every host
// samples one busy core at 99 Hz, so a host contributes 99 * 60 * minutes samples, one unit
// per host (the default: hosts are the clusters). Each host's shares are the service's times
// a log-normal factor per function (sigma: the host-to-host spread, 5 or 15 % relative),
// renormalised; the planted regression multiplies the function's share on every candidate
// host by 1 + r (the others make room). Counts per host and function are Poisson (normal
// past a mean of 50), the multinomial's limit for 1,000+ functions.
//
//   a. Detection: the smallest r of the grid 1, 2, 3, 5, 7, 10, 15, 20, 30, 50 % found with
//      95 % probability ("found": the function significant with delta > 0 at fdr 0.05), per
//      hosts per group x minutes, `--trials` comparisons per point, bisection over the grid
//      (detection grows with r, hosts and minutes).
//   b. A/A: the share of `--aa` comparisons of two draws of one distribution with any key
//      significant (10,000 functions, 30 hosts per group, 30 minutes), at fdr 0.05 and 0.01;
//      and over hosts per group for 1,000 functions.
//   c. Cost: CompareGroups for 10,000 keys x 100 hosts per group (median of 7 runs, wall
//      and CPU); then the whole Compare through the query service on a store filled with a
//      synthetic service (10,000 functions, `--store-hosts` hosts per version, 10 s windows
//      at 99 Hz over `--store-minutes`), loading and statistics apart.
//
//   compare_benchmark [--trials N] [--aa N] [--data DIR] [--store-hosts N] [--store-minutes N]
//                     [--parts abc]
#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <numeric>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/labels/labels.h"
#include "server/commit/batch_committer.h"
#include "server/compare/compare.h"
#include "server/query/compare_profiles.h"
#include "server/query/profile.h"
#include "server/query/query_service.h"
#include "server/registry/agent_registry.h"
#include "server/store/store.h"

namespace {

namespace compare = strata::server::compare;
namespace query = strata::server::query;
namespace store = strata::server::store;
using Clock = std::chrono::steady_clock;

constexpr double kHz = 99;
constexpr double kFdr = 0.05;

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

double CpuMs(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) / 1e6;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The service's shares: key 0 at `share`, keys 1.. by Zipf(1) over the rest.
std::vector<double> ServiceShares(int functions, double share) {
  std::vector<double> shares(functions);
  double sum = 0;
  for (int i = 1; i < functions; ++i) sum += shares[i] = 1.0 / i;
  for (int i = 1; i < functions; ++i) shares[i] *= (1 - share) / sum;
  shares[0] = share;
  return shares;
}

struct Model {
  std::vector<double> shares;
  double spread = 0.15;  // host-to-host, log-normal sigma of each function's share
  double minutes = 30;
};

// One host's shares: the service's, each times a log-normal factor, key 0 times 1 + planted.
void HostShares(const Model& m, double planted, std::mt19937_64& rng, std::vector<double>* out) {
  std::normal_distribution<double> z(0, m.spread);
  std::vector<double>& host = *out;
  host.resize(m.shares.size());
  double sum = 0;
  for (size_t i = 0; i < host.size(); ++i) sum += host[i] = m.shares[i] * std::exp(z(rng));
  for (double& s : host) s /= sum;
  if (planted != 0) {
    const double raised = host[0] * (1 + planted);
    const double others = (1 - raised) / (1 - host[0]);
    for (double& s : host) s *= others;
    host[0] = raised;
  }
}

// One host's unit over m.minutes: Poisson counts of its shares.
compare::Unit DrawHost(const Model& m, uint64_t cluster, double planted, std::mt19937_64& rng,
                       std::vector<double>* scratch) {
  HostShares(m, planted, rng, scratch);
  std::normal_distribution<double> z(0, 1);
  const double n = kHz * 60 * m.minutes;
  compare::Unit unit{cluster, 0, {}};
  for (size_t i = 0; i < scratch->size(); ++i) {
    const double mean = n * (*scratch)[i];
    uint64_t x = 0;
    if (mean >= 50) {
      x = static_cast<uint64_t>(std::max(0.0, std::round(mean + std::sqrt(mean) * z(rng))));
    } else if (mean > 0) {
      x = std::poisson_distribution<uint64_t>(mean)(rng);
    }
    if (x == 0) continue;
    unit.counts.emplace_back(static_cast<uint32_t>(i), x);
    unit.total += x;
  }
  return unit;
}

compare::Group DrawGroup(const Model& m, int hosts, double planted, std::mt19937_64& rng) {
  compare::Group g;
  std::vector<double> scratch;
  for (int h = 0; h < hosts; ++h) g.units.push_back(DrawHost(m, h, planted, rng, &scratch));
  return g;
}

void Check(const absl::Status& status, const char* what) {
  if (!status.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, status.ToString().c_str());
    std::exit(1);
  }
}

template <typename T>
T Take(absl::StatusOr<T> r, const char* what) {
  Check(r.status(), what);
  return *std::move(r);
}

// Comparisons of `trials` draws in which key 0 is found raised.
int Found(const Model& m, int hosts, double planted, int trials, uint64_t seed) {
  std::mt19937_64 rng(seed);
  int found = 0;
  for (int t = 0; t < trials; ++t) {
    const compare::Group b = DrawGroup(m, hosts, 0, rng);
    const compare::Group c = DrawGroup(m, hosts, planted, rng);
    const compare::Comparison r =
        Take(compare::CompareGroups(b, c, m.shares.size(), {.fdr = kFdr}), "compare");
    // keys are sorted and key 0 is in every draw.
    found += r.keys[0].key == 0 && r.keys[0].share.significant && r.keys[0].share.delta > 0;
  }
  return found;
}

void Detection(int trials) {
  const std::vector<double> grid = {0.01, 0.02, 0.03, 0.05, 0.07, 0.10, 0.15, 0.20, 0.30, 0.50};
  const std::vector<int> hosts_list = {3, 10, 30, 100};
  const std::vector<int> minutes_list = {1, 5, 30, 60};
  std::printf(
      "a. smallest planted regression (relative, of the grid 1-50 %%) found with 95 %% "
      "probability; 1,000 functions (Zipf 1), 99 Hz per host, fdr %.2f, %d comparisons per "
      "point\n",
      kFdr, trials);
  const auto start = Clock::now();
  uint64_t cell = 0;
  for (double spread : {0.05, 0.15}) {
    for (double share : {0.02, 0.10, 0.30}) {
      std::printf("\n  self share %.0f %%, host-to-host spread %.0f %%\n  %-12s", 100 * share,
                  100 * spread, "hosts/group");
      for (int minutes : minutes_list) std::printf("  %6d min", minutes);
      std::printf("\n");
      // Grid index found per (hosts, minutes); grid.size(): none. More hosts or more minutes
      // find no less, so a cell's search starts at the smaller of its upper and left
      // neighbours' sizes (taken as found) and bisects below.
      std::vector<std::vector<size_t>> best(hosts_list.size(),
                                            std::vector<size_t>(minutes_list.size()));
      for (size_t hi_index = 0; hi_index < hosts_list.size(); ++hi_index) {
        const int hosts = hosts_list[hi_index];
        std::printf("  %-12d", hosts);
        for (size_t mi = 0; mi < minutes_list.size(); ++mi) {
          const Model m{ServiceShares(1000, share), spread, static_cast<double>(minutes_list[mi])};
          ++cell;
          // Seeds per (cell, grid point): the same draws whatever the search visits.
          auto detected = [&](size_t g) {
            return Found(m, hosts, grid[g], trials, cell * 100 + g) * 100 >= 95 * trials;
          };
          size_t hi = grid.size();
          if (hi_index > 0) hi = std::min(hi, best[hi_index - 1][mi]);
          if (mi > 0) hi = std::min(hi, best[hi_index][mi - 1]);
          if (hi == grid.size()) {
            if (!detected(grid.size() - 1)) {
              best[hi_index][mi] = grid.size();
              std::printf("  %10s", "> 50 %");
              continue;
            }
            hi = grid.size() - 1;
          }
          size_t lo = 0;
          while (lo < hi) {
            const size_t mid = (lo + hi) / 2;
            if (detected(mid)) {
              hi = mid;
            } else {
              lo = mid + 1;
            }
          }
          best[hi_index][mi] = lo;
          std::printf("  %8.0f %%", 100 * grid[lo]);
        }
        std::printf("\n");
        std::fflush(stdout);
      }
    }
  }
  std::printf("  (%.0f s)\n\n", Ms(Clock::now() - start) / 1000);
}

double AaRate(const Model& m, int hosts, int comparisons, double fdr, uint64_t seed) {
  std::mt19937_64 rng(seed);
  int flagged = 0;
  for (int i = 0; i < comparisons; ++i) {
    const compare::Group b = DrawGroup(m, hosts, 0, rng);
    const compare::Group c = DrawGroup(m, hosts, 0, rng);
    const compare::Comparison r =
        Take(compare::CompareGroups(b, c, m.shares.size(), {.fdr = fdr}), "compare");
    flagged += std::any_of(r.keys.begin(), r.keys.end(),
                           [](const compare::KeyComparison& k) { return k.share.significant; });
  }
  return 100.0 * flagged / comparisons;
}

void AaRates(int comparisons) {
  std::printf("b. A/A: any key significant, %d comparisons of one distribution, 30 min\n",
              comparisons);
  for (double spread : {0.05, 0.15}) {
    const Model m{ServiceShares(10'000, 0.10), spread, 30};
    std::printf("  10,000 functions, 30 hosts/group, spread %2.0f %%: fdr 0.05 %.1f %%, "
                "fdr 0.01 %.1f %%\n",
                100 * spread, AaRate(m, 30, comparisons, 0.05, 5), AaRate(m, 30, comparisons, 0.01, 5));
  }
  const Model m{ServiceShares(1000, 0.10), 0.15, 30};
  std::printf("  1,000 functions, spread 15 %%, fdr 0.05, hosts/group 3 / 10 / 30 / 100:");
  for (int hosts : {3, 10, 30, 100}) std::printf(" %.1f %%", AaRate(m, hosts, comparisons, 0.05, 6));
  std::printf("\n\n");
}

void CompareGroupsCost() {
  const Model m{ServiceShares(10'000, 0.10), 0.15, 30};
  std::mt19937_64 rng(9);
  const compare::Group b = DrawGroup(m, 100, 0, rng);
  const compare::Group c = DrawGroup(m, 100, 0.05, rng);
  std::vector<double> wall, cpu;
  size_t keys = 0, tested = 0;
  for (int run = 0; run < 7; ++run) {
    const auto t = Clock::now();
    const double c0 = CpuMs(CLOCK_THREAD_CPUTIME_ID);
    const compare::Comparison r =
        Take(compare::CompareGroups(b, c, m.shares.size(), {.fdr = kFdr}), "compare");
    cpu.push_back(CpuMs(CLOCK_THREAD_CPUTIME_ID) - c0);
    wall.push_back(Ms(Clock::now() - t));
    keys = r.keys.size();
    tested = r.keys_tested;
  }
  std::printf(
      "c. CompareGroups, %zu keys (%zu tested) x 100 hosts per group, 30 min at 99 Hz: median "
      "of 7 runs %.1f ms wall, %.1f ms CPU\n",
      keys, tested, Median(wall), Median(cpu));
}

struct StoreSpec {
  std::string data;
  int hosts = 30;      // per version
  int minutes = 30;    // of 10 s windows
  int functions = 10'000;
};

// Two versions of one service, `hosts` hosts each; version 2 spends 10 % more in fn_0 (10 %
// self share; the others Zipf). Stacks
// main -> mid_(i % 50) -> fn_i, one per function; every host's 10 s window holds 990 samples
// drawn from its own shares (15 % host-to-host spread).
int64_t FillStore(const StoreSpec& s, int64_t t0) {
  std::filesystem::remove_all(s.data);
  std::filesystem::create_directories(s.data);
  std::unique_ptr<store::Store> opened =
      Take(store::Store::Open(s.data, store::StoreOptions{}), "open");
  store::Store* st = opened.get();
  const auto start = Clock::now();
  store::WriteBatch batch;
  auto intern = [&](const std::string& name) {
    return Take(st->interner().InternFunction({name, "/usr/bin/checkout", "", 0}, &batch),
                "function");
  };
  const uint64_t main_id = intern("main");
  std::vector<uint64_t> mids;
  for (int j = 0; j < 50; ++j) mids.push_back(intern(absl::StrCat("mid_", j)));
  std::vector<uint64_t> stacks;
  for (int i = 0; i < s.functions; ++i) {
    store::StackFrames frames;
    frames.function_ids = {main_id, mids[i % 50], intern(absl::StrCat("fn_", i))};
    stacks.push_back(Take(st->interner().InternStack(frames, &batch), "stack"));
  }
  std::vector<uint64_t> label_sets;
  for (int version : {1, 2}) {
    const strata::labels::LabelSet set = {{"version", absl::StrCat(version)}};
    label_sets.push_back(
        Take(st->interner().InternLabelSet("checkout", set, 100, &batch), "labels"));
  }
  Check(st->Commit(&batch), "commit");
  std::mt19937_64 rng(3);
  const Model m{ServiceShares(s.functions, 0.10), 0.15, 0};
  std::vector<std::vector<double>> cdfs;  // per host
  for (int version : {1, 2}) {
    for (int h = 0; h < s.hosts; ++h) {
      std::vector<double> host;
      HostShares(m, version == 2 ? 0.10 : 0, rng, &host);
      std::partial_sum(host.begin(), host.end(), host.begin());
      cdfs.push_back(std::move(host));
    }
  }
  const int64_t windows = s.minutes * 6;
  const int samples_per_window = static_cast<int>(kHz * 10);
  std::uniform_real_distribution<double> u(0, 1);
  uint64_t cells = 0;
  absl::flat_hash_map<uint32_t, uint64_t> counts;
  for (int64_t w = 0; w < windows; ++w) {
    const int64_t window = t0 + w * strata::server::commit::kWindowMs;
    for (size_t h = 0; h < cdfs.size(); ++h) {
      counts.clear();
      const std::vector<double>& cdf = cdfs[h];
      for (int n = 0; n < samples_per_window; ++n) {
        const double x = u(rng) * cdf.back();
        ++counts[static_cast<uint32_t>(std::lower_bound(cdf.begin(), cdf.end(), x) - cdf.begin())];
      }
      const int version = h < static_cast<size_t>(s.hosts) ? 1 : 2;
      const std::string host = absl::StrCat("v", version, "-host-", h % s.hosts);
      for (const auto& [f, n] : counts) {
        batch.AddSamples("checkout", window, host, stacks[f], n, label_sets[version - 1]);
      }
      cells += counts.size();
    }
    Check(st->Commit(&batch), "commit");
  }
  (void)st->CompactAll();
  std::printf(
      "   store: %d functions, 2 x %d hosts, %d min of 10 s windows at 99 Hz, %llu cells, "
      "filled and compacted in %.1f s\n",
      s.functions, s.hosts, s.minutes, static_cast<unsigned long long>(cells),
      Ms(Clock::now() - start) / 1000);
  (void)st->Close();
  return t0 + windows * strata::server::commit::kWindowMs;
}

void RunCompareCost(const StoreSpec& s) {
  const int64_t t0 = 1'760'000'400'000 / 3'600'000 * 3'600'000;
  const int64_t end = FillStore(s, t0);
  std::unique_ptr<store::Store> opened =
      Take(store::Store::Open(s.data, store::StoreOptions{}), "open");
  strata::server::registry::AgentRegistry registry;
  query::QueryService service(opened.get(), &registry);
  strata::v1::CompareRequest request;
  request.set_service("checkout");
  request.mutable_baseline()->set_selector("version=1");
  request.mutable_baseline()->mutable_range()->set_from_ms(t0);
  request.mutable_baseline()->mutable_range()->set_to_ms(end);
  *request.mutable_candidate() = request.baseline();
  request.mutable_candidate()->set_selector("version=2");

  constexpr int kRuns = 5;
  std::vector<double> wall, cpu;
  double cold = 0;
  std::string planted;
  for (int run = 0; run <= kRuns; ++run) {
    const auto t = Clock::now();
    const double c0 = CpuMs(CLOCK_PROCESS_CPUTIME_ID);
    const strata::v1::CompareResponse r = Take(service.RunCompare(request), "RunCompare");
    const double ms = Ms(Clock::now() - t);
    if (run == 0) {
      cold = ms;
      for (const auto& f : r.functions()) {
        if (f.function().function() == "fn_0") {
          char line[160];
          std::snprintf(line, sizeof line, "fn_0 (planted +10 %%): %+.1f %% [%+.1f, %+.1f], q %.2g",
                        f.self().relative(), f.self().relative_ci_low(),
                        f.self().relative_ci_high(), f.self().q());
          planted = line;
        }
      }
      continue;
    }
    wall.push_back(ms);
    cpu.push_back(CpuMs(CLOCK_PROCESS_CPUTIME_ID) - c0);
  }
  std::printf("   RunCompare (%d hosts per group, 4 load threads): first %.0f ms; then median of %d: "
              "%.0f ms wall, %.0f ms CPU; %s\n",
              s.hosts, cold, kRuns, Median(wall), Median(cpu), planted.c_str());

  // The same request with the loads timed: loading is every load (CPU on the loading
  // threads, wall until the last returned), statistics the rest (keying, CompareGroups,
  // the answer).
  query::ProfileReader reader(opened.get());
  std::vector<double> load_wall, load_cpu, stats_wall, stats_cpu;
  for (int run = 0; run <= kRuns; ++run) {
    std::mutex mu;
    double loads_cpu = 0;
    Clock::time_point last_load;
    auto load = [&](const query::ProfileQuery& q) {
      const double c0 = CpuMs(CLOCK_THREAD_CPUTIME_ID);
      auto profile = reader.Load(q);
      const double used = CpuMs(CLOCK_THREAD_CPUTIME_ID) - c0;
      std::lock_guard<std::mutex> lock(mu);
      loads_cpu += used;
      last_load = std::max(last_load, Clock::now());
      return profile;
    };
    const auto t = Clock::now();
    const double c0 = CpuMs(CLOCK_PROCESS_CPUTIME_ID);
    Check(query::CompareRequested(request, end, 20, load).status(), "CompareRequested");
    const double total_cpu = CpuMs(CLOCK_PROCESS_CPUTIME_ID) - c0;
    const auto done = Clock::now();
    if (run == 0) continue;
    load_wall.push_back(Ms(last_load - t));
    load_cpu.push_back(loads_cpu);
    stats_wall.push_back(Ms(done - last_load));
    stats_cpu.push_back(total_cpu - loads_cpu);
  }
  std::printf("   of which loading %.0f ms wall, %.0f ms CPU (%d loads); statistics %.0f ms wall, "
              "%.0f ms CPU (medians of %d)\n",
              Median(load_wall), Median(load_cpu), 2 * (s.hosts + 1), Median(stats_wall),
              Median(stats_cpu), kRuns);
  (void)opened->Close();
}

}  // namespace

int main(int argc, char** argv) {
  int trials = 100, aa = 200;
  std::string parts = "abc";
  StoreSpec spec{"/tmp/strata_compare_benchmark"};
  CLI::App app{"compare_benchmark: detection, A/A rate and cost of the release comparison"};
  app.add_option("--trials", trials, "comparisons per detection point")->capture_default_str();
  app.add_option("--aa", aa, "A/A comparisons")->capture_default_str();
  app.add_option("--data", spec.data, "store directory of part c (wiped)")->capture_default_str();
  app.add_option("--store-hosts", spec.hosts, "hosts per version in the store")
      ->capture_default_str();
  app.add_option("--store-minutes", spec.minutes, "minutes of samples in the store")
      ->capture_default_str();
  app.add_option("--parts", parts, "which of a (detection), b (A/A), c (cost)")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (parts.find('a') != std::string::npos) Detection(trials);
  if (parts.find('b') != std::string::npos) AaRates(aa);
  if (parts.find('c') != std::string::npos) {
    CompareGroupsCost();
    RunCompareCost(spec);
  }
  return 0;
}
