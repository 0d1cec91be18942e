// Guards the server's ingest cost per sample against large regressions on a shared, noisy
// machine: a short fleet run (strata-loadgen against a real strata-server) measures the
// server's CPU per million samples, and the same process measures an anchor on the same
// batches: unpacking them and decoding every context against the agents' call graph, the
// core of what the server does per sample, without the store, the aggregation tables or
// gRPC. Both move with the machine's speed and load; their ratio moves with what the server
// does around decoding, which is where features add cost per sample. OTLP ingest is held the
// same way, its anchor the parsing of the same samples' OTLP requests. The figures and their
// bounds are printed on every run.
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "common/encoding/graph.h"
#include "common/encoding/graph_delta_edges.h"
#include "common/encoding/numbering.h"
#include "common/encoding/packed_contexts.h"
#include "common/testing/temp_dir.h"
#include "server/otlp/otlp_convert.h"  // otlp_v1
#include "gtest/gtest.h"
#include "tests/e2e/harness.h"
#include "tests/e2e/http_client.h"
#include "tools/loadgen/program.h"

namespace strata::e2e {
namespace {

// The server's CPU per sample may be at most this many times the anchor's. Measured between
// 38 and 77 on a 2-core machine (lower when other work keeps it busy: gRPC's threads then
// wake less often per message; higher when the window holds a minute's rollup); a regression
// of the size that once went unseen (3x) crosses it, that spread does not.
constexpr double kMaxRatio = 130;
// The same for OTLP against its parse anchor: measured 10.1 to 16.3 on a 2-core AMD EPYC
// guest (where the bound above measured 13.9 and 20.5), 14.4 to 21.8 on a 2-core EPYC guest
// under PVM (the bound above 30.7 to 40.2). OTLP requests are large (an agent's
// 10 s in one), so the server's cost per sample is less its wake-ups' than with Strata's
// stream, whose ratio moved 3-5x between machines; the bound leaves about that much room.
constexpr double kMaxOtlpRatio = 60;

double ThreadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// CPU milliseconds per million samples to unpack and decode the load generator's batches
// (its default program, as every simulated agent sends it), the fastest of a few rounds.
double AnchorMsPerMillionSamples() {
  auto program = loadgen::Program::Build({});
  EXPECT_TRUE(program.ok()) << program.status();
  if (!program.ok()) return -1;
  encoding::CallGraph graph;
  for (v1::GraphDelta& delta : (*program)->DeltasFrom(0, 0)) {
    EXPECT_TRUE(encoding::UnpackDeltaEdges(&delta, size_t{1} << 20).ok());
    EXPECT_TRUE(graph.EnsureNodes(delta.first_node() + delta.nodes_size()).ok());
    for (const v1::CallEdge& e : delta.edges()) {
      EXPECT_TRUE(graph.AddEdge({e.caller(), e.call_site(), e.callee()}).ok());
    }
  }
  auto numbering = encoding::Numbering::Compute(graph, (*program)->epoch());
  EXPECT_TRUE(numbering.ok()) << numbering.status();
  if (!numbering.ok()) return -1;
  double best = 1e300;
  std::vector<encoding::ContextRecord> records;
  for (int round = 0; round < 5; ++round) {
    uint64_t samples = 0, frames = 0;
    const double start = ThreadCpuSeconds();
    for (uint64_t i = 0; i < 16; ++i) {
      const loadgen::Payload& payload = (*program)->payload(i);
      EXPECT_TRUE(encoding::DecodePackedContexts(payload.packed_contexts, &records).ok());
      for (const encoding::ContextRecord& r : records) {
        bool truncated = false;
        auto path = encoding::Decode(**numbering, r.context, &truncated);
        EXPECT_TRUE(path.ok()) << path.status();
        if (path.ok()) frames += path->size();
      }
      samples += payload.samples;
    }
    EXPECT_GT(frames, 0u);
    best = std::min(best, (ThreadCpuSeconds() - start) * 1e3 / (samples * 1e-6));
  }
  return best;
}

// CPU milliseconds per million samples to parse the load generator's OTLP requests (its
// default program's, each with an agent's resource attributes), what any OTLP receiver does
// first, the fastest of a few rounds. The server's conversion of them to Strata's stacks is
// not part of it, so that the guard sees that conversion grow too.
double OtlpAnchorMsPerMillionSamples() {
  loadgen::ProgramOptions options;
  options.otlp = true;
  auto program = loadgen::Program::Build(options);
  EXPECT_TRUE(program.ok()) << program.status();
  if (!program.ok()) return -1;
  std::vector<std::string> requests;
  uint64_t samples_per_round = 0;
  for (uint64_t i = 0; i < 16; ++i) {
    requests.push_back(loadgen::OtlpRequestOf((*program)->payload(i),
                                              {{"service.name", "guard"},
                                               {"host.name", "guard-host-0"}},
                                              0)
                           .SerializeAsString());
    samples_per_round += (*program)->payload(i).samples;
  }
  double best = 1e300;
  server::otlp::otlp_v1::ExportProfilesServiceRequest parsed;
  for (int round = 0; round < 5; ++round) {
    uint64_t stacks = 0;
    const double start = ThreadCpuSeconds();
    for (const std::string& bytes : requests) {
      EXPECT_TRUE(parsed.ParseFromString(bytes));
      stacks += parsed.dictionary().stack_table_size();
    }
    EXPECT_GT(stacks, 0u);
    best = std::min(best, (ThreadCpuSeconds() - start) * 1e3 / (samples_per_round * 1e-6));
  }
  return best;
}

// The server's user + system CPU seconds so far (/proc/PID/stat).
double ProcessCpuSeconds(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // Fields after the command's closing parenthesis; utime and stime are the 12th and 13th.
  std::istringstream rest(stat.substr(stat.rfind(')') + 2));
  std::string field;
  double utime = 0, stime = 0;
  for (int i = 1; i <= 13 && rest >> field; ++i) {
    if (i == 12) (void)absl::SimpleAtod(field, &utime);
    if (i == 13) (void)absl::SimpleAtod(field, &stime);
  }
  return (utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// Samples the server applied so far (the counter `metric` of its /metrics), -1 if unreadable.
double SamplesApplied(int http_port, const std::string& metric) {
  auto [status, metrics] = strata::testing::HttpGet(http_port, "/metrics");
  std::smatch m;
  double v = -1;
  if (status == 200 &&
      std::regex_search(metrics, m, std::regex("\n" + metric + " ([0-9.e+]+)"))) {
    (void)absl::SimpleAtod(m[1].str(), &v);
  }
  return v;
}

// Waits until the server has applied at least `samples`; false after `timeout_s`.
bool AwaitSamples(int http_port, const std::string& metric, double samples, double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (std::chrono::steady_clock::now() < deadline) {
    if (SamplesApplied(http_port, metric) >= samples) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return false;
}

// The server's steady CPU milliseconds per million samples while 300 simulated agents speak
// `protocol` to it, the samples it stored counted by `metric`.
double ServerMsPerMillionSamples(const std::string& protocol, const std::string& metric) {
  strata::testing::TempDir dir("ingest_cost_guard");
  ServerProcess server(dir.path() + "/data", dir.path() + "/server.log",
                       {"--http", "127.0.0.1:0"});
  EXPECT_GT(server.http_port(), 0) << server.process().Output();
  if (server.http_port() <= 0) return -1;
  // 300 agents at the default 99 Hz x 4 threads and 10 s intervals: about 120,000 samples
  // per second. The CPU is measured once every agent has connected and shipped (graphs
  // sent, tables grown), over 3.6 million samples of steady load.
  constexpr int kAgents = 300;
  ChildProcess load({BinPath("strata-loadgen"), "--server", server.address(), "--json",
                     "--protocol", protocol, "--agents", std::to_string(kAgents), "--duration",
                     "55", "--ramp-up", "5", "--query-every", "0"},
                    dir.path() + "/loadgen.log");
  const double warm = kAgents * 3960.0 * 1.5;  // every agent's first batch, and some
  EXPECT_TRUE(AwaitSamples(server.http_port(), metric, warm, 60)) << server.process().Output();
  const double samples0 = SamplesApplied(server.http_port(), metric);
  const double cpu0 = ProcessCpuSeconds(server.process().pid());
  EXPECT_TRUE(AwaitSamples(server.http_port(), metric, samples0 + 3.6e6, 120))
      << server.process().Output();
  const double cpu1 = ProcessCpuSeconds(server.process().pid());
  const double samples1 = SamplesApplied(server.http_port(), metric);
  EXPECT_EQ(load.Wait(120), 0) << load.Output() << "\nserver log:\n" << server.process().Output();
  const std::string output = load.Output();
  const std::string json = output.substr(output.rfind('{'));
  EXPECT_NE(json.find("\"ok\":true"), std::string::npos) << json;
  if (samples1 <= samples0) return -1;
  return (cpu1 - cpu0) * 1e3 / ((samples1 - samples0) * 1e-6);
}

// The server's CPU per sample against `anchor` (measured before and after the load, the
// lower taken): printed, recorded, and held under `bound`.
void ExpectWithinBound(const char* what, double server_ms, double anchor_before,
                       double anchor_after, double bound) {
  const double anchor = std::min(anchor_before, anchor_after);
  ASSERT_GT(server_ms, 0);
  ASSERT_GT(anchor, 0);
  const double ratio = server_ms / anchor;
  std::printf("%s: server %.0f CPU ms per million samples (steady, 300 agents), anchor %.1f ms: "
              "ratio %.1f (bound %.0f)\n",
              what, server_ms, anchor, ratio, bound);
  ::testing::Test::RecordProperty("server_ms_per_million_samples", std::to_string(server_ms));
  ::testing::Test::RecordProperty("anchor_ms_per_million_samples", std::to_string(anchor));
  EXPECT_LT(ratio, bound) << "the server's CPU per sample grew far beyond its anchor";
}

TEST(IngestCostGuardTest, ServerCpuPerSampleStaysWithinItsBoundOfTheDecodeAnchor) {
  const double anchor_before = AnchorMsPerMillionSamples();
  const double server_ms = ServerMsPerMillionSamples("strata", "strata_ingest_samples_total");
  ExpectWithinBound("ingest cost", server_ms, anchor_before, AnchorMsPerMillionSamples(),
                    kMaxRatio);
}

TEST(IngestCostGuardTest, OtlpServerCpuPerSampleStaysWithinItsBoundOfTheParseAnchor) {
  const double anchor_before = OtlpAnchorMsPerMillionSamples();
  const double server_ms = ServerMsPerMillionSamples("otlp", "strata_otlp_samples_total");
  ExpectWithinBound("OTLP ingest cost", server_ms, anchor_before,
                    OtlpAnchorMsPerMillionSamples(), kMaxOtlpRatio);
}

}  // namespace
}  // namespace strata::e2e
