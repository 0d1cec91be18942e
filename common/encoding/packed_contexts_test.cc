#include "common/encoding/packed_contexts.h"

#include <algorithm>
#include <bit>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <tuple>

#include "common/testing/sanitizers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace strata::encoding {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kMaxU64 = std::numeric_limits<uint64_t>::max();

ContextRecord R(uint32_t target, NodeId leaf, std::vector<uint64_t> ids, uint64_t count) {
  return {target, {leaf, std::move(ids)}, count};
}

// (target, leaf, ids) -> summed count: the meaning of a record list, whatever its order.
std::map<std::tuple<uint32_t, NodeId, std::vector<uint64_t>>, uint64_t> Sum(
    const std::vector<ContextRecord>& records) {
  std::map<std::tuple<uint32_t, NodeId, std::vector<uint64_t>>, uint64_t> m;
  for (const auto& r : records) m[{r.target_id, r.context.leaf, r.context.ids}] += r.count;
  return m;
}

std::string Bytes(std::initializer_list<int> b) {
  std::string s;
  for (int x : b) s.push_back(static_cast<char>(x));
  return s;
}

// Hand-built version 2 bit streams: '0'/'1' in stream order (least significant bit of each
// byte first), spaces ignored, zero-padded to a byte boundary.
std::string BitStream(const std::string& bits) {
  std::string out;
  int used = 0;
  for (char c : bits) {
    if (c == ' ') continue;
    if (used % 8 == 0) out.push_back('\0');
    if (c == '1') out.back() = static_cast<char>(out.back() | (1 << (used % 8)));
    ++used;
  }
  return out;
}

// Reference Exp-Golomb code of order k as a bit string (the format's definition).
std::string G(int k, uint64_t v) {
  const uint64_t u = v + (uint64_t{1} << k);
  const int m = std::bit_width(u) - 1;
  std::string s(static_cast<size_t>(m - k), '0');
  s += '1';
  for (int b = 0; b < m; ++b) s += ((u >> b) & 1) != 0 ? '1' : '0';
  return s;
}

// `width`-bit field, least significant bit first.
std::string Field(uint64_t v, int width) {
  std::string s;
  for (int b = 0; b < width; ++b) s += ((v >> b) & 1) != 0 ? '1' : '0';
  return s;
}

// One multi-id context of a version 2 bit stream: `suffix` as stored (its first id already
// relative to the previous context's where that applies), bit-packed at `width` or as runs.
std::string Multi(uint64_t leaf_delta, uint64_t keep, const std::vector<uint64_t>& suffix,
                  int width, bool new_width = true, uint64_t count = 1, bool runs = false) {
  std::string s = G(0, leaf_delta);
  s += count == 1 ? "1" : "0" + G(0, count - 2);
  s += G(2, keep) + G(2, suffix.size());
  s += new_width ? std::string("0") + (runs ? "1" : "0") + G(0, static_cast<uint64_t>(width))
                 : "1";
  for (size_t k = 0; k < suffix.size();) {
    size_t end = k + 1;
    if (runs) {
      while (end < suffix.size() && suffix[end] == suffix[k]) ++end;
    }
    s += Field(suffix[k], width);
    if (runs) s += G(0, end - k - 1);
    k = end;
  }
  return s;
}

std::string EncodeOrDie(const std::vector<ContextRecord>& records, uint8_t version) {
  auto bytes = EncodePackedContexts(records, version);
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  return bytes.ok() ? *bytes : std::string();
}

std::vector<ContextRecord> DecodeOrDie(const std::string& bytes) {
  auto out = DecodePackedContexts(bytes);
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? *out : std::vector<ContextRecord>{};
}

// A fib-like recursion: an outer id, then per level one of two back edges (ids 0/1).
std::vector<uint64_t> BinaryRecursion(std::mt19937_64& rng, uint64_t outer, size_t depth) {
  std::vector<uint64_t> ids{outer};
  for (size_t d = 0; d < depth; ++d) ids.push_back(rng() % 2);
  return ids;
}

class PackedContextsVersionTest : public ::testing::TestWithParam<uint8_t> {};

TEST_P(PackedContextsVersionTest, EmptyBatch) {
  const std::string bytes = EncodeOrDie({}, GetParam());
  if (GetParam() == kPackedContextsVersion3) {
    // A zero group count and the check bits.
    EXPECT_LE(bytes.size(), 3u);
    EXPECT_EQ(bytes[0], static_cast<char>(GetParam()));
  } else {
    EXPECT_EQ(bytes, Bytes({GetParam(), 0}));
  }
  EXPECT_TRUE(DecodeOrDie(bytes).empty());
}

TEST_P(PackedContextsVersionTest, RoundTripsSortedAndMerged) {
  std::vector<ContextRecord> in = {
      R(2, 9, {5}, 1),          R(1, 7, {3}, 4),   R(1, 7, {1}, 1),
      R(1, 7, {0, 2, 9}, 2),    R(1, 3, {0}, 1),   R(1, 7, {3}, 6),  // merges with (1, 7, {3})
      R(1, 3, {4, 4}, 1),
      R(2, 9, {1ull << 63}, kMaxU64 - 1),
      R(7, 0xffffffff, {kMaxU64, 0}, 3),
  };
  const std::string bytes = EncodeOrDie(in, GetParam());
  const auto out = DecodeOrDie(bytes);
  EXPECT_EQ(out.size(), in.size() - 1);
  EXPECT_EQ(Sum(out), Sum(in));
  std::vector<ContextRecord> expected;
  if (GetParam() == kPackedContextsVersion1) {
    // (target, leaf, single before multi, ids).
    expected = {R(1, 3, {0}, 1), R(1, 3, {4, 4}, 1), R(1, 7, {1}, 1), R(1, 7, {3}, 10),
                R(1, 7, {0, 2, 9}, 2), R(2, 9, {5}, 1), R(2, 9, {1ull << 63}, kMaxU64 - 1),
                R(7, 0xffffffff, {kMaxU64, 0}, 3)};
  } else if (GetParam() == kPackedContextsVersion3) {
    // (target, leaf, ids).
    expected = {R(1, 3, {0}, 1), R(1, 3, {4, 4}, 1), R(1, 7, {0, 2, 9}, 2), R(1, 7, {1}, 1),
                R(1, 7, {3}, 10), R(2, 9, {5}, 1), R(2, 9, {1ull << 63}, kMaxU64 - 1),
                R(7, 0xffffffff, {kMaxU64, 0}, 3)};
  } else {
    // (target, single before multi, leaf, ids).
    expected = {R(1, 3, {0}, 1), R(1, 7, {1}, 1), R(1, 7, {3}, 10), R(1, 3, {4, 4}, 1),
                R(1, 7, {0, 2, 9}, 2), R(2, 9, {5}, 1), R(2, 9, {1ull << 63}, kMaxU64 - 1),
                R(7, 0xffffffff, {kMaxU64, 0}, 3)};
  }
  EXPECT_EQ(out, expected);
  // Re-encoding the decoded records gives the same bytes.
  EXPECT_EQ(EncodeOrDie(out, GetParam()), bytes);
}

TEST_P(PackedContextsVersionTest, RandomRecordsRoundTrip) {
  std::mt19937_64 rng(42);
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<ContextRecord> in;
    const int n = static_cast<int>(rng() % 200);
    for (int i = 0; i < n; ++i) {
      ContextRecord r;
      r.target_id = static_cast<uint32_t>(rng() % 4 == 0 ? rng() : rng() % 3);
      r.context.leaf = static_cast<NodeId>(rng() % 8 == 0 ? rng() : rng() % 40);
      switch (rng() % 8) {
        case 0:  // arbitrary short stack
          for (size_t k = 0, ids = 2 + rng() % 6; k < ids; ++k) {
            r.context.ids.push_back(rng() % 3 == 0 ? rng() >> (rng() % 64) : rng() % 100);
          }
          break;
        case 1:  // recursion through two back edges
          r.context.ids = BinaryRecursion(rng, rng() % 4, 1 + rng() % 30);
          break;
        case 2:  // self recursion: a run of one value, then the leaf segment
          r.context.ids.assign(1 + rng() % 300, rng() % 3);
          r.context.ids.push_back(rng() % 50);
          break;
        default:
          r.context.ids.push_back(rng() % 3 == 0 ? rng() >> (rng() % 64) : rng() % 100);
      }
      r.count = rng() % 3 == 0 ? 1 : 1 + (rng() >> (rng() % 56 + 8));
      in.push_back(r);
    }
    const auto out = DecodeOrDie(EncodeOrDie(in, GetParam()));
    ASSERT_EQ(Sum(out), Sum(in));
  }
}

TEST_P(PackedContextsVersionTest, EncodeRejectsInvalidRecords) {
  const uint8_t v = GetParam();
  EXPECT_THAT(std::string(EncodePackedContexts({R(1, 2, {}, 1)}, v).status().message()),
              HasSubstr("no ids"));
  EXPECT_THAT(std::string(EncodePackedContexts({R(1, 2, {1}, 0)}, v).status().message()),
              HasSubstr("zero count"));
  EXPECT_FALSE(
      EncodePackedContexts({R(1, 2, std::vector<uint64_t>(kMaxPackedIds + 1, 1), 1)}, v).ok());
  EXPECT_FALSE(EncodePackedContexts({R(1, 2, {1}, kMaxU64), R(1, 2, {1}, 1)}, v).ok());
}

INSTANTIATE_TEST_SUITE_P(Versions, PackedContextsVersionTest,
                         ::testing::Values(kPackedContextsVersion1, kPackedContextsVersion2,
                                           kPackedContextsVersion3),
                         [](const ::testing::TestParamInfo<uint8_t>& info) {
                           return "V" + std::to_string(info.param);
                         });

TEST(PackedContextsTest, WritesVersion3ByDefault) {
  auto bytes = EncodePackedContexts({R(1, 2, {3}, 1)});
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ(static_cast<uint8_t>((*bytes)[0]), 3);
  EXPECT_EQ(kPackedContextsVersion, kPackedContextsVersion3);
  EXPECT_EQ(kPackedContextsVersion2, 2);
  EXPECT_FALSE(EncodePackedContexts({R(1, 2, {3}, 1)}, 4).ok());
  EXPECT_FALSE(EncodePackedContexts({R(1, 2, {3}, 1)}, 0).ok());
}

TEST(PackedContextsTest, SteadyStateContextsTakeAboutThreeBytes) {
  // 1000 leaves, two single-id contexts each with small ids, counts 1 and 5.
  std::vector<ContextRecord> in;
  for (NodeId leaf = 2; leaf < 1002; ++leaf) {
    in.push_back(R(1, leaf, {leaf % 50}, 1));
    in.push_back(R(1, leaf, {leaf % 50 + 40}, 5));
  }
  const std::string bytes = EncodeOrDie(in, kPackedContextsVersion2);
  // head + id per context, plus a count byte for half of them.
  EXPECT_LE(bytes.size(), in.size() * 5 / 2 + 8);
  EXPECT_EQ(Sum(DecodeOrDie(bytes)), Sum(in));
}

TEST(PackedContextsTest, DeepBinaryRecursionTakesAFewBytesPerContext) {
  // 150 distinct fib-like contexts 10..20 levels deep from two entry paths, as the demo
  // workload produces every interval; a few single-id contexts beside them.
  std::mt19937_64 rng(3);
  std::vector<ContextRecord> in;
  std::set<std::vector<uint64_t>> seen;
  while (in.size() < 150) {
    auto ids = BinaryRecursion(rng, 3 + rng() % 2, 10 + rng() % 11);
    if (seen.insert(ids).second) in.push_back(R(1, 15, ids, rng() % 4 == 0 ? 2 : 1));
  }
  for (NodeId leaf : {9, 14}) in.push_back(R(1, leaf, {0}, 300));
  const std::string v3 = EncodeOrDie(in, kPackedContextsVersion3);
  const std::string v2 = EncodeOrDie(in, kPackedContextsVersion2);
  const std::string v1 = EncodeOrDie(in, kPackedContextsVersion1);
  EXPECT_EQ(Sum(DecodeOrDie(v3)), Sum(in));
  EXPECT_EQ(Sum(DecodeOrDie(v2)), Sum(in));
  EXPECT_EQ(DecodeOrDie(v1).size(), in.size());
  EXPECT_LE(v2.size(), in.size() * 4);
  EXPECT_LT(v2.size() * 4, v1.size());
  // Version 3 learns that the ids are 0/1 and that neighbours' stacks have similar lengths.
  EXPECT_LT(v3.size(), v2.size());
  RecordProperty("v1_bytes", std::to_string(v1.size()));
  RecordProperty("v2_bytes", std::to_string(v2.size()));
  RecordProperty("v3_bytes", std::to_string(v3.size()));
}

TEST(PackedContextsTest, DeepStacksCostTheirRunsAndDifferingSuffixes) {
  // Self recursion 4000 levels deep through one back edge (its dummy annotation is 0): the
  // outer id, a run of zeros, the leaf segment's id. Alone, it takes a few bytes.
  std::vector<uint64_t> deep(4000, 0);
  deep[0] = 7;
  deep.push_back(5);
  EXPECT_LE(EncodeOrDie({R(1, 20, deep, 1)}, kPackedContextsVersion2).size(), 16u);

  std::vector<ContextRecord> in;
  for (size_t depth : {1000, 2000, 3000, 4000}) {
    std::vector<uint64_t> ids(depth, 0);
    ids[0] = 7;
    ids.push_back(5);
    in.push_back(R(1, 20, ids, 1));
    ids.back() = 0;  // sampled in the recursive function itself
    in.push_back(R(1, 21, ids, 1));
  }
  in.push_back(R(2, 20, std::vector<uint64_t>(kMaxPackedIds, 2), 1));
  // 64 stacks 3001 deep that differ in their last id: each costs its prefix length, not
  // its ids.
  for (uint64_t last = 0; last < 64; ++last) {
    std::vector<uint64_t> ids(3000, 1);
    ids.push_back(last);
    in.push_back(R(2, 22, ids, 1));
  }
  const std::string bytes = EncodeOrDie(in, kPackedContextsVersion2);
  EXPECT_EQ(Sum(DecodeOrDie(bytes)), Sum(in));
  EXPECT_LE(bytes.size(), 73 * 5u);
}

TEST(PackedContextsTest, PrefixesAreSharedAcrossLeavesAndTargets) {
  std::vector<ContextRecord> in;
  std::mt19937_64 rng(11);
  for (uint32_t target = 0; target < 1000; ++target) {
    const auto stem = BinaryRecursion(rng, target, 12);
    for (NodeId leaf = 30; leaf < 34; ++leaf) {
      auto ids = stem;
      ids.push_back(leaf % 3);
      in.push_back(R(target * 7, leaf, ids, 1 + leaf % 2));
      in.push_back(R(target * 7, leaf, {target + leaf}, 1));
      in.push_back(R(target * 7, leaf, stem, 1));  // the stem itself, at another leaf
    }
  }
  std::shuffle(in.begin(), in.end(), rng);
  const std::string bytes = EncodeOrDie(in, kPackedContextsVersion2);
  const auto out = DecodeOrDie(bytes);
  EXPECT_EQ(Sum(out), Sum(in));
  EXPECT_EQ(out.size(), in.size());
  // About 3.7 bytes per context; one varint per id (version 1) takes about 11.
  EXPECT_LE(bytes.size(), in.size() * 4);
  // Decoded order: per target, single-id contexts by (leaf, id), then multi-id ones by
  // (leaf, ids).
  for (size_t i = 1; i < out.size(); ++i) {
    const auto key = [](const ContextRecord& r) {
      return std::make_tuple(r.target_id, r.context.ids.size() > 1, r.context.leaf,
                             r.context.ids);
    };
    EXPECT_LT(key(out[i - 1]), key(out[i]));
  }
}

TEST(PackedContextsTest, HandBuiltVersion1BuffersDecode) {
  // Version 1: two groups. Target 1: leaf 2 single id 5 (count 1), leaf 2 single id 7
  // (delta 2, count 4), leaf 3 multi {1, 300, 0} (count 1). Target 4: leaf 9 {0, 0} count 2.
  const std::string v1 = Bytes({1, 2,
                                1, 3,
                                (2 << 2) | 1, 5,
                                (0 << 2) | 0, 2, 2,
                                (1 << 2) | 2 | 1, 1, 1, 0xac, 0x02, 0,
                                4, 1,
                                (9 << 2) | 2, 0, 0, 0, 0});
  const std::vector<ContextRecord> expected = {R(1, 2, {5}, 1), R(1, 2, {7}, 4),
                                               R(1, 3, {1, 300, 0}, 1), R(4, 9, {0, 0}, 2)};
  EXPECT_EQ(DecodeOrDie(v1), expected);
  EXPECT_EQ(EncodeOrDie(expected, kPackedContextsVersion1), v1);
  // The same records in version 2 decode to the same meaning.
  EXPECT_EQ(Sum(DecodeOrDie(EncodeOrDie(expected, kPackedContextsVersion2))), Sum(expected));
}

TEST(PackedContextsTest, HandBuiltVersion2BufferDecodes) {
  // Target 1: singles leaf 2 id 5, leaf 2 id 7 (stored 7 - 5 - 1 = 1, count 4); multis
  // leaf 3 {4, 0, 1, 1} count 1, leaf 3 {4, 0, 1, 1, 0} (extends it; width 0), leaf 3 {4, 1}
  // (prefix 1; first id stored 1 - 0 - 1 = 0; same width), leaf 6 {4, 1, 2} (prefix 2)
  // count 3, leaf 7 {9, 0 x 20, 3} (no prefix; three runs at width 4).
  std::vector<uint64_t> deep(20, 0);
  deep.insert(deep.begin(), 9);
  deep.push_back(3);
  const std::string bits = Multi(3, 0, {4, 0, 1, 1}, 3) + Multi(0, 4, {0}, 0) +
                           Multi(0, 1, {0}, 0, false) + Multi(3, 2, {2}, 2, true, 3) +
                           Multi(1, 0, deep, 4, true, 1, /*runs=*/true);
  const std::string v2 =
      Bytes({2, 1, 1, 2, 5, (2 << 1) | 1, 5, 0, 1, 2}) + BitStream(bits);
  const std::vector<ContextRecord> expected = {
      R(1, 2, {5}, 1), R(1, 2, {7}, 4), R(1, 3, {4, 0, 1, 1}, 1), R(1, 3, {4, 0, 1, 1, 0}, 1),
      R(1, 3, {4, 1}, 1), R(1, 6, {4, 1, 2}, 3), R(1, 7, deep, 1)};
  EXPECT_EQ(DecodeOrDie(v2), expected);
  EXPECT_EQ(EncodeOrDie(expected, kPackedContextsVersion2), v2);
}

std::string Error(const std::string& bytes) {
  auto r = DecodePackedContexts(bytes);
  EXPECT_FALSE(r.ok()) << "accepted " << ::testing::PrintToString(bytes);
  if (!r.ok()) {
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  }
  return r.ok() ? std::string() : std::string(r.status().message());
}

TEST(PackedContextsTest, DecodeRejectsMalformedVersion1Input) {
  // One valid buffer to start from: version 1, one group (target 1, 1 context), leaf 2,
  // single id 5, count 1.
  const std::string valid = Bytes({1, 1, 1, 1, (2 << 2) | 1, 5});
  ASSERT_TRUE(DecodePackedContexts(valid).ok());
  EXPECT_THAT(Error(""), HasSubstr("empty"));
  EXPECT_THAT(Error(Bytes({4, 0})), HasSubstr("version"));
  EXPECT_THAT(Error(Bytes({0, 0})), HasSubstr("version"));
  EXPECT_THAT(Error(Bytes({1})), HasSubstr("truncated"));
  for (size_t cut = 1; cut < valid.size(); ++cut) Error(valid.substr(0, cut));
  EXPECT_THAT(Error(valid + Bytes({0})), HasSubstr("trailing"));
  // Eleven-byte varint and a tenth byte with more than the top bit.
  Error(Bytes({1, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00}));
  Error(Bytes({1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02}));
  // Group count far beyond the buffer.
  EXPECT_THAT(Error(Bytes({1, 0xff, 0xff, 0x03, 1, 1, 9, 5})), HasSubstr("group count"));
  // Context count beyond the buffer, and zero.
  EXPECT_THAT(Error(Bytes({1, 1, 1, 0x7f, 9, 5})), HasSubstr("context count"));
  EXPECT_THAT(Error(Bytes({1, 1, 1, 0, 9, 5})), HasSubstr("context count"));
  // Target ID beyond 32 bits; targets not increasing.
  EXPECT_THAT(Error(Bytes({1, 1, 0x80, 0x80, 0x80, 0x80, 0x10, 1, 9, 5})), HasSubstr("32 bits"));
  EXPECT_THAT(Error(Bytes({1, 2, 3, 1, 9, 5, 3, 1, 9, 5})), HasSubstr("order"));
  // Leaf sum beyond 32 bits: leaf 2^32 - 1, then delta 1.
  EXPECT_THAT(Error(Bytes({1, 1, 1, 2, 0xfd, 0xff, 0xff, 0xff, 0x3f, 0, 1 << 2 | 1, 0})),
              HasSubstr("leaf"));
  // Single id overflow: id 2^64 - 1, then delta 1 on the same leaf.
  EXPECT_THAT(Error(Bytes({1, 1, 1, 2, 9, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                           0x01, 1, 1})),
              HasSubstr("overflows"));
  // Count overflow: count - 2 = 2^64 - 1.
  EXPECT_THAT(Error(Bytes({1, 1, 1, 1, 8, 5, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                           0x01})),
              HasSubstr("count overflows"));
  // Multi-id context whose id count is beyond the buffer or the limit.
  EXPECT_THAT(Error(Bytes({1, 1, 1, 1, (2 << 2) | 2 | 1, 100, 1, 2})), HasSubstr("id count"));
  EXPECT_THAT(Error(Bytes({1, 1, 1, 1, (2 << 2) | 2 | 1, 0xff, 0xff, 0x03, 1, 2})),
              HasSubstr("id count"));
}

TEST(PackedContextsTest, DecodeRejectsMalformedVersion2Input) {
  // Version 2, one group: target 1, one single (leaf 2, id 5, count 1), one multi (leaf 3,
  // ids {4, 1}).
  const std::string head = Bytes({2, 1, 1, 1, 1, (2 << 1) | 1, 5});
  auto buffer = [&](const std::string& bits) { return head + BitStream(bits); };
  const std::string valid = buffer(Multi(3, 0, {2, 1}, 2));
  ASSERT_EQ(DecodeOrDie(valid), (std::vector<ContextRecord>{R(1, 2, {5}, 1), R(1, 3, {2, 1}, 1)}));
  ASSERT_EQ(EncodeOrDie(DecodeOrDie(valid), kPackedContextsVersion2), valid);
  for (size_t cut = 1; cut < valid.size(); ++cut) Error(valid.substr(0, cut));
  EXPECT_THAT(Error(valid + Bytes({0})), HasSubstr("trailing"));
  // Padding bits must be zero: the multi-id context takes 21 bits.
  ASSERT_EQ(valid.size(), head.size() + 3);
  std::string padded = valid;
  padded.back() = static_cast<char>(padded.back() | 0x80);
  EXPECT_THAT(Error(padded), HasSubstr("padding"));
  // Counts: both zero, singles beyond the buffer, multis beyond the buffer.
  EXPECT_THAT(Error(Bytes({2, 1, 1, 0, 0, 0, 0, 0})), HasSubstr("context count"));
  EXPECT_THAT(Error(Bytes({2, 1, 1, 9, 0, 4, 1, 4, 1})), HasSubstr("context count"));
  EXPECT_THAT(Error(Bytes({2, 1, 1, 0, 20}) + BitStream(Multi(3, 0, {4, 1}, 3))),
              HasSubstr("context count"));
  // Single ids of a leaf strictly ascend: 2^64 - 1, then one more overflows.
  EXPECT_THAT(Error(Bytes({2, 1, 1, 2, 0, (2 << 1) | 1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                           0xff, 0xff, 0x01, 1, 0})),
              HasSubstr("overflows"));
  // Leaf beyond 32 bits (single and multi).
  EXPECT_THAT(Error(Bytes({2, 1, 1, 1, 0, 0xff, 0xff, 0xff, 0xff, 0x7f, 5})), HasSubstr("leaf"));
  EXPECT_THAT(Error(buffer(Multi(uint64_t{1} << 32, 0, {4, 1}, 3))), HasSubstr("leaf"));
  // A shared prefix longer than the previous stack (the first one has none).
  EXPECT_THAT(Error(buffer(Multi(3, 1, {4, 1}, 3))), HasSubstr("prefix"));
  // Fewer than two ids, and more than kMaxPackedIds.
  EXPECT_THAT(Error(buffer(Multi(3, 0, {4}, 3))), HasSubstr("fewer than 2"));
  EXPECT_THAT(Error(buffer(Multi(3, 0, std::vector<uint64_t>(kMaxPackedIds + 1, 0), 0))),
              HasSubstr("limit"));
  // Same leaf as the previous multi-id context but not after it (a duplicate, a prefix).
  const std::string two_multis = Bytes({2, 1, 1, 0, 2});
  EXPECT_THAT(Error(two_multis + BitStream(Multi(3, 0, {4, 1}, 3) + Multi(0, 2, {}, 0))),
              HasSubstr("out of order"));
  EXPECT_THAT(Error(two_multis + BitStream(Multi(3, 0, {4, 1}, 3) + Multi(0, 1, {}, 0))),
              HasSubstr("fewer than 2"));
  // The first differing id of a same-leaf context overflows: previous id 2^64 - 1.
  EXPECT_THAT(Error(two_multis + BitStream(Multi(3, 0, {4, kMaxU64}, 64) +
                                           Multi(0, 1, {0, 0}, 64, false))),
              HasSubstr("overflows"));
  // Width beyond 64 bits; ids beyond the buffer (packed and as runs); runs beyond the stack.
  const std::string stack_of_10 = G(0, 3) + "1" + G(2, 0) + G(2, 10);
  EXPECT_THAT(Error(buffer(stack_of_10 + "00" + G(0, 65))), HasSubstr("width"));
  EXPECT_THAT(Error(buffer(stack_of_10 + "00" + G(0, 3))), HasSubstr("truncated ids"));
  EXPECT_THAT(Error(buffer(stack_of_10 + "01" + G(0, 3) + "111" + G(0, 3))),
              HasSubstr("truncated ids"));
  EXPECT_THAT(Error(buffer(stack_of_10 + "01" + G(0, 3) + "111" + G(0, 6) + "000" + G(0, 3))),
              HasSubstr("run beyond"));
  EXPECT_TRUE(
      DecodePackedContexts(buffer(stack_of_10 + "01" + G(0, 3) + "111" + G(0, 6) + "000" +
                                  G(0, 2)))
          .ok());
  // Exp-Golomb codes of more than 64 bits, and a count that overflows.
  EXPECT_THAT(Error(buffer(std::string(64, '0') + "1" + std::string(64, '0'))),
              HasSubstr("truncated leaf"));
  EXPECT_THAT(Error(buffer("1 0" + G(0, kMaxU64 - 1) + G(2, 0) + G(2, 2) + "1")),
              HasSubstr("count overflows"));
}

TEST(PackedContextsTest, Version3IsSmallerThanVersion2OnSingleIdContexts) {
  // The steady state of a large program: mostly single-id contexts of ids spread over many
  // magnitudes, leaves a few apart, counts mostly 1.
  std::mt19937_64 rng(11);
  std::vector<ContextRecord> in;
  for (int i = 0; i < 2000; ++i) {
    std::vector<uint64_t> ids{rng() >> (30 + rng() % 34)};
    if (i % 10 == 0) ids.push_back(rng() % 4);
    in.push_back(R(1, static_cast<NodeId>(rng() % 6000), ids, rng() % 2 == 0 ? 1 : 1 + rng() % 9));
  }
  const std::string v3 = EncodeOrDie(in, kPackedContextsVersion3);
  const std::string v2 = EncodeOrDie(in, kPackedContextsVersion2);
  EXPECT_EQ(Sum(DecodeOrDie(v3)), Sum(in));
  EXPECT_LT(v3.size() * 5, v2.size() * 4);
  // The cost breakdown covers the whole buffer.
  PackedContextsCost cost;
  ASSERT_TRUE(EncodePackedContexts(in, kPackedContextsVersion3, &cost).ok());
  const double total = cost.framing + cost.leaves + cost.stack_shapes + cost.single_ids +
                       cost.innermost_ids + cost.inner_ids + cost.counts;
  EXPECT_NEAR(total, 8.0 * static_cast<double>(v3.size()), 1e-6);
  EXPECT_GT(cost.single_ids, cost.leaves);
  EXPECT_GE(cost.framing, 8.0);  // version byte
  RecordProperty("v2_bytes", std::to_string(v2.size()));
  RecordProperty("v3_bytes", std::to_string(v3.size()));
}

TEST(PackedContextsTest, DecodeRejectsMalformedVersion3Input) {
  const std::vector<ContextRecord> in = {R(1, 2, {5}, 1), R(1, 2, {9}, 3), R(1, 4, {1, 0, 0, 7}, 1),
                                         R(2, 3, {1ull << 40}, 2)};
  const std::string valid = EncodeOrDie(in, kPackedContextsVersion3);
  ASSERT_EQ(Sum(DecodeOrDie(valid)), Sum(in));
  ASSERT_NE(valid.back(), '\0');
  for (size_t cut = 1; cut < valid.size(); ++cut) {
    EXPECT_FALSE(DecodePackedContexts(valid.substr(0, cut)).ok()) << cut;
  }
  EXPECT_THAT(Error(valid + Bytes({0})), HasSubstr("zero last byte"));
  EXPECT_FALSE(DecodePackedContexts(valid + Bytes({0x42})).ok());
  for (size_t at = 1; at < valid.size(); ++at) {
    std::string flipped = valid;
    flipped[at] = static_cast<char>(flipped[at] ^ 0x10);
    EXPECT_FALSE(DecodePackedContexts(flipped).ok()) << at;
  }
  EXPECT_THAT(Error(Bytes({3, 0xff, 0xff, 0xff, 0xff})), HasSubstr("range coder"));
}

TEST(PackedContextsTest, Version3ContextsPerByteAreBounded) {
  // 20,000 contexts that version 3 would code in a few hundredths of a bit each: leaves one
  // apart, the same id, counts of 1. The encoder writes version 2 instead.
  std::vector<ContextRecord> in;
  for (NodeId leaf = 0; leaf < 20000; ++leaf) in.push_back(R(1, leaf, {0}, 1));
  const std::string bytes = EncodeOrDie(in, kPackedContextsVersion3);
  EXPECT_EQ(bytes[0], kPackedContextsVersion2);
  EXPECT_EQ(Sum(DecodeOrDie(bytes)), Sum(in));
  // Fifty of them are within the bound.
  in.resize(50);
  const std::string small = EncodeOrDie(in, kPackedContextsVersion3);
  EXPECT_EQ(small[0], kPackedContextsVersion3);
  EXPECT_LE(in.size(), 16 * small.size());
  EXPECT_EQ(Sum(DecodeOrDie(small)), Sum(in));
}

TEST(PackedContextsTest, IdsPerBufferAreCapped) {
  // Each context: a 4096-deep stack of zeros that differs from the previous one in its last
  // id, about 4 bytes each. 1024 of them reach kMaxPackedIdsPerBuffer exactly.
  auto buffer = [](uint64_t contexts) {
    // Width 0, bit-packed: the initial state, so "same width".
    std::string bits = Multi(1, 0, std::vector<uint64_t>(kMaxPackedIds, 0), 0, false);
    for (uint64_t i = 1; i < contexts; ++i) bits += Multi(0, kMaxPackedIds - 1, {0}, 0, false);
    std::string out = Bytes({2, 1, 1, 0});
    AppendVarint(&out, contexts);
    return out + BitStream(bits);
  };
  static_assert(kMaxPackedIdsPerBuffer == 1024 * kMaxPackedIds);
  const std::string at_cap = buffer(1024);
  EXPECT_LT(at_cap.size(), 5000u);
  auto ok = DecodePackedContexts(at_cap);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->size(), 1024u);
  EXPECT_EQ(ok->back().context.ids.back(), 1023u);
  EXPECT_THAT(Error(buffer(1025)), HasSubstr("more ids"));
  // The encoder refuses what the decoder would refuse.
  std::vector<ContextRecord> in;
  for (uint64_t i = 0; i < 1025; ++i) {
    std::vector<uint64_t> ids(kMaxPackedIds, 0);
    ids.back() = i;
    in.push_back(R(1, 1, std::move(ids), 1));
  }
  EXPECT_THAT(std::string(EncodePackedContexts(in).status().message()), HasSubstr("max"));
  in.pop_back();
  EXPECT_TRUE(EncodeOrDie(in, kPackedContextsVersion2) == at_cap);
  // Version 3 holds them in a few bytes per context too.
  const std::string v3 = EncodeOrDie(in, kPackedContextsVersion3);
  EXPECT_LT(v3.size(), 5000u);
  EXPECT_EQ(DecodeOrDie(v3).size(), 1024u);
}

// Corrupts valid buffers of `version` `trials` times: every outcome is InvalidArgument or a
// well-formed, bounded record list that re-encodes.
void CorruptionSweep(const std::vector<ContextRecord>& in, uint8_t version, uint64_t seed,
                     int trials = strata::testing::Trials(20000)) {
  std::mt19937_64 rng(seed);
  const std::string valid = EncodeOrDie(in, version);
  ASSERT_FALSE(valid.empty());
  size_t accepted = 0, rejected = 0;
  for (int trial = 0; trial < trials; ++trial) {
    std::string bytes = valid;
    switch (trial % 6) {
      case 0:  // flip random bytes
        for (int k = 0; k < 1 + static_cast<int>(rng() % 4); ++k) {
          bytes[rng() % bytes.size()] = static_cast<char>(rng());
        }
        break;
      case 1:  // truncate
        bytes.resize(rng() % bytes.size());
        break;
      case 2:  // insert random bytes
        bytes.insert(rng() % (bytes.size() + 1),
                     std::string(1 + rng() % 3, static_cast<char>(rng())));
        break;
      case 3: {  // random buffer with a valid version byte
        bytes.assign(rng() % 64, '\0');
        for (char& c : bytes) c = static_cast<char>(rng());
        if (!bytes.empty()) bytes[0] = static_cast<char>(version);
        break;
      }
      case 4:  // all 0xff (maximal varints), or all zero bits (longest Exp-Golomb prefixes)
        bytes.assign(1 + rng() % 40, rng() % 2 == 0 ? '\xff' : '\0');
        bytes[0] = static_cast<char>(version);
        break;
      case 5:  // flip single bits
        for (int k = 0; k < 1 + static_cast<int>(rng() % 3); ++k) {
          bytes[rng() % bytes.size()] ^= static_cast<char>(1 << (rng() % 8));
        }
        break;
    }
    auto out = DecodePackedContexts(bytes);
    if (!out.ok()) {
      ++rejected;
      EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
      continue;
    }
    ++accepted;
    // Whatever decodes is well formed and bounded (version 3: a well-predicted context takes
    // a fraction of a byte, so only the id limit bounds the records).
    EXPECT_LE(out->size(), version == kPackedContextsVersion3 ? kMaxPackedIdsPerBuffer
                                                              : bytes.size());
    size_t ids = 0;
    for (const auto& r : *out) {
      EXPECT_FALSE(r.context.ids.empty());
      EXPECT_LE(r.context.ids.size(), kMaxPackedIds);
      EXPECT_GT(r.count, 0u);
      ids += r.context.ids.size();
    }
    EXPECT_LE(ids, std::max(bytes.size(), kMaxPackedIdsPerBuffer));
    auto again = EncodePackedContexts(*out, version);
    ASSERT_TRUE(again.ok()) << again.status();
    auto back = DecodePackedContexts(*again);
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(Sum(*back), Sum(*out));
  }
  EXPECT_GT(rejected, 0u);
  EXPECT_GT(accepted, 0u);
  ::testing::Test::RecordProperty("accepted", std::to_string(accepted));
}

std::vector<ContextRecord> MixedRecords(uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<ContextRecord> in;
  for (int i = 0; i < 300; ++i) {
    std::vector<uint64_t> ids{rng() % 1000};
    if (i % 7 == 0) ids.push_back(rng());
    in.push_back(R(static_cast<uint32_t>(i % 3), static_cast<NodeId>(2 + rng() % 100), ids,
                   1 + rng() % 4));
  }
  return in;
}

// Decoding into a vector that holds another batch's records (more of them, longer ID stacks,
// or fewer) gives exactly what a fresh decode gives, in both layouts, and after a rejected
// buffer too.
TEST(PackedContextsTest, DecodingIntoAUsedVectorGivesTheSameRecords) {
  for (uint8_t version :
       {kPackedContextsVersion1, kPackedContextsVersion2, kPackedContextsVersion3}) {
    std::vector<ContextRecord> reused;
    for (uint64_t seed : {3u, 4u, 5u}) {
      std::vector<ContextRecord> in = MixedRecords(seed);
      in.resize(100 * seed - 200);  // 100, 200, then 300 records
      const std::string bytes = EncodeOrDie(in, version);
      ASSERT_TRUE(DecodePackedContexts(bytes, &reused).ok());
      EXPECT_EQ(reused, DecodeOrDie(bytes)) << "version " << int{version} << " seed " << seed;
    }
    EXPECT_FALSE(DecodePackedContexts(std::string(1, '\x07'), &reused).ok());
    const std::string small = EncodeOrDie({R(1, 2, {5}, 1), R(1, 3, {4, 0}, 2)}, version);
    ASSERT_TRUE(DecodePackedContexts(small, &reused).ok());
    EXPECT_EQ(reused, DecodeOrDie(small));
  }
}

TEST(PackedContextsTest, RandomlyCorruptedVersion1InputNeverCrashes) {
  CorruptionSweep(MixedRecords(7), kPackedContextsVersion1, 7);
}

TEST(PackedContextsTest, RandomlyCorruptedVersion2InputNeverCrashes) {
  CorruptionSweep(MixedRecords(7), kPackedContextsVersion2, 7);
}

TEST(PackedContextsTest, RandomlyCorruptedDeepRecursionNeverCrashes) {
  // Mostly multi-id contexts: binary recursion, runs, wide ids, several leaves and targets.
  std::mt19937_64 rng(99);
  std::vector<ContextRecord> in = MixedRecords(5);
  for (int i = 0; i < 200; ++i) {
    std::vector<uint64_t> ids = BinaryRecursion(rng, rng() % 5, 1 + rng() % 25);
    if (i % 10 == 0) ids.insert(ids.end(), 50 + rng() % 100, rng() % 3);
    if (i % 13 == 0) ids.push_back(rng());
    in.push_back(R(static_cast<uint32_t>(i % 4), static_cast<NodeId>(10 + rng() % 3), ids,
                   i % 5 == 0 ? 1 + rng() % 1000 : 1));
  }
  CorruptionSweep(in, kPackedContextsVersion2, 123);
  CorruptionSweep(in, kPackedContextsVersion3, 124);
}

TEST(PackedContextsTest, RandomlyCorruptedVersion3InputNeverCrashes) {
  // Every trial, under a sanitizer too: the range coder accepts so few corrupted buffers that
  // a tenth of the sweep meets none.
  CorruptionSweep(MixedRecords(7), kPackedContextsVersion3, 8, 20000);
}

}  // namespace
}  // namespace strata::encoding
