// Packed wire layout of a batch's calling contexts (proto strata.v1.SampleBatch
// .packed_contexts; the proto comment is the format's specification).
//
// The agent aggregates an interval into (target, encoded context) -> count records and packs
// them here; the server unpacks them before decoding each context against the batch's epoch.
// Contexts are grouped by target and sorted by leaf, so leaves are delta-coded and a leaf's
// single-number IDs are delta-coded against each other; a count of 1 costs no byte.
//
// Decoding is strict and bounded: every malformed input (truncated or over-long varints,
// overflowing leaves/ids/counts, group or context counts beyond what the remaining bytes can
// hold, unsorted groups, trailing bytes, an unknown version) returns InvalidArgument. Work and
// memory are linear in the input size; no input loops or crashes.
//
// Stateless free functions; thread-safe.
#ifndef STRATA_COMMON_ENCODING_PACKED_CONTEXTS_H_
#define STRATA_COMMON_ENCODING_PACKED_CONTEXTS_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/encoding/numbering.h"

namespace strata::encoding {

// Version byte that starts every packed buffer.
inline constexpr uint8_t kPackedContextsVersion = 1;
// Upper bound on the ids of one context accepted by the decoder (the decoder's ID-stack
// limit is deeper than any decodable path needs).
inline constexpr size_t kMaxPackedIds = kDefaultMaxDecodeDepth;

// One distinct calling context of a batch and its sample count.
struct ContextRecord {
  uint32_t target_id = 0;
  EncodedContext context;  // leaf + ID stack (ids non-empty)
  uint64_t count = 0;      // > 0
  friend bool operator==(const ContextRecord&, const ContextRecord&) = default;
};

// Packs `records` (any order; equal (target, leaf, ids) records are merged by summing their
// counts). InvalidArgument for a record with no ids, more than kMaxPackedIds ids, a zero
// count, or merged counts that overflow 64 bits.
absl::StatusOr<std::string> EncodePackedContexts(std::vector<ContextRecord> records);

// Unpacks a buffer written by EncodePackedContexts. Records come out grouped by ascending
// target ID, sorted by (leaf, single before multi-ID, ids) within a target.
absl::StatusOr<std::vector<ContextRecord>> DecodePackedContexts(std::string_view bytes);

// Varint helpers of the format (exposed for benchmarks and tests).
void AppendVarint(std::string* out, uint64_t value);
// Reads a varint at *pos, advancing it. false on truncation or more than 64 bits.
bool ReadVarint(std::string_view bytes, size_t* pos, uint64_t* value);

}  // namespace strata::encoding

#endif  // STRATA_COMMON_ENCODING_PACKED_CONTEXTS_H_
