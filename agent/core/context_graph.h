// The agent's side of the calling-context encoding: function nodes (keyed by module and
// function start) and the append-only call graph discovered while unwinding, plus the
// records the shipper sends to the server as GraphDelta messages.
//
// Written by the profiling thread (NodeFor/AddPath/ExtendPath), read by the shipping thread
// (DeltaFrom): methods lock internally, except that ExtendPath, the per-sample call, reads
// without the lock (one writer) and locks only to add. The graph only grows for the life of the agent process; its
// random graph_id tells the server when an agent restarted with a new graph.
#ifndef STRATA_AGENT_CORE_CONTEXT_GRAPH_H_
#define STRATA_AGENT_CORE_CONTEXT_GRAPH_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/encoding/graph.h"
#include "common/encoding/numbering.h"
#include "strata/v1/ingest.pb.h"

namespace strata::agent {

struct FunctionRecord {
  std::string name;
  std::string module;
  std::string build_id;  // lowercase hex
  uint64_t start_offset = 0;
};

class ContextGraph {
 public:
  // (build ID, or the module's path without one; start offset; name).
  using NodeKey = std::tuple<std::string, uint64_t, std::string>;

  explicit ContextGraph(uint64_t graph_id) : graph_id_(graph_id) {}

  uint64_t graph_id() const { return graph_id_; }

  // The node of a function, created on first sight.
  encoding::NodeId NodeFor(const FunctionRecord& function);
  // Edge IDs of a sampled path (outermost first), adding missing edges.
  absl::StatusOr<std::vector<encoding::EdgeId>> AddPath(
      std::span<const encoding::PathFrame> outer_to_leaf, bool truncated);
  // AddPath for a path whose first `known` edge IDs are already in (*edges)[0, known), from
  // an earlier AddPath/ExtendPath of the same outer frames with the same `truncated` (edges
  // never change once added). Only the edges into frames [known, end) are looked up or
  // added; *edges is resized to the path's length. Lets the profiler reuse the edge-ID
  // prefix of a thread's unchanged outer frames and keep one vector per thread (no
  // allocation per sample). On error *edges is shortened to the valid prefix.
  //
  // Only from the thread that writes the graph (the profiling thread): it reads without the
  // lock unless it adds an edge.
  absl::Status ExtendPath(std::span<const encoding::PathFrame> outer_to_leaf, bool truncated,
                          size_t known, std::vector<encoding::EdgeId>* edges)
      ABSL_NO_THREAD_SAFETY_ANALYSIS;
  // Appends a delta this graph produced earlier (DeltaFrom, kept in the agent's spool): a
  // restarted agent resumes its graph. Errors when the delta does not continue the graph
  // exactly where it ends (nodes and edges in order, no duplicate) or names unknown nodes;
  // the graph is then unchanged by the part that failed.
  absl::Status Restore(const v1::GraphDelta& delta);
  // Numbering of the current epoch (recomputed only when edges were added since).
  absl::StatusOr<std::shared_ptr<const encoding::Numbering>> CurrentNumbering();

  // Nodes from `from_node` and edges from `from_edge` as one message of at most
  // `max_nodes` nodes and `max_edges` edges (edges only up to the first that references a
  // node not in the message or earlier): the server bounds its messages, so a large graph
  // goes out in several. Names and modules are cut to what the server accepts (at a UTF-8
  // character boundary).
  static constexpr uint32_t kMaxDeltaNodes = 16384;
  static constexpr uint32_t kMaxDeltaEdges = 65536;
  static constexpr size_t kMaxNameBytes = 16384;
  static constexpr size_t kMaxPathBytes = 4096;
  v1::GraphDelta DeltaFrom(uint32_t from_node, uint64_t from_edge,
                           uint32_t max_nodes = kMaxDeltaNodes,
                           uint32_t max_edges = kMaxDeltaEdges) const;
  uint32_t num_nodes() const;
  uint64_t num_edges() const;

 private:
  const uint64_t graph_id_;
  mutable absl::Mutex mu_;
  encoding::CallGraph graph_ ABSL_GUARDED_BY(mu_);
  std::vector<FunctionRecord> functions_ ABSL_GUARDED_BY(mu_);  // by node ID - 2
  absl::flat_hash_map<NodeKey, encoding::NodeId> nodes_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<const encoding::Numbering> numbering_ ABSL_GUARDED_BY(mu_);
};

}  // namespace strata::agent

#endif  // STRATA_AGENT_CORE_CONTEXT_GRAPH_H_
