// Append-only call graph shared by the agent (which discovers it while unwinding) and the
// server (which replays the agent's GraphDelta messages). It is the input of the dynamic PCCE
// numbering in numbering.h.
//
// Ownership: a CallGraph belongs to one agent session (agent side) or one agent's session
// state (server side). It is not thread-safe; Numbering snapshots copy what they need, so they
// can be used from other threads while the graph keeps growing.
//
// Node and edge IDs are dense and assigned in discovery order, so two graphs built from the same
// node count and edge list are identical, including the back-edge classification (decided once,
// when an edge is added, and never changed).
#ifndef STRATA_COMMON_ENCODING_GRAPH_H_
#define STRATA_COMMON_ENCODING_GRAPH_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace strata::encoding {

using NodeId = uint32_t;
using EdgeId = uint64_t;

// Virtual root: a thread's outermost frame is called from here (call_site 0).
inline constexpr NodeId kRootNode = 0;
// Marker for stacks whose unwinding stopped early: the outermost recovered frame is called from
// here (call_site 0). It hangs off the root implicitly; decoding reports truncated=true.
inline constexpr NodeId kTruncatedNode = 1;
// First ID returned by AddNode().
inline constexpr NodeId kFirstFunctionNode = 2;

// `caller` calls `callee` from the call site whose return address is `call_site` (offset in
// the caller's module; 0 for edges from kRootNode / kTruncatedNode).
struct CallEdge {
  NodeId caller = 0;
  uint64_t call_site = 0;
  NodeId callee = 0;
  friend bool operator==(const CallEdge&, const CallEdge&) = default;
};

// One frame of a path, outermost first. `call_site` is the return-address offset of the call
// made from this frame to the next (inner) frame; ignored (0 when decoded) for the leaf.
struct PathFrame {
  NodeId function = 0;
  uint64_t call_site = 0;
  friend bool operator==(const PathFrame&, const PathFrame&) = default;
};

class CallGraph {
 public:
  CallGraph();
  CallGraph(const CallGraph&) = delete;
  CallGraph& operator=(const CallGraph&) = delete;
  CallGraph(CallGraph&&) = default;
  CallGraph& operator=(CallGraph&&) = default;

  // Returns the next dense node ID (the first call returns kFirstFunctionNode).
  NodeId AddNode();
  // Server side: grows the node count to `n` (no-op when already >= n). Errors when n would
  // exceed the node limit.
  absl::Status EnsureNodes(size_t n);

  // Includes kRootNode and kTruncatedNode, so an empty graph has 2 nodes.
  size_t num_nodes() const { return num_nodes_; }
  // The epoch of a numbering of the whole graph.
  uint64_t num_edges() const { return edges_.size(); }

  // Appends an edge, or returns the existing ID when the same (caller, call_site, callee) is
  // already present. The edge is classified as a back edge, for good, when it would close a
  // cycle among the non-back edges. Errors: unknown caller/callee, callee is the root or the
  // truncated marker.
  absl::StatusOr<EdgeId> AddEdge(const CallEdge& edge);
  std::optional<EdgeId> FindEdge(NodeId caller, uint64_t call_site, NodeId callee) const;

  // Work spent classifying edges since the graph was made: nodes visited and adjacency
  // entries scanned by the searches. Pearce-Kelly's cost per edge is bounded by the region it
  // reorders, not by a constant: adding the edges of a long chain against its order costs
  // the chain's length each, so a graph of n edges can cost n^2 / 2. AppendEdges bounds it.
  uint64_t search_steps() const { return search_steps_; }

  // Requires id < num_edges().
  const CallEdge& edge(EdgeId id) const { return edges_[id]; }
  bool is_back_edge(EdgeId id) const { return is_back_[id] != 0; }
  std::span<const CallEdge> edges() const { return edges_; }

  // Agent side: adds the edges of a sampled path (outermost first) that are missing and returns
  // the path's edge IDs, starting with the edge from kRootNode (or kTruncatedNode when
  // `truncated`). All nodes must exist. Errors: empty path, unknown node, root/marker inside.
  absl::StatusOr<std::vector<EdgeId>> AddPath(std::span<const PathFrame> outer_to_leaf,
                                              bool truncated);
  // Same, without adding edges: errors (NotFound) when an edge is missing.
  absl::StatusOr<std::vector<EdgeId>> FindPath(std::span<const PathFrame> outer_to_leaf,
                                               bool truncated) const;

 private:
  struct EdgeKey {
    NodeId caller;
    NodeId callee;
    uint64_t call_site;
    friend bool operator==(const EdgeKey&, const EdgeKey&) = default;
    template <typename H>
    friend H AbslHashValue(H h, const EdgeKey& k) {
      return H::combine(std::move(h), k.caller, k.callee, k.call_site);
    }
  };

  static uint64_t PairKey(NodeId caller, NodeId callee) {
    return uint64_t{caller} << 32 | callee;
  }

  // Incremental topological order of the non-back edges (Pearce-Kelly). Returns true when
  // caller -> callee would close a cycle; otherwise records the edge in the order.
  bool InsertIntoOrder(NodeId caller, NodeId callee);

  // Removes the edges [first, num_edges()), the last ones first: AppendEdges undoes a delta
  // with it. The topological order stays valid for the edges that remain.
  void RemoveEdgesFrom(EdgeId first);
  friend absl::Status AppendEdges(CallGraph& graph, uint64_t first_edge,
                                  std::span<const CallEdge> edges, uint64_t max_search_steps);
  friend absl::Status RestoreEdges(CallGraph& graph, std::span<const CallEdge> edges,
                                   std::span<const uint8_t> is_back);

  size_t num_nodes_ = kFirstFunctionNode;
  std::vector<CallEdge> edges_;
  std::vector<uint8_t> is_back_;
  absl::flat_hash_map<EdgeKey, EdgeId> index_;
  // The first edge of each (caller, callee) pair. Another call site of the same pair is
  // classified like it without a search (non-back edges only grow, so callee still reaches
  // caller, or caller -> callee is still in the order) and adds nothing to the adjacency.
  absl::flat_hash_map<uint64_t, EdgeId> first_of_pair_;
  uint64_t search_steps_ = 0;

  // Non-back adjacency and topological positions, used only for classification.
  std::vector<std::vector<NodeId>> succ_;
  std::vector<std::vector<NodeId>> pred_;
  // Positions: distinct, not dense (a node may move to a new top position).
  std::vector<uint64_t> order_;
  uint64_t next_position_ = kFirstFunctionNode;
  std::vector<uint32_t> mark_;
  uint32_t mark_epoch_ = 0;
  std::vector<NodeId> scratch_forward_;
  std::vector<NodeId> scratch_backward_;
  std::vector<NodeId> scratch_stack_;
};

// ---- GraphDelta helpers (wire <-> graph) ----

// Edges [from, to) for a GraphDelta. Errors when the range is not inside the graph.
absl::StatusOr<std::vector<CallEdge>> ExportEdges(const CallGraph& graph, uint64_t from,
                                                  uint64_t to);

// Server side: applies the node part of a GraphDelta. `first_node` must equal
// graph.num_nodes() (else FailedPrecondition, the caller answers Resync); `count` nodes are
// added.
absl::Status AppendNodes(CallGraph& graph, uint32_t first_node, size_t count);

// Server side: appends an edge list received from the wire. `first_edge` must equal
// graph.num_edges() (else FailedPrecondition). Every edge must reference existing nodes, must
// not point into the root/marker and must not duplicate an existing edge or another edge of
// the delta (InvalidArgument). When classifying the edges takes graph.search_steps() past
// `max_search_steps`, ResourceExhausted (the steps spent stay counted). All-or-nothing: on
// error the graph's edges are unchanged.
absl::Status AppendEdges(CallGraph& graph, uint64_t first_edge, std::span<const CallEdge> edges,
                         uint64_t max_search_steps = UINT64_MAX);

// Server side, reloading a graph it classified before: adds `edges` to a graph that has none,
// each with the back-edge flag it was given then (`is_back[i]` for edges[i]), without the
// searches, and lays out the non-back edges' topological order in one pass: time linear in
// nodes plus edges, where AppendEdges costs what classifying them cost. Only for flags the
// graph's own classification produced: a back flag on an edge that closes no cycle is not
// detected. Errors: FailedPrecondition when the graph has edges; InvalidArgument as
// AppendEdges; DataLoss for flags no classification gives (non-back edges that form a cycle,
// a self-call not back, two call sites of one pair flagged apart). On error the graph has no
// edges.
absl::Status RestoreEdges(CallGraph& graph, std::span<const CallEdge> edges,
                          std::span<const uint8_t> is_back);

}  // namespace strata::encoding

#endif  // STRATA_COMMON_ENCODING_GRAPH_H_
