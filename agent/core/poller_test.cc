#include "agent/core/poller.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cstdint>

#include "common/base/unique_fd.h"
#include "gtest/gtest.h"

namespace strata::agent {
namespace {

// An eventfd stands in for a source's or the process events' descriptor: readable while its
// counter is non-zero.
class Signal {
 public:
  Signal() : fd_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {}
  int fd() const { return fd_.get(); }
  void Raise() const {
    const uint64_t one = 1;
    ASSERT_EQ(write(fd_.get(), &one, sizeof(one)), static_cast<ssize_t>(sizeof(one)));
  }
  void Clear() const {
    uint64_t count;
    (void)!read(fd_.get(), &count, sizeof(count));
  }

 private:
  base::UniqueFd fd_;
};

class PollerTest : public ::testing::Test {
 protected:
  std::unique_ptr<Poller> Make() {
    PollerOptions options;
    options.ready_fds = {source_.fd()};
    options.change_fds = {changes_.fd()};
    options.clock = [this] { return now_; };
    auto poller = Poller::Create(std::move(options));
    EXPECT_TRUE(poller.ok()) << poller.status();
    return poller.ok() ? std::move(*poller) : nullptr;
  }

  // A Wait that must not fail.
  static Wakeup WaitOn(Poller& poller, absl::Duration timeout) {
    absl::StatusOr<Wakeup> woke = poller.Wait(timeout);
    EXPECT_TRUE(woke.ok()) << woke.status();
    return woke.ok() ? *woke : Wakeup{};
  }
  static bool Quiet(const Wakeup& woke) { return !woke.changed && woke.ready_count == 0; }

  Signal source_;
  Signal changes_;
  absl::Time now_ = absl::FromUnixSeconds(1000);
};

TEST_F(PollerTest, NothingReadyTimesOutEmpty) {
  auto poller = Make();
  EXPECT_TRUE(Quiet(WaitOn(*poller, absl::ZeroDuration())));
}

TEST_F(PollerTest, ReadySourceIsReportedWhileReadable) {
  auto poller = Make();
  source_.Raise();
  for (int round = 0; round < 2; ++round) {  // level-triggered: until the source is read
    Wakeup woke = WaitOn(*poller, absl::Seconds(10));
    ASSERT_EQ(woke.ready_count, 1);
    EXPECT_EQ(woke.ready[0], source_.fd());
    EXPECT_FALSE(woke.changed);
  }
  source_.Clear();
  EXPECT_TRUE(Quiet(WaitOn(*poller, absl::ZeroDuration())));
}

TEST_F(PollerTest, WakeEndsTheWaitAndIsConsumed) {
  auto poller = Make();
  poller->Wake();
  poller->Wake();
  const absl::Time start = absl::Now();
  EXPECT_TRUE(Quiet(WaitOn(*poller, absl::Seconds(10))));  // at once
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  // Read: the next wait times out.
  EXPECT_TRUE(Quiet(WaitOn(*poller, absl::ZeroDuration())));
}

TEST_F(PollerTest, ChangesWakeOnceThenWaitOutTheGap) {
  auto poller = Make();
  changes_.Raise();
  Wakeup woke = WaitOn(*poller, absl::Seconds(10));
  EXPECT_TRUE(woke.changed);
  EXPECT_FALSE(poller->changes_armed());

  // Still readable, but disarmed: no wake-up until the gap has passed.
  now_ += absl::Milliseconds(99);
  woke = WaitOn(*poller, absl::ZeroDuration());
  EXPECT_FALSE(woke.changed);
  EXPECT_FALSE(poller->changes_armed());

  now_ += absl::Milliseconds(1);
  woke = WaitOn(*poller, absl::Seconds(10));
  EXPECT_TRUE(woke.changed);

  // Nothing new once read: re-armed after the gap, but quiet.
  changes_.Clear();
  now_ += absl::Milliseconds(100);
  woke = WaitOn(*poller, absl::ZeroDuration());
  EXPECT_FALSE(woke.changed);
  EXPECT_TRUE(poller->changes_armed());
}

TEST_F(PollerTest, DisarmedChangesShortenTheWaitToTheGap) {
  auto poller = Make();
  changes_.Raise();
  ASSERT_TRUE(WaitOn(*poller, absl::Seconds(10)).changed);
  // The wait ends when the gap does (1 ms from now), not after 10 s.
  now_ += absl::Milliseconds(99);
  const absl::Time start = absl::Now();
  Wakeup woke = WaitOn(*poller, absl::Seconds(10));
  EXPECT_FALSE(woke.changed);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST_F(PollerTest, StoppedChangeDescriptorNoLongerWakes) {
  auto poller = Make();
  poller->StopWatching(changes_.fd());
  changes_.Raise();
  EXPECT_TRUE(Quiet(WaitOn(*poller, absl::ZeroDuration())));
}

TEST_F(PollerTest, SourcesAndChangesTogether) {
  auto poller = Make();
  source_.Raise();
  changes_.Raise();
  Wakeup woke = WaitOn(*poller, absl::Seconds(10));
  EXPECT_TRUE(woke.changed);
  ASSERT_EQ(woke.ready_count, 1);
  EXPECT_EQ(woke.ready[0], source_.fd());
}

}  // namespace
}  // namespace strata::agent
