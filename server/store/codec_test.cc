// The store's record and key encodings: every record type round-trips, malformed input is
// refused with DataLoss naming the record, and the bytes older servers wrote still decode.
// Expected bytes are written out by hand from the formats in codec.h, not produced by the
// encoders, so a change of the on-disk format fails here.
#include "server/store/codec.h"

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace strata::server::store {
namespace {

using ::testing::HasSubstr;

std::string Bytes(std::string_view s) { return std::string(s); }

std::string BE(uint64_t v) {
  std::string out;
  for (int i = 7; i >= 0; --i) out.push_back(static_cast<char>(v >> (8 * i)));
  return out;
}

std::string LE(uint64_t v) {
  std::string out;
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
  return out;
}

// `status` is DataLoss and says which record is corrupt.
void ExpectCorrupt(const absl::Status& status, std::string_view record) {
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("corrupt " + std::string(record)));
}

// Every strict prefix of `encoded` is refused by `decode`, except the lengths in `valid`
// (shorter records of a format without a length field).
template <typename Decode>
void ExpectTruncationsRefused(const std::string& encoded, Decode decode, std::string_view record,
                              std::initializer_list<size_t> valid = {}) {
  for (size_t n = 0; n < encoded.size(); ++n) {
    if (std::find(valid.begin(), valid.end(), n) != valid.end()) continue;
    SCOPED_TRACE(testing::Message() << record << " truncated to " << n << " bytes");
    ExpectCorrupt(decode(std::string_view(encoded).substr(0, n)).status(), record);
  }
}

TEST(CodecTest, FixedWidthIntegers) {
  std::string be, le;
  PutFixed64BE(&be, 0x0102030405060708ULL);
  PutFixed64LE(&le, 0x0102030405060708ULL);
  EXPECT_EQ(be, Bytes("\x01\x02\x03\x04\x05\x06\x07\x08"));
  EXPECT_EQ(le, Bytes("\x08\x07\x06\x05\x04\x03\x02\x01"));
  EXPECT_EQ(GetFixed64BE(be.data()), 0x0102030405060708ULL);
  EXPECT_EQ(GetFixed64LE(le.data()), 0x0102030405060708ULL);
}

// IDs are persisted: the hash must never change. Values from an independent implementation
// of MurmurHash64A.
TEST(CodecTest, HashIsStable) {
  EXPECT_EQ(Hash64("", 0), 0u);
  EXPECT_EQ(Hash64("strata", 0), 0x4153990b697d9d6fULL);
  EXPECT_EQ(Hash64("0123456789abcdef!", 42), 0x19283cacf11e99d7ULL);
  const std::string stack = EncodeStack({{7}, false});
  EXPECT_EQ(ContentId(stack, 0), 0xf7179e9702f34850ULL);
  EXPECT_EQ(ContentId(stack, 3), 0x387cfc61285e4afaULL);
}

TEST(CodecTest, IdKey) {
  EXPECT_EQ(IdKey(0x1234), BE(0x1234));
  EXPECT_EQ(*DecodeIdKey(IdKey(0x1234)), 0x1234u);
  ExpectCorrupt(DecodeIdKey("short").status(), "id key");
}

TEST(CodecTest, CellKeyRoundTripsWithAndWithoutLabels) {
  const std::string unlabelled = EncodeCellKey("svc", 60'000, "host-1", 42);
  EXPECT_EQ(unlabelled, Bytes("svc") + '\0' + BE(60'000) + "host-1" + '\0' + BE(42));
  absl::StatusOr<CellKey> cell = DecodeCellKey(unlabelled);
  ASSERT_TRUE(cell.ok()) << cell.status();
  EXPECT_EQ(cell->scope, "svc");
  EXPECT_EQ(cell->window_start_ms, 60'000u);
  EXPECT_EQ(cell->host, "host-1");
  EXPECT_EQ(cell->stack_id, 42u);
  EXPECT_EQ(cell->label_set, 0u);

  const std::string labelled = EncodeCellKey("svc", 60'000, "", 42, 9);
  EXPECT_EQ(labelled, Bytes("svc") + '\0' + BE(60'000) + '\0' + BE(42) + BE(9));
  cell = DecodeCellKey(labelled);
  ASSERT_TRUE(cell.ok()) << cell.status();
  EXPECT_EQ(cell->host, "");
  EXPECT_EQ(cell->label_set, 9u);
  EXPECT_TRUE(labelled.starts_with(CellPrefix("svc", 60'000)));
}

TEST(CodecTest, CorruptCellKeysAreRefused) {
  const std::string labelled = EncodeCellKey("svc", 1, "h", 2, 3);
  // Cut after the stack ID, the key is an unlabelled one: still valid.
  ExpectTruncationsRefused(labelled, DecodeCellKey, "sample key", {labelled.size() - 8});
  ExpectCorrupt(DecodeCellKey(labelled + "x").status(), "sample key");
  // A label set suffix of 0 is never written (unlabelled keys have none).
  ExpectCorrupt(DecodeCellKey(EncodeCellKey("svc", 1, "h", 2) + BE(0)).status(), "sample key");
}

TEST(CodecTest, Count) {
  EXPECT_EQ(EncodeCount(5), LE(5));
  EXPECT_EQ(*DecodeCount(EncodeCount(UINT64_MAX)), UINT64_MAX);
  ExpectTruncationsRefused(EncodeCount(5), DecodeCount, "sample count");
  ExpectCorrupt(DecodeCount(EncodeCount(5) + "x").status(), "sample count");
}

TEST(CodecTest, Stack) {
  const StackFrames stack{{1, 0xffffffffffffffffULL, 3}, true};
  const std::string encoded = EncodeStack(stack);
  EXPECT_EQ(encoded, Bytes("\x01") + LE(1) + LE(0xffffffffffffffffULL) + LE(3));
  EXPECT_EQ(*DecodeStack(encoded), stack);
  EXPECT_EQ(*DecodeStack(EncodeStack({})), StackFrames{});
  // A stack has no length field: cut at a frame boundary it is a shorter stack.
  ExpectTruncationsRefused(encoded, DecodeStack, "stack", {1, 9, 17});
  ExpectCorrupt(DecodeStack(Bytes("\x04") + LE(1)).status(), "stack");  // unknown flag
}

TEST(CodecTest, StackWithCallSites) {
  const StackFrames stack{{1, 2, 3}, false, {0x40, 0x1234}};
  const std::string encoded = EncodeStack(stack);
  EXPECT_EQ(encoded, Bytes("\x02") + LE(1) + LE(2) + LE(3) + LE(0x40) + LE(0x1234));
  EXPECT_EQ(*DecodeStack(encoded), stack);
  const StackFrames truncated{{1, 2}, true, {7}};
  EXPECT_EQ(*DecodeStack(EncodeStack(truncated)), truncated);
  // Call sites are part of the identity: the same functions called from elsewhere differ.
  EXPECT_NE(EncodeStack(stack), EncodeStack({{1, 2, 3}, false, {0x40, 0x1238}}));
  EXPECT_NE(EncodeStack(stack), EncodeStack({{1, 2, 3}, false}));
  // Sites that do not fit the functions (one fewer) are not written.
  EXPECT_EQ(EncodeStack({{1, 2, 3}, false, {0x40}}), EncodeStack({{1, 2, 3}, false}));
  // Without an odd number of words (n functions + n - 1 sites, n >= 2) it is corrupt.
  ExpectCorrupt(DecodeStack(Bytes("\x02") + LE(1)).status(), "stack");
  ExpectCorrupt(DecodeStack(Bytes("\x02") + LE(1) + LE(2)).status(), "stack");
  ExpectCorrupt(DecodeStack(encoded.substr(0, encoded.size() - 8)).status(), "stack");
  ExpectCorrupt(DecodeStack(encoded.substr(0, encoded.size() - 1)).status(), "stack");
}

TEST(CodecTest, Function) {
  const FunctionInfo f{"main", "/usr/bin/app", "\x01\xab", 0x1040};
  const std::string encoded = EncodeFunction(f);
  EXPECT_EQ(encoded, Bytes("\x01\x04main\x0c/usr/bin/app\x02\x01\xab") + LE(0x1040));
  EXPECT_EQ(*DecodeFunction(encoded), f);
  ExpectTruncationsRefused(encoded, DecodeFunction, "function");
  ExpectCorrupt(DecodeFunction(encoded + "x").status(), "function");
  std::string v2 = encoded;
  v2[0] = 2;
  ExpectCorrupt(DecodeFunction(v2).status(), "function");
}

TEST(CodecTest, FunctionIdentityIgnoresTheModuleWhenThereIsABuildId) {
  FunctionInfo a{"f", "/a/lib.so", "id", 16};
  FunctionInfo b{"f", "/b/lib.so", "id", 16};
  EXPECT_EQ(FunctionIdentity(a), FunctionIdentity(b));
  a.build_id.clear();
  b.build_id.clear();
  EXPECT_NE(FunctionIdentity(a), FunctionIdentity(b));
}

TEST(CodecTest, ServiceSummary) {
  const std::string encoded = EncodeServiceSummary(10, 20, 30);
  EXPECT_EQ(encoded, LE(10) + LE(20) + LE(30));
  absl::StatusOr<ServiceSummary> s = DecodeServiceSummary(encoded);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->first_window_ms, 10);
  EXPECT_EQ(s->last_window_ms, 20);
  EXPECT_EQ(s->total_samples, 30u);
  ExpectTruncationsRefused(encoded, DecodeServiceSummary, "service summary");
}

TEST(CodecTest, AgentRoundTrips) {
  const AgentRecord agent{"", "host-1", "x86_64", "1.2", 1'700'000'000'000, 300, "alice"};
  const std::string encoded = EncodeAgent(agent);
  EXPECT_EQ(encoded, Bytes("\x02\x06host-1\x06x86_64\x03" "1.2") + LE(1'700'000'000'000) +
                         Bytes("\xac\x02\x05" "alice"));
  EXPECT_EQ(*DecodeAgent(encoded), agent);  // the ID lives in the key
  ExpectTruncationsRefused(encoded, DecodeAgent, "agent");
  ExpectCorrupt(DecodeAgent(encoded + "x").status(), "agent");
  std::string v3 = encoded;
  v3[0] = 3;
  ExpectCorrupt(DecodeAgent(v3).status(), "agent");
}

// Version 1 agent records (written before owners were kept) still decode, without an owner.
TEST(CodecTest, AgentVersion1StillDecodes) {
  const std::string v1 = Bytes("\x01\x02h1\x07" "aarch64\x03" "0.9") + LE(1234) + Bytes("\x07");
  absl::StatusOr<AgentRecord> agent = DecodeAgent(v1);
  ASSERT_TRUE(agent.ok()) << agent.status();
  EXPECT_EQ(agent->host, "h1");
  EXPECT_EQ(agent->arch, "aarch64");
  EXPECT_EQ(agent->version, "0.9");
  EXPECT_EQ(agent->last_batch_ms, 1234);
  EXPECT_EQ(agent->batches, 7u);
  EXPECT_EQ(agent->owner, "");
  ExpectTruncationsRefused(v1, DecodeAgent, "agent");
}

TEST(CodecTest, GraphNode) {
  const GraphNode node{0, "f", "/bin/app", "", 300};
  const std::string encoded = EncodeGraphNode(node);
  EXPECT_EQ(encoded, std::string("\x01" "f\x08/bin/app\x00\xac\x02", 14));
  EXPECT_EQ(*DecodeGraphNode(encoded), node);  // the ID lives in the key
  ExpectTruncationsRefused(encoded, DecodeGraphNode, "graph node");
  ExpectCorrupt(DecodeGraphNode(encoded + "x").status(), "graph node");
}

TEST(CodecTest, GraphEdge) {
  const GraphEdge edge{1, 0x401000, 2};
  const std::string encoded = EncodeGraphEdge(edge);
  EXPECT_EQ(encoded, Bytes("\x01\x80\xa0\x80\x02\x02"));
  EXPECT_EQ(*DecodeGraphEdge(encoded), edge);
  ExpectTruncationsRefused(encoded, DecodeGraphEdge, "graph edge");
  // Node IDs are 32 bits.
  ExpectCorrupt(DecodeGraphEdge(Bytes("\x80\x80\x80\x80\x10\x00\x00")).status(), "graph edge");
  // The classification follows, in records written since it is kept; without it the edge is
  // classified again when the graph loads.
  EXPECT_EQ(DecodeGraphEdge(encoded)->back, std::nullopt);
  for (bool back : {false, true}) {
    const GraphEdge classified{1, 0x401000, 2, back};
    const std::string with_flag = EncodeGraphEdge(classified);
    EXPECT_EQ(with_flag, encoded + (back ? "\x01" : std::string(1, '\0')));
    EXPECT_EQ(*DecodeGraphEdge(with_flag), classified);
  }
  ExpectCorrupt(DecodeGraphEdge(encoded + "\x02").status(), "graph edge");
  ExpectCorrupt(DecodeGraphEdge(encoded + std::string("\x01\x00", 2)).status(), "graph edge");
}

TEST(CodecTest, Capture) {
  const CaptureInfo capture{"", "svc", "h", 4242, 99, 1000, 2000, true, "gone"};
  const std::string encoded = EncodeCapture(capture);
  EXPECT_EQ(encoded, Bytes("\x01\x03svc\x01h\x92\x21\x63") + LE(1000) + LE(2000) +
                         Bytes("\x01\x04gone"));
  EXPECT_EQ(*DecodeCapture(encoded), capture);  // the ID lives in the key
  ExpectTruncationsRefused(encoded, DecodeCapture, "capture");
  std::string bad_flag = encoded;
  bad_flag[bad_flag.size() - 6] = 2;  // `finished` is 0 or 1
  ExpectCorrupt(DecodeCapture(bad_flag).status(), "capture");
  std::string v2 = encoded;
  v2[0] = 2;
  ExpectCorrupt(DecodeCapture(v2).status(), "capture");
}

TEST(CodecTest, MetaKeys) {
  EXPECT_EQ(AgentKey("a1"), "aa1");
  EXPECT_EQ(CaptureKey("c1"), "cc1");
  EXPECT_EQ(SequenceKey("a1", 5), Bytes("qa1") + '\0' + BE(5));
  // Stores written before incarnations keyed the applied sequence by agent only.
  EXPECT_EQ(LegacySequenceKey("a1"), "qa1");
  EXPECT_EQ(LabelSetKey(7), "l" + BE(7));
  EXPECT_EQ(ServiceLabelSetKey("svc", 7), Bytes("Lsvc") + '\0' + BE(7));
  EXPECT_TRUE(ServiceLabelSetKey("svc", 7).starts_with(ServiceLabelSetPrefix("svc")));
  EXPECT_EQ(GraphNodeKey("a1", 2, 3), Bytes("ga1") + '\0' + BE(2) + "n" + BE(3));
  // Outside the graph's prefix: LoadGraph never meets it.
  EXPECT_EQ(GraphUseKey("a1", 2), Bytes("Ga1") + '\0' + BE(2));
  EXPECT_EQ(GraphEdgeKey("a1", 2, 3), Bytes("ga1") + '\0' + BE(2) + "e" + BE(3));
  EXPECT_EQ(PhaseKey({"svc", 10'000, "payload"}),
            Bytes("psvc") + '\0' + BE(10'000) + BE(Hash64("payload", 0)));
  EXPECT_TRUE(PhaseKey({"svc", 10'000, "x"}).starts_with(PhasePrefix("svc", 10'000)));
}

}  // namespace
}  // namespace strata::server::store

namespace strata::server::store {
namespace {

TEST(CodecTest, LeafAddressesRoundTripAndKeysCarryTheHost) {
  const std::vector<LeafAddressCount> counts = {{7, 0x1000, 3}, {7, 0x1010, 1}, {9, 1ull << 40, 2}};
  auto decoded = DecodeLeafAddresses(EncodeLeafAddresses(counts));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(*decoded, counts);
  const std::string key = LeafAddressKey("svc", 60'000, "host-a", "agent-1", 5, 9);
  EXPECT_TRUE(key.starts_with(LeafAddressPrefix("svc", 60'000)));
  EXPECT_LT(key, LeafAddressPrefix("svc", 70'000));
  auto host = LeafAddressKeyHost(key);
  ASSERT_TRUE(host.ok());
  EXPECT_EQ(*host, "host-a");
  std::string value = EncodeLeafAddresses(counts);
  EXPECT_FALSE(DecodeLeafAddresses(value.substr(0, value.size() - 1)).ok());
  EXPECT_FALSE(DecodeLeafAddresses(value + "x").ok());
  EXPECT_FALSE(DecodeLeafAddresses("").ok());
  EXPECT_FALSE(LeafAddressKeyHost("x").ok());
}

}  // namespace
}  // namespace strata::server::store
