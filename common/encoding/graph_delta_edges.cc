#include "common/encoding/graph_delta_edges.h"

#include <vector>

#include "common/encoding/packed_edges.h"

namespace strata::encoding {

void PackDeltaEdges(v1::GraphDelta* delta) {
  if (delta->edges_size() == 0) return;
  std::vector<CallEdge> edges;
  edges.reserve(delta->edges_size());
  for (const v1::CallEdge& e : delta->edges()) {
    edges.push_back({e.caller(), e.call_site(), e.callee()});
  }
  std::optional<std::string> packed = EncodePackedEdges(edges, delta->first_node());
  if (!packed) return;
  delta->set_packed_edges(*std::move(packed));
  delta->clear_edges();
}

absl::Status UnpackDeltaEdges(v1::GraphDelta* delta, size_t max_edges) {
  if (delta->packed_edges().empty()) return absl::OkStatus();
  if (delta->edges_size() > 0) {
    return absl::InvalidArgumentError("graph delta with both edges and packed_edges");
  }
  std::vector<CallEdge> edges;
  if (absl::Status s = DecodePackedEdges(delta->packed_edges(), delta->first_node(), max_edges,
                                         &edges);
      !s.ok()) {
    return s;
  }
  delta->mutable_edges()->Reserve(static_cast<int>(edges.size()));
  for (const CallEdge& e : edges) {
    v1::CallEdge* out = delta->add_edges();
    out->set_caller(e.caller);
    out->set_call_site(e.call_site);
    out->set_callee(e.callee);
  }
  delta->clear_packed_edges();
  return absl::OkStatus();
}

}  // namespace strata::encoding
