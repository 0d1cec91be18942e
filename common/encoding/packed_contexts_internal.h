// Internal to common/encoding's packed contexts (packed_contexts.cc: versions 1 and 2 and the
// framing; packed_contexts_v3.cc: version 3): what both files use. Not for other modules.
#ifndef STRATA_COMMON_ENCODING_PACKED_CONTEXTS_INTERNAL_H_
#define STRATA_COMMON_ENCODING_PACKED_CONTEXTS_INTERNAL_H_

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/encoding/packed_contexts.h"

namespace strata::encoding::internal {

inline constexpr uint64_t kMaxLeaf = std::numeric_limits<NodeId>::max();
inline constexpr uint64_t kMaxU64 = std::numeric_limits<uint64_t>::max();

// Contexts a version 3 buffer may hold per byte of its size (about half a bit a context;
// real batches take 5 bits or more). A well-predicted context can cost less, so without the
// bound a few bytes could make the decoder build millions of records; the encoder writes
// version 2 for a batch that would exceed it.
inline constexpr uint64_t kMaxV3ContextsPerByte = 16;

inline absl::Status Malformed(const std::string& what, size_t pos) {
  return absl::InvalidArgumentError(
      absl::StrCat("packed contexts: ", what, " at byte ", pos));
}

inline size_t GroupEnd(const std::vector<ContextRecord>& records, size_t begin) {
  size_t end = begin;
  while (end < records.size() && records[end].target_id == records[begin].target_id) ++end;
  return end;
}

// Adds `bits` to a field of *cost when there is one.
inline void Charge(PackedContextsCost* cost, double PackedContextsCost::*field, double bits) {
  if (cost != nullptr) cost->*field += bits;
}

// Where decoding appends records: it reuses the records (and their ID stacks' memory) that
// the caller's vector already holds, so that decoding batch after batch into one vector
// allocates nothing once it has held a batch as large.
class RecordSink {
 public:
  explicit RecordSink(std::vector<ContextRecord>* records) : records_(records) {}
  // Room for `more` records without moving the earlier ones (references stay valid).
  void Reserve(size_t more) { records_->reserve(size_ + more); }
  // A cleared record after the last one.
  ContextRecord& Append() {
    if (size_ == records_->size()) records_->emplace_back();
    ContextRecord& r = (*records_)[size_++];
    r.target_id = 0;
    r.context.leaf = 0;
    r.context.ids.clear();
    r.count = 0;
    return r;
  }
  size_t size() const { return size_; }
  const ContextRecord& operator[](size_t i) const { return (*records_)[i]; }
  // Drops the records beyond those appended.
  void Finish() { records_->resize(size_); }

 private:
  std::vector<ContextRecord>* const records_;
  size_t size_ = 0;
};

// Length of the common prefix of a and b.
inline size_t CommonPrefix(const std::vector<uint64_t>& a, const std::vector<uint64_t>& b) {
  const auto [ai, bi] = std::mismatch(a.begin(), a.end(), b.begin(), b.end());
  return static_cast<size_t>(ai - a.begin());
}

// Version 3 (packed_contexts_v3.cc): `records` sorted as SortsBeforeV3, into *out (the
// version byte first); the bits of each field added to *cost when given.
void EncodeV3(const std::vector<ContextRecord>& records, std::string* out,
              PackedContextsCost* cost);
absl::Status DecodeV3(std::string_view bytes, RecordSink* out);

}  // namespace strata::encoding::internal

#endif  // STRATA_COMMON_ENCODING_PACKED_CONTEXTS_INTERNAL_H_
