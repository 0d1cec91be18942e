#include "tools/loadgen/program.h"

#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/encoding/graph_delta_edges.h"
#include "common/encoding/packed_contexts.h"
#include "server/otlp/otlp_builder.h"

namespace strata::loadgen {
namespace {

std::vector<v1::GraphDelta> ChunkedDeltas(const agent::ContextGraph& graph, uint32_t nodes,
                                          uint64_t edges) {
  std::vector<v1::GraphDelta> out;
  while (nodes < graph.num_nodes() || edges < graph.num_edges()) {
    v1::GraphDelta d = graph.DeltaFrom(nodes, edges);
    if (d.nodes_size() == 0 && d.edges_size() == 0) break;
    nodes = d.first_node() + d.nodes_size();
    edges = d.first_edge() + d.edges_size();
    encoding::PackDeltaEdges(&d);  // as agents send them
    out.push_back(std::move(d));
  }
  return out;
}

constexpr char kExecutable[] = "/opt/loadgen/bin/service";

uint64_t FunctionAddress(uint32_t function) { return 0x1000 + 64 * uint64_t{function}; }

// One interval's distinct stacks (outermost first, as in the stream) as an OTLP request: a
// location per (function, call site), its one line naming the function; a truncated stack
// ends in an abort marker.
::opentelemetry::proto::collector::profiles::v1development::ExportProfilesServiceRequest
OtlpRequest(const SampleStream& stream, const std::vector<StreamStack>& interval) {
  server::otlp::RequestBuilder builder;
  const int32_t mapping = builder.Mapping(kExecutable);
  auto* profile = builder.AddProfile(builder.AddResource({}), "samples", "count", 0);
  std::map<std::vector<int32_t>, uint64_t> counts;  // leaf-first locations -> samples
  for (const StreamStack& s : interval) {
    std::vector<int32_t> locations;
    for (size_t i = s.frames.size(); i-- > 0;) {
      const StreamFrame& f = s.frames[i];
      const std::string& name = stream.function_names[f.function];
      const uint64_t call_site = i + 1 == s.frames.size() ? 0 : f.call_site;
      locations.push_back(builder.Location(mapping, FunctionAddress(f.function) + call_site,
                                           {{name, kExecutable, 0}}, "native"));
    }
    // The eBPF profiler's marker of an unwinding stop, outermost.
    if (s.truncated) locations.push_back(builder.Location(mapping, 0, {}, "abort-marker"));
    counts[locations] += s.count;
  }
  for (const auto& [locations, count] : counts) {
    builder.AddSample(profile, builder.Stack(locations), {}, static_cast<int64_t>(count));
  }
  return builder.Take();
}

}  // namespace

::opentelemetry::proto::collector::profiles::v1development::ExportProfilesServiceRequest
OtlpRequestOf(const Payload& payload,
              const std::vector<std::pair<std::string, std::string>>& resource,
              uint64_t time_unix_nano) {
  auto request = payload.otlp;
  auto* attributes = request.mutable_resource_profiles(0)->mutable_resource();
  for (const auto& [key, value] : resource) {
    auto* kv = attributes->add_attributes();
    kv->set_key(key);
    kv->mutable_value()->set_string_value(value);
  }
  request.mutable_resource_profiles(0)->mutable_scope_profiles(0)->mutable_profiles(0)
      ->set_time_unix_nano(time_unix_nano);
  return request;
}

absl::StatusOr<std::unique_ptr<Program>> Program::Build(const ProgramOptions& options) {
  SyntheticOptions synthetic;
  synthetic.functions = options.functions;
  synthetic.distinct_paths = std::max<uint32_t>(1, options.contexts);
  synthetic.samples_per_interval = options.samples_per_interval;
  synthetic.intervals = options.intervals;
  synthetic.seed = options.seed;
  const SampleStream stream =
      options.recorded != nullptr ? *options.recorded : SynthesizeSampleStream(synthetic);

  std::unique_ptr<Program> program(new Program());
  program->graph_ = std::make_unique<agent::ContextGraph>(options.seed);
  agent::ContextGraph& graph = *program->graph_;
  // Nodes for the functions that appear in samples only, as a real agent discovers them.
  std::vector<encoding::NodeId> node_of(stream.function_names.size(), 0);
  auto node = [&](uint32_t f) {
    if (node_of[f] == 0) {
      node_of[f] = graph.NodeFor({stream.function_names[f], kExecutable, "", FunctionAddress(f)});
    }
    return node_of[f];
  };
  // Every path first, so that all payloads are encoded against the final graph (one epoch).
  std::vector<std::map<std::vector<encoding::EdgeId>, uint64_t>> intervals;
  for (const auto& interval : stream.intervals) {
    auto& agg = intervals.emplace_back();
    for (const StreamStack& s : interval) {
      std::vector<encoding::PathFrame> frames;
      for (const StreamFrame& f : s.frames) frames.push_back({node(f.function), f.call_site});
      auto path = graph.AddPath(frames, s.truncated);
      if (!path.ok()) return path.status();
      agg[*path] += s.count;
    }
  }
  auto numbering = graph.CurrentNumbering();
  if (!numbering.ok()) return numbering.status();
  encoding::Encoder encoder(**numbering);
  for (size_t i = 0; i < intervals.size(); ++i) {
    const auto& agg = intervals[i];
    std::vector<encoding::ContextRecord> records;
    Payload payload;
    if (options.otlp) payload.otlp = OtlpRequest(stream, stream.intervals[i]);
    for (const auto& [path, count] : agg) {
      auto context = encoder.Encode(path);
      if (!context.ok()) return context.status();
      records.push_back({1, *std::move(context), count});
      payload.samples += count;
    }
    payload.contexts = static_cast<uint32_t>(records.size());
    auto packed = encoding::EncodePackedContexts(std::move(records));
    if (!packed.ok()) return packed.status();
    payload.packed_contexts = *std::move(packed);
    program->payloads_.push_back(std::move(payload));
  }
  if (program->payloads_.empty()) return absl::InvalidArgumentError("no intervals");
  program->initial_deltas_ = ChunkedDeltas(graph, 0, 0);
  return program;
}

std::vector<v1::GraphDelta> Program::DeltasFrom(uint32_t known_nodes, uint64_t known_edges) const {
  if (known_nodes <= encoding::kFirstFunctionNode && known_edges == 0) return initial_deltas_;
  return ChunkedDeltas(*graph_, known_nodes, known_edges);
}

}  // namespace strata::loadgen
