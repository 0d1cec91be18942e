// Aggregation throughput of strata::table::SortedTable against std::unordered_map and
// absl::flat_hash_map: 10 M updates of Zipf-distributed stack IDs (100,000 distinct keys,
// s = 0.8 and 1.1, and 1.1 with a phase switch halfway), count 1 per update. Then, as a
// diagnostic, s = 0.8 again with keys picked so that each heads a chain of its own: what
// the table's chains cost is the difference.
//
// Every contender does the same work: the same key stream (generated once per stream,
// outside the timed loop), one count per update, a container bounded to the 100,000 keys
// (the table's max_entries; the maps reserve that many, so neither rehashes), built before
// the clock starts. After each timed run, outside the clock, the container's contents are
// checked against reference counts: a contender that dropped or miscounted an update fails
// the run. Contenders run round-robin, `--rounds` times each, so that a noisy neighbour
// slows all of them alike; times are CPU time of this process. The summary gives the median
// and best rate per contender and, in the same run, the ratios of the medians against
// std::unordered_map and absl::flat_hash_map; for the goals, also the table's rate against
// absl's in each round (runs a fraction of a second apart: their median holds still on a host
// whose speed drifts within a run) and its best round's against absl's best.
//
// Probe lengths (1 = the key's entry is the first one looked at): for the table, the mean
// chain position of hits during the first period (before any sort could run), during the
// rest of the stream (sorted chains), and count-weighted in the final layout; for the maps,
// the count-weighted final value only (chain position in std::unordered_map, groups probed
// in absl::flat_hash_map). For the table, "ideal" is the final value had every chain been
// ordered by its entries' final counts: the best any order can do with these chains. MB =
// bytes the container holds at the bound (the maps: buckets or slots plus, for
// std::unordered_map, one 32-byte node per key). For the table, "sorts" counts the chains the
// period-end sorts reordered and "passes" the hits behind a head that passed the entry before
// them (TableStats).
//
// A third anchor, "absl + period counts", is absl::flat_hash_map keeping per update the
// table's period counts (and recording the keys that cross frequency_threshold), without
// sorting: the table's own bookkeeping on absl's lookup, so that the summary can say how much
// of the gap to absl is the bookkeeping and how much the chains.
//
// Usage: table_benchmark [--rounds=N] [--updates=N] [--only=SUBSTRING]
// --only keeps the contenders whose name contains SUBSTRING, plus the baselines.

#include <time.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/internal/hashtable_debug.h"
#include "common/table/sorted_table.h"

namespace {

using strata::table::CountTable;
using strata::table::KeyCount;
using strata::table::SortedTableOptions;
using strata::table::TableStats;

constexpr uint32_t kDistinctKeys = 100'000;

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

struct Stream {
  std::string name;
  std::vector<uint64_t> keys;
  std::vector<KeyCount<uint64_t>> items;  // the same keys, count 1, for AddBatch
  absl::flat_hash_map<uint64_t, uint64_t> expected;
  bool own_chains = false;  // a diagnostic: no goal is reported on it
};

// Keys are scrambled 64-bit values, as stack IDs are hashes. With `phase_switch`, halfway
// through the popularity ranks rotate by half the key space: the hot keys of the second
// half were cold (and inserted late, at chain tails) in the first half. With `own_chains`,
// keys that would share a chain in the table are skipped, so every key heads a chain of
// its own: the same stream without what chains cost (a diagnostic, not a workload).
Stream MakeStream(double s, bool phase_switch, bool own_chains, size_t updates) {
  Stream out;
  char name[64];
  std::snprintf(name, sizeof name, "Zipf s=%.1f%s%s", s, phase_switch ? ", phase switch" : "",
                own_chains ? ", a chain per key" : "");
  out.name = name;
  out.own_chains = own_chains;
  std::vector<uint64_t> key_of_rank(kDistinctKeys);
  {
    const CountTable layout = *CountTable::Create({.max_entries = kDistinctKeys});
    std::vector<bool> taken(layout.bucket_count());
    uint64_t x = 0;
    for (uint64_t& key : key_of_rank) {
      do {
        key = SplitMix64(x++);  // bijective: distinct x give distinct keys
      } while (own_chains && taken[layout.BucketIndex(key)]);
      taken[layout.BucketIndex(key)] = true;
    }
  }
  std::vector<double> cdf(kDistinctKeys);
  double sum = 0;
  for (uint32_t r = 0; r < kDistinctKeys; ++r) cdf[r] = sum += 1.0 / std::pow(r + 1.0, s);
  for (double& c : cdf) c /= sum;
  std::mt19937_64 rng(20240601 + static_cast<int>(std::lround(s * 100)));
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  out.keys.resize(updates);
  for (size_t i = 0; i < updates; ++i) {
    uint32_t rank = static_cast<uint32_t>(
        std::min<size_t>(std::lower_bound(cdf.begin(), cdf.end(), uniform(rng)) - cdf.begin(),
                         kDistinctKeys - 1));
    if (phase_switch && i >= updates / 2) rank = (rank + kDistinctKeys / 2) % kDistinctKeys;
    out.keys[i] = key_of_rank[rank];
  }
  out.items.reserve(updates);
  for (uint64_t key : out.keys) out.items.push_back({key, 1});
  for (uint64_t key : out.keys) ++out.expected[key];
  return out;
}

double CpuSeconds() {
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

// One timed run of one contender on one stream.
struct Run {
  double seconds = 0;
  double probe_first = 0, probe_after = 0, probe_final = 0;  // 0: not applicable
  double probe_ideal = 0;  // the table: probe_final with every chain ordered by final count
  double memory_mb = 0;
  uint64_t chains_sorted = 0;
  uint64_t entries_passed = 0;
};

[[noreturn]] void Fail(const std::string& contender, const std::string& what) {
  std::fprintf(stderr, "%s: %s\n", contender.c_str(), what.c_str());
  std::exit(1);
}

template <typename Map>
void CheckCounts(const std::string& contender, const Stream& stream, const Map& map) {
  if (map.size() != stream.expected.size()) Fail(contender, "wrong number of keys");
  for (const auto& [key, count] : map) {
    auto it = stream.expected.find(key);
    if (it == stream.expected.end() || it->second != count) Fail(contender, "wrong count");
  }
}

// The table, fed one Add per update or AddBatch with 1024 items per call (the server and the
// agent hand over batches).
Run RunStrata(const std::string& name, const Stream& stream, SortedTableOptions options,
              bool batched) {
  options.max_entries = kDistinctKeys;
  absl::StatusOr<CountTable> created = CountTable::Create(options);
  if (!created.ok()) Fail(name, std::string(created.status().message()));
  CountTable& table = *created;
  const size_t period = options.period;
  const size_t n = stream.keys.size();
  TableStats first;
  const double start = CpuSeconds();
  if (batched) {
    constexpr size_t kBatch = 1024;
    for (size_t i = 0; i < n; i += kBatch) {
      const size_t batch = std::min(kBatch, n - i);
      const size_t stored = table.AddBatch(std::span(stream.items).subspan(i, batch));
      if (stored != batch) Fail(name, "table full");
      if (i < period && i + kBatch >= period) first = table.stats();  // ~ the first period
    }
  } else {
    // A local span, as the maps' range-for loops have: the table's stores cannot move it.
    const std::span<const uint64_t> keys(stream.keys);
    const size_t first_end = std::min(period, n);
    for (uint64_t key : keys.first(first_end)) table.Add(key);
    first = table.stats();  // the first sort has just run, at the end of the first period
    for (uint64_t key : keys.subspan(first_end)) table.Add(key);
  }
  Run run;
  run.seconds = CpuSeconds() - start;

  absl::flat_hash_map<uint64_t, uint64_t> contents;
  table.ForEach([&](uint64_t key, uint64_t count) { contents[key] = count; });
  CheckCounts(name, stream, contents);
  const TableStats end = table.stats();
  if (end.updates != n) Fail(name, "wrong number of updates");
  run.probe_first = first.MeanHitProbeLengthSince(TableStats());
  run.probe_after = end.MeanHitProbeLengthSince(first);
  uint64_t weighted = 0, total = 0;
  table.ForEach([&](uint64_t key, uint64_t count) {
    weighted += count * table.ProbeLength(key);
    total += count;
  });
  run.probe_final = static_cast<double>(weighted) / static_cast<double>(total);
  // What no order of the chains can beat: each chain's counts in descending order.
  uint64_t ideal = 0;
  std::vector<uint64_t> chain;
  for (uint32_t b = 0; b < table.bucket_count(); ++b) {
    chain.clear();
    table.ForEachInChain(b, [&](uint64_t, uint64_t count, uint32_t) { chain.push_back(count); });
    std::sort(chain.begin(), chain.end(), std::greater<>());
    for (size_t p = 0; p < chain.size(); ++p) ideal += chain[p] * (p + 1);
  }
  run.probe_ideal = static_cast<double>(ideal) / static_cast<double>(total);
  run.memory_mb = static_cast<double>(table.memory_bytes()) / 1e6;
  run.chains_sorted = end.chains_sorted;
  run.entries_passed = end.entries_passed;
  return run;
}

Run RunStdUnorderedMap(const std::string& name, const Stream& stream) {
  std::unordered_map<uint64_t, uint64_t> map;
  map.reserve(kDistinctKeys);
  const double start = CpuSeconds();
  for (uint64_t key : stream.keys) ++map[key];
  Run run;
  run.seconds = CpuSeconds() - start;
  CheckCounts(name, stream, map);
  uint64_t weighted = 0, total = 0;
  for (size_t b = 0; b < map.bucket_count(); ++b) {
    uint64_t position = 0;
    for (auto it = map.begin(b); it != map.end(b); ++it) {
      weighted += it->second * ++position;
      total += it->second;
    }
  }
  run.probe_final = static_cast<double>(weighted) / static_cast<double>(total);
  run.memory_mb = (map.bucket_count() * sizeof(void*) + map.size() * 32.0) / 1e6;
  return run;
}

// Groups probed per update in an absl map's final layout, count-weighted (1: the first).
template <typename Map, typename CountOf>
double AbslFinalProbe(const Map& map, CountOf count_of) {
  uint64_t weighted = 0, total = 0;
  for (const auto& [key, value] : map) {
    const uint64_t count = count_of(value);
    weighted += count * (1 + absl::container_internal::GetHashtableDebugNumProbes(map, key));
    total += count;
  }
  return static_cast<double>(weighted) / static_cast<double>(total);
}

// With `prefetch`, absl's own prefetch 8 keys ahead (the analogue of AddBatch).
Run RunAbslFlatHashMap(const std::string& name, const Stream& stream, bool prefetch) {
  absl::flat_hash_map<uint64_t, uint64_t> map;
  map.reserve(kDistinctKeys);
  const std::vector<uint64_t>& keys = stream.keys;
  const double start = CpuSeconds();
  if (prefetch) {
    for (size_t i = 0; i < keys.size(); ++i) {
      if (i + 8 < keys.size()) map.prefetch(keys[i + 8]);
      ++map[keys[i]];
    }
  } else {
    for (uint64_t key : keys) ++map[key];
  }
  Run run;
  run.seconds = CpuSeconds() - start;
  CheckCounts(name, stream, map);
  run.probe_final = AbslFinalProbe(map, [](uint64_t count) { return count; });
  run.memory_mb = map.capacity() * (sizeof(std::pair<uint64_t, uint64_t>) + 1.0) / 1e6;
  return run;
}

// absl::flat_hash_map doing per update what the sorted table does besides finding the entry:
// the entry's count of the current period (the table's tagged period word: reset when its
// tag is stale, by a mask), keys that cross frequency_threshold recorded, the period counted
// down and ended. No sorting: what the table's bookkeeping costs a map that finds entries as
// absl does. There is no sweep of stale words: 10 M updates are 152 periods, fewer than the
// 255 tags; past 255 periods (--updates over 16.7 M) a stale word can pass for current, which
// changes period counts (checked nowhere here), not the work per update.
Run RunAbslWithPeriodCounts(const std::string& name, const Stream& stream) {
  struct Entry {  // 8 bytes: 16-byte slots, as the plain map's
    uint32_t count;
    uint32_t period;  // tag << 24 | count in the tag's period
  };
  absl::flat_hash_map<uint64_t, Entry> map;
  map.reserve(kDistinctKeys);
  const SortedTableOptions defaults;
  const uint32_t hot_min = defaults.frequency_threshold + 1;
  constexpr uint32_t kLimit = CountTable::kPeriodCountLimit;
  std::vector<uint64_t> hot;  // this period's keys over the threshold
  hot.reserve(defaults.period / hot_min + 1);
  uint32_t epoch = 0;
  uint32_t base = 1u << 24;
  int64_t left = defaults.period;
  size_t hot_seen = 0;
  const double start = CpuSeconds();
  for (uint64_t key : stream.keys) {
    Entry& e = map[key];
    ++e.count;
    const uint32_t delta = e.period ^ base;
    uint32_t stale = uint32_t{delta <= kLimit} - 1u;  // all ones if stale
    // Opaque to the optimizer, so that the mask stays a mask (as it compiles in the table):
    // GCC otherwise branches on it, and most hits on cold keys find a stale word.
    asm("" : "+r"(stale));
    const uint32_t n = (delta & ~stale) + 1;
    e.period = base + n;
    if (n == hot_min || n > kLimit) [[unlikely]] {
      e.period = base + std::min(n, kLimit);
      if (n == hot_min) hot.push_back(key);
    }
    if (--left == 0) [[unlikely]] {
      left = defaults.period;
      base = (1 + ++epoch % 255) << 24;
      hot_seen += hot.size();
      hot.clear();
    }
  }
  Run run;
  run.seconds = CpuSeconds() - start;
  absl::flat_hash_map<uint64_t, uint64_t> contents;
  for (const auto& [key, entry] : map) contents[key] = entry.count;
  CheckCounts(name, stream, contents);
  if (hot_seen + hot.size() == 0) Fail(name, "no key crossed the threshold");
  run.probe_final = AbslFinalProbe(map, [](const Entry& e) { return e.count; });
  run.memory_mb = map.capacity() * (sizeof(std::pair<uint64_t, Entry>) + 1.0) / 1e6;
  return run;
}

struct Contender {
  std::string name;
  std::function<Run(const Stream&)> run;
  std::vector<Run> runs;  // one per round

  double Rate(const Run& r, size_t updates) const { return updates / r.seconds / 1e6; }
  double MedianRate(size_t updates) const {
    std::vector<double> rates;
    for (const Run& r : runs) rates.push_back(Rate(r, updates));
    std::sort(rates.begin(), rates.end());
    const size_t m = rates.size() / 2;
    return rates.size() % 2 == 1 ? rates[m] : (rates[m - 1] + rates[m]) / 2;
  }
  // This contender's rate against `anchor`'s in the same round (runs a fraction of a second
  // apart, which a host whose speed drifts within a run moves alike): the median, lowest and
  // highest over the rounds.
  struct PairedRatios {
    double median, lowest, highest;
  };
  PairedRatios PairedWith(const Contender& anchor) const {
    std::vector<double> ratios;
    for (size_t r = 0; r < runs.size() && r < anchor.runs.size(); ++r) {
      ratios.push_back(anchor.runs[r].seconds / runs[r].seconds);
    }
    std::sort(ratios.begin(), ratios.end());
    const size_t m = ratios.size() / 2;
    return {ratios.size() % 2 == 1 ? ratios[m] : (ratios[m - 1] + ratios[m]) / 2,
            ratios.front(), ratios.back()};
  }
  double BestRate(size_t updates) const {
    double best = 0;
    for (const Run& r : runs) best = std::max(best, Rate(r, updates));
    return best;
  }
};

constexpr const char* kStd = "std::unordered_map";
constexpr const char* kAbsl = "absl::flat_hash_map";
constexpr const char* kAbslPeriod = "absl + period counts";
constexpr const char* kSortedAdd = "strata sorted, Add";
constexpr const char* kSortedBatch = "strata sorted, AddBatch";

std::vector<Contender> MakeContenders() {
  const SortedTableOptions sorted;  // the defaults: sorting on, 2^17 buckets for 100k keys
  const SortedTableOptions unsorted{.sorting = false};
  // A quarter of the buckets (mean chain length ~3 when full): less memory, deeper chains.
  const SortedTableOptions deep{.bucket_count = kDistinctKeys / 4};
  const SortedTableOptions deep_unsorted{.bucket_count = kDistinctKeys / 4, .sorting = false};
  auto strata = [](const char* name, SortedTableOptions options, bool batched) {
    return Contender{name, [=](const Stream& s) { return RunStrata(name, s, options, batched); },
                     {}};
  };
  std::vector<Contender> out;
  out.push_back(strata(kSortedAdd, sorted, false));
  out.push_back(strata(kSortedBatch, sorted, true));
  out.push_back(strata("strata sorting off, Add", unsorted, false));
  out.push_back(strata("strata deep sorted, Add", deep, false));
  out.push_back(strata("strata deep sorting off, Add", deep_unsorted, false));
  out.push_back({kStd, [](const Stream& s) { return RunStdUnorderedMap(kStd, s); }, {}});
  out.push_back({kAbsl, [](const Stream& s) { return RunAbslFlatHashMap(kAbsl, s, false); }, {}});
  out.push_back({"absl::flat_hash_map, prefetch",
                 [](const Stream& s) {
                   return RunAbslFlatHashMap("absl::flat_hash_map, prefetch", s, true);
                 },
                 {}});
  out.push_back({kAbslPeriod,
                 [](const Stream& s) { return RunAbslWithPeriodCounts(kAbslPeriod, s); },
                 {}});
  return out;
}

const Contender* Find(const std::vector<Contender>& contenders, const char* name) {
  for (const Contender& c : contenders) {
    if (c.name == name) return &c;
  }
  return nullptr;
}

void Report(const Stream& stream, const std::vector<Contender>& contenders, int rounds) {
  const size_t n = stream.keys.size();
  std::printf("\n%s: %zu updates, %zu distinct keys (of %u), %d rounds, CPU time\n",
              stream.name.c_str(), n, stream.expected.size(), kDistinctKeys, rounds);
  std::printf("%-30s %9s %9s %7s %7s %7s %7s %7s %7s %7s %7s %8s\n", "contender", "M upd/s",
              "best", "x std", "x absl", "probe1", "probe2", "final", "ideal", "MB", "sorts",
              "passes");
  const double std_rate = Find(contenders, kStd)->MedianRate(n);  // the baselines always run
  const double absl_rate = Find(contenders, kAbsl)->MedianRate(n);
  for (const Contender& c : contenders) {
    const Run& last = c.runs.back();  // probe lengths and memory are the same every round
    const double rate = c.MedianRate(n);
    std::printf("%-30s %9.1f %9.1f %7.2f %7.2f ", c.name.c_str(), rate, c.BestRate(n),
                rate / std_rate, rate / absl_rate);
    if (last.probe_first > 0) {
      std::printf("%7.3f %7.3f ", last.probe_first, last.probe_after);
    } else {
      std::printf("%7s %7s ", "-", "-");
    }
    std::printf("%7.3f ", last.probe_final);
    if (last.probe_ideal > 0) {
      std::printf("%7.3f ", last.probe_ideal);
    } else {
      std::printf("%7s ", "-");
    }
    std::printf("%7.2f ", last.memory_mb);
    if (c.name.starts_with("strata")) {
      std::printf("%7llu %8llu\n", static_cast<unsigned long long>(last.chains_sorted),
                  static_cast<unsigned long long>(last.entries_passed));
    } else {
      std::printf("%7s %8s\n", "-", "-");
    }
  }
  for (const char* name : {kSortedAdd, kSortedBatch}) {
    if (stream.own_chains) break;
    const Contender* c = Find(contenders, name);
    if (c == nullptr) continue;  // left out by --only
    const double rate = c->MedianRate(n);
    const Contender& absl = *Find(contenders, kAbsl);
    const Contender::PairedRatios paired = c->PairedWith(absl);
    // A host whose speed swings within a run can put one of these above 1 by chance: the goal
    // is met against absl only if the medians' ratio, the rounds' median ratio and the best
    // rounds' ratio (a neighbour only ever slows a round) all say so.
    const double best_ratio = c->BestRate(n) / absl.BestRate(n);
    const bool absl_met = rate >= absl_rate && paired.median >= 1 && best_ratio >= 1;
    std::printf("goal (%s): >= 2x std::unordered_map %s (%.2fx), >= absl::flat_hash_map %s "
                "(%.2fx; round by round %.2fx, %.2fx-%.2fx; best against best %.2fx)\n",
                name, rate >= 2 * std_rate ? "met" : "NOT met", rate / std_rate,
                absl_met ? "met" : "NOT met", rate / absl_rate, paired.median, paired.lowest,
                paired.highest, best_ratio);
    if (const Contender* like = Find(contenders, kAbslPeriod); like != nullptr) {
      std::printf("  (%s) against absl keeping the same period counts: %.2fx\n", name,
                  rate / like->MedianRate(n));
    }
  }
}

// The hot-paths query: TopN(100) of a full table, microseconds per call.
void ReportTopN(const Stream& stream) {
  absl::StatusOr<CountTable> table = CountTable::Create({.max_entries = kDistinctKeys});
  for (uint64_t key : stream.keys) table->Add(key);
  constexpr int kCalls = 200;
  size_t sink = 0;
  const double start = CpuSeconds();
  for (int i = 0; i < kCalls; ++i) sink += table->TopN(100).size();
  const double us = (CpuSeconds() - start) / kCalls * 1e6;
  std::printf("\nTopN(100) of %zu entries (%s): %.0f us per call (%zu)\n", table->size(),
              stream.name.c_str(), us, sink / kCalls);
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 5;
  size_t updates = 10'000'000;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--rounds=", 9) == 0) {
      rounds = std::max(1, std::atoi(argv[i] + 9));
    } else if (std::strncmp(argv[i], "--updates=", 10) == 0) {
      updates = std::max<size_t>(kDistinctKeys, std::strtoull(argv[i] + 10, nullptr, 10));
    } else if (std::strncmp(argv[i], "--only=", 7) == 0) {
      only = argv[i] + 7;
    } else {
      std::fprintf(stderr, "usage: %s [--rounds=N] [--updates=N] [--only=SUBSTRING]\n", argv[0]);
      return 2;
    }
  }
  const struct {
    double s;
    bool phase_switch;
    bool own_chains;
  } kStreams[] = {{0.8, false, false}, {1.1, false, false}, {1.1, true, false}, {0.8, false, true}};
  for (const auto& spec : kStreams) {
    const Stream stream = MakeStream(spec.s, spec.phase_switch, spec.own_chains, updates);
    std::vector<Contender> contenders = MakeContenders();
    std::erase_if(contenders, [&](const Contender& c) {
      return c.name.find(only) == std::string::npos && c.name != kStd && c.name != kAbsl &&
             c.name != kAbslPeriod;
    });
    for (int round = 0; round < rounds; ++round) {
      for (Contender& c : contenders) c.runs.push_back(c.run(stream));
    }
    Report(stream, contenders, rounds);
    if (spec.s == 1.1 && !spec.phase_switch && !spec.own_chains) ReportTopN(stream);
  }
  return 0;
}
