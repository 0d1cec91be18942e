#include "common/encoding/packed_edges.h"

#include <algorithm>
#include <limits>
#include <memory>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/encoding/range_coder.h"

namespace strata::encoding {
namespace {

namespace rc = range_coding;

constexpr uint64_t kCheck = 0xa5;
constexpr int kCheckBits = 8;

// Call sites are predicted from the caller's last one in the buffer when it has one; edges
// from the root and the truncation marker always leave from site 0.
enum SiteContext { kNewCaller = 0, kSeenCaller = 1, kMarkerCaller = 2 };

struct EdgeModels {
  rc::SmallUintModel count;
  rc::Prob follows[2];  // caller = previous callee; by whether that callee was fresh
  rc::Prob same_caller;
  rc::IdModel caller;   // the caller's id (deltas to earlier ids cost more: callers spread)
  rc::Prob fresh[2];    // callee = highest node so far + 1; by whether the caller followed
  rc::IdModel callee;   // zigzag(callee - caller)
  rc::IdModel site[3];  // zigzag(site - predicted site), by SiteContext
};

// What both sides know before each edge.
struct EdgeState {
  NodeId prev_caller = kRootNode;
  NodeId prev_callee = kRootNode;
  bool prev_fresh = false;
  uint64_t highest;  // the highest node id seen (before the first: the delta's first new node - 1)
  uint64_t prev_site = 0;
  absl::flat_hash_map<NodeId, uint64_t> last_site;  // caller -> its last call site

  explicit EdgeState(NodeId next_node) : highest(next_node > 0 ? next_node - 1 : 0) {}

  SiteContext Context(NodeId caller, uint64_t* predicted) const {
    if (caller < kFirstFunctionNode) {
      *predicted = 0;
      return kMarkerCaller;
    }
    if (auto it = last_site.find(caller); it != last_site.end()) {
      *predicted = it->second;
      return kSeenCaller;
    }
    *predicted = prev_site;
    return kNewCaller;
  }

  void Advance(const CallEdge& e, bool fresh) {
    prev_caller = e.caller;
    prev_callee = e.callee;
    prev_fresh = fresh;
    highest = std::max<uint64_t>({highest, e.caller, e.callee});
    prev_site = e.call_site;
    last_site[e.caller] = e.call_site;
  }
};

int64_t Diff(uint64_t a, uint64_t b) { return static_cast<int64_t>(a - b); }  // modulo 2^64

}  // namespace

std::optional<std::string> EncodePackedEdges(std::span<const CallEdge> edges,
                                             NodeId next_node) {
  if (edges.empty()) return std::nullopt;
  auto models = std::make_unique<EdgeModels>();
  EdgeModels& m = *models;
  std::string out(1, static_cast<char>(kPackedEdgesVersion));
  rc::Encoder enc(&out);
  m.count.Encode(enc, edges.size() - 1);
  EdgeState state(next_node);
  for (const CallEdge& e : edges) {
    const bool follows = e.caller == state.prev_callee;
    enc.EncodeBit(m.follows[state.prev_fresh], follows);
    if (!follows) {
      const bool same = e.caller == state.prev_caller;
      enc.EncodeBit(m.same_caller, same);
      if (!same) m.caller.Encode(enc, e.caller);
    }
    const bool fresh = e.callee == state.highest + 1;
    enc.EncodeBit(m.fresh[follows], fresh);
    if (!fresh) m.callee.Encode(enc, rc::ZigZag(Diff(e.callee, e.caller)));
    uint64_t predicted = 0;
    const SiteContext context = state.Context(e.caller, &predicted);
    m.site[context].Encode(enc, rc::ZigZag(Diff(e.call_site, predicted)));
    state.Advance(e, fresh);
  }
  enc.EncodeDirect(kCheck, kCheckBits);
  enc.Finish();
  if (edges.size() > kMaxEdgesPerByte * out.size()) return std::nullopt;
  return out;
}

absl::Status DecodePackedEdges(std::string_view bytes, NodeId next_node, size_t max_edges,
                               std::vector<CallEdge>* out) {
  auto bad = [](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("packed edges: ", what));
  };
  if (bytes.empty()) return bad("empty buffer");
  if (static_cast<uint8_t>(bytes[0]) != kPackedEdgesVersion) {
    return bad(absl::StrCat("unknown version ", static_cast<int>(static_cast<uint8_t>(bytes[0]))));
  }
  auto models = std::make_unique<EdgeModels>();
  EdgeModels& m = *models;
  rc::Decoder dec;
  if (!dec.Start(bytes.substr(1))) return bad("bad range coder start");
  const uint64_t count = m.count.Decode(dec) + 1;
  if (count > max_edges || count > kMaxEdgesPerByte * bytes.size()) {
    return bad(absl::StrCat(count, " edges in ", bytes.size(), " bytes (at most ", max_edges,
                            " and ", kMaxEdgesPerByte, " a byte)"));
  }
  constexpr uint64_t kMaxNode = std::numeric_limits<NodeId>::max();
  const size_t first = out->size();
  out->reserve(first + count);
  EdgeState state(next_node);
  for (uint64_t i = 0; i < count; ++i) {
    CallEdge e;
    const bool follows = dec.DecodeBit(m.follows[state.prev_fresh]) == 1;
    uint64_t caller = state.prev_callee;
    if (!follows) {
      caller = state.prev_caller;
      if (dec.DecodeBit(m.same_caller) == 0) {
        caller = m.caller.Decode(dec);
      }
    }
    const bool fresh = dec.DecodeBit(m.fresh[follows]) == 1;
    uint64_t callee = state.highest + 1;
    if (!fresh) callee = caller + static_cast<uint64_t>(rc::UnZigZag(m.callee.Decode(dec)));
    if (caller > kMaxNode || callee > kMaxNode) {
      out->resize(first);
      return bad(absl::StrCat("node id beyond 32 bits at edge ", i));
    }
    e.caller = static_cast<NodeId>(caller);
    e.callee = static_cast<NodeId>(callee);
    uint64_t predicted = 0;
    const SiteContext context = state.Context(e.caller, &predicted);
    e.call_site = predicted + static_cast<uint64_t>(rc::UnZigZag(m.site[context].Decode(dec)));
    state.Advance(e, fresh);
    out->push_back(e);
  }
  if (dec.DecodeDirect(kCheckBits) != kCheck || !dec.EndsExactly()) {
    out->resize(first);
    return bad("bad check bits or trailing bytes");
  }
  return absl::OkStatus();
}

}  // namespace strata::encoding
