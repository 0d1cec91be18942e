#include "common/encoding/numbering.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace strata::encoding {
namespace {

bool IsSource(NodeId n) { return n == kRootNode || n == kTruncatedNode; }

}  // namespace

absl::StatusOr<std::shared_ptr<const Numbering>> Numbering::Compute(const CallGraph& graph,
                                                                    uint64_t epoch) {
  if (epoch > graph.num_edges()) {
    return absl::OutOfRangeError(absl::StrCat("epoch ", epoch, " is beyond the graph's ",
                                              graph.num_edges(), " edges"));
  }
  const size_t n = graph.num_nodes();
  std::shared_ptr<Numbering> num(new Numbering());
  num->edges_.resize(epoch);
  num->num_contexts_.assign(n, 0);

  // Incoming edges per callee, in edge ID order (counting sort), and forward out-degree data
  // for Kahn's algorithm.
  std::vector<uint64_t> in_begin(n + 1, 0);
  std::vector<uint32_t> out_begin(n + 1, 0);
  std::vector<uint32_t> pending(n, 0);  // unprocessed forward in-edges
  for (EdgeId e = 0; e < epoch; ++e) {
    const CallEdge& ce = graph.edge(e);
    num->edges_[e].edge = ce;
    num->edges_[e].kind = graph.is_back_edge(e) ? EdgeKind::kBack : EdgeKind::kForward;
    ++in_begin[ce.callee + 1];
    if (!graph.is_back_edge(e)) {
      ++out_begin[ce.caller + 1];
      ++pending[ce.callee];
    }
  }
  for (size_t i = 0; i < n; ++i) {
    in_begin[i + 1] += in_begin[i];
    out_begin[i + 1] += out_begin[i];
  }
  std::vector<EdgeId> in_edges(epoch);
  std::vector<NodeId> out_nodes(out_begin[n]);
  {
    std::vector<uint64_t> in_fill(in_begin.begin(), in_begin.end() - 1);
    std::vector<uint32_t> out_fill(out_begin.begin(), out_begin.end() - 1);
    for (EdgeId e = 0; e < epoch; ++e) {
      const CallEdge& ce = num->edges_[e].edge;
      in_edges[in_fill[ce.callee]++] = e;
      if (num->edges_[e].kind == EdgeKind::kForward) out_nodes[out_fill[ce.caller]++] = ce.callee;
    }
  }

  // Each node's ranges are written into its slot of the in-edge layout (at most one range per
  // incoming edge) and compacted once every node is done.
  num->ranges_.resize(epoch);
  std::vector<uint32_t> range_count(n, 0);
  std::vector<NodeId> ready;
  ready.reserve(n);
  for (NodeId v = 0; v < n; ++v) {
    if (pending[v] == 0) ready.push_back(v);
  }
  size_t processed = 0;
  for (size_t head = 0; head < ready.size(); ++head) {
    const NodeId v = ready[head];
    ++processed;
    if (IsSource(v)) {
      num->num_contexts_[v] = 1;
    } else {
      const auto in = std::span<const EdgeId>(in_edges).subspan(in_begin[v],
                                                                in_begin[v + 1] - in_begin[v]);
      uint64_t back = 0, candidates = 0;
      for (EdgeId e : in) {
        if (num->edges_[e].kind == EdgeKind::kBack) {
          ++back;
        } else {
          ++candidates;
        }
      }
      // Reserve one value per candidate in case it turns into a push edge, so the total never
      // exceeds kMaxContexts: dummies (back + push) + forward sum <= back + candidates + cap.
      const uint64_t cap = kMaxContexts - back - candidates;
      uint64_t sum = 0, pushes = 0;
      for (EdgeId e : in) {
        EdgeInfo& info = num->edges_[e];
        if (info.kind == EdgeKind::kBack) continue;
        const uint64_t c = num->num_contexts_[info.edge.caller];
        if (sum + c > cap) {  // no wrap: sum <= cap < 2^63 and c <= 2^63
          info.kind = EdgeKind::kPush;
          ++pushes;
        } else {
          info.value = sum;
          sum += c;
        }
      }
      const uint64_t dummies = back + pushes;
      InRange* slot = num->ranges_.data() + in_begin[v];
      uint32_t count = 0;
      uint64_t next_dummy = 0;
      for (EdgeId e : in) {
        EdgeInfo& info = num->edges_[e];
        if (info.kind != EdgeKind::kForward) {
          info.value = next_dummy;
          slot[count++] = InRange{next_dummy, e, true};
          ++next_dummy;
        }
      }
      for (EdgeId e : in) {
        EdgeInfo& info = num->edges_[e];
        if (info.kind != EdgeKind::kForward) continue;
        info.value += dummies;
        // Edges whose caller has no contexts can never be decoded to; skip their empty range.
        if (num->num_contexts_[info.edge.caller] != 0) {
          slot[count++] = InRange{info.value, e, false};
        }
      }
      num->num_contexts_[v] = dummies + sum;
      num->num_push_edges_ += pushes;
      range_count[v] = count;
    }
    for (uint32_t i = out_begin[v]; i < out_begin[v + 1]; ++i) {
      const NodeId w = out_nodes[i];
      if (--pending[w] == 0) ready.push_back(w);
    }
  }
  if (processed != n) {
    return absl::InternalError("forward edges contain a cycle");  // CallGraph prevents this
  }
  num->range_begin_.resize(n + 1);
  uint64_t write = 0;
  for (NodeId v = 0; v < n; ++v) {
    num->range_begin_[v] = write;
    if (write != in_begin[v]) {  // destination is below the source: forward copy is safe
      std::copy_n(num->ranges_.begin() + in_begin[v], range_count[v],
                  num->ranges_.begin() + write);
    }
    write += range_count[v];
  }
  num->range_begin_[n] = write;
  num->ranges_.resize(write);
  return std::shared_ptr<const Numbering>(std::move(num));
}

absl::Status Numbering::DecodeEdges(const EncodedContext& context,
                                    std::vector<EdgeId>* edges_out, bool* truncated,
                                    size_t max_depth) const {
  edges_out->clear();
  NodeId node = context.leaf;
  if (node >= num_contexts_.size() || IsSource(node)) {
    return absl::InvalidArgumentError(absl::StrCat("unknown leaf node ", node));
  }
  if (context.ids.empty()) return absl::InvalidArgumentError("empty ID stack");
  size_t level = context.ids.size() - 1;
  uint64_t id = context.ids[level];
  while (true) {
    if (id >= num_contexts_[node]) {
      return absl::InvalidArgumentError(absl::StrCat("id ", id, " out of range at node ", node,
                                                     " (", num_contexts_[node], " contexts)"));
    }
    if (edges_out->size() >= max_depth) {
      return absl::ResourceExhaustedError(
          absl::StrCat("decoded path exceeds ", max_depth, " frames"));
    }
    // The last range starting at or below id holds it: ranges tile [0, numCC(node)).
    const InRange* first = ranges_.data() + range_begin_[node];
    const InRange* last = ranges_.data() + range_begin_[node + 1];
    const InRange* r =
        std::upper_bound(first, last, id, [](uint64_t v, const InRange& x) { return v < x.start; });
    if (r == first) return absl::InternalError("numbering has no range for id");
    --r;
    const EdgeInfo& info = edges_[r->edge];
    edges_out->push_back(r->edge);
    if (r->dummy) {
      // Start of a segment: the pushed id continues at the back/push edge's caller.
      if (level == 0) {
        return absl::InvalidArgumentError("ID stack underflow (segment needs an outer id)");
      }
      id = context.ids[--level];
      node = info.edge.caller;
      if (IsSource(node)) return absl::InternalError("push edge from a source node");
      continue;
    }
    id -= r->start;
    node = info.edge.caller;
    if (IsSource(node)) {
      if (level != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(level, " unused outer ids after reaching the root"));
      }
      *truncated = node == kTruncatedNode;
      std::reverse(edges_out->begin(), edges_out->end());
      return absl::OkStatus();
    }
  }
}

absl::StatusOr<std::vector<PathFrame>> Decode(const Numbering& numbering,
                                              const EncodedContext& context, bool* truncated,
                                              size_t max_depth) {
  std::vector<EdgeId> edges;
  bool trunc = false;
  if (absl::Status s = numbering.DecodeEdges(context, &edges, &trunc, max_depth); !s.ok()) {
    return s;
  }
  std::vector<PathFrame> frames;
  frames.reserve(edges.size());
  for (size_t i = 0; i < edges.size(); ++i) {
    const NodeId fn = numbering.edge(edges[i]).callee;
    const uint64_t site = i + 1 < edges.size() ? numbering.edge(edges[i + 1]).call_site : 0;
    frames.push_back(PathFrame{fn, site});
  }
  if (truncated != nullptr) *truncated = trunc;
  return frames;
}

absl::Status Encoder::EncodeInto(std::span<const EdgeId> edges, EncodedContext* out) const {
  out->ids.clear();
  if (edges.empty()) return absl::InvalidArgumentError("empty path");
  const uint64_t epoch = numbering_.epoch();
  NodeId at = kRootNode;
  uint64_t id = 0;
  for (size_t i = 0; i < edges.size(); ++i) {
    const EdgeId e = edges[i];
    if (e >= epoch) {
      return absl::OutOfRangeError(absl::StrCat("edge ", e, " is beyond epoch ", epoch));
    }
    const CallEdge& ce = numbering_.edge(e);
    if (i == 0 ? !IsSource(ce.caller) : ce.caller != at) {
      return absl::InvalidArgumentError(absl::StrCat("path is discontinuous at edge ", i));
    }
    if (numbering_.kind(e) == EdgeKind::kForward) {
      id += numbering_.annotation(e);
    } else {
      out->ids.push_back(id);
      id = numbering_.annotation(e);
    }
    at = ce.callee;
  }
  out->ids.push_back(id);
  out->leaf = at;
  return absl::OkStatus();
}

absl::StatusOr<EncodedContext> Encoder::Encode(std::span<const EdgeId> edges) const {
  EncodedContext out;
  if (absl::Status s = EncodeInto(edges, &out); !s.ok()) return s;
  return out;
}

absl::StatusOr<EncodedContext> EncodePath(CallGraph& graph,
                                          std::span<const PathFrame> outer_to_leaf,
                                          bool truncated,
                                          std::shared_ptr<const Numbering>* numbering) {
  absl::StatusOr<std::vector<EdgeId>> edges = graph.AddPath(outer_to_leaf, truncated);
  if (!edges.ok()) return edges.status();
  if (*numbering == nullptr || (*numbering)->epoch() != graph.num_edges()) {
    absl::StatusOr<std::shared_ptr<const Numbering>> fresh =
        Numbering::Compute(graph, graph.num_edges());
    if (!fresh.ok()) return fresh.status();
    *numbering = *std::move(fresh);
  }
  return Encoder(**numbering).Encode(*edges);
}

size_t Numbering::MemoryBytes() const {
  return sizeof(*this) + edges_.capacity() * sizeof(EdgeInfo) +
         num_contexts_.capacity() * sizeof(uint64_t) +
         range_begin_.capacity() * sizeof(uint64_t) + ranges_.capacity() * sizeof(InRange);
}

size_t NumberingCache::MemoryBytes() const {
  size_t bytes = 0;
  for (const auto& numbering : entries_) bytes += numbering->MemoryBytes();
  return bytes;
}

absl::StatusOr<std::shared_ptr<const Numbering>> NumberingCache::Get(const CallGraph& graph,
                                                                     uint64_t epoch) {
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if ((*it)->epoch() == epoch) {
      std::shared_ptr<const Numbering> hit = *it;
      entries_.erase(it);
      entries_.push_front(hit);
      return hit;
    }
  }
  absl::StatusOr<std::shared_ptr<const Numbering>> fresh = Numbering::Compute(graph, epoch);
  if (!fresh.ok()) return fresh.status();
  std::erase_if(entries_, [epoch](const auto& kept) { return kept->epoch() < epoch; });
  entries_.push_front(*fresh);
  while (entries_.size() > capacity_) entries_.pop_back();
  return fresh;
}

}  // namespace strata::encoding
