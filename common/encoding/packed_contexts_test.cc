#include "common/encoding/packed_contexts.h"

#include <algorithm>
#include <limits>
#include <map>
#include <random>
#include <tuple>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace strata::encoding {
namespace {

using ::testing::HasSubstr;

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

TEST(PackedContextsTest, EmptyBatch) {
  auto bytes = EncodePackedContexts({});
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(bytes->size(), 2u);
  auto back = DecodePackedContexts(*bytes);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->empty());
}

TEST(PackedContextsTest, RoundTripsSortedAndMerged) {
  std::vector<ContextRecord> in = {
      R(2, 9, {5}, 1),          R(1, 7, {3}, 4),   R(1, 7, {1}, 1),
      R(1, 7, {0, 2, 9}, 2),    R(1, 3, {0}, 1),   R(1, 7, {3}, 6),  // merges with (1, 7, {3})
      R(2, 9, {1ull << 63}, std::numeric_limits<uint64_t>::max() - 1),
      R(7, 0xffffffff, {std::numeric_limits<uint64_t>::max(), 0}, 3),
  };
  auto bytes = EncodePackedContexts(in);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  auto out = DecodePackedContexts(*bytes);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->size(), in.size() - 1);
  EXPECT_EQ(Sum(*out), Sum(in));
  // Canonical order: by target, leaf, single before multi, ids.
  EXPECT_EQ((*out)[0], R(1, 3, {0}, 1));
  EXPECT_EQ((*out)[1], R(1, 7, {1}, 1));
  EXPECT_EQ((*out)[2], R(1, 7, {3}, 10));
  EXPECT_EQ((*out)[3], R(1, 7, {0, 2, 9}, 2));
  EXPECT_EQ((*out)[4], R(2, 9, {5}, 1));
  // Re-encoding the decoded records gives the same bytes.
  auto again = EncodePackedContexts(*out);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *bytes);
}

TEST(PackedContextsTest, SteadyStateContextsTakeAboutThreeBytes) {
  // 1000 leaves, two single-id contexts each with small ids, counts 1 and 5.
  std::vector<ContextRecord> in;
  for (NodeId leaf = 2; leaf < 1002; ++leaf) {
    in.push_back(R(1, leaf, {leaf % 50}, 1));
    in.push_back(R(1, leaf, {leaf % 50 + 40}, 5));
  }
  auto bytes = EncodePackedContexts(in);
  ASSERT_TRUE(bytes.ok());
  // head + id per context, plus a count byte for half of them.
  EXPECT_LE(bytes->size(), in.size() * 5 / 2 + 8);
  auto out = DecodePackedContexts(*bytes);
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(Sum(*out), Sum(in));
}

TEST(PackedContextsTest, EncodeRejectsInvalidRecords) {
  EXPECT_THAT(std::string(EncodePackedContexts({R(1, 2, {}, 1)}).status().message()),
              HasSubstr("no ids"));
  EXPECT_THAT(std::string(EncodePackedContexts({R(1, 2, {1}, 0)}).status().message()),
              HasSubstr("zero count"));
  EXPECT_FALSE(EncodePackedContexts({R(1, 2, std::vector<uint64_t>(kMaxPackedIds + 1, 1), 1)}).ok());
  EXPECT_FALSE(EncodePackedContexts({R(1, 2, {1}, std::numeric_limits<uint64_t>::max()),
                                     R(1, 2, {1}, 1)})
                   .ok());
}

TEST(PackedContextsTest, RandomRecordsRoundTrip) {
  std::mt19937_64 rng(42);
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<ContextRecord> in;
    const int n = static_cast<int>(rng() % 200);
    for (int i = 0; i < n; ++i) {
      ContextRecord r;
      r.target_id = static_cast<uint32_t>(rng() % 4 == 0 ? rng() : rng() % 3);
      r.context.leaf = static_cast<NodeId>(rng() % 8 == 0 ? rng() : rng() % 40);
      const size_t ids = rng() % 5 == 0 ? 2 + rng() % 6 : 1;
      for (size_t k = 0; k < ids; ++k) {
        r.context.ids.push_back(rng() % 3 == 0 ? rng() >> (rng() % 64) : rng() % 100);
      }
      r.count = rng() % 3 == 0 ? 1 : 1 + (rng() >> (rng() % 64 + 8));
      in.push_back(r);
    }
    auto bytes = EncodePackedContexts(in);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    auto out = DecodePackedContexts(*bytes);
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ(Sum(*out), Sum(in));
  }
}

std::string Bytes(std::initializer_list<int> b) {
  std::string s;
  for (int x : b) s.push_back(static_cast<char>(x));
  return s;
}

TEST(PackedContextsTest, DecodeRejectsMalformedInput) {
  auto error = [](const std::string& bytes) {
    auto r = DecodePackedContexts(bytes);
    EXPECT_FALSE(r.ok()) << "accepted " << testing::PrintToString(bytes);
    if (!r.ok()) {
      EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    }
    return r.ok() ? std::string() : std::string(r.status().message());
  };
  // One valid buffer to start from: version 1, one group (target 1, 1 context), leaf 2,
  // single id 5, count 1.
  const std::string valid = Bytes({1, 1, 1, 1, (2 << 2) | 1, 5});
  ASSERT_TRUE(DecodePackedContexts(valid).ok());
  EXPECT_THAT(error(""), HasSubstr("empty"));
  EXPECT_THAT(error(Bytes({2, 0})), HasSubstr("version"));
  EXPECT_THAT(error(Bytes({1})), HasSubstr("truncated"));
  for (size_t cut = 1; cut < valid.size(); ++cut) error(valid.substr(0, cut));
  EXPECT_THAT(error(valid + Bytes({0})), HasSubstr("trailing"));
  // Eleven-byte varint and a tenth byte with more than the top bit.
  EXPECT_FALSE(DecodePackedContexts(Bytes({1, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80,
                                           0x80, 0x80, 0x00}))
                   .ok());
  EXPECT_FALSE(
      DecodePackedContexts(Bytes({1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02}))
          .ok());
  // Group count far beyond the buffer.
  EXPECT_THAT(error(Bytes({1, 0xff, 0xff, 0x03, 1, 1, 9, 5})), HasSubstr("group count"));
  // Context count beyond the buffer, and zero.
  EXPECT_THAT(error(Bytes({1, 1, 1, 0x7f, 9, 5})), HasSubstr("context count"));
  EXPECT_THAT(error(Bytes({1, 1, 1, 0, 9, 5})), HasSubstr("context count"));
  // Target ID beyond 32 bits; targets not increasing.
  EXPECT_THAT(error(Bytes({1, 1, 0x80, 0x80, 0x80, 0x80, 0x10, 1, 9, 5})), HasSubstr("32 bits"));
  EXPECT_THAT(error(Bytes({1, 2, 3, 1, 9, 5, 3, 1, 9, 5})), HasSubstr("order"));
  // Leaf sum beyond 32 bits: leaf 2^32 - 1, then delta 1.
  EXPECT_THAT(error(Bytes({1, 1, 1, 2, 0xfd, 0xff, 0xff, 0xff, 0x3f, 0, 1 << 2 | 1, 0})),
              HasSubstr("leaf"));
  // Single id overflow: id 2^64 - 1, then delta 1 on the same leaf.
  EXPECT_THAT(error(Bytes({1, 1, 1, 2, 9, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                           0x01, 1, 1})),
              HasSubstr("overflows"));
  // Count overflow: count - 2 = 2^64 - 1.
  EXPECT_THAT(error(Bytes({1, 1, 1, 1, 8, 5, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                           0x01})),
              HasSubstr("count overflows"));
  // Multi-id context whose id count is beyond the buffer or the limit.
  EXPECT_THAT(error(Bytes({1, 1, 1, 1, (2 << 2) | 2 | 1, 100, 1, 2})), HasSubstr("id count"));
  EXPECT_THAT(error(Bytes({1, 1, 1, 1, (2 << 2) | 2 | 1, 0xff, 0xff, 0x03, 1, 2})),
              HasSubstr("id count"));
}

TEST(PackedContextsTest, RandomlyCorruptedInputNeverCrashes) {
  std::mt19937_64 rng(7);
  std::vector<ContextRecord> in;
  for (int i = 0; i < 300; ++i) {
    std::vector<uint64_t> ids{rng() % 1000};
    if (i % 7 == 0) ids.push_back(rng());
    in.push_back(R(static_cast<uint32_t>(i % 3), static_cast<NodeId>(2 + rng() % 100), ids,
                   1 + rng() % 4));
  }
  auto valid = EncodePackedContexts(in);
  ASSERT_TRUE(valid.ok());
  size_t accepted = 0, rejected = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    std::string bytes = *valid;
    switch (trial % 5) {
      case 0:  // flip random bytes
        for (int k = 0; k < 1 + static_cast<int>(rng() % 4); ++k) {
          bytes[rng() % bytes.size()] = static_cast<char>(rng());
        }
        break;
      case 1:  // truncate
        bytes.resize(rng() % bytes.size());
        break;
      case 2:  // insert random bytes
        bytes.insert(rng() % (bytes.size() + 1), std::string(1 + rng() % 3, static_cast<char>(rng())));
        break;
      case 3: {  // random buffer with a valid version byte
        bytes.assign(rng() % 64, '\0');
        for (char& c : bytes) c = static_cast<char>(rng());
        if (!bytes.empty()) bytes[0] = 1;
        break;
      }
      case 4:  // all 0xff (maximal varints)
        bytes.assign(1 + rng() % 40, '\xff');
        bytes[0] = 1;
        break;
    }
    auto out = DecodePackedContexts(bytes);
    if (!out.ok()) {
      ++rejected;
      EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
      continue;
    }
    ++accepted;
    // Whatever decodes is well formed and bounded by the input size.
    EXPECT_LE(out->size(), bytes.size());
    for (const auto& r : *out) {
      EXPECT_FALSE(r.context.ids.empty());
      EXPECT_GT(r.count, 0u);
    }
    auto again = EncodePackedContexts(*out);
    ASSERT_TRUE(again.ok()) << again.status();
    auto back = DecodePackedContexts(*again);
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(Sum(*back), Sum(*out));
  }
  EXPECT_GT(rejected, 0u);
  RecordProperty("accepted", std::to_string(accepted));
}

}  // namespace
}  // namespace strata::encoding
