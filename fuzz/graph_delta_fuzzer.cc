// Fuzz target: the server's replay of GraphDelta messages into an agent's call graph and the
// PCCE numbering built on it (common/encoding/graph.h, numbering.h), the way
// server/ingest applies them: packed_edges unpacked (common/encoding/graph_delta_edges.h),
// the message's shape checks (server/ingest/limits.h CheckGraphDelta), then AppendNodes and
// AppendEdges.
//
// Input: GraphDelta messages, each preceded by its length as a varint (protobuf's delimited
// format), applied in order; a delta the server would refuse is skipped like a refused
// message. Oracles besides the sanitizers: a refused unpacking leaves the delta as it was;
// edges packed as agents pack them unpack to the same edges (by value); AppendEdges is all-or-nothing;
// and on the graph
// that results, every path from the root (random walks seeded by the input) encodes and
// decodes back to the same edges and frames, at the full epoch and at an earlier one.
#include <cstdint>
#include <random>
#include <string_view>
#include <vector>

#include "common/encoding/graph.h"
#include "common/encoding/graph_delta_edges.h"
#include "common/encoding/numbering.h"
#include "common/encoding/packed_contexts.h"
#include "fuzz/fuzz_util.h"
#include "google/protobuf/stubs/logging.h"
#include "server/ingest/limits.h"
#include "strata/v1/ingest.pb.h"

namespace {

namespace enc = strata::encoding;

// Walks from kRootNode / kTruncatedNode over edges below `epoch` and checks that each walk
// round-trips through Encoder and Decode/DecodeEdges.
void CheckRoundTrips(const enc::CallGraph& graph, uint64_t epoch, std::minstd_rand& rng) {
  auto numbering = enc::Numbering::Compute(graph, epoch);
  STRATA_FUZZ_CHECK(numbering.ok(), "Numbering::Compute(%llu) failed: %s",
                    static_cast<unsigned long long>(epoch),
                    numbering.status().ToString().c_str());
  std::vector<std::vector<enc::EdgeId>> out_edges(graph.num_nodes());
  for (enc::EdgeId e = 0; e < epoch; ++e) out_edges[graph.edge(e).caller].push_back(e);
  const enc::Encoder encoder(**numbering);
  for (int walk = 0; walk < 16; ++walk) {
    const enc::NodeId start = (rng() & 1) ? enc::kTruncatedNode : enc::kRootNode;
    if (out_edges[start].empty()) continue;
    std::vector<enc::EdgeId> path;
    enc::NodeId at = start;
    const size_t length = 1 + rng() % 48;
    while (path.size() < length && !out_edges[at].empty()) {
      const enc::EdgeId e = out_edges[at][rng() % out_edges[at].size()];
      path.push_back(e);
      at = graph.edge(e).callee;
    }
    auto encoded = encoder.Encode(path);
    STRATA_FUZZ_CHECK(encoded.ok(), "encoding a root path failed: %s",
                      encoded.status().ToString().c_str());
    STRATA_FUZZ_CHECK(encoded->leaf == at, "encoded leaf %u, path ends at %u", encoded->leaf, at);
    std::vector<enc::EdgeId> decoded_edges;
    bool truncated = false;
    absl::Status st = (*numbering)->DecodeEdges(*encoded, &decoded_edges, &truncated);
    STRATA_FUZZ_CHECK(st.ok(), "DecodeEdges of an encoded path failed: %s",
                      st.ToString().c_str());
    STRATA_FUZZ_CHECK(decoded_edges == path && truncated == (start == enc::kTruncatedNode),
                      "DecodeEdges returned another path (%zu edges, %zu expected)",
                      decoded_edges.size(), path.size());
    auto frames = enc::Decode(**numbering, *encoded, &truncated);
    STRATA_FUZZ_CHECK(frames.ok() && frames->size() == path.size(), "Decode failed: %s",
                      frames.status().ToString().c_str());
    for (size_t i = 0; i < path.size(); ++i) {
      const uint64_t call_site = i + 1 < path.size() ? graph.edge(path[i + 1]).call_site : 0;
      STRATA_FUZZ_CHECK((*frames)[i].function == graph.edge(path[i]).callee &&
                            (*frames)[i].call_site == call_site,
                        "Decode frame %zu differs from the path", i);
    }
  }
  // Arbitrary contexts (ids near the valid ranges and far off) decode or fail, never crash.
  for (int i = 0; i < 8; ++i) {
    enc::EncodedContext c;
    c.leaf = static_cast<enc::NodeId>(rng() % (graph.num_nodes() + 1));
    const size_t n = 1 + rng() % 4;
    for (size_t k = 0; k < n; ++k) {
      const uint64_t bound = (*numbering)->num_contexts(c.leaf) + 2;
      c.ids.push_back((rng() & 3) == 0 ? (uint64_t{rng()} << 33 | rng()) : rng() % bound);
    }
    bool truncated = false;
    (void)enc::Decode(**numbering, c, &truncated);
  }
}

}  // namespace

// Protobuf logs every string field that is not UTF-8; fuzz inputs are full of them.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  const strata::server::ingest::IngestLimits limits;
  enc::CallGraph graph;
  size_t pos = 0;
  uint64_t seed = size;
  while (pos < bytes.size()) {
    uint64_t length = 0;
    if (!enc::ReadVarint(bytes, &pos, &length)) break;
    length = std::min<uint64_t>(length, bytes.size() - pos);
    strata::v1::GraphDelta delta;
    const bool parsed = delta.ParseFromArray(bytes.data() + pos, static_cast<int>(length));
    pos += length;
    seed = seed * 1000003 + length;
    if (!parsed) continue;
    if (!delta.packed_edges().empty()) {
      const std::string before = delta.SerializeAsString();
      if (!enc::UnpackDeltaEdges(&delta, limits.max_delta_edges).ok()) {
        STRATA_FUZZ_CHECK(delta.SerializeAsString() == before, "a refused unpacking changed it");
        continue;
      }
    } else if (delta.edges_size() > 0) {
      strata::v1::GraphDelta packed = delta;
      enc::PackDeltaEdges(&packed);
      if (!packed.packed_edges().empty()) {
        // The same edges by value (fields of CallEdge unknown to this version do not travel).
        absl::Status st = enc::UnpackDeltaEdges(&packed, delta.edges_size());
        STRATA_FUZZ_CHECK(st.ok() && packed.edges_size() == delta.edges_size(),
                          "packed edges do not unpack: %s", st.ToString().c_str());
        for (int i = 0; i < delta.edges_size(); ++i) {
          const strata::v1::CallEdge& a = delta.edges(i);
          const strata::v1::CallEdge& b = packed.edges(i);
          STRATA_FUZZ_CHECK(a.caller() == b.caller() && a.call_site() == b.call_site() &&
                                a.callee() == b.callee(),
                            "packed edge %d unpacks to another edge", i);
        }
      }
    }
    if (!strata::server::ingest::CheckGraphDelta(delta, limits).ok()) continue;
    if (graph.num_nodes() + delta.nodes_size() > limits.max_graph_nodes ||
        graph.num_edges() + delta.edges_size() > limits.max_graph_edges) {
      continue;
    }
    if (delta.nodes_size() > 0 &&
        !enc::AppendNodes(graph, delta.first_node(), delta.nodes_size()).ok()) {
      continue;
    }
    std::vector<enc::CallEdge> edges;
    for (const auto& e : delta.edges()) edges.push_back({e.caller(), e.call_site(), e.callee()});
    const uint64_t edges_before = graph.num_edges();
    absl::Status st = enc::AppendEdges(graph, delta.first_edge(), edges);
    if (st.ok()) {
      STRATA_FUZZ_CHECK(graph.num_edges() == edges_before + edges.size(),
                        "AppendEdges OK but the graph has %llu edges",
                        static_cast<unsigned long long>(graph.num_edges()));
      for (size_t i = 0; i < edges.size(); ++i) {
        STRATA_FUZZ_CHECK(graph.edge(edges_before + i) == edges[i], "edge %zu differs", i);
        auto found = graph.FindEdge(edges[i].caller, edges[i].call_site, edges[i].callee);
        STRATA_FUZZ_CHECK(found.has_value() && *found == edges_before + i,
                          "FindEdge does not find edge %zu", i);
      }
    } else {
      STRATA_FUZZ_CHECK(graph.num_edges() == edges_before,
                        "a refused delta changed the graph: %s", st.ToString().c_str());
    }
  }
  std::minstd_rand rng(static_cast<uint32_t>(seed ^ (seed >> 32)) | 1);
  CheckRoundTrips(graph, graph.num_edges(), rng);
  if (graph.num_edges() > 1) CheckRoundTrips(graph, rng() % graph.num_edges(), rng);
  return 0;
}
