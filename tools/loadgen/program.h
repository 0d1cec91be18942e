// What a simulated agent ships, precomputed once per "program" and shared by every agent that
// runs it: the call graph of a synthetic sample stream (program-like: thousands of functions,
// recursion, Zipf-distributed hot paths; tools/loadgen/sample_stream.h), built and cut into
// graph deltas exactly as the real agent does (agent/core/context_graph), and one
// packed_contexts payload (version 2) per interval, encoded against the whole graph. A
// simulated agent's batch is then its own sequence, time and target around one payload, so
// the load generator can drive thousands of agents on a few cores.
//
// With ProgramOptions::otlp the same samples are also kept as one OTLP profiles request per
// interval (the dictionary and one profile of ("samples", "count") values, one sample per
// distinct stack, as the OpenTelemetry eBPF profiler sends them), without its resource: each
// simulated agent adds its own service.name, host.name and labels.
#ifndef STRATA_TOOLS_LOADGEN_PROGRAM_H_
#define STRATA_TOOLS_LOADGEN_PROGRAM_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/core/context_graph.h"
#include "opentelemetry/proto/collector/profiles/v1development/profiles_service.pb.h"
#include "strata/v1/ingest.pb.h"
#include "tools/loadgen/sample_stream.h"

namespace strata::loadgen {

struct ProgramOptions {
  uint32_t functions = 6000;
  uint32_t contexts = 200;            // distinct contexts (paths) per interval, at most
  uint32_t samples_per_interval = 3960;  // 99 Hz x 4 busy threads x 10 s
  uint32_t intervals = 16;            // payloads before they repeat
  uint32_t seed = 1;
  // A recorded stream (sample_stream.h's text format, e.g. from record_stream) instead of a
  // synthetic one; the options above other than the seed are then ignored.
  const SampleStream* recorded = nullptr;
  bool otlp = false;  // also build Payload::otlp
};

struct Payload {
  std::string packed_contexts;  // all of target 1
  uint64_t samples = 0;
  uint32_t contexts = 0;
  // The same samples as an OTLP request without a resource's attributes or a time (empty
  // unless ProgramOptions::otlp).
  ::opentelemetry::proto::collector::profiles::v1development::ExportProfilesServiceRequest otlp;
};

// `payload`'s OTLP request as an agent with `resource` (service.name, host.name, labels)
// sends it at `time_unix_nano`.
::opentelemetry::proto::collector::profiles::v1development::ExportProfilesServiceRequest
OtlpRequestOf(const Payload& payload,
              const std::vector<std::pair<std::string, std::string>>& resource,
              uint64_t time_unix_nano);

class Program {
 public:
  static absl::StatusOr<std::unique_ptr<Program>> Build(const ProgramOptions& options);

  // Graph deltas from what a server already has (its Welcome), in messages of bounded size.
  std::vector<v1::GraphDelta> DeltasFrom(uint32_t known_nodes, uint64_t known_edges) const;
  uint64_t epoch() const { return graph_->num_edges(); }
  uint32_t num_nodes() const { return graph_->num_nodes(); }
  const Payload& payload(uint64_t i) const { return payloads_[i % payloads_.size()]; }

 private:
  Program() = default;
  std::unique_ptr<agent::ContextGraph> graph_;
  std::vector<Payload> payloads_;
  std::vector<v1::GraphDelta> initial_deltas_;  // DeltasFrom(0, 0), shipped by most connects
};

}  // namespace strata::loadgen

#endif  // STRATA_TOOLS_LOADGEN_PROGRAM_H_
