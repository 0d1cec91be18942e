// The store's records: what callers pass in and get back (copies, owned by the caller).
// Plain data; how each is encoded on disk is the codec's business (codec.h, internal).
#ifndef STRATA_SERVER_STORE_RECORDS_H_
#define STRATA_SERVER_STORE_RECORDS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "common/labels/labels.h"

namespace strata::server::store {

struct FunctionInfo {
  std::string name;
  std::string module;    // path of the executable or shared library
  std::string build_id;  // GNU build ID as agents send it (lowercase hex); empty if none
  uint64_t start_offset = 0;

  bool operator==(const FunctionInfo&) const = default;
};

struct StackFrames {
  std::vector<uint64_t> function_ids;  // outermost first
  bool truncated = false;              // unwinding stopped before the outermost frame
  // Empty (not known: stacks from before they were kept), or one per frame but the leaf:
  // call_sites[i] is the return-address offset, in function_ids[i]'s module, of its call to
  // function_ids[i + 1]. Part of the stack's identity: one function path called from two
  // sites is two stacks, whose lines differ.
  std::vector<uint64_t> call_sites;

  bool operator==(const StackFrames&) const = default;
};

// Zeroes the call sites inside recursion (a frame whose function is called again deeper in
// the stack): they would make paths, and stacks, exponential in the depth (a function calling
// itself from two sites has 2^depth), where their lines say little. `functions` outermost
// first, `call_sites` one per frame but the leaf; `seen` is scratch, cleared first.
template <typename FunctionId>
void ZeroCallSitesInRecursion(const std::vector<FunctionId>& functions,
                              std::vector<uint64_t>& call_sites,
                              absl::flat_hash_set<FunctionId>& seen) {
  seen.clear();
  for (size_t i = functions.size(); i-- > 0;) {
    if (!seen.insert(functions[i]).second && i < call_sites.size()) call_sites[i] = 0;
  }
}

struct SampleKey {
  std::string service;
  int64_t window_start_ms = 0;
  std::string host;
  uint64_t stack_id = 0;
  uint64_t label_set = 0;  // 0: no labels

  bool operator==(const SampleKey&) const = default;
};

// Time resolution of sample cells. Raw windows are expected to divide a minute evenly
// (e.g. 10 s), so that every raw window lies inside one rollup window.
enum class Resolution {
  kRaw,
  kMinute,
  kHour,
  // Coarsest resolutions that exactly cover the range: whole hours from rollup_1h, whole
  // minutes at the edges from rollup_1m, the rest raw. Keys carry the window start of the
  // resolution they were read at. Not available for captures (always raw).
  kAuto,
};

struct SampleQuery {
  std::string service;
  int64_t from_ms = 0;  // inclusive
  int64_t to_ms = 0;    // exclusive
  std::optional<std::string> host;
  // When set, scans the samples of this capture instead of the continuous profile; the
  // returned keys carry `service` as given here.
  std::optional<std::string> capture_id;
  Resolution resolution = Resolution::kRaw;
  // When set, only cells of these label set IDs (0 for samples without labels); unset: all.
  std::optional<absl::flat_hash_set<uint64_t>> label_sets;
  // When set, only cells of these hosts (a cluster node reading the hosts it serves a
  // fan-out query for).
  std::optional<absl::flat_hash_set<std::string>> hosts;
  // SumSamples: samples per host only, no per-stack sums (a cluster node measuring which
  // hosts it holds for a fan-out query).
  bool hosts_only = false;
};

// A distinct label set of a service's samples.
struct LabelSetRecord {
  uint64_t id = 0;  // 0: the empty set
  labels::LabelSet labels;

  bool operator==(const LabelSetRecord&) const = default;
};

// Samples of one stack summed over a query's range.
struct StackCount {
  uint64_t stack_id = 0;
  uint64_t count = 0;

  bool operator==(const StackCount&) const = default;
};

// The cells of a SampleQuery reduced to one count per stack: what a profile needs, without
// the window and host of every cell.
struct SampleTotals {
  // One entry per stack that has a cell, heaviest first, then by stack ID (stack_counts.h).
  std::vector<StackCount> stacks;
  std::vector<std::string> hosts;  // hosts that have a cell, sorted
  std::vector<uint64_t> host_samples;  // samples of each of `hosts`
};

struct ServiceSummary {
  std::string service;
  int64_t first_window_ms = 0;
  int64_t last_window_ms = 0;
  uint64_t total_samples = 0;

  bool operator==(const ServiceSummary&) const = default;
};

struct AgentRecord {
  std::string agent_id;
  std::string host;
  std::string arch;
  std::string version;
  int64_t last_batch_ms = 0;
  uint64_t batches = 0;
  std::string owner;  // the principal that writes as this agent; empty: none recorded

  bool operator==(const AgentRecord&) const = default;
};

// One function node of an agent's call graph (dense node ID = record index).
struct GraphNode {
  uint32_t id = 0;
  std::string name;
  std::string module;
  std::string build_id;
  uint64_t start_offset = 0;

  bool operator==(const GraphNode&) const = default;
};

// One call edge of an agent's call graph; its edge ID is its index in AgentGraph::edges.
struct GraphEdge {
  uint32_t caller = 0;
  uint64_t call_site = 0;
  uint32_t callee = 0;
  // Whether the server classified it as a back edge, kept so that a reload need not classify
  // again; absent in records written before it was kept.
  std::optional<bool> back;

  bool operator==(const GraphEdge&) const = default;
};

// All persisted records of one (agent, graph_id), in index order. Nodes are contiguous by
// id (starting at whatever id was appended first); edges are contiguous from edge 0.
struct AgentGraph {
  std::vector<GraphNode> nodes;
  std::vector<GraphEdge> edges;
};

// A stored graph and when a batch of it was last applied (WriteBatch::MarkGraphUsed; 0: no
// mark, e.g. a graph stored before marks were kept).
struct StoredGraph {
  std::string agent_id;
  uint64_t graph_id = 0;
  int64_t last_used_ms = 0;

  bool operator==(const StoredGraph&) const = default;
};

struct PhaseEvent {
  std::string service;
  int64_t window_start_ms = 0;
  std::string payload;  // opaque to the store

  bool operator==(const PhaseEvent&) const = default;
};

// Agents' unwinding counters of one service (SampleBatch.unwind), summed.
struct UnwindCounts {
  uint64_t stacks = 0;
  uint64_t truncated = 0;
  uint64_t verify_failures = 0;
  uint64_t jit_frames_cfi = 0;
  uint64_t jit_frames_fp = 0;
  uint64_t lost = 0;
  uint64_t python_frames = 0;
  uint64_t python_stale = 0;

  bool operator==(const UnwindCounts&) const = default;
  // Saturating sum.
  void Add(const UnwindCounts& o);
};

// Where one batch's samples of one service stopped in their user leaf functions
// (SampleBatch.leaf_addresses): function ID, instruction offset in its module, samples.
struct LeafAddressCount {
  uint64_t function_id = 0;
  uint64_t offset = 0;
  uint64_t count = 0;

  bool operator==(const LeafAddressCount&) const = default;
};

struct CaptureInfo {
  std::string capture_id;
  std::string service;
  std::string host;
  uint32_t pid = 0;
  uint32_t frequency_hz = 0;
  int64_t start_ms = 0;
  int64_t end_ms = 0;  // 0 while running
  bool finished = false;
  std::string error;

  bool operator==(const CaptureInfo&) const = default;
};

// A release comparison's state (server/regress), kept so that releases and their verdicts
// survive restarts. The store keeps `payload` as it is: its encoding is the regress module's.
struct ReleaseRecord {
  std::string release_id;  // unique per release: service '\0' label '\0' value
  std::string payload;

  bool operator==(const ReleaseRecord&) const = default;
};

}  // namespace strata::server::store

#endif  // STRATA_SERVER_STORE_RECORDS_H_
