// Key and value encodings of the store's column families, and the stable content hash
// behind stack and function IDs. Internal to server/store (store.cc and its tests).
//
// Keys use big-endian fixed-width integers so that byte order equals numeric order; values
// use little-endian fixed64 and varint-prefixed strings. Every decoder validates lengths and
// returns DataLoss on malformed input.
#ifndef STRATA_SERVER_STORE_CODEC_H_
#define STRATA_SERVER_STORE_CODEC_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/store/records.h"

namespace strata::server::store {

// MurmurHash64A: fixed across platforms and releases (IDs are persisted).
uint64_t Hash64(std::string_view data, uint64_t seed);
// Candidate ID number `probe` for content `identity`; never 0 (0 means "no ID").
uint64_t ContentId(std::string_view identity, uint32_t probe);

void PutFixed64BE(std::string* out, uint64_t v);
uint64_t GetFixed64BE(const char* p);
void PutFixed64LE(std::string* out, uint64_t v);
uint64_t GetFixed64LE(const char* p);

std::string IdKey(uint64_t id);  // stacks and functions CFs
absl::StatusOr<uint64_t> DecodeIdKey(std::string_view key);

// Samples / captures cell key: scope '\0' BE(window) host '\0' BE(stack) [BE(label set)].
// The label set ID is present only when not 0 (no labels), so stores written before labels
// read unchanged and unlabelled samples cost nothing more.
struct CellKey {
  std::string_view scope;  // service or capture ID
  uint64_t window_start_ms = 0;
  std::string_view host;
  uint64_t stack_id = 0;
  uint64_t label_set = 0;
};
std::string EncodeCellKey(std::string_view scope, uint64_t window_start_ms,
                          std::string_view host, uint64_t stack_id, uint64_t label_set = 0);
// Prefix of every cell of `scope` in `window` (and `host`, when given).
std::string CellPrefix(std::string_view scope, uint64_t window_start_ms);
absl::StatusOr<CellKey> DecodeCellKey(std::string_view key);  // views into `key`

std::string EncodeCount(uint64_t count);
absl::StatusOr<uint64_t> DecodeCount(std::string_view value);

// Stacks: [flags u8: bit0 truncated, bit1 call sites][fixed64 LE function id]* and, with
// bit1, [fixed64 LE call site]* (one fewer than functions). The encoding is also the stack's
// identity.
std::string EncodeStack(const StackFrames& stack);
absl::StatusOr<StackFrames> DecodeStack(std::string_view value);

// Functions: the identity is (build ID, or module path when there is none; start offset;
// name); the value holds all fields.
std::string FunctionIdentity(const FunctionInfo& function);
std::string EncodeFunction(const FunctionInfo& function);
absl::StatusOr<FunctionInfo> DecodeFunction(std::string_view value);

// Services: [fixed64 first window][fixed64 last window][fixed64 total samples].
std::string EncodeServiceSummary(int64_t first_window_ms, int64_t last_window_ms,
                                 uint64_t total);
absl::StatusOr<ServiceSummary> DecodeServiceSummary(std::string_view value);

// Meta column family: one leading byte tells the record type.
inline constexpr char kAgentTag = 'a';
inline constexpr char kCaptureTag = 'c';
inline constexpr char kGraphTag = 'g';
inline constexpr char kPhaseTag = 'p';
inline constexpr char kSequenceTag = 'q';
inline constexpr char kLabelSetTag = 'l';
inline constexpr char kServiceLabelSetTag = 'L';
inline constexpr char kUnwindTag = 'u';
inline constexpr char kLeafAddressTag = 'x';
inline constexpr char kLeafAddressHourTag = 'X';
inline constexpr char kRequestsTag = 'r';
inline constexpr char kRequestsHourTag = 'Y';
inline constexpr char kRollupStateTag = 'R';
inline constexpr char kReleaseTag = 'v';
inline constexpr char kGraphUseTag = 'G';
inline constexpr char kJournalWrittenTag = 'J';

std::string AgentKey(std::string_view agent_id);
// Applied batch sequence of one incarnation of an agent (its graph ID): 'q' agent '\0'
// BE(incarnation). Stores written before incarnations keyed it 'q' agent (LegacySequenceKey).
std::string SequenceKey(std::string_view agent_id, uint64_t incarnation);
std::string LegacySequenceKey(std::string_view agent_id);
std::string CaptureKey(std::string_view capture_id);
std::string ReleaseKey(std::string_view release_id);
// 'J' service -> BE(sequence): journal records below the sequence hold no cell of the service
// that is not in the cell column families.
std::string JournalWrittenKey(std::string_view service);
// Label sets: 'l' BE(id) -> labels::Encode(set) (content-addressed like stacks), and the
// sets each service's samples use: 'L' service '\0' BE(id) -> "".
std::string LabelSetKey(uint64_t label_set);
std::string ServiceLabelSetPrefix(std::string_view service);
std::string ServiceLabelSetKey(std::string_view service, uint64_t label_set);
// 'g' agent '\0' BE(graph_id); nodes follow as 'n' BE(node id), edges as 'e' BE(index).
std::string GraphPrefix(std::string_view agent_id, uint64_t graph_id);
std::string GraphNodeKey(std::string_view agent_id, uint64_t graph_id, uint64_t node_id);
std::string GraphEdgeKey(std::string_view agent_id, uint64_t graph_id, uint64_t index);
// When a batch of (agent, graph_id) was last applied, about (server clock, Unix ms, refreshed
// hourly): 'G' agent '\0' BE(graph_id) -> fixed64 LE. Outside the graph's prefix, so that
// servers older than it read graphs as before.
std::string GraphUseKey(std::string_view agent_id, uint64_t graph_id);
// 'p' service '\0' BE(window) BE(hash of payload).
std::string PhasePrefix(std::string_view service, uint64_t window_start_ms);
std::string PhaseKey(const PhaseEvent& event);

// Unwinding counters of one batch and service: 'u' service '\0' BE(window) agent '\0'
// BE(incarnation) BE(sequence) (one record per batch: written once, with the batch).
std::string UnwindPrefix(std::string_view service, uint64_t window_start_ms);
std::string UnwindKey(std::string_view service, uint64_t window_start_ms,
                      std::string_view agent_id, uint64_t incarnation, uint64_t sequence);
// [version u8 = 2][varint stacks, truncated, verify_failures, jit_frames_cfi, jit_frames_fp,
// lost][varint python_frames, python_stale (version 2+)]; later versions may append fields.
std::string EncodeUnwindCounts(const UnwindCounts& counts);
absl::StatusOr<UnwindCounts> DecodeUnwindCounts(std::string_view value);

// Leaf addresses of one batch and service: 'x' service '\0' BE(window) host '\0' agent '\0'
// BE(incarnation) BE(sequence) (one record per batch, written with it).
std::string LeafAddressPrefix(std::string_view service, uint64_t window_start_ms);
std::string LeafAddressKey(std::string_view service, uint64_t window_start_ms,
                           std::string_view host, std::string_view agent_id,
                           uint64_t incarnation, uint64_t sequence);
// The host of a leaf-address or requests key (batch or hour); DataLoss for a malformed key.
absl::StatusOr<std::string_view> LeafAddressKeyHost(std::string_view key);
// Leaf addresses of one service, hour and host, summed over its batches by a merge operator:
// 'X' service '\0' BE(hour start) host '\0'. LeafAddressKeyHost reads these too.
std::string LeafAddressHourPrefix(std::string_view service, uint64_t hour_start_ms);
std::string LeafAddressHourKey(std::string_view service, uint64_t hour_start_ms,
                               std::string_view host);
// Requests a host served in one batch's window, as its agent scraped them (SampleBatch.
// requests): 'r' service '\0' BE(window) host '\0' agent '\0' BE(incarnation) BE(sequence),
// and summed per hour by the same merge operator, 'Y' service '\0' BE(hour start) host '\0'
// (written together from the first such record on). The value is a leaf-address list of one
// entry, (0, 0) -> requests, so that the meta column's one merge operator sums both.
std::string RequestsPrefix(std::string_view service, uint64_t window_start_ms);
std::string RequestsKey(std::string_view service, uint64_t window_start_ms,
                        std::string_view host, std::string_view agent_id, uint64_t incarnation,
                        uint64_t sequence);
std::string RequestsHourPrefix(std::string_view service, uint64_t hour_start_ms);
std::string RequestsHourKey(std::string_view service, uint64_t hour_start_ms,
                            std::string_view host);
// The first hour whose leaf addresses are all in hourly records (the store wrote them from
// then on): 'R' "leaf-address-hours" -> fixed64 LE hour start.
std::string LeafAddressHoursSinceKey();
// The window start of a per-batch meta record ('u' unwind counters, 'x' leaf addresses, 'r'
// requests), which
// the store keeps as long as the raw samples of that window; nullopt for every other key.
std::optional<uint64_t> BatchMetaWindowStart(std::string_view key);
// The hour of an hourly leaf-address or requests record ('X', 'Y'), kept as long as the hour
// rollups.
std::optional<uint64_t> HourlyMetaWindowStart(std::string_view key);
// [version u8 = 1][varint n] n x [varint function_id][varint offset][varint count].
std::string EncodeLeafAddresses(const std::vector<LeafAddressCount>& counts);
absl::StatusOr<std::vector<LeafAddressCount>> DecodeLeafAddresses(std::string_view value);

std::string EncodeAgent(const AgentRecord& agent);
absl::StatusOr<AgentRecord> DecodeAgent(std::string_view value);
std::string EncodeGraphNode(const GraphNode& node);  // id lives in the key
absl::StatusOr<GraphNode> DecodeGraphNode(std::string_view value);
std::string EncodeGraphEdge(const GraphEdge& edge);
absl::StatusOr<GraphEdge> DecodeGraphEdge(std::string_view value);
std::string EncodeCapture(const CaptureInfo& capture);
absl::StatusOr<CaptureInfo> DecodeCapture(std::string_view value);
// Releases: [version byte 1][string payload].
std::string EncodeRelease(const ReleaseRecord& release);
absl::StatusOr<ReleaseRecord> DecodeRelease(std::string_view value);

}  // namespace strata::server::store

#endif  // STRATA_SERVER_STORE_CODEC_H_
