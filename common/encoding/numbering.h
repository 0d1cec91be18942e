// Dynamic precise calling context encoding (PCCE, Sumner et al.) over an append-only CallGraph.
//
// A Numbering is the deterministic PCCE numbering of the first `epoch` edges of a graph
// (epoch = number of edges). The agent encodes each distinct calling context of a shipping
// interval against the numbering of the batch's epoch; the server replays the same edge list,
// computes the numbering of that epoch and decodes. Both sides compute bit-identical numberings
// from the same edge list.
//
// Scheme (see DESIGN.md, "Context encoding"):
//  * Nodes are processed in a topological order of the non-back edges. A node's incoming
//    edges are laid out as: one dummy edge from the root per incoming back or push edge (in
//    edge ID order), then its forward edges in edge ID order. An edge's annotation is the sum
//    of the context counts (numCC) of the edges before it; a dummy edge covers one value.
//    numCC(root) = numCC(truncated marker) = 1.
//  * If a forward edge would make numCC exceed 2^63, it becomes a push edge for this epoch
//    ("selective reduction"); the decision depends only on the edge list.
//  * Encoding a path: id = 0; a forward edge adds its annotation; a back or push edge pushes
//    the current id and restarts at the annotation of its dummy edge. The result is
//    (leaf, ids) with ids[0] the outermost segment and ids.back() the segment ending at the leaf.
//    One dummy per back/push edge (instead of the paper's one per target) makes the pushed
//    entry identify the edge, so no call site has to be sent.
//
// Ownership: Numbering is immutable and self-contained (it copies the edges it needs), shared
// through std::shared_ptr<const Numbering>; it may be used from any thread. Encoder borrows a
// Numbering and must not outlive it.
#ifndef STRATA_COMMON_ENCODING_NUMBERING_H_
#define STRATA_COMMON_ENCODING_NUMBERING_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/encoding/graph.h"

namespace strata::encoding {

// Upper bound of numCC(node); every id is < kMaxContexts.
inline constexpr uint64_t kMaxContexts = uint64_t{1} << 63;
// Default bound on the number of frames Decode() produces.
inline constexpr size_t kDefaultMaxDecodeDepth = 4096;

// One distinct calling context: ids[0] outermost segment ... back() the segment ending at the
// leaf (proto strata.v1.ContextCount fields leaf/ids).
struct EncodedContext {
  NodeId leaf = 0;
  std::vector<uint64_t> ids;
  friend bool operator==(const EncodedContext&, const EncodedContext&) = default;
};

enum class EdgeKind : uint8_t {
  kForward = 0,  // adds its annotation
  kBack = 1,     // closes a cycle: push, restart at its dummy's annotation
  kPush = 2,     // forward edge whose range would overflow: same handling as kBack
};

class Numbering {
 public:
  // Numbering of edges [0, epoch) of `graph` (nodes: all of graph's current nodes).
  // Errors: epoch > graph.num_edges(). O(nodes + edges).
  static absl::StatusOr<std::shared_ptr<const Numbering>> Compute(const CallGraph& graph,
                                                                  uint64_t epoch);

  uint64_t epoch() const { return edges_.size(); }
  size_t num_nodes() const { return num_contexts_.size(); }
  // Number of distinct acyclic segment contexts ending at `node` (0 for unknown nodes).
  uint64_t num_contexts(NodeId node) const {
    return node < num_contexts_.size() ? num_contexts_[node] : 0;
  }
  // Requires edge < epoch().
  EdgeKind kind(EdgeId edge) const { return edges_[edge].kind; }
  // Forward edge: its annotation. Back/push edge: the annotation of its dummy edge.
  uint64_t annotation(EdgeId edge) const { return edges_[edge].value; }
  const CallEdge& edge(EdgeId edge) const { return edges_[edge].edge; }
  // Number of push edges ("selective reduction") in this epoch.
  uint64_t num_push_edges() const { return num_push_edges_; }
  // Heap bytes held (per edge and per node of the epoch: a few dozen bytes each).
  size_t MemoryBytes() const;

  // Decoding to edge IDs (outermost first). See Decode().
  absl::Status DecodeEdges(const EncodedContext& context, std::vector<EdgeId>* edges_out,
                           bool* truncated, size_t max_depth = kDefaultMaxDecodeDepth) const;

 private:
  struct EdgeInfo {
    CallEdge edge;
    uint64_t value = 0;
    EdgeKind kind = EdgeKind::kForward;
  };
  // One decodable range of a node's incoming edges: [start, next entry's start).
  struct InRange {
    uint64_t start;
    EdgeId edge;
    bool dummy;
  };

  Numbering() = default;

  std::vector<EdgeInfo> edges_;
  std::vector<uint64_t> num_contexts_;
  std::vector<uint64_t> range_begin_;  // per node, index into ranges_; size num_nodes + 1
  std::vector<InRange> ranges_;
  uint64_t num_push_edges_ = 0;
};

// Encodes many paths against one Numbering (agent: once per batch, each distinct path once).
class Encoder {
 public:
  explicit Encoder(const Numbering& numbering) : numbering_(numbering) {}

  // `edges` is a path from kRootNode or kTruncatedNode to the leaf (as CallGraph::AddPath
  // returns). Errors: empty, edge beyond the epoch, discontinuous, not starting at the root.
  absl::StatusOr<EncodedContext> Encode(std::span<const EdgeId> edges) const;
  // Same into `out` (reuses its storage).
  absl::Status EncodeInto(std::span<const EdgeId> edges, EncodedContext* out) const;

  const Numbering& numbering() const { return numbering_; }

 private:
  const Numbering& numbering_;
};

// Convenience for one-off encodes: adds the path's missing edges to `graph`, refreshes
// `*numbering` when it is null or its epoch differs from graph.num_edges(), then encodes.
// Agents encoding many paths should use AddPath during the interval and one Encoder per batch.
absl::StatusOr<EncodedContext> EncodePath(CallGraph& graph,
                                          std::span<const PathFrame> outer_to_leaf,
                                          bool truncated,
                                          std::shared_ptr<const Numbering>* numbering);

// Server side: decodes to the outer->leaf path (the leaf's call_site is 0). `*truncated` is
// set when the path hangs off kTruncatedNode. Errors (never crashes or loops): unknown leaf,
// empty ids, id out of range, stack underflow or leftover ids, more than `max_depth` frames.
absl::StatusOr<std::vector<PathFrame>> Decode(const Numbering& numbering,
                                              const EncodedContext& context, bool* truncated,
                                              size_t max_depth = kDefaultMaxDecodeDepth);

// Keeps the numberings of the few most recent epochs of one graph (server: per agent session;
// agent: the latest). Not thread-safe; the returned numberings are.
class NumberingCache {
 public:
  explicit NumberingCache(size_t capacity = 4) : capacity_(capacity == 0 ? 1 : capacity) {}
  // Errors: epoch > graph.num_edges() (the batch references edges the server has not seen).
  // Computing a numbering drops those of older epochs: an agent's batches name epochs in
  // order (the ingest refuses one older than the last applied), so a graph that keeps
  // growing would otherwise keep `capacity` numberings (each a few dozen bytes per edge)
  // where one is used.
  absl::StatusOr<std::shared_ptr<const Numbering>> Get(const CallGraph& graph, uint64_t epoch);
  // Drop everything (e.g. when the graph is replaced after a Resync).
  void Clear() { entries_.clear(); }
  // Heap bytes of the numberings kept (shared with callers that still hold one).
  size_t MemoryBytes() const;

 private:
  size_t capacity_;
  std::deque<std::shared_ptr<const Numbering>> entries_;  // most recent first
};

}  // namespace strata::encoding

#endif  // STRATA_COMMON_ENCODING_NUMBERING_H_
