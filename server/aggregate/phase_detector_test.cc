#include "server/aggregate/phase_detector.h"

#include "common/testing/temp_dir.h"
#include "gtest/gtest.h"

namespace strata::server {
namespace {

class PhaseDetectorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s = store::Store::Open(dir_.path(), {});
    ASSERT_TRUE(s.ok()) << s.status();
    store_ = std::move(*s);
    store::WriteBatch wb;
    auto fn = [&](const char* name) { return *store_->InternFunction({name, "/bin/x", "", 0}, &wb); };
    const uint64_t main = fn("main"), a = fn("parse"), b = fn("deflate"), c = fn("stats");
    stack_a_ = *store_->InternStack({{main, a}, false}, &wb);
    stack_b_ = *store_->InternStack({{main, b}, false}, &wb);
    stack_c_ = *store_->InternStack({{main, c}, false}, &wb);
    ASSERT_TRUE(store_->Commit(&wb).ok());
  }

  // One batch of `n` samples split a:b:c by the given weights.
  void Feed(PhaseDetector& detector, int64_t window, uint64_t a, uint64_t b, uint64_t c) {
    v1::SampleBatch proto;
    proto.set_start_ms(window);
    AppliedBatch batch{&agent_, &proto, window, false, {}};
    batch.contexts = {{&service_, stack_a_, a}, {&service_, stack_b_, b}, {&service_, stack_c_, c}};
    detector.OnBatch(batch);
  }

  std::vector<v1::PhaseChange> Events() {
    std::vector<v1::PhaseChange> out;
    auto scanned = store_->ScanPhaseEvents("svc", 0, INT64_MAX);
    EXPECT_TRUE(scanned.ok()) << scanned.status();
    for (const auto& e : *scanned) {
      v1::PhaseChange change;
      EXPECT_TRUE(change.ParseFromString(e.payload));
      out.push_back(change);
    }
    return out;
  }

  strata::testing::TempDir dir_;
  std::unique_ptr<store::Store> store_;
  AgentIdentity agent_{"a", "h", "x86_64", "t", 1};
  std::string service_ = "svc";
  uint64_t stack_a_ = 0, stack_b_ = 0, stack_c_ = 0;
};

TEST_F(PhaseDetectorTest, HotPathSwitchIsRecordedWithBothPaths) {
  PhaseDetector detector(store_.get(), {.period = 1000});
  for (int i = 0; i < 10; ++i) Feed(detector, i * 10'000, 180, 10, 10);       // parse hot
  for (int i = 10; i < 20; ++i) Feed(detector, i * 10'000, 10, 180, 10);      // deflate hot
  auto events = Events();
  ASSERT_FALSE(events.empty());
  const auto& e = events.front();
  EXPECT_EQ(e.service(), "svc");
  EXPECT_GE(e.window_start_ms(), 100'000);  // after the switch, not before
  ASSERT_GE(e.rose_size(), 1);
  ASSERT_GE(e.fell_size(), 1);
  EXPECT_EQ(e.rose(0).path().frames(1).function(), "deflate");
  EXPECT_EQ(e.fell(0).path().frames(1).function(), "parse");
  EXPECT_GE(e.fell(0).count_before(), 10 * e.rose(0).count_before());
}

TEST_F(PhaseDetectorTest, SwitchInsideAPeriodIsRecorded) {
  // 7 batches of 200 before the switch: the period of samples 1000-2000 straddles it, so the
  // new hot path overtakes the old one there by less than 10x.
  PhaseDetector detector(store_.get(), {.period = 1000});
  for (int i = 0; i < 7; ++i) Feed(detector, i * 10'000, 120, 60, 20);
  for (int i = 7; i < 20; ++i) Feed(detector, i * 10'000, 5, 185, 10);
  auto events = Events();
  ASSERT_FALSE(events.empty());
  ASSERT_GE(events.front().rose_size(), 1);
  EXPECT_EQ(events.front().rose(0).path().frames(1).function(), "deflate");
  EXPECT_EQ(events.front().fell(0).path().frames(1).function(), "parse");
  EXPECT_LE(events.size(), 2u);  // one switch, not an event per period
}

TEST_F(PhaseDetectorTest, BatchArrivalOrderIsNotAPhaseChange) {
  // Two equally hot contexts (one path on two threads) arrive as whole-interval lumps; a
  // period cut inside a batch would see one at 150 and the other at 0.
  PhaseDetector detector(store_.get(), {.period = 250});
  for (int i = 0; i < 30; ++i) Feed(detector, i * 10'000, 150, 150, 20);
  EXPECT_TRUE(Events().empty());
}

TEST_F(PhaseDetectorTest, SteadyOrMildChangesRecordNothing) {
  PhaseDetector detector(store_.get(), {.period = 1000});
  for (int i = 0; i < 10; ++i) Feed(detector, i * 10'000, 120, 60, 20);
  for (int i = 10; i < 20; ++i) Feed(detector, i * 10'000, 60, 120, 20);  // only 2x
  EXPECT_TRUE(Events().empty());
  EXPECT_EQ(detector.events(), 0u);
}

}  // namespace
}  // namespace strata::server
