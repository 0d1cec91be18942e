#include "common/encoding/packed_contexts.h"

#include <algorithm>
#include <limits>
#include <tuple>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace strata::encoding {
namespace {

constexpr uint64_t kCountIsOne = 1;
constexpr uint64_t kMulti = 2;
constexpr int kFlagBits = 2;

absl::Status Malformed(const std::string& what, size_t pos) {
  return absl::InvalidArgumentError(
      absl::StrCat("packed contexts: ", what, " at byte ", pos));
}

bool SortsBefore(const ContextRecord& a, const ContextRecord& b) {
  const bool a_multi = a.context.ids.size() > 1, b_multi = b.context.ids.size() > 1;
  return std::tie(a.target_id, a.context.leaf, a_multi, a.context.ids) <
         std::tie(b.target_id, b.context.leaf, b_multi, b.context.ids);
}

bool SameContext(const ContextRecord& a, const ContextRecord& b) {
  return a.target_id == b.target_id && a.context == b.context;
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

absl::StatusOr<std::string> EncodePackedContexts(std::vector<ContextRecord> records) {
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
  std::sort(records.begin(), records.end(), SortsBefore);
  // Merge equal contexts.
  size_t kept = 0;
  for (size_t i = 0; i < records.size(); ++i) {
    if (kept > 0 && SameContext(records[kept - 1], records[i])) {
      if (records[kept - 1].count > std::numeric_limits<uint64_t>::max() - records[i].count) {
        return absl::InvalidArgumentError("packed contexts: merged count overflows");
      }
      records[kept - 1].count += records[i].count;
    } else {
      if (kept != i) records[kept] = std::move(records[i]);
      ++kept;
    }
  }
  records.resize(kept);

  std::string out;
  out.reserve(8 + records.size() * 4);
  out.push_back(static_cast<char>(kPackedContextsVersion));
  uint64_t groups = 0;
  for (size_t i = 0; i < records.size(); ++i) {
    groups += i == 0 || records[i].target_id != records[i - 1].target_id;
  }
  AppendVarint(&out, groups);
  for (size_t g = 0; g < records.size();) {
    size_t end = g;
    while (end < records.size() && records[end].target_id == records[g].target_id) ++end;
    AppendVarint(&out, records[g].target_id);
    AppendVarint(&out, end - g);
    NodeId prev_leaf = 0;
    uint64_t base = 0;
    for (size_t i = g; i < end; ++i) {
      const ContextRecord& r = records[i];
      const uint64_t delta = r.context.leaf - prev_leaf;  // sorted: no wrap
      if (delta != 0) base = 0;
      prev_leaf = r.context.leaf;
      const bool multi = r.context.ids.size() > 1;
      AppendVarint(&out, (delta << kFlagBits) | (multi ? kMulti : 0) |
                             (r.count == 1 ? kCountIsOne : 0));
      if (!multi) {
        const uint64_t id = r.context.ids[0];
        AppendVarint(&out, id - base);  // single ids of a leaf ascend
        base = id;
      } else {
        AppendVarint(&out, r.context.ids.size() - 2);
        for (uint64_t id : r.context.ids) AppendVarint(&out, id);
      }
      if (r.count != 1) AppendVarint(&out, r.count - 2);
    }
    g = end;
  }
  return out;
}

absl::StatusOr<std::vector<ContextRecord>> DecodePackedContexts(std::string_view bytes) {
  if (bytes.empty()) return Malformed("empty buffer", 0);
  if (static_cast<uint8_t>(bytes[0]) != kPackedContextsVersion) {
    return Malformed(absl::StrCat("unknown version ", static_cast<uint8_t>(bytes[0])), 0);
  }
  size_t pos = 1;
  auto remaining = [&] { return bytes.size() - pos; };
  uint64_t groups = 0;
  if (!ReadVarint(bytes, &pos, &groups)) return Malformed("truncated group count", pos);
  // A group takes at least 4 bytes (target, count, one head, one id).
  if (groups > remaining() / 4) return Malformed("group count beyond the buffer", pos);

  std::vector<ContextRecord> out;
  uint64_t prev_target = 0;
  for (uint64_t g = 0; g < groups; ++g) {
    uint64_t target = 0, n = 0;
    const size_t group_pos = pos;
    if (!ReadVarint(bytes, &pos, &target)) return Malformed("truncated target id", pos);
    if (target > std::numeric_limits<uint32_t>::max()) {
      return Malformed("target id beyond 32 bits", group_pos);
    }
    if (g > 0 && target <= prev_target) return Malformed("targets out of order", group_pos);
    prev_target = target;
    if (!ReadVarint(bytes, &pos, &n)) return Malformed("truncated context count", pos);
    // A context takes at least 2 bytes (head, one id).
    if (n == 0 || n > remaining() / 2) return Malformed("bad context count", group_pos);
    out.reserve(out.size() + n);
    uint64_t leaf = 0;
    uint64_t base = 0;
    for (uint64_t i = 0; i < n; ++i) {
      const size_t at = pos;
      uint64_t head = 0;
      if (!ReadVarint(bytes, &pos, &head)) return Malformed("truncated context", at);
      const uint64_t delta = head >> kFlagBits;
      if (delta > std::numeric_limits<NodeId>::max() - leaf) {
        return Malformed("leaf beyond 32 bits", at);
      }
      leaf += delta;
      if (delta != 0) base = 0;
      ContextRecord r;
      r.target_id = static_cast<uint32_t>(target);
      r.context.leaf = static_cast<NodeId>(leaf);
      if ((head & kMulti) == 0) {
        uint64_t v = 0;
        if (!ReadVarint(bytes, &pos, &v)) return Malformed("truncated id", pos);
        if (v > std::numeric_limits<uint64_t>::max() - base) return Malformed("id overflows", at);
        base += v;
        r.context.ids.push_back(base);
      } else {
        uint64_t extra = 0;
        if (!ReadVarint(bytes, &pos, &extra)) return Malformed("truncated id count", pos);
        if (extra > kMaxPackedIds - 2 || extra + 2 > remaining()) {
          return Malformed("bad id count", at);
        }
        r.context.ids.resize(extra + 2);
        for (uint64_t& id : r.context.ids) {
          if (!ReadVarint(bytes, &pos, &id)) return Malformed("truncated id", pos);
        }
      }
      if ((head & kCountIsOne) != 0) {
        r.count = 1;
      } else {
        uint64_t v = 0;
        if (!ReadVarint(bytes, &pos, &v)) return Malformed("truncated count", pos);
        if (v > std::numeric_limits<uint64_t>::max() - 2) return Malformed("count overflows", at);
        r.count = v + 2;
      }
      out.push_back(std::move(r));
    }
  }
  if (pos != bytes.size()) return Malformed("trailing bytes", pos);
  return out;
}

}  // namespace strata::encoding
