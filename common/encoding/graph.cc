#include "common/encoding/graph.h"

#include <algorithm>
#include <limits>
#include <tuple>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

namespace strata::encoding {
namespace {

// Node IDs must stay representable as uint32 and leave room for the mark epoch scheme.
constexpr size_t kMaxNodes = size_t{1} << 31;

bool IsSource(NodeId n) { return n == kRootNode || n == kTruncatedNode; }

}  // namespace

CallGraph::CallGraph()
    : succ_(kFirstFunctionNode),
      pred_(kFirstFunctionNode),
      order_{0, 1},
      mark_(kFirstFunctionNode, 0) {}

NodeId CallGraph::AddNode() {
  const NodeId id = static_cast<NodeId>(num_nodes_++);
  succ_.emplace_back();
  pred_.emplace_back();
  order_.push_back(next_position_++);  // no edges yet: any position after the others is valid
  mark_.push_back(0);
  return id;
}

absl::Status CallGraph::EnsureNodes(size_t n) {
  if (n > kMaxNodes) {
    return absl::InvalidArgumentError(absl::StrCat("node count ", n, " exceeds the limit"));
  }
  while (num_nodes_ < n) AddNode();
  return absl::OkStatus();
}

std::optional<EdgeId> CallGraph::FindEdge(NodeId caller, uint64_t call_site,
                                          NodeId callee) const {
  auto it = index_.find(EdgeKey{caller, callee, call_site});
  if (it == index_.end()) return std::nullopt;
  return it->second;
}

absl::StatusOr<EdgeId> CallGraph::AddEdge(const CallEdge& edge) {
  if (edge.caller >= num_nodes_ || edge.callee >= num_nodes_) {
    return absl::InvalidArgumentError(absl::StrCat("edge ", edge.caller, " -> ", edge.callee,
                                                   " references an unknown node (have ",
                                                   num_nodes_, ")"));
  }
  if (IsSource(edge.callee)) {
    return absl::InvalidArgumentError(
        absl::StrCat("edge ", edge.caller, " -> ", edge.callee, " calls the root or marker"));
  }
  const EdgeKey key{edge.caller, edge.callee, edge.call_site};
  auto [it, inserted] = index_.try_emplace(key, edges_.size());
  if (!inserted) return it->second;
  auto [pair, first] = first_of_pair_.try_emplace(PairKey(edge.caller, edge.callee),
                                                  edges_.size());
  const bool back = first ? InsertIntoOrder(edge.caller, edge.callee) : is_back_[pair->second];
  edges_.push_back(edge);
  is_back_.push_back(back ? 1 : 0);
  return it->second;
}

void CallGraph::RemoveEdgesFrom(EdgeId first) {
  while (edges_.size() > first) {
    const EdgeId id = edges_.size() - 1;
    const CallEdge& e = edges_[id];
    index_.erase(EdgeKey{e.caller, e.callee, e.call_site});
    auto pair = first_of_pair_.find(PairKey(e.caller, e.callee));
    if (pair->second == id) {
      first_of_pair_.erase(pair);
      // Appended last to both lists: every later non-back edge is gone already.
      if (!is_back_[id]) {
        succ_[e.caller].pop_back();
        pred_[e.callee].pop_back();
      }
    }
    edges_.pop_back();
    is_back_.pop_back();
  }
}

// Pearce-Kelly dynamic topological sort over the non-back edges. order_[n] is n's position.
// Adding x -> y with order_[x] < order_[y] needs nothing; otherwise the nodes reachable from y
// with positions <= order_[x] (delta_f) and the nodes reaching x with positions >= order_[y]
// (delta_b) are re-laid out in the union of their positions, delta_b first. Reaching x from y
// means the edge closes a cycle: it becomes a back edge and is not added to the order.
bool CallGraph::InsertIntoOrder(NodeId x, NodeId y) {
  if (x == y) return true;
  if (order_[y] < order_[x] && succ_[y].empty() && pred_[y].empty()) {
    // A callee without edges reaches nothing and may take any position: a new one above all
    // others. Agents name a new stack's functions leaf first and add its edges root first,
    // each callee below its caller: reordering them one by one would cost the stack's depth
    // per edge.
    order_[y] = next_position_++;
  }
  const uint64_t lb = order_[y];
  const uint64_t ub = order_[x];
  if (lb > ub) {
    succ_[x].push_back(y);
    pred_[y].push_back(x);
    return false;
  }
  if (++mark_epoch_ == 0) {  // wrapped: reset marks
    std::fill(mark_.begin(), mark_.end(), 0);
    mark_epoch_ = 1;
  }
  // Forward search from y.
  scratch_forward_.clear();
  scratch_stack_.clear();
  scratch_stack_.push_back(y);
  mark_[y] = mark_epoch_;
  while (!scratch_stack_.empty()) {
    const NodeId n = scratch_stack_.back();
    scratch_stack_.pop_back();
    scratch_forward_.push_back(n);
    search_steps_ += 1 + succ_[n].size();
    for (NodeId w : succ_[n]) {
      if (w == x) return true;
      if (mark_[w] != mark_epoch_ && order_[w] < ub) {
        mark_[w] = mark_epoch_;
        scratch_stack_.push_back(w);
      }
    }
  }
  // Backward search from x.
  scratch_backward_.clear();
  scratch_stack_.push_back(x);
  mark_[x] = mark_epoch_;
  while (!scratch_stack_.empty()) {
    const NodeId n = scratch_stack_.back();
    scratch_stack_.pop_back();
    scratch_backward_.push_back(n);
    search_steps_ += 1 + pred_[n].size();
    for (NodeId w : pred_[n]) {
      if (mark_[w] != mark_epoch_ && order_[w] > lb) {
        mark_[w] = mark_epoch_;
        scratch_stack_.push_back(w);
      }
    }
  }
  auto by_order = [this](NodeId a, NodeId b) { return order_[a] < order_[b]; };
  std::sort(scratch_forward_.begin(), scratch_forward_.end(), by_order);
  std::sort(scratch_backward_.begin(), scratch_backward_.end(), by_order);
  std::vector<uint64_t> positions;
  positions.reserve(scratch_forward_.size() + scratch_backward_.size());
  for (NodeId n : scratch_backward_) positions.push_back(order_[n]);
  for (NodeId n : scratch_forward_) positions.push_back(order_[n]);
  std::sort(positions.begin(), positions.end());
  size_t i = 0;
  for (NodeId n : scratch_backward_) order_[n] = positions[i++];
  for (NodeId n : scratch_forward_) order_[n] = positions[i++];
  succ_[x].push_back(y);
  pred_[y].push_back(x);
  return false;
}

namespace {

template <typename Lookup>
absl::StatusOr<std::vector<EdgeId>> WalkPath(size_t num_nodes,
                                             std::span<const PathFrame> outer_to_leaf,
                                             bool truncated, Lookup&& lookup) {
  if (outer_to_leaf.empty()) return absl::InvalidArgumentError("empty path");
  for (const PathFrame& f : outer_to_leaf) {
    if (f.function >= num_nodes || IsSource(f.function)) {
      return absl::InvalidArgumentError(
          absl::StrCat("path frame references invalid node ", f.function));
    }
  }
  std::vector<EdgeId> edges;
  edges.reserve(outer_to_leaf.size());
  CallEdge e{truncated ? kTruncatedNode : kRootNode, 0, outer_to_leaf[0].function};
  for (size_t i = 0;; ++i) {
    absl::StatusOr<EdgeId> id = lookup(e);
    if (!id.ok()) return id.status();
    edges.push_back(*id);
    if (i + 1 == outer_to_leaf.size()) break;
    e = CallEdge{outer_to_leaf[i].function, outer_to_leaf[i].call_site,
                 outer_to_leaf[i + 1].function};
  }
  return edges;
}

}  // namespace

absl::StatusOr<std::vector<EdgeId>> CallGraph::AddPath(std::span<const PathFrame> outer_to_leaf,
                                                       bool truncated) {
  return WalkPath(num_nodes_, outer_to_leaf, truncated,
                  [this](const CallEdge& e) { return AddEdge(e); });
}

absl::StatusOr<std::vector<EdgeId>> CallGraph::FindPath(
    std::span<const PathFrame> outer_to_leaf, bool truncated) const {
  return WalkPath(num_nodes_, outer_to_leaf, truncated,
                  [this](const CallEdge& e) -> absl::StatusOr<EdgeId> {
                    std::optional<EdgeId> id = FindEdge(e.caller, e.call_site, e.callee);
                    if (!id) {
                      return absl::NotFoundError(absl::StrCat("no edge ", e.caller, " -> ",
                                                              e.callee, " at ", e.call_site));
                    }
                    return *id;
                  });
}

absl::StatusOr<std::vector<CallEdge>> ExportEdges(const CallGraph& graph, uint64_t from,
                                                  uint64_t to) {
  if (from > to || to > graph.num_edges()) {
    return absl::OutOfRangeError(absl::StrCat("edge range [", from, ", ", to,
                                              ") not inside [0, ", graph.num_edges(), ")"));
  }
  auto all = graph.edges();
  return std::vector<CallEdge>(all.begin() + from, all.begin() + to);
}

absl::Status AppendNodes(CallGraph& graph, uint32_t first_node, size_t count) {
  if (first_node != graph.num_nodes()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "delta starts at node ", first_node, " but the graph has ", graph.num_nodes()));
  }
  if (count > kMaxNodes - graph.num_nodes()) {
    return absl::InvalidArgumentError(absl::StrCat("node count overflow: ", count));
  }
  return graph.EnsureNodes(graph.num_nodes() + count);
}

absl::Status AppendEdges(CallGraph& graph, uint64_t first_edge, std::span<const CallEdge> edges,
                         uint64_t max_search_steps) {
  if (first_edge != graph.num_edges()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "delta starts at edge ", first_edge, " but the graph has ", graph.num_edges()));
  }
  // Validate everything first so that a bad delta leaves the graph untouched.
  absl::flat_hash_set<std::tuple<NodeId, NodeId, uint64_t>> seen;
  seen.reserve(edges.size());
  for (size_t i = 0; i < edges.size(); ++i) {
    const CallEdge& e = edges[i];
    if (e.caller >= graph.num_nodes() || e.callee >= graph.num_nodes() || IsSource(e.callee)) {
      return absl::InvalidArgumentError(
          absl::StrCat("delta edge ", first_edge + i, " (", e.caller, " -> ", e.callee,
                       ") references an unknown or invalid node"));
    }
    if (graph.FindEdge(e.caller, e.call_site, e.callee) ||
        !seen.insert({e.caller, e.callee, e.call_site}).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("delta edge ", first_edge + i, " duplicates an existing edge"));
    }
  }
  for (const CallEdge& e : edges) {
    absl::StatusOr<EdgeId> id = graph.AddEdge(e);
    if (!id.ok()) return id.status();  // unreachable after validation
    if (graph.search_steps() > max_search_steps) {
      graph.RemoveEdgesFrom(first_edge);
      return absl::ResourceExhaustedError(absl::StrCat(
          "classifying the call graph's edges took more than ", max_search_steps,
          " search steps, at edge ", *id, " (a long chain added against its order)"));
    }
  }
  return absl::OkStatus();
}

absl::Status RestoreEdges(CallGraph& graph, std::span<const CallEdge> edges,
                          std::span<const uint8_t> is_back) {
  if (graph.num_edges() != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("restoring edges into a graph that has ", graph.num_edges()));
  }
  if (is_back.size() != edges.size()) {
    return absl::InvalidArgumentError(absl::StrCat(edges.size(), " edges but ",
                                                   is_back.size(), " back-edge flags"));
  }
  // Checked as the edges go in (the index finds repeats; no second set of every edge, which
  // for the largest graphs would be a few hundred megabytes); on error they come out again.
  const auto fail = [&graph](absl::Status status) {
    graph.RemoveEdgesFrom(0);
    return status;
  };
  graph.edges_.reserve(edges.size());
  graph.is_back_.reserve(edges.size());
  graph.index_.reserve(edges.size());
  for (size_t i = 0; i < edges.size(); ++i) {
    const CallEdge& e = edges[i];
    const bool back = is_back[i] != 0;
    if (e.caller >= graph.num_nodes() || e.callee >= graph.num_nodes() || IsSource(e.callee)) {
      return fail(absl::InvalidArgumentError(
          absl::StrCat("edge ", i, " (", e.caller, " -> ", e.callee,
                       ") references an unknown or invalid node")));
    }
    if (e.caller == e.callee && !back) {
      return fail(absl::DataLossError(
          absl::StrCat("edge ", i, " calls its own caller but is not a back edge")));
    }
    auto pair = graph.first_of_pair_.find(CallGraph::PairKey(e.caller, e.callee));
    const bool first = pair == graph.first_of_pair_.end();
    if (!first && (graph.is_back_[pair->second] != 0) != back) {
      return fail(absl::DataLossError(
          absl::StrCat("edge ", i, " and edge ", pair->second,
                       " join the same functions but only one is a back edge")));
    }
    if (!graph.index_.try_emplace(CallGraph::EdgeKey{e.caller, e.callee, e.call_site}, i)
             .second) {
      return fail(absl::InvalidArgumentError(
          absl::StrCat("edge ", i, " duplicates an earlier edge")));
    }
    if (first) graph.first_of_pair_.emplace(CallGraph::PairKey(e.caller, e.callee), i);
    graph.edges_.push_back(e);
    graph.is_back_.push_back(back ? 1 : 0);
    if (first && !back) {
      graph.succ_[e.caller].push_back(e.callee);
      graph.pred_[e.callee].push_back(e.caller);
    }
  }
  // Kahn's algorithm over the non-back edges: each node's position comes after its callers'.
  const size_t n = graph.num_nodes();
  std::vector<uint32_t> callers(n);
  std::vector<NodeId> ready;
  for (NodeId v = 0; v < n; ++v) {
    callers[v] = static_cast<uint32_t>(graph.pred_[v].size());
    if (callers[v] == 0) ready.push_back(v);
  }
  uint64_t position = 0;
  while (!ready.empty()) {
    const NodeId v = ready.back();
    ready.pop_back();
    graph.order_[v] = position++;
    for (NodeId w : graph.succ_[v]) {
      if (--callers[w] == 0) ready.push_back(w);
    }
  }
  if (position != n) {
    // Positions are left half assigned: give every node a distinct one again.
    for (NodeId v = 0; v < n; ++v) graph.order_[v] = v;
    graph.next_position_ = n;
    return fail(absl::DataLossError("the non-back edges form a cycle"));
  }
  graph.next_position_ = position;
  return absl::OkStatus();
}

}  // namespace strata::encoding
