#include "common/encoding/packed_contexts.h"

#include <algorithm>
#include <bit>
#include <limits>
#include <memory>
#include <tuple>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/encoding/packed_contexts_internal.h"

namespace strata::encoding {
namespace {

using internal::Charge;
using internal::CommonPrefix;
using internal::DecodeV3;
using internal::EncodeV3;
using internal::GroupEnd;
using internal::kMaxLeaf;
using internal::kMaxU64;
using internal::kMaxV3ContextsPerByte;
using internal::Malformed;
using internal::RecordSink;

// Version 1 head flags.
constexpr uint64_t kCountIsOne = 1;
constexpr uint64_t kMulti = 2;
constexpr int kFlagBits = 2;

// Version 2: Exp-Golomb orders of the bit-coded fields of a multi-id context.
constexpr int kLeafOrder = 0;
constexpr int kCountOrder = 0;
constexpr int kPrefixOrder = 2;
constexpr int kSuffixOrder = 2;
constexpr int kWidthOrder = 0;
constexpr int kRunOrder = 0;
// Fewest bits a multi-id context takes: leaf delta, count flag, prefix and suffix lengths,
// width flag.
constexpr uint64_t kMinMultiBits = (kLeafOrder + 1) + 1 + (kPrefixOrder + 1) +
                                   (kSuffixOrder + 1) + 1;


bool IsMulti(const ContextRecord& r) { return r.context.ids.size() > 1; }

// Version 1 order: (target, leaf, single before multi, ids).
bool SortsBeforeV1(const ContextRecord& a, const ContextRecord& b) {
  const bool a_multi = IsMulti(a), b_multi = IsMulti(b);
  return std::tie(a.target_id, a.context.leaf, a_multi, a.context.ids) <
         std::tie(b.target_id, b.context.leaf, b_multi, b.context.ids);
}

// Version 2 order: (target, single before multi, leaf, ids).
bool SortsBeforeV2(const ContextRecord& a, const ContextRecord& b) {
  const bool a_multi = IsMulti(a), b_multi = IsMulti(b);
  return std::tie(a.target_id, a_multi, a.context.leaf, a.context.ids) <
         std::tie(b.target_id, b_multi, b.context.leaf, b.context.ids);
}

// Version 3 order: (target, leaf, ids).
bool SortsBeforeV3(const ContextRecord& a, const ContextRecord& b) {
  return std::tie(a.target_id, a.context.leaf, a.context.ids) <
         std::tie(b.target_id, b.context.leaf, b.context.ids);
}

bool SameContext(const ContextRecord& a, const ContextRecord& b) {
  return a.target_id == b.target_id && a.context == b.context;
}

// Checks the records, sorts them in the version's order and merges equal contexts.
absl::Status Canonicalize(std::vector<ContextRecord>& records, uint8_t version) {
  for (const ContextRecord& r : records) {
    if (r.context.ids.empty()) {
      return absl::InvalidArgumentError("packed contexts: a context has no ids");
    }
    if (r.context.ids.size() > kMaxPackedIds) {
      return absl::InvalidArgumentError(
          absl::StrCat("packed contexts: a context has ", r.context.ids.size(), " ids (max ",
                       kMaxPackedIds, ")"));
    }
    if (r.count == 0) return absl::InvalidArgumentError("packed contexts: a zero count");
  }
  std::sort(records.begin(), records.end(),
            version == kPackedContextsVersion1   ? SortsBeforeV1
            : version == kPackedContextsVersion2 ? SortsBeforeV2
                                                 : SortsBeforeV3);
  size_t kept = 0;
  for (size_t i = 0; i < records.size(); ++i) {
    if (kept > 0 && SameContext(records[kept - 1], records[i])) {
      if (records[kept - 1].count > kMaxU64 - records[i].count) {
        return absl::InvalidArgumentError("packed contexts: merged count overflows");
      }
      records[kept - 1].count += records[i].count;
    } else {
      if (kept != i) records[kept] = std::move(records[i]);
      ++kept;
    }
  }
  records.resize(kept);
  uint64_t total_ids = 0;
  for (const ContextRecord& r : records) total_ids += r.context.ids.size();
  if (total_ids > kMaxPackedIdsPerBuffer) {
    return absl::InvalidArgumentError(absl::StrCat("packed contexts: ", total_ids,
                                                   " ids in one batch (max ",
                                                   kMaxPackedIdsPerBuffer, ")"));
  }
  return absl::OkStatus();
}

// End of the group of records[begin] (same target).

// Bits are appended least significant first within each byte; fields are written least
// significant bit first.
class BitWriter {
 public:
  explicit BitWriter(std::string* out) : out_(out) {}

  // Appends the low `bits` (<= 64) bits of `value`.
  void Put(uint64_t value, int bits) {
    while (bits > 0) {
      const int take = std::min(bits, 8 - used_);
      pending_ |= static_cast<uint32_t>(value & ((1u << take) - 1)) << used_;
      used_ += take;
      bits -= take;
      value >>= take;  // take <= 8
      if (used_ == 8) {
        out_->push_back(static_cast<char>(pending_));
        pending_ = 0;
        used_ = 0;
      }
    }
  }

  // Exp-Golomb code of order k: with u = value + 2^k and m = bit width of u minus 1,
  // (m - k) zero bits, a one bit, then the low m bits of u. Requires u < 2^64.
  void PutExpGolomb(uint64_t value, int k) {
    const uint64_t u = value + (uint64_t{1} << k);
    const int m = std::bit_width(u) - 1;
    Put(0, m - k);
    Put(1, 1);
    Put(u, m);
  }

  // Pads the last byte with zero bits.
  void Finish() {
    if (used_ > 0) out_->push_back(static_cast<char>(pending_));
    pending_ = 0;
    used_ = 0;
  }

 private:
  std::string* out_;
  uint32_t pending_ = 0;
  int used_ = 0;
};

class BitReader {
 public:
  BitReader(std::string_view bytes, size_t byte_pos)
      : bytes_(bytes), bit_(uint64_t{byte_pos} * 8), end_(uint64_t{bytes.size()} * 8) {}

  uint64_t remaining_bits() const { return end_ - bit_; }
  // Byte holding the next bit.
  size_t byte_pos() const { return static_cast<size_t>(bit_ / 8); }

  // Reads `bits` (<= 64) bits. false when the buffer ends first.
  bool Get(int bits, uint64_t* value) {
    if (static_cast<uint64_t>(bits) > remaining_bits()) return false;
    uint64_t v = 0;
    for (int got = 0; got < bits;) {
      const int offset = static_cast<int>(bit_ % 8);
      const int take = std::min(8 - offset, bits - got);
      const uint64_t chunk =
          (static_cast<uint8_t>(bytes_[bit_ / 8]) >> offset) & ((1u << take) - 1);
      v |= chunk << got;
      got += take;
      bit_ += static_cast<uint64_t>(take);
    }
    *value = v;
    return true;
  }

  // Reads an Exp-Golomb code of order k (see BitWriter). false on truncation or a value
  // beyond 64 bits.
  bool GetExpGolomb(int k, uint64_t* value) {
    int zeros = 0;
    while (true) {
      if (bit_ >= end_) return false;
      const uint8_t byte = static_cast<uint8_t>(bytes_[bit_ / 8]) >> (bit_ % 8);
      if (byte != 0) {
        const int run = std::countr_zero(byte);
        zeros += run;
        bit_ += static_cast<uint64_t>(run) + 1;
        break;
      }
      const int run = 8 - static_cast<int>(bit_ % 8);
      zeros += run;
      bit_ += static_cast<uint64_t>(run);
      if (zeros > 63 - k) return false;
    }
    if (zeros > 63 - k) return false;
    const int m = zeros + k;  // <= 63
    uint64_t low = 0;
    if (!Get(m, &low)) return false;
    *value = ((uint64_t{1} << m) | low) - (uint64_t{1} << k);
    return true;
  }

  // The bits left in the current byte are all zero; moves to the next byte boundary.
  bool SkipZeroPadding() {
    if (bit_ % 8 == 0) return true;
    const uint8_t rest = static_cast<uint8_t>(bytes_[bit_ / 8]) >> (bit_ % 8);
    bit_ = (bit_ / 8 + 1) * 8;
    return rest == 0;
  }

 private:
  std::string_view bytes_;
  uint64_t bit_;
  uint64_t end_;
};

// Bits of the Exp-Golomb code of order k of `value` (see BitWriter::PutExpGolomb).
uint64_t ExpGolombBits(uint64_t value, int k) {
  return 2 * static_cast<uint64_t>(std::bit_width(value + (uint64_t{1} << k))) - 1 -
         static_cast<uint64_t>(k);
}

// End of the run of values equal to v[begin].
size_t RunEnd(const std::vector<uint64_t>& v, size_t begin) {
  size_t end = begin + 1;
  while (end < v.size() && v[end] == v[begin]) ++end;
  return end;
}


// The framing both versions share (see DecodeGroups): version, group count, then per group
// the target ID and a body that `write_body(records, begin, end, &out)` writes for records
// [begin, end).
template <typename WriteBody>
std::string EncodeGroups(const std::vector<ContextRecord>& records, uint8_t version,
                         WriteBody write_body) {
  std::string out;
  out.reserve(8 + records.size() * 4);
  out.push_back(static_cast<char>(version));
  uint64_t groups = 0;
  for (size_t i = 0; i < records.size(); ++i) {
    groups += i == 0 || records[i].target_id != records[i - 1].target_id;
  }
  AppendVarint(&out, groups);
  for (size_t g = 0; g < records.size();) {
    const size_t end = GroupEnd(records, g);
    AppendVarint(&out, records[g].target_id);
    write_body(records, g, end, &out);
    g = end;
  }
  return out;
}

// Version 1 group body (sorted by leaf, multi, ids).
void EncodeGroupV1(const std::vector<ContextRecord>& records, size_t begin, size_t end,
                   std::string* out) {
  AppendVarint(out, end - begin);
  NodeId prev_leaf = 0;
  uint64_t base = 0;
  for (size_t i = begin; i < end; ++i) {
    const ContextRecord& r = records[i];
    const uint64_t delta = r.context.leaf - prev_leaf;  // sorted: no wrap
    if (delta != 0) base = 0;
    prev_leaf = r.context.leaf;
    const bool multi = IsMulti(r);
    AppendVarint(out, (delta << kFlagBits) | (multi ? kMulti : 0) |
                          (r.count == 1 ? kCountIsOne : 0));
    if (!multi) {
      const uint64_t id = r.context.ids[0];
      AppendVarint(out, id - base);  // single ids of a leaf ascend
      base = id;
    } else {
      AppendVarint(out, r.context.ids.size() - 2);
      for (uint64_t id : r.context.ids) AppendVarint(out, id);
    }
    if (r.count != 1) AppendVarint(out, r.count - 2);
  }
}

// Bits of `value` as a varint.
double VarintBits(uint64_t value) {
  return 8.0 * std::max(1, (static_cast<int>(std::bit_width(value)) + 6) / 7);
}


// Multi-id contexts [begin, end) of one group (sorted by leaf, ids) as a bit stream.
void EncodeMultiV2(const std::vector<ContextRecord>& records, size_t begin, size_t end,
                   std::string* out, PackedContextsCost* cost) {
  using C = PackedContextsCost;
  BitWriter bits(out);
  NodeId prev_leaf = 0;
  int width = 0;
  bool use_runs = false;
  const std::vector<uint64_t> none;
  std::vector<uint64_t> suffix;
  for (size_t i = begin; i < end; ++i) {
    const ContextRecord& r = records[i];
    const std::vector<uint64_t>& ids = r.context.ids;
    const std::vector<uint64_t>& prev = i == begin ? none : records[i - 1].context.ids;
    const bool same_leaf = i != begin && r.context.leaf == prev_leaf;
    bits.PutExpGolomb(r.context.leaf - prev_leaf, kLeafOrder);
    Charge(cost, &C::leaves, ExpGolombBits(r.context.leaf - prev_leaf, kLeafOrder));
    prev_leaf = r.context.leaf;
    bits.Put(r.count == 1 ? 1 : 0, 1);
    if (r.count != 1) bits.PutExpGolomb(r.count - 2, kCountOrder);
    Charge(cost, &C::counts, r.count == 1 ? 1 : 1 + ExpGolombBits(r.count - 2, kCountOrder));
    const size_t keep = CommonPrefix(prev, ids);
    bits.PutExpGolomb(keep, kPrefixOrder);
    bits.PutExpGolomb(ids.size() - keep, kSuffixOrder);
    Charge(cost, &C::stack_shapes,
           ExpGolombBits(keep, kPrefixOrder) + ExpGolombBits(ids.size() - keep, kSuffixOrder));
    suffix.assign(ids.begin() + static_cast<ptrdiff_t>(keep), ids.end());
    // Same leaf, sorted: the first differing id exceeds the previous context's.
    if (same_leaf && keep < prev.size()) suffix[0] -= prev[keep] + 1;
    uint64_t widest = 0;
    for (uint64_t v : suffix) widest |= v;
    const int w = std::bit_width(widest);
    // Runs of equal ids (recursion through one back edge) when that is shorter.
    uint64_t run_bits = 0;
    for (size_t k = 0; k < suffix.size();) {
      const size_t run_end = RunEnd(suffix, k);
      run_bits += static_cast<uint64_t>(w) + ExpGolombBits(run_end - k - 1, kRunOrder);
      k = run_end;
    }
    const bool runs = run_bits < static_cast<uint64_t>(w) * suffix.size();
    if (w == width && runs == use_runs) {
      bits.Put(1, 1);
      Charge(cost, &C::stack_shapes, 1);
    } else {
      bits.Put(0, 1);
      bits.Put(runs ? 1 : 0, 1);
      bits.PutExpGolomb(static_cast<uint64_t>(w), kWidthOrder);
      Charge(cost, &C::stack_shapes, 2 + ExpGolombBits(static_cast<uint64_t>(w), kWidthOrder));
      width = w;
      use_runs = runs;
    }
    if (!runs) {
      for (uint64_t v : suffix) bits.Put(v, w);
      Charge(cost, &C::innermost_ids, w);
      Charge(cost, &C::inner_ids, static_cast<double>(w) * static_cast<double>(suffix.size() - 1));
      continue;
    }
    for (size_t k = 0; k < suffix.size();) {
      const size_t run_end = RunEnd(suffix, k);
      bits.Put(suffix[k], w);
      bits.PutExpGolomb(run_end - k - 1, kRunOrder);
      Charge(cost, run_end == suffix.size() ? &C::innermost_ids : &C::inner_ids,
             static_cast<double>(w) + ExpGolombBits(run_end - k - 1, kRunOrder));
      k = run_end;
    }
  }
  bits.Finish();
}

// Version 2 group body (single-id contexts first, each part sorted by leaf, ids).
void EncodeGroupV2(const std::vector<ContextRecord>& records, size_t begin, size_t end,
                   std::string* out, PackedContextsCost* cost) {
  using C = PackedContextsCost;
  const size_t multi_begin = static_cast<size_t>(
      std::find_if(records.begin() + static_cast<ptrdiff_t>(begin),
                   records.begin() + static_cast<ptrdiff_t>(end), IsMulti) -
      records.begin());
  AppendVarint(out, multi_begin - begin);
  AppendVarint(out, end - multi_begin);
  NodeId prev_leaf = 0;
  uint64_t prev_id = 0;
  for (size_t i = begin; i < multi_begin; ++i) {
    const ContextRecord& r = records[i];
    const uint64_t delta = r.context.leaf - prev_leaf;  // sorted: no wrap
    prev_leaf = r.context.leaf;
    const uint64_t id = r.context.ids[0];
    AppendVarint(out, (delta << 1) | (r.count == 1 ? 1 : 0));
    // Ids of a leaf strictly ascend after its first one.
    const uint64_t stored_id = i != begin && delta == 0 ? id - prev_id - 1 : id;
    AppendVarint(out, stored_id);
    prev_id = id;
    if (r.count != 1) AppendVarint(out, r.count - 2);
    // The head's flag bit is the count's.
    Charge(cost, &C::leaves, VarintBits((delta << 1) | 1) - 1);
    Charge(cost, &C::single_ids, VarintBits(stored_id));
    Charge(cost, &C::counts, r.count == 1 ? 1 : 1 + VarintBits(r.count - 2));
  }
  if (multi_begin < end) EncodeMultiV2(records, multi_begin, end, out, cost);
}

// leaf += delta, unless the sum leaves 32 bits.
absl::Status AddLeafDelta(uint64_t delta, size_t at, uint64_t* leaf) {
  if (delta > kMaxLeaf - *leaf) return Malformed("leaf beyond 32 bits", at);
  *leaf += delta;
  return absl::OkStatus();
}

// A context's count: 1 when flagged, else the stored count - 2.
absl::Status CountOf(bool count_is_one, uint64_t stored, size_t at, uint64_t* count) {
  if (count_is_one) {
    *count = 1;
  } else if (stored > kMaxU64 - 2) {
    return Malformed("count overflows", at);
  } else {
    *count = stored + 2;
  }
  return absl::OkStatus();
}

// Reads the count of a context whose head is at `at`: nothing when flagged as 1, else a
// varint.
absl::Status ReadCount(std::string_view bytes, size_t* pos, bool count_is_one, size_t at,
                       uint64_t* count) {
  uint64_t stored = 0;
  if (!count_is_one && !ReadVarint(bytes, pos, &stored)) {
    return Malformed("truncated count", *pos);
  }
  return CountOf(count_is_one, stored, at, count);
}

// The framing both versions share: after the version byte, the group count, then per group
// its target ID (strictly increasing) and a body that `read_body(target, group_pos, &pos,
// &out)` decodes; no trailing bytes. Every group takes at least 4 bytes.

template <typename ReadBody>
absl::Status DecodeGroups(std::string_view bytes, ReadBody read_body, RecordSink* out) {
  size_t pos = 1;
  uint64_t groups = 0;
  if (!ReadVarint(bytes, &pos, &groups)) return Malformed("truncated group count", pos);
  if (groups > (bytes.size() - pos) / 4) return Malformed("group count beyond the buffer", pos);
  uint64_t prev_target = 0;
  for (uint64_t g = 0; g < groups; ++g) {
    uint64_t target = 0;
    const size_t group_pos = pos;
    if (!ReadVarint(bytes, &pos, &target)) return Malformed("truncated target id", pos);
    if (target > std::numeric_limits<uint32_t>::max()) {
      return Malformed("target id beyond 32 bits", group_pos);
    }
    if (g > 0 && target <= prev_target) return Malformed("targets out of order", group_pos);
    prev_target = target;
    if (absl::Status s = read_body(static_cast<uint32_t>(target), group_pos, &pos, out);
        !s.ok()) {
      return s;
    }
  }
  if (pos != bytes.size()) return Malformed("trailing bytes", pos);
  out->Finish();
  return absl::OkStatus();
}

// Version 1 group body: context_count, then contexts (head, id part, count).
absl::Status DecodeGroupV1(std::string_view bytes, uint32_t target, size_t group_pos,
                           size_t* pos, RecordSink* out) {
  uint64_t n = 0;
  if (!ReadVarint(bytes, pos, &n)) return Malformed("truncated context count", *pos);
  // A context takes at least 2 bytes (head, one id).
  if (n == 0 || n > (bytes.size() - *pos) / 2) return Malformed("bad context count", group_pos);
  out->Reserve(n);
  uint64_t leaf = 0;
  uint64_t base = 0;
  for (uint64_t i = 0; i < n; ++i) {
    const size_t at = *pos;
    uint64_t head = 0;
    if (!ReadVarint(bytes, pos, &head)) return Malformed("truncated context", at);
    const uint64_t delta = head >> kFlagBits;
    if (absl::Status s = AddLeafDelta(delta, at, &leaf); !s.ok()) return s;
    if (delta != 0) base = 0;
    ContextRecord& r = out->Append();
    r.target_id = target;
    r.context.leaf = static_cast<NodeId>(leaf);
    if ((head & kMulti) == 0) {
      uint64_t v = 0;
      if (!ReadVarint(bytes, pos, &v)) return Malformed("truncated id", *pos);
      if (v > kMaxU64 - base) return Malformed("id overflows", at);
      base += v;
      r.context.ids.push_back(base);
    } else {
      uint64_t extra = 0;
      if (!ReadVarint(bytes, pos, &extra)) return Malformed("truncated id count", *pos);
      if (extra > kMaxPackedIds - 2 || extra + 2 > bytes.size() - *pos) {
        return Malformed("bad id count", at);
      }
      r.context.ids.resize(extra + 2);
      for (uint64_t& id : r.context.ids) {
        if (!ReadVarint(bytes, pos, &id)) return Malformed("truncated id", *pos);
      }
    }
    if (absl::Status s = ReadCount(bytes, pos, (head & kCountIsOne) != 0, at, &r.count);
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

// Decodes `n` multi-id contexts of target `target` from the bit stream at *pos, appending
// them to *out and advancing *pos past the stream's padding.
absl::Status DecodeMultiV2(std::string_view bytes, size_t* pos, uint32_t target, uint64_t n,
                           uint64_t* total_ids, RecordSink* out) {
  BitReader bits(bytes, *pos);
  uint64_t leaf = 0;
  uint64_t width = 0, use_runs = 0;
  size_t prev = 0;  // index in *out of the previous multi-id context of the group
  for (uint64_t i = 0; i < n; ++i) {
    const size_t at = bits.byte_pos();
    uint64_t delta = 0, one = 0, keep = 0, rest = 0, same_width = 0;
    if (!bits.GetExpGolomb(kLeafOrder, &delta)) return Malformed("truncated leaf", at);
    if (absl::Status s = AddLeafDelta(delta, at, &leaf); !s.ok()) return s;
    ContextRecord& r = out->Append();
    r.target_id = target;
    r.context.leaf = static_cast<NodeId>(leaf);
    uint64_t stored_count = 0;
    if (!bits.Get(1, &one) || (one == 0 && !bits.GetExpGolomb(kCountOrder, &stored_count))) {
      return Malformed("truncated count", at);
    }
    if (absl::Status s = CountOf(one != 0, stored_count, at, &r.count); !s.ok()) return s;
    if (!bits.GetExpGolomb(kPrefixOrder, &keep) || !bits.GetExpGolomb(kSuffixOrder, &rest)) {
      return Malformed("truncated id stack", at);
    }
    const std::vector<uint64_t>* prev_ids = i == 0 ? nullptr : &(*out)[prev].context.ids;
    const size_t prev_len = prev_ids == nullptr ? 0 : prev_ids->size();
    if (keep > prev_len) return Malformed("shared prefix beyond the previous id stack", at);
    if (rest > kMaxPackedIds - keep) return Malformed("id stack beyond the limit", at);
    if (keep + rest < 2) return Malformed("multi-id context with fewer than 2 ids", at);
    // Sorted by (leaf, ids) and distinct: a context of the previous one's leaf extends or
    // exceeds it.
    const bool same_leaf = i != 0 && delta == 0;
    if (same_leaf && rest == 0) return Malformed("multi-id contexts out of order", at);
    if (keep + rest > kMaxPackedIdsPerBuffer - *total_ids) {
      return Malformed("more ids than a buffer may hold", at);
    }
    *total_ids += keep + rest;
    if (!bits.Get(1, &same_width)) return Malformed("truncated id width", at);
    if (same_width == 0) {
      if (!bits.Get(1, &use_runs) || !bits.GetExpGolomb(kWidthOrder, &width) || width > 64) {
        return Malformed("bad id width", at);
      }
    }
    std::vector<uint64_t>& ids = r.context.ids;
    ids.reserve(keep + rest);
    if (keep > 0) ids.assign(prev_ids->begin(), prev_ids->begin() + static_cast<ptrdiff_t>(keep));
    const int w = static_cast<int>(width);
    if (use_runs == 0) {
      if (width * rest > bits.remaining_bits()) return Malformed("truncated ids", at);
      for (uint64_t k = 0; k < rest; ++k) {
        uint64_t v = 0;
        bits.Get(w, &v);  // fits: checked above
        ids.push_back(v);
      }
    } else {
      // Each run: its value, then its length - 1; the runs fill the suffix exactly.
      for (uint64_t left = rest; left > 0;) {
        uint64_t v = 0, extra = 0;
        if (!bits.Get(w, &v) || !bits.GetExpGolomb(kRunOrder, &extra)) {
          return Malformed("truncated ids", at);
        }
        if (extra >= left) return Malformed("run beyond the id stack", at);
        ids.insert(ids.end(), extra + 1, v);
        left -= extra + 1;
      }
    }
    // Same leaf, sorted: the first differing id is stored above the previous context's.
    if (same_leaf && keep < prev_len) {
      const uint64_t above = (*prev_ids)[keep];
      if (above == kMaxU64 || ids[keep] > kMaxU64 - above - 1) {
        return Malformed("id overflows", at);
      }
      ids[keep] += above + 1;
    }
    prev = out->size() - 1;
  }
  if (!bits.SkipZeroPadding()) return Malformed("non-zero padding bits", bits.byte_pos());
  *pos = bits.byte_pos();
  return absl::OkStatus();
}

// Version 2 group body: single_count, multi_count, the single-id contexts (varints), the
// multi-id contexts (bit stream). *total_ids counts the ids of the buffer so far.
absl::Status DecodeGroupV2(std::string_view bytes, uint32_t target, size_t group_pos,
                           size_t* pos, uint64_t* total_ids, RecordSink* out) {
  uint64_t singles = 0, multis = 0;
  if (!ReadVarint(bytes, pos, &singles) || !ReadVarint(bytes, pos, &multis)) {
    return Malformed("truncated context count", *pos);
  }
  // A single-id context takes at least 2 bytes (head, id), a multi-id one kMinMultiBits.
  const uint64_t remaining = bytes.size() - *pos;
  if (singles > remaining / 2 || multis > (remaining - singles * 2) * 8 / kMinMultiBits ||
      singles + multis == 0) {
    return Malformed("bad context count", group_pos);
  }
  out->Reserve(singles + multis);
  uint64_t leaf = 0;
  uint64_t prev_id = 0;
  for (uint64_t i = 0; i < singles; ++i) {
    const size_t at = *pos;
    uint64_t head = 0, id = 0;
    if (!ReadVarint(bytes, pos, &head)) return Malformed("truncated context", at);
    const uint64_t delta = head >> 1;
    if (absl::Status s = AddLeafDelta(delta, at, &leaf); !s.ok()) return s;
    if (!ReadVarint(bytes, pos, &id)) return Malformed("truncated id", *pos);
    if (i != 0 && delta == 0) {
      if (prev_id == kMaxU64 || id > kMaxU64 - prev_id - 1) return Malformed("id overflows", at);
      id += prev_id + 1;
    }
    prev_id = id;
    ContextRecord& r = out->Append();
    r.target_id = target;
    r.context.leaf = static_cast<NodeId>(leaf);
    r.context.ids.push_back(id);
    if (absl::Status s = ReadCount(bytes, pos, (head & 1) != 0, at, &r.count); !s.ok()) {
      return s;
    }
  }
  *total_ids += singles;
  if (*total_ids > kMaxPackedIdsPerBuffer) {
    return Malformed("more ids than a buffer may hold", group_pos);
  }
  if (multis == 0) return absl::OkStatus();
  return DecodeMultiV2(bytes, pos, target, multis, total_ids, out);
}

void AddCost(const PackedContextsCost& fields, size_t bytes, PackedContextsCost* cost) {
  const double counted = fields.framing + fields.leaves + fields.stack_shapes +
                         fields.single_ids + fields.innermost_ids + fields.inner_ids +
                         fields.counts;
  cost->framing += fields.framing + 8.0 * static_cast<double>(bytes) - counted;
  cost->leaves += fields.leaves;
  cost->stack_shapes += fields.stack_shapes;
  cost->single_ids += fields.single_ids;
  cost->innermost_ids += fields.innermost_ids;
  cost->inner_ids += fields.inner_ids;
  cost->counts += fields.counts;
}

}  // namespace

void AppendVarint(std::string* out, uint64_t value) {
  while (value >= 0x80) {
    out->push_back(static_cast<char>(value | 0x80));
    value >>= 7;
  }
  out->push_back(static_cast<char>(value));
}

bool ReadVarint(std::string_view bytes, size_t* pos, uint64_t* value) {
  uint64_t v = 0;
  size_t p = *pos;
  for (int shift = 0; shift < 64; shift += 7) {
    if (p >= bytes.size()) return false;
    const uint8_t b = static_cast<uint8_t>(bytes[p++]);
    // The tenth byte may only carry the top bit of a 64-bit value.
    if (shift == 63 && b > 1) return false;
    v |= uint64_t{b & 0x7fu} << shift;
    if ((b & 0x80) == 0) {
      *pos = p;
      *value = v;
      return true;
    }
  }
  return false;
}

absl::StatusOr<std::string> EncodePackedContexts(std::vector<ContextRecord> records,
                                                 uint8_t version, PackedContextsCost* cost) {
  if (version != kPackedContextsVersion3 && version != kPackedContextsVersion2 &&
      version != kPackedContextsVersion1) {
    return absl::InvalidArgumentError(
        absl::StrCat("packed contexts: cannot write version ", version));
  }
  if (absl::Status s = Canonicalize(records, version); !s.ok()) return s;
  if (version == kPackedContextsVersion3) {
    std::string out;
    out.reserve(8 + records.size() * 3);
    out.push_back(static_cast<char>(version));
    PackedContextsCost metered;
    EncodeV3(records, &out, cost == nullptr ? nullptr : &metered);
    if (records.size() <= kMaxV3ContextsPerByte * out.size()) {
      if (cost != nullptr) AddCost(metered, out.size(), cost);
      return out;
    }
    version = kPackedContextsVersion2;
    std::sort(records.begin(), records.end(), SortsBeforeV2);
  }
  if (version == kPackedContextsVersion1) return EncodeGroups(records, version, EncodeGroupV1);
  PackedContextsCost metered;
  std::string out = EncodeGroups(
      records, version,
      [&](const std::vector<ContextRecord>& all, size_t begin, size_t end, std::string* body) {
        EncodeGroupV2(all, begin, end, body, cost == nullptr ? nullptr : &metered);
      });
  if (cost != nullptr) AddCost(metered, out.size(), cost);
  return out;
}

absl::Status DecodePackedContexts(std::string_view bytes, std::vector<ContextRecord>* records) {
  if (bytes.empty()) return Malformed("empty buffer", 0);
  RecordSink sink(records);
  const uint8_t version = static_cast<uint8_t>(bytes[0]);
  if (version == kPackedContextsVersion3) return DecodeV3(bytes, &sink);
  if (version == kPackedContextsVersion2) {
    uint64_t total_ids = 0;
    return DecodeGroups(
        bytes,
        [&](uint32_t target, size_t group_pos, size_t* pos, RecordSink* out) {
          return DecodeGroupV2(bytes, target, group_pos, pos, &total_ids, out);
        },
        &sink);
  }
  if (version == kPackedContextsVersion1) {
    return DecodeGroups(
        bytes,
        [&](uint32_t target, size_t group_pos, size_t* pos, RecordSink* out) {
          return DecodeGroupV1(bytes, target, group_pos, pos, out);
        },
        &sink);
  }
  return Malformed(absl::StrCat("unknown version ", version), 0);
}

absl::StatusOr<std::vector<ContextRecord>> DecodePackedContexts(std::string_view bytes) {
  std::vector<ContextRecord> records;
  if (absl::Status s = DecodePackedContexts(bytes, &records); !s.ok()) return s;
  return records;
}

}  // namespace strata::encoding
