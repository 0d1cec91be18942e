// query_benchmark: query latency over a week of one service's profiles.
//
// Fill (through the Store API, as ingest writes it): one service, `--stacks` distinct stacks
// (default 100,000; depth 6-30, drawn as paths of a random call tree over 5,000 functions)
// over `--days` days of 10 s windows. Each window holds `--zipf-cells` cells drawn from a
// Zipf(1.1) distribution over all stacks (the hot set, 1-20 samples each) plus
// `--sweep-cells` cells that sweep through every stack in turn (the long tail), so every stack
// occurs and each hour holds a few thousand distinct stacks. The store is compacted after the
// fill, as a long-running server would have done by then.
//
// Then, for ranges of 1 h, 24 h and 7 d ending mid-hour at the end of the data: p50/p99 of
// flame graph (JSON rendering, default node budget), top (20 functions) and diff (the last
// half of the range against the first half, i.e. the same amount of data), in process through
// QueryService::Run*, plus Grafana's flame graph call (server/grafana, binary Connect body)
// and the timeline (Series, about 100 intervals). The first (cold cache) run of each is
// reported separately: it fills the store's per-hour and per-minute aggregates and the
// reader's resolved stacks, which later runs reuse. Per range it prints the cells read from
// RocksDB (all runs; one warm load) and the hour and minute blocks used; then a stage
// breakdown of a warm 1 h and 7 d query (load, flame tree, JSON, top, diff). For comparison
// the same loads run once more reading raw 10 s cells only.
//
//   query_benchmark [--data DIR] [--reuse] [--iterations N] [--hour-block-mib N]
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "common/base/process_memory.h"
#include "querier/v1/querier.pb.h"
#include "server/grafana/querier.h"
#include "server/query/diff.h"
#include "server/query/flamegraph.h"
#include "server/query/profile.h"
#include "server/query/query_service.h"
#include "server/registry/agent_registry.h"
#include "server/store/store.h"

namespace {

using Clock = std::chrono::steady_clock;
constexpr int64_t kWindowMs = 10'000;
constexpr int64_t kHourMs = 3'600'000;
constexpr int64_t kDayMs = 24 * kHourMs;

struct Options {
  std::string data = "/tmp/strata_query_benchmark";
  bool reuse = false;
  int stacks = 100'000;
  int days = 7;
  int zipf_cells = 24;
  int sweep_cells = 6;
  int iterations = 20;
  size_t hour_block_mib = 256;
  std::vector<std::string> ranges = {"1h", "24h", "7d"};
  bool malloc_defaults = false;
};

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

// Zipf over [0, n) by inverse CDF table.
class Zipf {
 public:
  Zipf(int n, double s) : cdf_(n) {
    double sum = 0;
    for (int i = 0; i < n; ++i) cdf_[i] = (sum += 1.0 / std::pow(i + 1, s));
    for (double& c : cdf_) c /= sum;
  }
  int operator()(std::mt19937_64& rng) {
    const double u = std::uniform_real_distribution<double>(0, 1)(rng);
    return static_cast<int>(std::lower_bound(cdf_.begin(), cdf_.end(), u) - cdf_.begin());
  }

 private:
  std::vector<double> cdf_;
};

int64_t Fill(const Options& o, int64_t t0) {
  strata::server::store::StoreOptions so;
  auto store = strata::server::store::Store::Open(o.data, so);
  if (!store.ok()) {
    std::fprintf(stderr, "open: %s\n", store.status().ToString().c_str());
    std::exit(1);
  }
  std::mt19937_64 rng(42);
  const auto start = Clock::now();

  // Functions and stacks: a random call tree of 5,000 functions; each stack is a path from
  // main through it (caller chosen from a small fan-out so paths share prefixes, as real
  // profiles do).
  strata::server::store::WriteBatch batch;
  constexpr int kFunctions = 5000;
  std::vector<uint64_t> fids(kFunctions);
  for (int i = 0; i < kFunctions; ++i) {
    auto id = (*store)->interner().InternFunction(
        {absl::StrCat(i == 0 ? "main" : "fn_", i), "/usr/bin/bench_service", "",
         static_cast<uint64_t>(i) * 64},
        &batch);
    fids[i] = *id;
  }
  std::vector<uint64_t> stack_ids;
  stack_ids.reserve(o.stacks);
  for (int s = 0; s < o.stacks; ++s) {
    strata::server::store::StackFrames frames;
    const int depth = 6 + static_cast<int>(rng() % 25);
    uint64_t f = 0;
    frames.function_ids.push_back(fids[0]);
    for (int d = 1; d < depth; ++d) {
      // Fan-out 4 near the root, wider deeper down; the last frame makes the stack distinct.
      const uint64_t fan = d < 4 ? 4 : 40;
      f = (f * 7 + 1 + rng() % fan) % kFunctions;
      frames.function_ids.push_back(fids[f]);
    }
    frames.function_ids.push_back(fids[1 + s % (kFunctions - 1)]);
    frames.truncated = false;
    auto id = (*store)->interner().InternStack(frames, &batch);
    // Distinct content → distinct ID; duplicate paths are possible, count the distinct ones.
    stack_ids.push_back(*id);
    if (s % 10'000 == 9'999) (void)(*store)->Commit(&batch);
  }
  (void)(*store)->Commit(&batch);
  std::sort(stack_ids.begin(), stack_ids.end());
  const size_t distinct =
      std::unique(stack_ids.begin(), stack_ids.end()) - stack_ids.begin();
  stack_ids.resize(distinct);
  std::shuffle(stack_ids.begin(), stack_ids.end(), rng);

  Zipf zipf(static_cast<int>(stack_ids.size()), 1.1);
  const int64_t windows = o.days * kDayMs / kWindowMs;
  uint64_t cells = 0, samples = 0;
  size_t sweep = 0;
  for (int64_t w = 0; w < windows; ++w) {
    const int64_t window = t0 + w * kWindowMs;
    for (int c = 0; c < o.zipf_cells; ++c) {
      const uint64_t n = 1 + rng() % 20;
      batch.AddSamples("bench", window, "host-1", stack_ids[zipf(rng)], n);
      samples += n;
    }
    for (int c = 0; c < o.sweep_cells; ++c) {
      batch.AddSamples("bench", window, "host-1", stack_ids[sweep++ % stack_ids.size()], 1);
      samples += 1;
    }
    cells += o.zipf_cells + o.sweep_cells;
    if (w % 360 == 359 || w + 1 == windows) {
      if (auto st = (*store)->Commit(&batch); !st.ok()) {
        std::fprintf(stderr, "commit: %s\n", st.ToString().c_str());
        std::exit(1);
      }
    }
  }
  const auto filled = Clock::now();
  // The server's background roller sums every whole minute and hour into the rollups as
  // they end; a store filled at once rolls up at once.
  const int64_t end = t0 + windows * kWindowMs;
  if (absl::Status st = (*store)->RollUp(end); !st.ok()) {
    std::fprintf(stderr, "roll-up: %s\n", st.ToString().c_str());
    std::exit(1);
  }
  const auto rolled = Clock::now();
  (void)(*store)->CompactAll();
  const auto compacted = Clock::now();
  std::printf(
      "fill: %zu distinct stacks, %lld windows, %llu cells (%.0f per window), %llu samples in "
      "%.1f s; roll-up %.1f s; compaction %.1f s; %.1f MiB on disk\n",
      distinct, static_cast<long long>(windows), static_cast<unsigned long long>(cells),
      static_cast<double>(cells) / windows, static_cast<unsigned long long>(samples),
      Ms(filled - start) / 1000, Ms(rolled - filled) / 1000, Ms(compacted - rolled) / 1000,
      (*store)->ApproximateBytesOnDisk() / 1048576.0);
  (void)(*store)->Close();
  return end;
}

// The benchmark service's profile over [from_ms, to_ms).
strata::server::query::ProfileQuery BenchQuery(int64_t from_ms, int64_t to_ms) {
  strata::server::query::ProfileQuery q;
  q.service = "bench";
  q.from_ms = from_ms;
  q.to_ms = to_ms;
  return q;
}

struct Stats {
  double cold, p50, p99, max;
};

template <typename F>
Stats Measure(int iterations, F run) {
  auto t = Clock::now();
  run();
  Stats s{Ms(Clock::now() - t), 0, 0, 0};
  std::vector<double> v;
  for (int i = 0; i < iterations; ++i) {
    t = Clock::now();
    run();
    v.push_back(Ms(Clock::now() - t));
  }
  std::sort(v.begin(), v.end());
  auto pct = [&](double p) {
    return v[std::min(v.size() - 1, static_cast<size_t>(std::ceil(p * v.size())) - 1)];
  };
  s.p50 = pct(0.50);
  s.p99 = pct(0.99);
  s.max = v.back();
  return s;
}

void Check(const absl::Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, s.ToString().c_str());
    std::exit(1);
  }
}

template <typename T>
void Check(const absl::StatusOr<T>& r, const char* what) {
  Check(r.status(), what);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"query_benchmark: flame graph, top and diff latency over a week of profiles"};
  app.add_option("--data", o.data, "store directory (wiped unless --reuse)")->capture_default_str();
  app.add_flag("--reuse", o.reuse, "reuse a store filled by an earlier run");
  app.add_option("--stacks", o.stacks, "distinct stacks")->capture_default_str();
  app.add_option("--days", o.days, "days of 10 s windows")->capture_default_str();
  app.add_option("--zipf-cells", o.zipf_cells, "Zipf-drawn cells per window")
      ->capture_default_str();
  app.add_option("--sweep-cells", o.sweep_cells, "sweeping cells per window")
      ->capture_default_str();
  app.add_option("--iterations", o.iterations, "timed runs per query (after one cold run)")
      ->capture_default_str();
  app.add_flag("--malloc-defaults", o.malloc_defaults,
               "keep glibc's malloc thresholds (strata-server raises them at start-up)");
  app.add_option("--ranges", o.ranges, "ranges to query (1h, 24h, 7d; e.g. to profile one)")
      ->delimiter(',')
      ->check(CLI::IsMember({"1h", "24h", "7d"}))
      ->capture_default_str();
  app.add_option("--hour-block-mib", o.hour_block_mib,
                 "store memory for per-hour aggregates (0: read the hour rollup every time)")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  // As strata-server does (process_memory.h), unless told otherwise.
  if (!o.malloc_defaults) Check(strata::base::RetainFreedMemory(), "malloc thresholds");
  std::printf("malloc: %s\n", o.malloc_defaults
                                   ? "glibc's defaults"
                                   : "freed memory retained, as strata-server (process_memory.h)");

  // A fixed, hour-aligned start keeps reused stores valid.
  const int64_t t0 = 1'760'000'400'000 / kHourMs * kHourMs;
  int64_t end = t0 + o.days * kDayMs;
  if (!o.reuse) {
    std::filesystem::remove_all(o.data);
    end = Fill(o, t0);
  }

  strata::server::store::StoreOptions so;
  so.hour_block_cache_bytes = o.hour_block_mib << 20;
  auto store = strata::server::store::Store::Open(o.data, so);
  Check(store, "open");
  strata::server::registry::AgentRegistry registry;
  strata::server::query::QueryService query(store->get(), &registry);

  // "Now" in the middle of the last hour, as a user's query would be.
  const int64_t now = end - 25 * 60'000 - 30'000;
  std::printf("\n%-6s %-10s %10s %10s %10s %10s %10s %9s\n", "range", "query", "cold ms",
              "p50 ms", "p99 ms", "max ms", "samples", "stacks");
  struct Range {
    const char* name;
    int64_t ms;
  };
  auto wanted = [&](const Range& r) {
    return std::find(o.ranges.begin(), o.ranges.end(), r.name) != o.ranges.end();
  };
  for (Range r : {Range{"1h", kHourMs}, Range{"24h", kDayMs}, Range{"7d", 7 * kDayMs}}) {
    if (!wanted(r)) continue;
    strata::v1::ProfileFilter filter;
    filter.set_service("bench");
    filter.mutable_range()->set_from_ms(now - r.ms);
    filter.mutable_range()->set_to_ms(now);
    const int iterations = r.ms >= 7 * kDayMs ? std::max(5, o.iterations / 2) : o.iterations;

    strata::v1::FlameGraphRequest flame;
    *flame.mutable_filter() = filter;
    flame.set_format(strata::v1::FlameGraphRequest::JSON);
    uint64_t total = 0;
    uint32_t pruned = 0;
    const strata::server::store::StoreStats before = (*store)->Stats();
    Stats fs = Measure(iterations, [&] {
      auto resp = query.RunFlameGraph(flame);
      Check(resp, "flamegraph");
      total = resp->total_samples();
      pruned = resp->pruned_nodes();
    });

    strata::v1::TopRequest top;
    *top.mutable_filter() = filter;
    Stats ts = Measure(iterations, [&] { Check(query.RunTop(top), "top"); });

    strata::v1::DiffRequest diff;
    *diff.mutable_filter() = filter;
    diff.mutable_filter()->mutable_range()->set_from_ms(now - r.ms / 2);
    *diff.mutable_base() = filter;
    diff.mutable_base()->mutable_range()->set_to_ms(now - r.ms / 2);
    Stats ds = Measure(iterations, [&] { Check(query.RunDiff(diff), "diff"); });

    // Grafana's flame graph call (Connect, binary protobuf) as its data source makes it, and
    // the timeline (about 100 intervals).
    querier::v1::SelectMergeStacktracesRequest grafana_request;
    grafana_request.set_profile_typeid("process_cpu:samples:count:cpu:nanoseconds");
    grafana_request.set_label_selector("{service_name=\"bench\"}");
    grafana_request.set_start(now - r.ms);
    grafana_request.set_end(now);
    grafana_request.set_max_nodes(16384);
    strata::server::http::HttpRequest grafana_call;
    grafana_call.method = "POST";
    grafana_call.path = "/querier.v1.QuerierService/SelectMergeStacktraces";
    grafana_call.content_type = "application/proto";
    grafana_request.SerializeToString(&grafana_call.body);
    Stats gs = Measure(iterations, [&] {
      strata::server::http::HttpResponse answer =
          strata::server::grafana::ServeQuerierCall(&query, grafana_call);
      if (answer.status != 200) {
        std::fprintf(stderr, "grafana: %d %s\n", answer.status, answer.body.c_str());
        std::exit(1);
      }
    });
    strata::v1::SeriesRequest series;
    *series.mutable_filter() = filter;
    Stats ss = Measure(iterations, [&] { Check(query.RunSeries(series), "series"); });

    // Distinct stacks in the range, for context, and what one (warm) load reads.
    strata::server::query::ProfileReader reader(store->get());
    strata::server::query::ProfileQuery pq = BenchQuery(now - r.ms, now);
    const strata::server::store::StoreStats warm = (*store)->Stats();
    auto profile = reader.Load(pq);
    Check(profile, "profile");
    const strata::server::store::StoreStats after = (*store)->Stats();
    for (auto [name, s] : {std::pair{"flamegraph", fs}, {"top", ts}, {"diff", ds},
                           {"grafana", gs}, {"series", ss}}) {
      std::printf("%-6s %-10s %10.1f %10.1f %10.1f %10.1f %10llu %9zu\n", r.name, name, s.cold,
                  s.p50, s.p99, s.max, static_cast<unsigned long long>(total),
                  profile->stacks.size());
    }
    std::printf("       (%d timed runs each; flame graph nodes pruned to the budget: %u)\n",
                iterations, pruned);
    std::printf(
        "       cells read from RocksDB: %llu by all runs of the range, %llu by one warm load "
        "(spans: %llu cached, %llu summed; hour blocks: %llu cached, %llu read; minute "
        "blocks: %llu cached, %llu read; %.1f MiB cached)\n",
        static_cast<unsigned long long>(warm.cells_scanned - before.cells_scanned),
        static_cast<unsigned long long>(after.cells_scanned - warm.cells_scanned),
        static_cast<unsigned long long>(after.span_hits - warm.span_hits),
        static_cast<unsigned long long>(after.span_misses - warm.span_misses),
        static_cast<unsigned long long>(after.hour_block_hits - warm.hour_block_hits),
        static_cast<unsigned long long>(after.hour_block_misses - warm.hour_block_misses),
        static_cast<unsigned long long>(after.minute_block_hits - warm.minute_block_hits),
        static_cast<unsigned long long>(after.minute_block_misses - warm.minute_block_misses),
        (after.span_bytes + after.hour_block_bytes + after.minute_block_bytes) /
            1048576.0);
  }

  // Where a 1 h and a 7 d query's time goes, stage by stage (warm caches; p50 of the timed
  // runs).
  for (Range r : {Range{"1h", kHourMs}, Range{"7d", 7 * kDayMs}}) {
    if (!wanted(r)) continue;
    strata::server::query::ProfileReader reader(store->get());
    strata::server::query::ProfileQuery pq = BenchQuery(now - r.ms, now);
    strata::server::query::ProfileQuery first_half = pq, second_half = pq;
    first_half.to_ms = second_half.from_ms = now - r.ms / 2;
    absl::StatusOr<strata::server::query::Profile> profile, base, current;
    strata::server::query::FlameTree tree;
    const int n = std::max(3, o.iterations / 4);
    Check(reader.Load(pq), "profile");  // this reader's resolved stacks
    const Stats load = Measure(n, [&] { profile = reader.Load(pq); });
    Check(profile, "profile");
    const Stats build =
        Measure(n, [&] { tree = strata::server::query::BuildFlameTree(*profile, 0); });
    const Stats json = Measure(n, [&] { (void)strata::server::query::RenderFlameJson(tree); });
    const Stats top =
        Measure(n, [&] { (void)strata::server::query::TopFunctions(*profile, false); });
    const Stats halves = Measure(n, [&] {
      base = reader.Load(first_half);
      current = reader.Load(second_half);
    });
    Check(base, "base");
    Check(current, "current");
    const Stats diff =
        Measure(n, [&] { (void)strata::server::query::DiffProfiles(*base, *current, 20); });
    std::printf(
        "%s%s stages, p50 ms: load %.1f, flame tree %.1f (%zu nodes), JSON %.1f, top functions "
        "%.1f; diff: two half loads %.1f, compare %.1f\n",
        r.ms == kHourMs ? "\n" : "", r.name, load.p50, build.p50, tree.nodes.size(), json.p50,
        top.p50, halves.p50, diff.p50);
  }

  // Comparison: the same loads reading raw cells only (what the rollups save).
  std::printf("\nProfile load, rollups (kAuto, hour blocks cached) vs raw cells only (kRaw), "
              "3 runs each:\n");
  std::printf("%-6s %14s %14s\n", "range", "auto p50 ms", "raw p50 ms");
  strata::server::query::ProfileReader reader(store->get());
  for (Range r : {Range{"24h", kDayMs}, Range{"7d", 7 * kDayMs}}) {
    if (!wanted(r)) continue;
    strata::server::query::ProfileQuery pq = BenchQuery(now - r.ms, now);
    Stats a = Measure(3, [&] { Check(reader.Load(pq), "auto"); });
    pq.resolution = strata::server::store::Resolution::kRaw;
    Stats raw = Measure(3, [&] { Check(reader.Load(pq), "raw"); });
    std::printf("%-6s %14.1f %14.1f\n", r.name, a.p50, raw.p50);
  }
  (void)(*store)->Close();
  store->reset();

  // After a restart: the first 7 d flame graph of a fresh process without the warm-up, and
  // with strata-server's warm-up (QueryService::WarmUp, --query-warmup 7d) done first.
  if (wanted(Range{"7d", 7 * kDayMs})) {
    std::printf("\nFirst 7d flame graph after a restart (store reopened, nothing in memory):\n");
    for (bool warm_up : {false, true}) {
      auto reopened = strata::server::store::Store::Open(o.data, so);
      Check(reopened, "reopen");
      strata::server::query::QueryService fresh(reopened->get(), &registry);
      double warmup_ms = 0;
      size_t services = 0;
      if (warm_up) {
        const Clock::time_point started = Clock::now();
        std::atomic<bool> stop{false};
        services = fresh.WarmUp(now, 7 * kDayMs, stop);
        warmup_ms = Ms(Clock::now() - started);
      }
      strata::v1::FlameGraphRequest flame;
      flame.mutable_filter()->set_service("bench");
      flame.mutable_filter()->mutable_range()->set_from_ms(now - 7 * kDayMs);
      flame.mutable_filter()->mutable_range()->set_to_ms(now);
      flame.set_format(strata::v1::FlameGraphRequest::JSON);
      const Clock::time_point started = Clock::now();
      Check(fresh.RunFlameGraph(flame), "flamegraph");
      const double first_ms = Ms(Clock::now() - started);
      if (warm_up) {
        std::printf("  after the warm-up (%zu service, %.0f ms in the background): %.1f ms\n",
                    services, warmup_ms, first_ms);
      } else {
        std::printf("  without the warm-up: %.1f ms\n", first_ms);
      }
      (void)(*reopened)->Close();
    }
  }
  return 0;
}
