// Packed wire layout of a batch's calling contexts (proto strata.v1.SampleBatch
// .packed_contexts; the proto comment is the format's specification).
//
// The agent aggregates an interval into (target, encoded context) -> count records and packs
// them here; the server unpacks them before decoding each context against the batch's epoch.
//
// Version 3 (written by default) codes every field of the batch (group headers, leaf
// deltas, ID stacks, counts) in one adaptive binary range-coded stream: contexts sorted by
// (target, leaf, ids); each ID stack as how many ids it drops from the previous context's
// stack and the ids it appends, every id modelled by its place in the stack and the id
// before it; each count as "more than one?" and the excess. The models adapt within the
// batch, so the coder learns the batch's own distributions: small leaf steps, counts of 1,
// recursion's repeated small ids (a few tenths of a bit each once learnt), and spends the
// raw bits only on the low bits of large ids. Version 2 (single-id contexts as byte-aligned
// varints, multi-id stacks as shared prefixes plus bit-packed suffixes) and version 1 (one
// varint per id) are still decoded, and written on request.
//
// Decoding is strict and bounded: every malformed input (truncated or over-long varints and
// bit codes, overflowing leaves/ids/counts, prefix lengths beyond the previous stack, stacks
// beyond kMaxPackedIds, group or context counts beyond what the remaining bytes can hold
// (version 3: beyond 16 contexts per byte of the buffer), unsorted groups or contexts, non-zero padding
// bits, trailing bytes (version 3: bytes its decoder does not read, or a last byte of zero),
// an unknown version) returns InvalidArgument. Because a bit-packed suffix of zeros takes no
// bits and a well-predicted range-coded field a fraction of one, a version 2 or 3 buffer may
// hold at most kMaxPackedIdsPerBuffer ids in total (the encoder refuses larger batches; a
// version 1 buffer holds at most one id per byte). Work and memory are linear in the input
// size plus the ids produced; no input loops or crashes.
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

// Layout versions (the byte that starts every packed buffer). The decoder reads all three.
// Version 3: every field in one adaptive range-coded stream.
inline constexpr uint8_t kPackedContextsVersion3 = 3;
// Version 2: shared ID-stack prefixes, bit-packed suffixes, byte-aligned single-id contexts.
inline constexpr uint8_t kPackedContextsVersion2 = 2;
// Version 1: one varint per id.
inline constexpr uint8_t kPackedContextsVersion1 = 1;
// The version EncodePackedContexts writes by default.
inline constexpr uint8_t kPackedContextsVersion = kPackedContextsVersion3;
// Upper bound on the ids of one context accepted by the decoder (the decoder's ID-stack
// limit is deeper than any decodable path needs).
inline constexpr size_t kMaxPackedIds = kDefaultMaxDecodeDepth;
// Upper bound on the ids of all contexts of one version 2 or 3 buffer (32 MiB as uint64). The
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

// Where the bits of a packed buffer go, by field (for benchmarks; versions 2 and 3).
// Version 3's figures are its coder's ideal cost (-log2 of each decision's probability,
// within a few bytes per buffer of what it writes); framing takes the rest of the buffer.
struct PackedContextsCost {
  double framing = 0;        // version, group headers, padding or the coder's last bytes
  double leaves = 0;         // leaf deltas
  double stack_shapes = 0;   // ID-stack lengths: shared prefixes, suffixes, widths and modes
  double single_ids = 0;     // the id of each single-id context
  double innermost_ids = 0;  // the last id of each multi-id stack (the leaf's segment)
  double inner_ids = 0;      // the other ids of multi-id stacks (recursion)
  double counts = 0;         // counts and count-is-one flags
};

// Packs `records` (any order; equal (target, leaf, ids) records are merged by summing their
// counts) in layout `version` (kPackedContextsVersion, or an older one for peers that only
// read it); a batch so regular that version 3 would code it in less than half a bit per
// context is written in version 2 (which a version 3 reader reads). InvalidArgument for a record with no ids, more than
// kMaxPackedIds ids, a zero count, merged counts that overflow 64 bits, more than
// kMaxPackedIdsPerBuffer ids in total, or an unknown version.
// With `cost`, adds the bits of each field to it (version 1: nothing).
absl::StatusOr<std::string> EncodePackedContexts(std::vector<ContextRecord> records,
                                                 uint8_t version = kPackedContextsVersion,
                                                 PackedContextsCost* cost = nullptr);

// Unpacks a buffer written by EncodePackedContexts (any version). Records come out grouped
// by ascending target ID. Within a target, version 3 yields the contexts sorted by (leaf,
// ids); version 2 the single-id contexts sorted by (leaf, id), then the multi-id contexts
// sorted by (leaf, ids); version 1 sorted by (leaf, single before multi-id, ids).
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
