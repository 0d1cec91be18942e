// Guards the calling-context encoding's size goal: at most 2.5 bytes on the wire per distinct
// context per batch, all-in (the batch message with its header, target and packed_contexts,
// and the graph delta message of the edges it is encoded against), on the synthetic stream
// encoding_benchmark reports on (tools/loadgen's defaults: 6,000 functions, Zipf 1.1 paths,
// 8,000 samples a batch). The stream is seeded and the coders are deterministic, so the figure
// is exact and the same on every machine: 2.44 bytes when this guard was written. A change to
// the codecs, the messages or the stream that crosses the goal fails here rather than in a
// benchmark nobody ran. So does one that takes the encoding under 50x fewer bytes than a
// pprof-style batch of the same stacks (tools/loadgen/pprof_style.h, encoding_benchmark's
// anchor: 56.8x).
#include <cstdio>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "common/encoding/graph.h"
#include "common/encoding/numbering.h"
#include "common/encoding/packed_contexts.h"
#include "common/encoding/packed_edges.h"
#include "gtest/gtest.h"
#include "strata/v1/ingest.pb.h"
#include "tools/loadgen/pprof_style.h"
#include "tools/loadgen/sample_stream.h"

namespace strata::e2e {
namespace {

using encoding::CallGraph;
using encoding::EdgeId;
using encoding::NodeId;

constexpr double kGoalBytesPerContext = 2.5;
constexpr double kGoalTimesFewerThanPprof = 50;

TEST(BytesPerContextGuardTest, SyntheticStreamStaysWithinTheGoal) {
  const loadgen::SampleStream stream = loadgen::SynthesizeSampleStream({});
  ASSERT_GE(stream.intervals.size(), 10u);
  CallGraph graph;
  std::vector<NodeId> node_of(stream.function_names.size());
  for (NodeId& n : node_of) n = graph.AddNode();
  uint32_t shipped_nodes = encoding::kFirstFunctionNode;
  uint64_t shipped_edges = 0;
  // As encoding_benchmark: the steady state is the last two thirds of the stream.
  const size_t steady_from = stream.intervals.size() / 3;
  uint64_t steady_bytes = 0, steady_contexts = 0, steady_pprof_bytes = 0;

  for (size_t iv = 0; iv < stream.intervals.size(); ++iv) {
    std::map<std::vector<EdgeId>, uint64_t> counts;  // the interval's distinct paths
    std::map<std::vector<EdgeId>, const loadgen::StreamStack*> example;  // a stack of each
    for (const loadgen::StreamStack& stack : stream.intervals[iv]) {
      std::vector<encoding::PathFrame> frames;
      for (const loadgen::StreamFrame& f : stack.frames) {
        frames.push_back({node_of[f.function], f.call_site});
      }
      auto path = graph.AddPath(frames, stack.truncated);
      ASSERT_TRUE(path.ok()) << path.status();
      counts[*path] += stack.count;
      example.try_emplace(*path, &stack);
    }

    v1::AgentMessage delta_message;
    v1::GraphDelta& delta = *delta_message.mutable_graph_delta();
    delta.set_first_node(shipped_nodes);
    for (uint32_t n = shipped_nodes; n < graph.num_nodes(); ++n) {
      v1::FunctionNode& node = *delta.add_nodes();
      node.set_id(n);
      node.set_name(stream.function_names[n - encoding::kFirstFunctionNode]);
      node.set_module("/opt/demo/bin/demo_service");
      node.set_build_id(std::string(20, '\xab'));
      node.set_start_offset(0x1000 + 64 * uint64_t{n});
    }
    delta.set_first_edge(shipped_edges);
    auto edges = encoding::ExportEdges(graph, shipped_edges, graph.num_edges());
    ASSERT_TRUE(edges.ok()) << edges.status();
    auto packed_edges = encoding::EncodePackedEdges(*edges, static_cast<NodeId>(shipped_nodes));
    ASSERT_TRUE(packed_edges.has_value()) << "the stream's edges should pack";
    delta.set_packed_edges(*packed_edges);
    const bool graph_grew = shipped_nodes < graph.num_nodes() || shipped_edges < graph.num_edges();
    shipped_nodes = static_cast<uint32_t>(graph.num_nodes());
    shipped_edges = graph.num_edges();

    auto numbering = encoding::Numbering::Compute(graph, graph.num_edges());
    ASSERT_TRUE(numbering.ok()) << numbering.status();
    encoding::Encoder encoder(**numbering);
    std::vector<encoding::ContextRecord> records;
    for (const auto& [path, count] : counts) {
      auto context = encoder.Encode(path);
      ASSERT_TRUE(context.ok()) << context.status();
      records.push_back({1, *std::move(context), count});
    }
    auto packed = encoding::EncodePackedContexts(std::move(records));
    ASSERT_TRUE(packed.ok()) << packed.status();

    v1::AgentMessage batch_message;
    v1::SampleBatch& batch = *batch_message.mutable_sample_batch();
    batch.set_sequence(iv + 1);
    batch.set_epoch(graph.num_edges());
    batch.set_start_ms(1'700'000'000'000 + 10'000 * static_cast<int64_t>(iv));
    batch.set_end_ms(batch.start_ms() + 10'000);
    v1::Target& target = *batch.add_targets();
    target.set_id(1);
    target.set_service("demo");
    target.set_pid(4242);
    target.set_executable("/opt/demo/bin/demo_service");
    batch.set_packed_contexts(*std::move(packed));

    if (iv >= steady_from) {
      steady_bytes += batch_message.ByteSizeLong();
      if (graph_grew) steady_bytes += delta_message.ByteSizeLong();
      steady_contexts += counts.size();
      std::vector<std::pair<const loadgen::StreamStack*, uint64_t>> distinct;
      for (const auto& [path, count] : counts) distinct.emplace_back(example.at(path), count);
      steady_pprof_bytes += loadgen::PprofStyleBatch(stream, distinct, iv).size();
    }
  }

  ASSERT_GT(steady_contexts, 0u);
  const double per_context =
      static_cast<double>(steady_bytes) / static_cast<double>(steady_contexts);
  std::printf("synthetic stream, all-in at steady state: %.3f bytes per distinct context "
              "(goal <= %.1f)\n",
              per_context, kGoalBytesPerContext);
  EXPECT_LE(per_context, kGoalBytesPerContext);
  const double times_fewer =
      static_cast<double>(steady_pprof_bytes) / static_cast<double>(steady_bytes);
  std::printf("against a pprof-style batch of the same stacks: %.1fx fewer bytes (goal >= %.0fx)\n",
              times_fewer, kGoalTimesFewerThanPprof);
  EXPECT_GE(times_fewer, kGoalTimesFewerThanPprof);
}

}  // namespace
}  // namespace strata::e2e
