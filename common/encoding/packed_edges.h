// Packed wire layout of a graph delta's new call edges (proto strata.v1.GraphDelta
// .packed_edges; the proto comment is the format's specification).
//
// A batch that reaches new code carries the call graph's new edges; on a stream of many
// distinct paths they were a fifth of the bytes shipped as one CallEdge message each. Here
// they are one adaptive range-coded stream (range_coder.h) that predicts what discovery order
// makes likely: an edge continues the path of the edge before it (its caller is that edge's
// callee), leads to the node after the highest one seen, and leaves from a call site near the
// caller's last one.
//
// Decoding is strict and bounded like packed_contexts: a malformed buffer, node ids beyond
// 32 bits, more than `max_edges` edges or more than kMaxEdgesPerByte per byte of the buffer
// return InvalidArgument. Work and memory are linear in the edges produced.
//
// Stateless free functions; thread-safe.
#ifndef STRATA_COMMON_ENCODING_PACKED_EDGES_H_
#define STRATA_COMMON_ENCODING_PACKED_EDGES_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "common/encoding/graph.h"

namespace strata::encoding {

// The byte that starts every packed edges buffer.
inline constexpr uint8_t kPackedEdgesVersion = 1;
// A well-predicted edge costs a fraction of a bit; this bounds what a few bytes can expand
// to. Real deltas take two bytes or more an edge.
inline constexpr size_t kMaxEdgesPerByte = 64;

// `edges` (non-empty, in edge ID order) of a delta whose first new node is `next_node` (the
// delta's first_node: a prediction, any value decodes). nullopt when the buffer would hold
// more than kMaxEdgesPerByte edges per byte: the caller sends the edges unpacked.
std::optional<std::string> EncodePackedEdges(std::span<const CallEdge> edges,
                                             NodeId next_node);

// Appends the edges of `bytes` to *out; `next_node` as given to the encoder.
absl::Status DecodePackedEdges(std::string_view bytes, NodeId next_node, size_t max_edges,
                               std::vector<CallEdge>* out);

}  // namespace strata::encoding

#endif  // STRATA_COMMON_ENCODING_PACKED_EDGES_H_
