// Version 3 of packed contexts: every field in one adaptive range-coded stream (the format
// is specified in proto/strata/v1/ingest.proto). Shared pieces: packed_contexts_internal.h.
#include <algorithm>
#include <bit>
#include <memory>

#include "common/encoding/packed_contexts_internal.h"
#include "common/encoding/range_coder.h"

namespace strata::encoding::internal {
namespace {

// ---- Version 3: every field in one adaptive range-coded stream ----

namespace rc = range_coding;

// Buckets of the id before a value in its stack: none (the outermost id), 0, 1, 2, 3, >= 4.
constexpr int kIdBuckets = 6;
// Where a stack value sits: the first suffix value of a context of the previous one's leaf
// (stored above the previous stack's value), the innermost id, an inner id.
enum IdClass { kIdAbovePrevious = 0, kIdInnermost = 1, kIdInner = 2, kIdClasses = 3 };

// Bits that end every version 3 stream at probability 1/2 each: a stream that was cut,
// extended or corrupted decodes them wrong (but for 1 in 256).
constexpr uint64_t kV3Check = 0xa5;
constexpr int kV3CheckBits = 8;


// Buckets of a stack length or of the ids dropped from one: 0, 1, 2-3, 4-7, >= 8.
constexpr int kLengthBuckets = 5;
int LengthBucket(uint64_t n) { return std::min(static_cast<int>(std::bit_width(n)), 4); }

// Signed difference as an unsigned value: 0, -1, 1, -2, 2, ...

int IdBucket(const std::vector<uint64_t>& ids, size_t j) {
  return j == 0 ? 0 : 1 + static_cast<int>(std::min<uint64_t>(ids[j - 1], kIdBuckets - 2));
}

// The adaptive models of a version 3 stream, shared by all its groups (about 30 KiB: kept
// off the stack).
struct V3Models {
  rc::SmallUintModel group_count, target_delta, context_count;
  rc::SmallUintModel leaf_delta[2];  // by: the previous context had its predecessor's leaf
  rc::SmallUintModel drop[2][kLengthBuckets];  // by: same leaf; the previous stack's length
  rc::SmallUintModel growth[2][kLengthBuckets];  // by: first context; the dropped ids' count
  rc::Prob repeats[kIdClasses][kIdBuckets];  // the value equals the id before it
  rc::IdModel value[kIdClasses][kIdBuckets];
  rc::Prob count_above_one[2];  // by: more than one id
  rc::SmallUintModel count[2];
};

// One context's fields, against the previous context of its group (null for the first).
// DecodeV3 walks the same models in the same order.
void EncodeContextV3(V3Models& m, rc::Encoder& enc, const ContextRecord& r,
                     const ContextRecord* prev, bool prev_delta_zero, PackedContextsCost* cost) {
  // Points the coder's meter at a field of *cost (when there is one).
  auto meter = [&](double PackedContextsCost::*field) {
    if (cost != nullptr) enc.Meter(&(cost->*field));
  };
  const uint64_t delta = prev == nullptr ? r.context.leaf : r.context.leaf - prev->context.leaf;
  meter(&PackedContextsCost::leaves);
  m.leaf_delta[prev_delta_zero].Encode(enc, delta);
  const bool same_leaf = prev != nullptr && delta == 0;
  const std::vector<uint64_t>& ids = r.context.ids;
  size_t keep = 0;
  size_t prev_len = 0;
  meter(&PackedContextsCost::stack_shapes);
  // The stack as the ids it drops from the previous one's and how many more it appends
  // (stacks of neighbours in sorted order have similar lengths).
  if (prev != nullptr) {
    prev_len = prev->context.ids.size();
    keep = CommonPrefix(prev->context.ids, ids);
  }
  const size_t drop = prev_len - keep;
  if (prev != nullptr) m.drop[same_leaf][LengthBucket(prev_len)].Encode(enc, drop);
  m.growth[prev == nullptr][LengthBucket(drop)].Encode(
      enc, rc::ZigZag(static_cast<int64_t>(ids.size() - keep) - static_cast<int64_t>(drop)));
  for (size_t j = keep; j < ids.size(); ++j) {
    meter(ids.size() == 1       ? &PackedContextsCost::single_ids
          : j + 1 == ids.size() ? &PackedContextsCost::innermost_ids
                                : &PackedContextsCost::inner_ids);
    const int bucket = IdBucket(ids, j);
    if (j == keep && same_leaf && keep < prev_len) {
      m.value[kIdAbovePrevious][bucket].Encode(enc, ids[j] - prev->context.ids[j] - 1);
      continue;
    }
    const int cls = j + 1 == ids.size() ? kIdInnermost : kIdInner;
    if (j > 0) {
      const bool repeat = ids[j] == ids[j - 1];
      enc.EncodeBit(m.repeats[cls][bucket], repeat ? 1 : 0);
      if (repeat) continue;
    }
    m.value[cls][bucket].Encode(enc, ids[j]);
  }
  const bool multi = ids.size() > 1;
  meter(&PackedContextsCost::counts);
  enc.EncodeBit(m.count_above_one[multi], r.count != 1 ? 1 : 0);
  if (r.count != 1) m.count[multi].Encode(enc, r.count - 2);
  meter(&PackedContextsCost::framing);
}


}  // namespace

// Version 3 body (records sorted by target, leaf, ids).
void EncodeV3(const std::vector<ContextRecord>& records, std::string* out,
              PackedContextsCost* cost) {
  auto models = std::make_unique<V3Models>();
  V3Models& m = *models;
  rc::Encoder enc(out);
  if (cost != nullptr) enc.Meter(&cost->framing);
  uint64_t groups = 0;
  for (size_t i = 0; i < records.size(); ++i) {
    groups += i == 0 || records[i].target_id != records[i - 1].target_id;
  }
  m.group_count.Encode(enc, groups);
  for (size_t g = 0; g < records.size();) {
    const size_t end = GroupEnd(records, g);
    m.target_delta.Encode(enc, g == 0 ? records[g].target_id
                                      : records[g].target_id - records[g - 1].target_id - 1);
    m.context_count.Encode(enc, end - g - 1);
    bool prev_delta_zero = false;
    for (size_t i = g; i < end; ++i) {
      const ContextRecord* prev = i == g ? nullptr : &records[i - 1];
      EncodeContextV3(m, enc, records[i], prev, prev_delta_zero, cost);
      prev_delta_zero = prev != nullptr && records[i].context.leaf == prev->context.leaf;
    }
    g = end;
  }
  if (cost != nullptr) enc.Meter(&cost->framing);
  enc.EncodeDirect(kV3Check, kV3CheckBits);
  enc.Finish();
}

absl::Status DecodeV3(std::string_view bytes, RecordSink* out) {
  auto models = std::make_unique<V3Models>();
  V3Models& m = *models;
  rc::Decoder dec;
  if (!dec.Start(bytes.substr(1))) return Malformed("bad range coder start", 1);
  // Positions in the stream are not byte-exact; errors name the context instead.
  auto bad = [](const std::string& what, uint64_t context) {
    return absl::InvalidArgumentError(
        absl::StrCat("packed contexts: ", what, " at context ", context));
  };
  const uint64_t groups = m.group_count.Decode(dec);
  // Every group holds a context.
  const uint64_t max_contexts = kMaxV3ContextsPerByte * bytes.size();
  if (groups > max_contexts) return bad("group count beyond the buffer's size", 0);
  uint64_t total_ids = 0;
  uint64_t target = 0;
  for (uint64_t g = 0; g < groups; ++g) {
    const uint64_t target_delta = m.target_delta.Decode(dec);
    if (g > 0 && target_delta == kMaxU64) return bad("target id beyond 32 bits", out->size());
    const uint64_t step = g == 0 ? target_delta : target_delta + 1;
    if (step > std::numeric_limits<uint32_t>::max() - target) {
      return bad("target id beyond 32 bits", out->size());
    }
    target += step;
    const uint64_t contexts = m.context_count.Decode(dec);  // minus one
    if (contexts >= max_contexts - out->size()) {
      return bad("context count beyond the buffer's size", out->size());
    }
    bool prev_delta_zero = false;
    uint64_t leaf = 0;
    for (uint64_t i = 0; i <= contexts; ++i) {
      const uint64_t at = out->size();
      const uint64_t delta = m.leaf_delta[prev_delta_zero].Decode(dec);
      if (delta > kMaxLeaf - leaf) return bad("leaf beyond 32 bits", at);
      leaf += delta;
      const bool same_leaf = i > 0 && delta == 0;
      prev_delta_zero = same_leaf;
      ContextRecord& r = out->Append();
      r.target_id = static_cast<uint32_t>(target);
      r.context.leaf = static_cast<NodeId>(leaf);
      const std::vector<uint64_t>* prev_ids = i == 0 ? nullptr : &(*out)[at - 1].context.ids;
      const size_t prev_len = prev_ids == nullptr ? 0 : prev_ids->size();
      uint64_t drop = 0;
      if (prev_ids != nullptr) {
        drop = m.drop[same_leaf][LengthBucket(prev_len)].Decode(dec);
        if (drop > prev_len) return bad("shared prefix beyond the previous id stack", at);
      }
      const uint64_t keep = prev_len - drop;
      // drop <= kMaxPackedIds: the growth is bounded before it is added.
      const int64_t growth = rc::UnZigZag(m.growth[i == 0][LengthBucket(drop)].Decode(dec));
      if (growth > static_cast<int64_t>(kMaxPackedIds) ||
          growth < -static_cast<int64_t>(drop)) {
        return bad("id stack length out of range", at);
      }
      const uint64_t rest = drop + static_cast<uint64_t>(growth);  // growth >= -drop
      if (rest > kMaxPackedIds - keep) return bad("id stack beyond the limit", at);
      if (keep + rest == 0) return bad("context without ids", at);
      // Sorted by (leaf, ids) and distinct: a context of the previous one's leaf extends or
      // exceeds it.
      if (same_leaf && rest == 0) return bad("contexts out of order", at);
      if (keep + rest > kMaxPackedIdsPerBuffer - total_ids) {
        return bad("more ids than a buffer may hold", at);
      }
      total_ids += keep + rest;
      std::vector<uint64_t>& ids = r.context.ids;
      ids.reserve(keep + rest);
      if (keep > 0) ids.assign(prev_ids->begin(), prev_ids->begin() + static_cast<ptrdiff_t>(keep));
      const size_t len = keep + rest;
      for (size_t j = keep; j < len; ++j) {
        const int bucket = IdBucket(ids, j);
        if (j == keep && same_leaf && keep < prev_len) {
          const uint64_t above = (*prev_ids)[j];
          const uint64_t v = m.value[kIdAbovePrevious][bucket].Decode(dec);
          if (above == kMaxU64 || v > kMaxU64 - above - 1) return bad("id overflows", at);
          ids.push_back(above + 1 + v);
          continue;
        }
        const int cls = j + 1 == len ? kIdInnermost : kIdInner;
        if (j > 0 && dec.DecodeBit(m.repeats[cls][bucket]) == 1) {
          ids.push_back(ids[j - 1]);
          continue;
        }
        ids.push_back(m.value[cls][bucket].Decode(dec));
      }
      const bool multi = len > 1;
      r.count = 1;
      if (dec.DecodeBit(m.count_above_one[multi]) == 1) {
        const uint64_t stored = m.count[multi].Decode(dec);
        if (stored > kMaxU64 - 2) return bad("count overflows", at);
        r.count = stored + 2;
      }
    }
  }
  if (dec.DecodeDirect(kV3CheckBits) != kV3Check) return Malformed("bad check bits", bytes.size());
  if (!dec.EndsExactly()) {
    return Malformed("trailing bytes, a zero last byte or other last bytes than the encoder's",
                     bytes.size());
  }
  out->Finish();
  return absl::OkStatus();
}

// Adds `fields` to *cost, with the rest of a `bytes`-byte buffer as framing.

}  // namespace strata::encoding::internal
