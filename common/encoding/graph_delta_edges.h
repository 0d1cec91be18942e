// GraphDelta's two forms of its edges on the wire (proto strata.v1.GraphDelta): one CallEdge
// message each, or packed_edges (packed_edges.h). Agents build deltas with CallEdge messages,
// which the spool and the shipper count, and pack them as they send them; the server unpacks
// a delta as it receives it, so everything past ingest sees one form.
#ifndef STRATA_COMMON_ENCODING_GRAPH_DELTA_EDGES_H_
#define STRATA_COMMON_ENCODING_GRAPH_DELTA_EDGES_H_

#include <cstddef>

#include "absl/status/status.h"
#include "strata/v1/ingest.pb.h"

namespace strata::encoding {

// Moves the delta's edges into packed_edges; leaves them where packing is refused.
void PackDeltaEdges(v1::GraphDelta* delta);

// Moves packed_edges into the delta's edges. InvalidArgument for a malformed field, a delta
// with both forms, or more than `max_edges` edges; the delta is then unchanged.
absl::Status UnpackDeltaEdges(v1::GraphDelta* delta, size_t max_edges);

}  // namespace strata::encoding

#endif  // STRATA_COMMON_ENCODING_GRAPH_DELTA_EDGES_H_
