#include "agent/core/context_graph.h"

#include <optional>

#include "absl/strings/str_cat.h"

namespace strata::agent {

namespace {

// Functions are identified by their module (build ID when it has one, so the same library in
// two processes is one node), start offset and name: two files of one build ID may not name
// it alike (a stripped copy has no name for a local function), and the name a node was sent
// with is the name it keeps.
ContextGraph::NodeKey KeyOf(const FunctionRecord& function) {
  return {function.build_id.empty() ? function.module : function.build_id,
          function.start_offset, function.name};
}

}  // namespace

encoding::NodeId ContextGraph::NodeFor(const FunctionRecord& function) {
  absl::MutexLock lock(&mu_);
  NodeKey key = KeyOf(function);
  auto it = nodes_.find(key);
  if (it != nodes_.end()) return it->second;
  const encoding::NodeId node = graph_.AddNode();
  functions_.push_back(function);
  nodes_.emplace(std::move(key), node);
  return node;
}

absl::StatusOr<std::vector<encoding::EdgeId>> ContextGraph::AddPath(
    std::span<const encoding::PathFrame> outer_to_leaf, bool truncated) {
  absl::MutexLock lock(&mu_);
  return graph_.AddPath(outer_to_leaf, truncated);
}

absl::Status ContextGraph::ExtendPath(std::span<const encoding::PathFrame> outer_to_leaf,
                                      bool truncated, size_t known,
                                      std::vector<encoding::EdgeId>* edges) {
  if (outer_to_leaf.empty()) return absl::InvalidArgumentError("empty path");
  if (known > outer_to_leaf.size() || known > edges->size()) {
    return absl::InvalidArgumentError("known edge prefix longer than the path");
  }
  edges->resize(outer_to_leaf.size());
  // The profiling thread is the graph's only writer: it finds the edges it added earlier
  // without the lock (the shipper's reads, under the lock, do not race with reads) and takes
  // the lock only to add one. A steady-state sample, whose edges all exist, takes no lock.
  std::optional<absl::MutexLock> lock;
  for (size_t i = known; i < outer_to_leaf.size(); ++i) {
    const encoding::PathFrame& f = outer_to_leaf[i];
    // Same checks as CallGraph::AddPath: function nodes only (no root or marker inside).
    if (f.function < encoding::kFirstFunctionNode || f.function >= graph_.num_nodes()) {
      edges->resize(i);
      return absl::InvalidArgumentError("path frame references an invalid node");
    }
    const encoding::CallEdge e =
        i == 0 ? encoding::CallEdge{truncated ? encoding::kTruncatedNode : encoding::kRootNode,
                                    0, f.function}
               : encoding::CallEdge{outer_to_leaf[i - 1].function,
                                    outer_to_leaf[i - 1].call_site, f.function};
    if (std::optional<encoding::EdgeId> found = graph_.FindEdge(e.caller, e.call_site, e.callee)) {
      (*edges)[i] = *found;
      continue;
    }
    if (!lock.has_value()) lock.emplace(&mu_);
    absl::StatusOr<encoding::EdgeId> id = graph_.AddEdge(e);
    if (!id.ok()) {
      edges->resize(i);
      return id.status();
    }
    (*edges)[i] = *id;
  }
  return absl::OkStatus();
}

absl::Status ContextGraph::Restore(const v1::GraphDelta& delta) {
  absl::MutexLock lock(&mu_);
  if (delta.nodes_size() > 0 && delta.first_node() != graph_.num_nodes()) {
    return absl::DataLossError(absl::StrCat("graph delta starts at node ", delta.first_node(),
                                            ", the graph has ", graph_.num_nodes()));
  }
  if (delta.edges_size() > 0 && delta.first_edge() != graph_.num_edges()) {
    return absl::DataLossError(absl::StrCat("graph delta starts at edge ", delta.first_edge(),
                                            ", the graph has ", graph_.num_edges()));
  }
  for (const v1::FunctionNode& n : delta.nodes()) {
    FunctionRecord f{n.name(), n.module(), n.build_id(), n.start_offset()};
    NodeKey key = KeyOf(f);
    if (n.id() != graph_.num_nodes() || nodes_.contains(key)) {
      return absl::DataLossError(absl::StrCat("graph delta node ", n.id(), " out of order"));
    }
    nodes_.emplace(std::move(key), graph_.AddNode());
    functions_.push_back(std::move(f));
  }
  for (const v1::CallEdge& e : delta.edges()) {
    const uint64_t expected = graph_.num_edges();
    auto id = graph_.AddEdge({e.caller(), e.call_site(), e.callee()});
    if (!id.ok()) return id.status();
    if (*id != expected) return absl::DataLossError("graph delta repeats an edge");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const encoding::Numbering>> ContextGraph::CurrentNumbering() {
  absl::MutexLock lock(&mu_);
  if (!numbering_ || numbering_->epoch() != graph_.num_edges() ||
      numbering_->num_nodes() != graph_.num_nodes()) {
    auto n = encoding::Numbering::Compute(graph_, graph_.num_edges());
    if (!n.ok()) return n.status();
    numbering_ = std::move(*n);
  }
  return numbering_;
}

namespace {

// `s` cut to at most `max_bytes`, not inside a UTF-8 sequence.
std::string_view Truncated(std::string_view s, size_t max_bytes) {
  if (s.size() <= max_bytes) return s;
  size_t n = max_bytes;
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  return s.substr(0, n);
}

}  // namespace

v1::GraphDelta ContextGraph::DeltaFrom(uint32_t from_node, uint64_t from_edge,
                                       uint32_t max_nodes, uint32_t max_edges) const {
  absl::MutexLock lock(&mu_);
  v1::GraphDelta delta;
  const uint32_t num_nodes = static_cast<uint32_t>(graph_.num_nodes());
  from_node = std::max<uint32_t>(from_node, encoding::kFirstFunctionNode);
  delta.set_first_node(std::min(from_node, num_nodes));
  const uint32_t end_node =
      static_cast<uint32_t>(std::min<uint64_t>(num_nodes, uint64_t{from_node} + max_nodes));
  for (uint32_t n = from_node; n < end_node; ++n) {
    const FunctionRecord& f = functions_[n - encoding::kFirstFunctionNode];
    auto* node = delta.add_nodes();
    node->set_id(n);
    node->set_name(std::string(Truncated(f.name, kMaxNameBytes)));
    node->set_module(std::string(Truncated(f.module, kMaxPathBytes)));
    node->set_build_id(f.build_id);
    node->set_start_offset(f.start_offset);
  }
  const uint32_t known_nodes = std::max(end_node, from_node);
  delta.set_first_edge(std::min(from_edge, graph_.num_edges()));
  const uint64_t end_edge = std::min(graph_.num_edges(), from_edge + max_edges);
  for (uint64_t e = from_edge; e < end_edge; ++e) {
    const encoding::CallEdge& edge = graph_.edge(e);
    if (edge.caller >= known_nodes || edge.callee >= known_nodes) break;  // next message
    auto* out = delta.add_edges();
    out->set_caller(edge.caller);
    out->set_call_site(edge.call_site);
    out->set_callee(edge.callee);
  }
  return delta;
}

uint32_t ContextGraph::num_nodes() const {
  absl::MutexLock lock(&mu_);
  return static_cast<uint32_t>(graph_.num_nodes());
}

uint64_t ContextGraph::num_edges() const {
  absl::MutexLock lock(&mu_);
  return graph_.num_edges();
}

}  // namespace strata::agent
