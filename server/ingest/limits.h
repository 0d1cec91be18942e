// Bounds on what one agent may send: per message (strings, maps, repeated fields, graph
// deltas, targets and services per batch), per agent graph, per context count and per
// sequence jump. Everything an agent sends is checked against them before it touches the
// store or the aggregation tables, so a broken or hostile client costs bounded memory and
// time and gets a clear error; well-behaved agents stay far below every default. Each bound
// has a strata-server flag (server/app/server_flags.cc) for fleets that need more.
#ifndef STRATA_SERVER_INGEST_LIMITS_H_
#define STRATA_SERVER_INGEST_LIMITS_H_

#include <cstdint>
#include <string_view>

#include "absl/status/status.h"
#include "strata/v1/ingest.pb.h"

namespace strata::server::ingest {

// How far past the server's clock samples may be (a host's clock that far ahead is wrong):
// samples stored in the year 2262 would show in no default range and outlive retention.
inline constexpr int64_t kMaxAheadOfServerMs = int64_t{24} * 3600 * 1000;

// Edges' worth of search steps every graph may spend, however small.
inline constexpr uint64_t kGraphSearchFloorEdges = 4096;

struct IngestLimits {
  // Whole gRPC messages (the transport refuses larger ones with RESOURCE_EXHAUSTED).
  uint32_t max_message_bytes = 16u << 20;
  // One GraphDelta; agents split larger graphs into several.
  uint32_t max_delta_nodes = 1u << 16;
  uint32_t max_delta_edges = 1u << 18;
  // One agent graph in total (a large program has ~10^5 functions and a few 10^5 edges).
  uint32_t max_graph_nodes = 1u << 21;
  uint64_t max_graph_edges = uint64_t{1} << 23;
  // Work classifying one agent graph's edges (encoding::CallGraph::search_steps), per edge
  // of the graph counting kGraphSearchFloorEdges more: the search is cheap for the orders
  // agents add edges in (about 50 steps an edge for a compiler's graph of 28,000 edges,
  // slowly growing with the graph) and quadratic for a long chain sent against its order.
  uint32_t max_graph_search_steps_per_edge = 1024;
  // One SampleBatch.
  uint32_t max_batch_targets = 4096;
  uint32_t max_batch_services = 256;
  uint32_t max_batch_contexts = 1u << 20;
  // Frames of the stacks one batch's contexts decode to, those not decoded before: a few
  // bytes of context may stand for thousands of frames (a deep path of a small graph), each
  // stack kept as a record of its own. A large program's first batch: ~10^5 contexts of
  // tens of frames.
  uint64_t max_batch_decoded_frames = uint64_t{1} << 23;
  // One context's count in one batch: 2^32 - 1 is 4 * 10^9 samples, far above a whole host's
  // samples per interval. Stored totals saturate at 2^64 - 1 (common/base/saturating.h).
  uint64_t max_context_count = (uint64_t{1} << 32) - 1;
  // A batch numbered further than this above the last applied one of its agent incarnation
  // is refused: 2^20 batches are 4 months of 10 s intervals with a capture every second.
  uint64_t max_sequence_gap = uint64_t{1} << 20;
  // Strings: identifiers (agent ID, host, service, capture ID, arch, version, build ID),
  // paths (modules, executables), function names (demangled C++ can be long), free text.
  uint32_t max_id_bytes = 256;
  uint32_t max_path_bytes = 4096;
  uint32_t max_name_bytes = 16384;
  uint32_t max_text_bytes = 4096;
  uint32_t max_labels = 64;
  uint32_t max_label_bytes = 1024;
  // Distinct label sets (Target.labels with Hello.labels) per service, ever stored: each is
  // a separate series in every query. Past it a target's samples are stored under the one
  // set {strata_overflow=label_sets}, counted and logged.
  uint32_t max_label_sets = 10'000;
};

// Shape checks of single messages (sizes, counts, NUL bytes in key parts). InvalidArgument
// naming the field and the bound.
// Hello.labels keys may not be reserved ("__...") either.
absl::Status CheckHello(const v1::Hello& hello, const IngestLimits& limits);
absl::Status CheckGraphDelta(const v1::GraphDelta& delta, const IngestLimits& limits);
// Targets (count, strings, distinct services, labels: at most max_labels each, in the
// syntax of common/labels, no reserved "__" keys), the number of repeated contexts, the
// profile type (CPU or off-CPU; captures CPU only) and the unwind counters.
absl::Status CheckBatchShape(const v1::SampleBatch& batch, const IngestLimits& limits);
absl::Status CheckHeartbeat(const v1::Heartbeat& heartbeat, const IngestLimits& limits);
absl::Status CheckCaptureStatus(const v1::CaptureStatus& status, const IngestLimits& limits);

// A key part of the store (agent ID, host, service, capture ID): non-empty, at most
// `max_bytes`, no NUL.
bool ValidKeyPart(std::string_view s, uint32_t max_bytes);

}  // namespace strata::server::ingest

#endif  // STRATA_SERVER_INGEST_LIMITS_H_
