// Aggregation throughput of strata::table::SortedTable against std::unordered_map and
// absl::flat_hash_map: 10 M updates of Zipf-distributed stack IDs (100,000 distinct keys,
// s = 0.8 and 1.1), every container bounded to 100,000 entries (the maps reserve that many).
// Keys are scrambled 64-bit values, as stack IDs are hashes. The key stream is generated once
// per exponent, outside the timed loop.
//
// Times are CPU time (the build machine is shared). Counters: items_per_second = updates/s; probe_* = mean chain position of hits (1 = head):
// probe_first_period is before any sort could happen, probe_after the rest of the stream,
// probe_final the count-weighted mean position in the final layout (for the maps: chain
// position in std::unordered_map, groups probed in absl::flat_hash_map); mem_MB = bytes the
// container holds at the bound.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <unordered_map>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/internal/hashtable_debug.h"
#include "benchmark/benchmark.h"
#include "common/table/sorted_table.h"

namespace {

constexpr uint32_t kDistinctKeys = 100'000;
constexpr size_t kUpdates = 10'000'000;

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// The stream for exponent s (scaled by 100 in the benchmark argument); one cached at a time.
// Arguments above 1000 mean the same exponent with a phase switch: halfway through, the
// popularity ranks rotate by half the key space, so the hot keys of the second half are keys
// that were cold (and inserted late, at chain tails) in the first half.
const std::vector<uint64_t>& ZipfStream(int arg) {
  static int cached_arg = -1;
  static std::vector<uint64_t> stream;
  if (cached_arg == arg) return stream;
  const bool phase_switch = arg > 1000;
  const int s_times_100 = arg % 1000;
  const double s = s_times_100 / 100.0;
  std::vector<double> cdf(kDistinctKeys);
  double sum = 0;
  for (uint32_t r = 0; r < kDistinctKeys; ++r) cdf[r] = sum += 1.0 / std::pow(r + 1.0, s);
  for (double& c : cdf) c /= sum;
  std::mt19937_64 rng(20240601 + s_times_100);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  stream.resize(kUpdates);
  for (size_t i = 0; i < kUpdates; ++i) {
    uint32_t rank = static_cast<uint32_t>(
        std::min<size_t>(std::lower_bound(cdf.begin(), cdf.end(), uniform(rng)) - cdf.begin(),
                         kDistinctKeys - 1));
    if (phase_switch && i >= kUpdates / 2) rank = (rank + kDistinctKeys / 2) % kDistinctKeys;
    stream[i] = SplitMix64(rank);  // bijective: distinct ranks give distinct keys
  }
  cached_arg = arg;
  return stream;
}

using strata::table::CountTable;
using strata::table::SortedTableOptions;
using strata::table::TableStats;

void RunStrata(benchmark::State& state, bool sorting, uint32_t bucket_count, bool batched = false,
               uint32_t frequency_threshold = SortedTableOptions().frequency_threshold) {
  const std::vector<uint64_t>& stream = ZipfStream(static_cast<int>(state.range(0)));
  SortedTableOptions options{.max_entries = kDistinctKeys, .bucket_count = bucket_count,
                             .sorting = sorting, .frequency_threshold = frequency_threshold};
  TableStats first, end;
  double probe_final = 0;
  size_t memory = 0;
  for (auto _ : state) {
    state.PauseTiming();
    absl::StatusOr<CountTable> created = CountTable::Create(options);
    if (!created.ok()) {
      state.SkipWithError(std::string(created.status().message()).c_str());
      return;
    }
    CountTable* table = &*created;
    state.ResumeTiming();
    const size_t period = options.period;
    if (batched) {
      // The server and agent hand over batches; 1024 (key, 1) items per call.
      std::vector<strata::table::KeyCount<uint64_t>> batch(1024);
      for (size_t i = 0; i < stream.size(); i += batch.size()) {
        const size_t n = std::min(batch.size(), stream.size() - i);
        for (size_t j = 0; j < n; ++j) batch[j] = {stream[i + j], 1};
        table->AddBatch(std::span(batch.data(), n));
        if (i + n == period) first = table->stats();
      }
    } else {
      for (size_t i = 0; i < period; ++i) table->Add(stream[i]);
      first = table->stats();  // the first sort has just run, at the end of the first period
      for (size_t i = period; i < stream.size(); ++i) table->Add(stream[i]);
    }
    benchmark::ClobberMemory();
    state.PauseTiming();
    end = table->stats();
    uint64_t weighted = 0, total = 0;
    for (uint32_t b = 0; b < table->bucket_count(); ++b) {
      uint64_t position = 0;
      table->ForEachInChain(b, [&](uint64_t, uint64_t count, uint32_t) {
        weighted += count * ++position;
        total += count;
      });
    }
    probe_final = static_cast<double>(weighted) / total;
    memory = table->memory_bytes();
    state.ResumeTiming();
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * stream.size()));
  TableStats none;
  state.counters["probe_first_period"] = first.MeanHitProbeLengthSince(none);
  state.counters["probe_after"] = end.MeanHitProbeLengthSince(first);
  state.counters["probe_final"] = probe_final;
  state.counters["chains_sorted"] = static_cast<double>(end.chains_sorted);
  state.counters["phase_changes"] = static_cast<double>(end.phase_changes);
  state.counters["mem_MB"] = memory / 1e6;
}

void BM_StrataSorted(benchmark::State& state) { RunStrata(state, true, 0); }
void BM_StrataUnsorted(benchmark::State& state) { RunStrata(state, false, 0); }
// A quarter of the buckets (mean chain length 4 when full): less memory, deeper chains.
void BM_StrataSortedDeep(benchmark::State& state) { RunStrata(state, true, kDistinctKeys / 4); }
void BM_StrataUnsortedDeep(benchmark::State& state) { RunStrata(state, false, kDistinctKeys / 4); }
// Deep chains, and entries with more than 4 counts per period (not 64) count as hot.
void BM_StrataSortedDeepT4(benchmark::State& state) {
  RunStrata(state, true, kDistinctKeys / 4, false, 4);
}

void BM_StrataSortedBatch(benchmark::State& state) { RunStrata(state, true, 0, true); }

void BM_StdUnorderedMap(benchmark::State& state) {
  const std::vector<uint64_t>& stream = ZipfStream(static_cast<int>(state.range(0)));
  double probe_final = 0, memory = 0;
  for (auto _ : state) {
    state.PauseTiming();
    std::unordered_map<uint64_t, uint64_t> map;
    map.reserve(kDistinctKeys);
    state.ResumeTiming();
    for (uint64_t key : stream) ++map[key];
    benchmark::ClobberMemory();
    state.PauseTiming();
    uint64_t weighted = 0, total = 0;
    for (size_t b = 0; b < map.bucket_count(); ++b) {
      uint64_t position = 0;
      for (auto it = map.begin(b); it != map.end(b); ++it) {
        weighted += it->second * ++position;
        total += it->second;
      }
    }
    probe_final = static_cast<double>(weighted) / total;
    // Bucket pointers plus one node (next pointer + pair, as malloc rounds it: 32 bytes).
    memory = map.bucket_count() * sizeof(void*) + map.size() * 32.0;
    state.ResumeTiming();
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * stream.size()));
  state.counters["probe_final"] = probe_final;
  state.counters["mem_MB"] = memory / 1e6;
}

void BM_AbslFlatHashMap(benchmark::State& state) {
  const std::vector<uint64_t>& stream = ZipfStream(static_cast<int>(state.range(0)));
  double probe_final = 0, memory = 0;
  for (auto _ : state) {
    state.PauseTiming();
    absl::flat_hash_map<uint64_t, uint64_t> map;
    map.reserve(kDistinctKeys);
    state.ResumeTiming();
    for (uint64_t key : stream) ++map[key];
    benchmark::ClobberMemory();
    state.PauseTiming();
    uint64_t weighted = 0, total = 0;
    for (const auto& [key, count] : map) {
      weighted += count * (1 + absl::container_internal::GetHashtableDebugNumProbes(map, key));
      total += count;
    }
    probe_final = static_cast<double>(weighted) / total;
    memory = map.capacity() * (sizeof(std::pair<uint64_t, uint64_t>) + 1.0);
    state.ResumeTiming();
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * stream.size()));
  state.counters["probe_final"] = probe_final;
  state.counters["mem_MB"] = memory / 1e6;
}

// The same loop as above with absl's own prefetch 8 keys ahead (the analogue of AddBatch).
void BM_AbslFlatHashMapPrefetch(benchmark::State& state) {
  const std::vector<uint64_t>& stream = ZipfStream(static_cast<int>(state.range(0)));
  for (auto _ : state) {
    state.PauseTiming();
    absl::flat_hash_map<uint64_t, uint64_t> map;
    map.reserve(kDistinctKeys);
    state.ResumeTiming();
    for (size_t i = 0; i < stream.size(); ++i) {
      if (i + 8 < stream.size()) map.prefetch(stream[i + 8]);
      ++map[stream[i]];
    }
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * stream.size()));
}

// The hot-paths query: top 100 of a full table.
void BM_StrataTop100(benchmark::State& state) {
  const std::vector<uint64_t>& stream = ZipfStream(static_cast<int>(state.range(0)));
  absl::StatusOr<CountTable> table = CountTable::Create({.max_entries = kDistinctKeys});
  for (uint64_t key : stream) table->Add(key);
  for (auto _ : state) benchmark::DoNotOptimize(table->TopN(100));
  state.counters["entries"] = static_cast<double>(table->size());
}

// Exponents 0.8 and 1.1; each contender runs on the same cached stream back to back.
#define STRATA_TABLE_BENCH(fn) \
  BENCHMARK(fn)->Arg(80)->Iterations(3)->Unit(benchmark::kMillisecond)
#define STRATA_TABLE_BENCH_11(fn) \
  BENCHMARK(fn)->Arg(110)->Iterations(3)->Unit(benchmark::kMillisecond)

STRATA_TABLE_BENCH(BM_StrataSorted);
STRATA_TABLE_BENCH(BM_StrataUnsorted);
STRATA_TABLE_BENCH(BM_StrataSortedDeep);
STRATA_TABLE_BENCH(BM_StrataUnsortedDeep);
STRATA_TABLE_BENCH(BM_StdUnorderedMap);
STRATA_TABLE_BENCH(BM_AbslFlatHashMap);
STRATA_TABLE_BENCH(BM_StrataSortedBatch);
STRATA_TABLE_BENCH(BM_AbslFlatHashMapPrefetch);
STRATA_TABLE_BENCH_11(BM_StrataSorted);
STRATA_TABLE_BENCH_11(BM_StrataUnsorted);
STRATA_TABLE_BENCH_11(BM_StrataSortedDeep);
STRATA_TABLE_BENCH_11(BM_StrataUnsortedDeep);
STRATA_TABLE_BENCH_11(BM_StdUnorderedMap);
STRATA_TABLE_BENCH_11(BM_AbslFlatHashMap);
STRATA_TABLE_BENCH_11(BM_StrataSortedBatch);
STRATA_TABLE_BENCH_11(BM_AbslFlatHashMapPrefetch);
// Zipf 1.1 with a phase switch halfway: where sorting has work to do.
#define STRATA_TABLE_BENCH_SWITCH(fn) \
  BENCHMARK(fn)->Arg(1110)->Iterations(3)->Unit(benchmark::kMillisecond)
STRATA_TABLE_BENCH_SWITCH(BM_StrataSorted);
STRATA_TABLE_BENCH_SWITCH(BM_StrataUnsorted);
STRATA_TABLE_BENCH_SWITCH(BM_StrataSortedDeep);
STRATA_TABLE_BENCH_SWITCH(BM_StrataUnsortedDeep);
STRATA_TABLE_BENCH_SWITCH(BM_StrataSortedDeepT4);
STRATA_TABLE_BENCH_SWITCH(BM_AbslFlatHashMap);

BENCHMARK(BM_StrataTop100)->Arg(110)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
