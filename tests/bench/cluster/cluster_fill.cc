// cluster_fill: the data of tests/bench/cluster/cluster.sh's fan-out query benchmark.
//
// Fill mode: the same synthetic profiles of one service as query_benchmark (a random call tree
// over 5,000 functions, `--stacks` stacks, each 10 s window of each host holding Zipf(1.1)-drawn
// cells, the hot set, plus cells sweeping through every stack, the long tail), for `--hosts` hosts,
// written through the Store API into the data directories of a cluster's nodes: each host into
// the directories of its owners on the hash ring (server/cluster/ring.h, the node IDs of
// `--nodes` with the default tokens, as the started nodes compute it), so every replica of a
// host holds the same cells. `--nodes single` writes every host into the one `--out`
// directory instead: the single server holding the same data. Each host's samples depend only
// on the host (its own random stream), so all replicas and the single directory agree; give
// every run the same `--end-ms`. Directories are filled in parallel and compacted, as a
// long-running server would have done by then. Prints one JSON line (end of the data, samples,
// hosts and bytes per directory).
//
//   cluster_fill --days 7 --hosts 12 --stacks 20000 --out D1,D2,D3 --nodes n1,n2,n3
//       --replication-factor 2 --end-ms MS
//   cluster_fill --days 7 --hosts 12 --stacks 20000 --out D --nodes single --end-ms MS
//
// Query mode: times Query/FlameGraph (JSON rendering) of `--service` over [--from-ms,
// --to-ms) against a running server or node, one cold run then `--iterations` timed ones;
// prints one JSON line (cold, p50, p99, max ms, the graph's total samples, the rendering's
// bytes). Fails if a node did not answer (the response names unreachable nodes).
//
//   cluster_fill --query 127.0.0.1:7070 --from-ms A --to-ms B [--iterations 20]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "server/cluster/ring.h"
#include "server/store/store.h"
#include "strata/v1/query.grpc.pb.h"

namespace {

using Clock = std::chrono::steady_clock;
constexpr int64_t kWindowMs = 10'000;
constexpr int64_t kDayMs = 24 * 3'600'000;
constexpr int kFunctions = 5000;

struct Options {
  // Fill.
  int days = 7;
  int hosts = 12;
  int stacks = 20'000;
  int zipf_cells = 4;
  int sweep_cells = 1;
  std::string out;
  std::string nodes;
  uint32_t replication_factor = 2;
  std::string service = "cluster-bench";
  int64_t end_ms = 0;
  // Query.
  std::string query;
  int64_t from_ms = 0, to_ms = 0;
  int iterations = 20;
};

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }
double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "cluster_fill: %s\n", what.c_str());
  std::exit(1);
}

// Zipf over [0, n) by inverse CDF table.
class Zipf {
 public:
  Zipf(int n, double s) : cdf_(n) {
    double sum = 0;
    for (int i = 0; i < n; ++i) cdf_[i] = (sum += 1.0 / std::pow(i + 1, s));
    for (double& c : cdf_) c /= sum;
  }
  int operator()(std::mt19937_64& rng) const {
    const double u = std::uniform_real_distribution<double>(0, 1)(rng);
    const auto it = std::lower_bound(cdf_.begin(), cdf_.end(), u);
    return static_cast<int>(std::min<ptrdiff_t>(it - cdf_.begin(), cdf_.size() - 1));
  }

 private:
  std::vector<double> cdf_;
};

// The program every host runs: its functions and stacks (as query_benchmark builds them).
struct Program {
  std::vector<strata::server::store::FunctionInfo> functions;
  // Frames as indexes into `functions`; distinct.
  std::vector<std::vector<int>> stacks;
};

Program BuildProgram(int stacks) {
  Program p;
  for (int i = 0; i < kFunctions; ++i) {
    p.functions.push_back({absl::StrCat(i == 0 ? "main" : "fn_", i), "/usr/bin/bench_service", "",
                           static_cast<uint64_t>(i) * 64});
  }
  std::mt19937_64 rng(42);
  std::set<std::vector<int>> seen;  // distinct paths only: distinct stack IDs
  for (int s = 0; s < stacks; ++s) {
    std::vector<int> frames{0};
    const int depth = 6 + static_cast<int>(rng() % 25);
    uint64_t f = 0;
    for (int d = 1; d < depth; ++d) {
      // Fan-out 4 near the root, wider deeper down; the last frame makes the stack distinct.
      const uint64_t fan = d < 4 ? 4 : 40;
      f = (f * 7 + 1 + rng() % fan) % kFunctions;
      frames.push_back(static_cast<int>(f));
    }
    frames.push_back(1 + s % (kFunctions - 1));
    if (seen.insert(frames).second) p.stacks.push_back(std::move(frames));
  }
  return p;
}

struct DirResult {
  std::string dir, node;
  std::vector<int> hosts;
  uint64_t cells = 0, samples = 0, bytes = 0;
  std::vector<uint64_t> stack_ids;  // in draw order (must agree across directories)
  std::string error;
};

std::string HostName(int h) { return absl::StrCat("bench-host-", h); }

// Fills one data directory with the samples of `r->hosts`.
void FillDir(const Options& o, const Program& program, const Zipf* zipf, int64_t t0,
             int64_t windows, DirResult* r) {
  namespace store = strata::server::store;
  auto opened = store::Store::Open(r->dir, store::StoreOptions{});
  if (!opened.ok()) {
    r->error = absl::StrCat(r->dir, ": ", opened.status().ToString());
    return;
  }
  store::Store& s = **opened;
  store::WriteBatch batch;
  std::vector<uint64_t> fids(kFunctions);
  for (int i = 0; i < kFunctions; ++i) {
    auto id = s.interner().InternFunction(program.functions[i], &batch);
    if (!id.ok()) {
      r->error = id.status().ToString();
      return;
    }
    fids[i] = *id;
  }
  std::vector<uint64_t> ids;
  for (size_t i = 0; i < program.stacks.size(); ++i) {
    store::StackFrames frames;
    for (int f : program.stacks[i]) frames.function_ids.push_back(fids[f]);
    auto id = s.interner().InternStack(frames, &batch);
    if (!id.ok()) {
      r->error = id.status().ToString();
      return;
    }
    ids.push_back(*id);
    if (i % 10'000 == 9'999) (void)s.Commit(&batch);
  }
  if (auto st = s.Commit(&batch); !st.ok()) {
    r->error = st.ToString();
    return;
  }
  // Distinct content, distinct IDs; in an order of their own (seeded: the same in every
  // directory), so the hot set is spread over the tree.
  if (std::set<uint64_t>(ids.begin(), ids.end()).size() != ids.size()) {
    r->error = "two stacks share an ID";
    return;
  }
  std::sort(ids.begin(), ids.end());
  std::mt19937_64 order(7);
  std::shuffle(ids.begin(), ids.end(), order);
  r->stack_ids = ids;

  // One random stream per host: a host's cells do not depend on which others share the
  // directory.
  std::vector<std::mt19937_64> rngs;
  std::vector<size_t> sweeps;
  for (int h : r->hosts) {
    rngs.emplace_back(1000 + h);
    sweeps.push_back(static_cast<size_t>(h) * 977);
  }
  for (int64_t w = 0; w < windows; ++w) {
    const int64_t window = t0 + w * kWindowMs;
    for (size_t i = 0; i < r->hosts.size(); ++i) {
      const std::string host = HostName(r->hosts[i]);
      for (int c = 0; c < o.zipf_cells; ++c) {
        const uint64_t n = 1 + rngs[i]() % 20;
        batch.AddSamples(o.service, window, host, ids[(*zipf)(rngs[i])], n);
        r->samples += n;
      }
      for (int c = 0; c < o.sweep_cells; ++c) {
        batch.AddSamples(o.service, window, host, ids[sweeps[i]++ % ids.size()], 1);
        r->samples += 1;
      }
      r->cells += o.zipf_cells + o.sweep_cells;
    }
    if (w % 360 == 359 || w + 1 == windows) {
      if (auto st = s.Commit(&batch); !st.ok()) {
        r->error = absl::StrCat(r->dir, ": commit: ", st.ToString());
        return;
      }
    }
  }
  if (auto st = s.CompactAll(); !st.ok()) {
    r->error = absl::StrCat(r->dir, ": compact: ", st.ToString());
    return;
  }
  r->bytes = s.ApproximateBytesOnDisk();
  if (auto st = s.Close(); !st.ok()) r->error = absl::StrCat(r->dir, ": close: ", st.ToString());
}

int Fill(const Options& o) {
  const std::vector<std::string> dirs = absl::StrSplit(o.out, ',', absl::SkipEmpty());
  const std::vector<std::string> nodes = absl::StrSplit(o.nodes, ',', absl::SkipEmpty());
  if (dirs.empty()) Die("--out: no directory");
  const bool single = nodes.size() == 1 && nodes[0] == "single";
  if (single ? dirs.size() != 1 : nodes.size() != dirs.size()) {
    Die("--out needs one directory per --nodes ID (one with --nodes single)");
  }
  if (o.days <= 0 || o.hosts <= 0 || o.stacks <= 0 || o.zipf_cells < 0 || o.sweep_cells < 0 ||
      o.replication_factor == 0) {
    Die("--days, --hosts, --stacks and --replication-factor must be positive");
  }
  for (const std::string& d : dirs) {
    std::error_code ec;
    if (std::filesystem::exists(d, ec) && !std::filesystem::is_empty(d, ec)) {
      Die(absl::StrCat(d, ": not empty (give a new directory)"));
    }
    std::filesystem::create_directories(d, ec);
    if (ec) Die(absl::StrCat(d, ": ", ec.message()));
  }
  const int64_t end = (o.end_ms > 0 ? o.end_ms
                                    : std::chrono::duration_cast<std::chrono::milliseconds>(
                                          std::chrono::system_clock::now().time_since_epoch())
                                          .count()) /
                      kWindowMs * kWindowMs;
  const int64_t windows = o.days * kDayMs / kWindowMs;
  const int64_t t0 = end - windows * kWindowMs;

  std::vector<DirResult> results(dirs.size());
  for (size_t i = 0; i < dirs.size(); ++i) {
    results[i].dir = dirs[i];
    results[i].node = single ? "single" : nodes[i];
  }
  if (single) {
    for (int h = 0; h < o.hosts; ++h) results[0].hosts.push_back(h);
  } else {
    std::vector<strata::server::cluster::RingMember> members;
    for (const std::string& n : nodes) {
      members.push_back({n, "", strata::server::cluster::kDefaultTokens});
    }
    const strata::server::cluster::Ring ring(members);
    for (int h = 0; h < o.hosts; ++h) {
      for (const auto* owner : ring.Owners(HostName(h), o.replication_factor)) {
        for (DirResult& r : results) {
          if (r.node == owner->id) r.hosts.push_back(h);
        }
      }
    }
  }

  const Program program = BuildProgram(o.stacks);
  const Zipf zipf(static_cast<int>(program.stacks.size()), 1.1);
  const auto start = Clock::now();
  std::vector<std::thread> threads;
  for (DirResult& r : results) {
    threads.emplace_back([&, rp = &r] { FillDir(o, program, &zipf, t0, windows, rp); });
  }
  for (std::thread& t : threads) t.join();
  const double seconds = Seconds(Clock::now() - start);
  for (const DirResult& r : results) {
    if (!r.error.empty()) Die(r.error);
    if (r.stack_ids != results[0].stack_ids) Die("stack IDs differ between directories");
  }

  // Samples of each host once (all replicas hold the same), for the query totals.
  uint64_t samples = 0, cells = 0;
  std::string per_dir;
  for (const DirResult& r : results) {
    absl::StrAppend(&per_dir, per_dir.empty() ? "" : ",", "{\"dir\":\"", r.dir, "\",\"node\":\"",
                    r.node, "\",\"hosts\":", r.hosts.size(), ",\"cells\":", r.cells,
                    ",\"samples\":", r.samples, ",\"bytes\":", r.bytes, "}");
  }
  // Recount per host (cheap: replay the draws' counts without writing).
  for (int h = 0; h < o.hosts; ++h) {
    std::mt19937_64 rng(1000 + h);
    for (int64_t w = 0; w < windows; ++w) {
      for (int c = 0; c < o.zipf_cells; ++c) {
        samples += 1 + rng() % 20;
        (void)zipf(rng);
      }
      samples += o.sweep_cells;
      cells += o.zipf_cells + o.sweep_cells;
    }
  }
  std::printf("{\"service\":\"%s\",\"from_ms\":%lld,\"end_ms\":%lld,\"windows\":%lld,"
              "\"hosts\":%d,\"stacks\":%zu,\"cells\":%llu,\"samples\":%llu,\"fill_s\":%.1f,"
              "\"dirs\":[%s]}\n",
              o.service.c_str(), static_cast<long long>(t0), static_cast<long long>(end),
              static_cast<long long>(windows), o.hosts, results[0].stack_ids.size(),
              static_cast<unsigned long long>(cells), static_cast<unsigned long long>(samples),
              seconds, per_dir.c_str());
  return 0;
}

int Query(const Options& o) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  auto channel = grpc::CreateCustomChannel(o.query, grpc::InsecureChannelCredentials(), args);
  auto stub = strata::v1::Query::NewStub(channel);
  strata::v1::FlameGraphRequest request;
  request.mutable_filter()->set_service(o.service);
  request.mutable_filter()->mutable_range()->set_from_ms(o.from_ms);
  request.mutable_filter()->mutable_range()->set_to_ms(o.to_ms);
  request.set_format(strata::v1::FlameGraphRequest::JSON);
  strata::v1::FlameGraphResponse response;
  auto run = [&] {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
    response.Clear();
    const auto t = Clock::now();
    const grpc::Status st = stub->FlameGraph(&ctx, request, &response);
    if (!st.ok()) Die(absl::StrCat("FlameGraph on ", o.query, ": ", st.error_message()));
    if (response.unreachable_nodes_size() > 0) {
      Die(absl::StrCat("FlameGraph on ", o.query, ": unreachable ",
                       response.unreachable_nodes(0)));
    }
    return Ms(Clock::now() - t);
  };
  const double cold = run();
  const uint64_t total = response.total_samples();
  std::vector<double> ms;
  for (int i = 0; i < o.iterations; ++i) {
    ms.push_back(run());
    if (response.total_samples() != total) Die("total samples changed between runs");
  }
  std::sort(ms.begin(), ms.end());
  auto pct = [&](double p) {
    if (ms.empty()) return 0.0;
    return ms[std::min(ms.size() - 1, static_cast<size_t>(std::ceil(p * ms.size())) - 1)];
  };
  std::printf("{\"server\":\"%s\",\"runs\":%zu,\"cold_ms\":%.1f,\"p50_ms\":%.1f,\"p99_ms\":%.1f,"
              "\"max_ms\":%.1f,\"total_samples\":%llu,\"bytes\":%zu}\n",
              o.query.c_str(), ms.size(), cold, pct(0.5), pct(0.99), ms.empty() ? 0 : ms.back(),
              static_cast<unsigned long long>(total), response.rendered().size());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"cluster_fill: a week of profiles in a cluster's data directories, and flame "
               "graph timing"};
  app.add_option("--days", o.days, "days of 10 s windows")->capture_default_str();
  app.add_option("--hosts", o.hosts, "hosts (bench-host-0...)")->capture_default_str();
  app.add_option("--stacks", o.stacks, "stacks of the program")->capture_default_str();
  app.add_option("--zipf-cells", o.zipf_cells, "Zipf-drawn cells per host and window")
      ->capture_default_str();
  app.add_option("--sweep-cells", o.sweep_cells, "sweeping cells per host and window")
      ->capture_default_str();
  app.add_option("--out", o.out, "data directories, comma-separated (new or empty)");
  app.add_option("--nodes", o.nodes,
                 "node IDs of the directories, comma-separated; 'single': one server");
  app.add_option("--replication-factor", o.replication_factor, "owners of each host")
      ->capture_default_str();
  app.add_option("--service", o.service, "service name")->capture_default_str();
  app.add_option("--end-ms", o.end_ms, "end of the data, Unix ms (default: now)");
  app.add_option("--query", o.query, "instead of filling: time flame graphs on this server");
  app.add_option("--from-ms", o.from_ms, "query range start, Unix ms");
  app.add_option("--to-ms", o.to_ms, "query range end, Unix ms");
  app.add_option("--iterations", o.iterations, "timed queries after the cold one")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (!o.query.empty()) {
    if (o.from_ms <= 0 || o.to_ms <= o.from_ms) Die("--query needs --from-ms < --to-ms");
    return Query(o);
  }
  if (o.out.empty() || o.nodes.empty()) Die("fill needs --out and --nodes (or --query)");
  return Fill(o);
}
