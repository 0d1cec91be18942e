// Packed wire layout of a batch's calling contexts (proto strata.v1.SampleBatch
// .packed_contexts; the proto comment is the format's specification).
//
// The agent aggregates an interval into (target, encoded context) -> count records and packs
// them here; the server unpacks them before decoding each context against the batch's epoch.
//
// Version 2 (written by default) splits each target's contexts into single-id contexts
// (byte-aligned varints: leaf delta and a count-of-1 flag in one head byte, the id
// delta-coded against the previous id of the same leaf) and multi-id contexts (a bit stream:
// each ID stack is coded as the length of the prefix it shares with the previous multi-id
// context plus the differing suffix, bit-packed at the suffix's widest value). Recursion
// pushes small, mostly equal ids (the dummy annotations of back edges), so a deep recursive
// context costs a few bits per differing id, and none for a suffix of zeros. Version 1 (one
// varint per id) is still decoded, and written on request.
//
// Decoding is strict and bounded: every malformed input (truncated or over-long varints and
// bit codes, overflowing leaves/ids/counts, prefix lengths beyond the previous stack, stacks
// beyond kMaxPackedIds, group or context counts beyond what the remaining bytes can hold,
// unsorted groups or multi-id contexts, non-zero padding bits, trailing bytes, an unknown
// version) returns InvalidArgument. Because a bit-packed suffix of zeros takes no bits, a
// version 2 buffer may hold at most kMaxPackedIdsPerBuffer ids in total (the encoder refuses
// larger batches; a version 1 buffer holds at most one id per byte). Work and memory are
// linear in the input size plus the ids produced; no input loops or crashes.
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

// Version byte that starts every packed buffer; EncodePackedContexts writes this one.
inline constexpr uint8_t kPackedContextsVersion = 2;
// The first layout (one varint per id), still accepted by the decoder.
inline constexpr uint8_t kPackedContextsVersion1 = 1;
// Upper bound on the ids of one context accepted by the decoder (the decoder's ID-stack
// limit is deeper than any decodable path needs).
inline constexpr size_t kMaxPackedIds = kDefaultMaxDecodeDepth;
// Upper bound on the ids of all contexts of one version 2 buffer (32 MiB as uint64). The
// agent's default aggregation bound (65536 contexts, 64 path edges each on average, at most
// one id per edge) stays within it.
inline constexpr size_t kMaxPackedIdsPerBuffer = size_t{1} << 22;

// One distinct calling context of a batch and its sample count.
struct ContextRecord {
  uint32_t target_id = 0;
  EncodedContext context;  // leaf + ID stack (ids non-empty)
  uint64_t count = 0;      // > 0
  friend bool operator==(const ContextRecord&, const ContextRecord&) = default;
};

// Packs `records` (any order; equal (target, leaf, ids) records are merged by summing their
// counts) in layout `version` (kPackedContextsVersion, or kPackedContextsVersion1 for peers
// that only read version 1). InvalidArgument for a record with no ids, more than
// kMaxPackedIds ids, a zero count, merged counts that overflow 64 bits, more than
// kMaxPackedIdsPerBuffer ids in total, or an unknown version.
absl::StatusOr<std::string> EncodePackedContexts(std::vector<ContextRecord> records,
                                                 uint8_t version = kPackedContextsVersion);

// Unpacks a buffer written by EncodePackedContexts (either version). Records come out
// grouped by ascending target ID. Within a target, version 2 yields the single-id contexts
// sorted by (leaf, id), then the multi-id contexts sorted by (leaf, ids); version 1 yields
// them sorted by (leaf, single before multi-id, ids).
absl::StatusOr<std::vector<ContextRecord>> DecodePackedContexts(std::string_view bytes);
// The same into *records, reusing the records it holds and their ID stacks' memory: a caller
// that decodes batch after batch into one vector allocates nothing once warm. On error
// *records holds an unspecified part of the buffer's records.
absl::Status DecodePackedContexts(std::string_view bytes, std::vector<ContextRecord>* records);

// Varint helpers of the format (exposed for benchmarks and tests).
void AppendVarint(std::string* out, uint64_t value);
// Reads a varint at *pos, advancing it. false on truncation or more than 64 bits.
bool ReadVarint(std::string_view bytes, size_t* pos, uint64_t* value);

}  // namespace strata::encoding

#endif  // STRATA_COMMON_ENCODING_PACKED_CONTEXTS_H_
