#include "common/rpc/reconnector.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace strata::rpc {
namespace {

using State = Reconnector::State;

class ReconnectorTest : public ::testing::Test {
 protected:
  Reconnector Make(std::vector<std::string> servers = {"n1", "n2", "n3"}, size_t first = 0) {
    ReconnectorOptions options;
    options.servers = std::move(servers);
    options.first = first;
    options.min_backoff = absl::Milliseconds(500);
    options.max_backoff = absl::Seconds(4);
    options.jitter = [this] { return jitter_; };
    return Reconnector(std::move(options));
  }

  // One stream that fails before its Welcome: the wait it leaves.
  static absl::Duration Fail(Reconnector& r) {
    r.Connect();
    return r.Closed();
  }

  double jitter_ = 0.0;  // waits are half the backoff
};

TEST_F(ReconnectorTest, DialsTheListRoundRobinFromTheFirstGiven) {
  Reconnector r = Make({"n1", "n2", "n3"}, /*first=*/4);
  std::vector<std::string> dialed;
  for (int i = 0; i < 4; ++i) {
    dialed.push_back(r.Connect());
    r.Closed();
  }
  EXPECT_EQ(dialed, (std::vector<std::string>{"n2", "n3", "n1", "n2"}));
}

TEST_F(ReconnectorTest, StatesFollowTheStream) {
  Reconnector r = Make();
  EXPECT_EQ(r.state(), State::kIdle);
  r.Connect();
  EXPECT_EQ(r.state(), State::kConnecting);
  r.Welcomed();
  EXPECT_EQ(r.state(), State::kConnected);
  r.Closed();
  EXPECT_EQ(r.state(), State::kBackingOff);
  r.Connect();
  EXPECT_EQ(r.state(), State::kConnecting);
}

TEST_F(ReconnectorTest, BackoffDoublesAfterEachWaitUpToTheCap) {
  Reconnector r = Make();
  std::vector<absl::Duration> waits;
  for (int i = 0; i < 6; ++i) waits.push_back(Fail(r));
  const std::vector<absl::Duration> expected = {
      absl::Milliseconds(250), absl::Milliseconds(500), absl::Seconds(1),
      absl::Seconds(2),        absl::Seconds(2),        absl::Seconds(2)};
  EXPECT_EQ(waits, expected);
  r.Connect();
  EXPECT_EQ(r.backoff(), absl::Seconds(4));
}

TEST_F(ReconnectorTest, JitterSpreadsTheWaitOverTheUpperHalf) {
  Reconnector r = Make();
  jitter_ = 0.5;
  EXPECT_EQ(Fail(r), absl::Milliseconds(375));
  jitter_ = 0.999;
  const absl::Duration wait = Fail(r);  // backoff 1 s now
  EXPECT_GT(wait, absl::Milliseconds(990));
  EXPECT_LT(wait, absl::Seconds(1));
}

TEST_F(ReconnectorTest, AWelcomeResetsTheBackoff) {
  Reconnector r = Make();
  for (int i = 0; i < 4; ++i) Fail(r);
  r.Connect();
  EXPECT_EQ(r.backoff(), absl::Seconds(4));
  r.Welcomed();
  EXPECT_EQ(r.Closed(), absl::Milliseconds(250));
  EXPECT_EQ(r.backoff(), absl::Milliseconds(500));
}

TEST_F(ReconnectorTest, RetryAfterIsTheLeastWaitAndKeepsTheBackoffGrowing) {
  Reconnector r = Make();
  r.Connect();
  r.Welcomed();
  r.RetryAfter(absl::Seconds(3));
  r.RetryAfter(absl::Seconds(1));  // the longest asked for counts
  EXPECT_EQ(r.Closed(), absl::Seconds(3));  // half of 3 s is less than asked: 3 s
  r.Connect();
  EXPECT_EQ(r.backoff(), absl::Seconds(1));  // not reset by the Welcome
  EXPECT_EQ(r.Closed(), absl::Milliseconds(500));  // a new stream: no retry_after
}

TEST_F(ReconnectorTest, SkippedBackoffDoesNotGrow) {
  Reconnector r = Make();
  EXPECT_EQ(Fail(r), absl::Milliseconds(250));
  r.SkipBackoff();
  EXPECT_EQ(r.state(), State::kIdle);
  EXPECT_EQ(Fail(r), absl::Milliseconds(250));
  EXPECT_EQ(Fail(r), absl::Milliseconds(500));
}

TEST_F(ReconnectorTest, ARedirectIsFollowedAtOnceThenTheOtherOwnersThenTheList) {
  Reconnector r = Make();
  EXPECT_EQ(r.Connect(), "n1");
  r.Redirected({"", "o1", "o2"});
  EXPECT_EQ(r.Closed(), absl::ZeroDuration());
  EXPECT_EQ(r.state(), State::kIdle);
  EXPECT_EQ(r.Connect(), "o1");
  EXPECT_EQ(r.Closed(), absl::Milliseconds(250));  // o1 is down: a failure
  EXPECT_EQ(r.Connect(), "o2");
  r.Closed();
  EXPECT_EQ(r.Connect(), "n2");
}

TEST_F(ReconnectorTest, ARedirectDoesNotGrowTheBackoff) {
  Reconnector r = Make();
  Fail(r);
  r.Connect();
  EXPECT_EQ(r.backoff(), absl::Seconds(1));
  r.Redirected({"o1"});
  EXPECT_EQ(r.Closed(), absl::ZeroDuration());
  r.Connect();
  EXPECT_EQ(r.backoff(), absl::Seconds(1));
}

TEST_F(ReconnectorTest, ARedirectNamingNoOwnerBacksOff) {
  Reconnector r = Make();
  r.Connect();
  r.Redirected({""});
  EXPECT_EQ(r.Closed(), absl::Milliseconds(250));
  EXPECT_EQ(r.Connect(), "n2");
}

TEST_F(ReconnectorTest, ARedirectLoopIsFollowedAtOnceOnlyAFewTimes) {
  Reconnector r = Make({"n1"});
  std::vector<absl::Duration> waits;
  std::vector<std::string> dialed;
  for (int i = 0; i < 6; ++i) {  // two nodes that each name the other
    dialed.push_back(r.Connect());
    r.Redirected({i % 2 == 0 ? "n2" : "n1"});
    waits.push_back(r.Closed());
  }
  const absl::Duration zero = absl::ZeroDuration();
  EXPECT_EQ(waits, (std::vector<absl::Duration>{zero, zero, zero, absl::Milliseconds(250),
                                                 absl::Milliseconds(500), absl::Seconds(1)}));
  // Past the bound the owner named is still the next dialed, after the wait.
  EXPECT_EQ(dialed, (std::vector<std::string>{"n1", "n2", "n1", "n2", "n1", "n2"}));
  EXPECT_EQ(r.redirects_in_a_row(), 6);
  EXPECT_EQ(r.owners().size(), 1u);

  // A Welcome ends the loop: the next redirect is followed at once again.
  r.Connect();
  r.Welcomed();
  EXPECT_EQ(r.redirects_in_a_row(), 0);
  r.Redirected({"n3"});
  EXPECT_EQ(r.Closed(), zero);
  EXPECT_EQ(r.Connect(), "n3");
}

}  // namespace
}  // namespace strata::rpc
