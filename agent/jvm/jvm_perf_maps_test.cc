#include "agent/jvm/jvm_perf_maps.h"

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "agent/jvm/hotspot_attach.h"
#include "gtest/gtest.h"

namespace strata::agent::jvm {
namespace {

using namespace std::string_literals;

TEST(AttachProtocolTest, RequestIsVersionCommandAndThreeArguments) {
  EXPECT_EQ(EncodeAttachRequest("jcmd", "Compiler.perfmap"),
            "1\0jcmd\0Compiler.perfmap\0\0\0"s);
}

TEST(AttachProtocolTest, ResponseCodeAndOutput) {
  EXPECT_EQ(ParseAttachResponse("0\nOpenJDK 64-Bit Server VM\n").value(),
            "OpenJDK 64-Bit Server VM\n");
  EXPECT_EQ(ParseAttachResponse("0\n").value(), "");
  EXPECT_TRUE(absl::IsFailedPrecondition(
      ParseAttachResponse("-1\njava.lang.IllegalArgumentException: Unknown diagnostic command")
          .status()));
  EXPECT_TRUE(absl::IsFailedPrecondition(
      ParseAttachResponse("0\njava.lang.IllegalArgumentException: Unknown diagnostic command")
          .status()));
  EXPECT_TRUE(absl::IsDataLoss(ParseAttachResponse("").status()));
  EXPECT_TRUE(absl::IsDataLoss(ParseAttachResponse("zero\nx").status()));
  EXPECT_TRUE(absl::IsDataLoss(ParseAttachResponse("0").status()));
}

// A command runner that records its calls and answers with `answer`.
struct FakeJvm {
  absl::Mutex mu;
  std::vector<pid_t> calls;
  absl::Status answer;

  JvmPerfMaps::CommandRunner Runner() {
    return [this](pid_t pid, std::string_view command, absl::Duration) {
      EXPECT_EQ(command, "Compiler.perfmap");
      absl::MutexLock lock(&mu);
      calls.push_back(pid);
      return answer.ok() ? absl::StatusOr<std::string>("") : answer;
    };
  }
};

// Waits (on the condition, at most 30 s) until `maps` has sent `n` requests and finished them.
void AwaitRequests(const JvmPerfMaps& maps, uint64_t n) {
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (absl::Now() < deadline) {
    JvmPerfMaps::Stats s = maps.stats();
    if (s.requests >= n && s.maps + s.failures >= n) return;
    absl::SleepFor(absl::Milliseconds(1));
  }
  ADD_FAILURE() << "requests never reached " << n;
}

TEST(JvmPerfMapsTest, OptInPerService) {
  FakeJvm jvm;
  JvmPerfMaps none({}, jvm.Runner());
  EXPECT_FALSE(none.Wants("api"));
  JvmPerfMaps one({{"api"}}, jvm.Runner());
  EXPECT_TRUE(one.Wants("api"));
  EXPECT_FALSE(one.Wants("batch"));
  JvmPerfMaps all({{"*"}}, jvm.Runner());
  EXPECT_TRUE(all.Wants("batch"));
}

TEST(JvmPerfMapsTest, AsksAtDoublingIntervalsAndSoonerForUnnamedCode) {
  FakeJvm jvm;
  // Answers are stamped with this clock; the ticks say their own time.
  const absl::Time t0 = absl::UnixEpoch() + absl::Hours(1);
  JvmPerfMaps maps({{"*"}, absl::Seconds(8)}, jvm.Runner(), [t0] { return t0; });
  auto at = [t0](double seconds) { return t0 + absl::Seconds(seconds); };
  maps.Tick(42, at(0), 0);  // first sight: at once
  AwaitRequests(maps, 1);
  maps.Tick(42, at(0.9), 0);  // the next one after 1 s
  EXPECT_EQ(maps.stats().requests, 1u);
  maps.Tick(42, at(1), 0);
  AwaitRequests(maps, 2);
  maps.Tick(42, at(1.5), 0);  // then 2 s after the last answer (at t0)
  EXPECT_EQ(maps.stats().requests, 2u);
  maps.Tick(42, at(1.6), 3);  // unnamed JIT code: 1 s after the last answer is enough
  AwaitRequests(maps, 3);
  maps.Tick(42, at(3.9), 3);  // no new unnamed code: the period (4 s now) holds
  EXPECT_EQ(maps.stats().requests, 3u);
  maps.Tick(42, at(4), 3);
  AwaitRequests(maps, 4);
  maps.Tick(42, at(7.9), 3);  // 8 s: the maximum
  EXPECT_EQ(maps.stats().requests, 4u);
  maps.Tick(42, at(8), 3);
  AwaitRequests(maps, 5);
  maps.Tick(42, at(7.9), 3);
  EXPECT_EQ(maps.stats().requests, 5u);
  maps.Tick(42, at(8), 3);
  AwaitRequests(maps, 6);
  absl::MutexLock lock(&jvm.mu);
  EXPECT_EQ(jvm.calls, std::vector<pid_t>(6, 42));
}

TEST(JvmPerfMapsTest, UnnamedCodeSeenWithinTheSecondIsAskedForAfterIt) {
  FakeJvm jvm;
  const absl::Time t0 = absl::UnixEpoch() + absl::Hours(1);
  JvmPerfMaps maps({{"*"}, absl::Seconds(60)}, jvm.Runner(), [t0] { return t0; });
  auto at = [t0](double seconds) { return t0 + absl::Seconds(seconds); };
  // Answers at t0; the period grows to 8 s.
  uint64_t requests = 0;
  for (const double t : {0.0, 1.0, 2.0, 4.0}) {
    maps.Tick(42, at(t), 0);
    AwaitRequests(maps, ++requests);
  }
  ASSERT_EQ(maps.stats().requests, 4u);
  maps.Tick(42, at(0.5), 5);  // new unnamed code, within a second of the last answer
  EXPECT_EQ(maps.stats().requests, 4u);
  maps.Tick(42, at(1.5), 5);  // none newer since, but that code is still unnamed
  AwaitRequests(maps, 5);
  maps.Tick(42, at(2.5), 5);  // asked for: the period holds again
  EXPECT_EQ(maps.stats().requests, 5u);
}

TEST(JvmPerfMapsTest, GivesUpOnAJvmThatRefusesAndRetriesOneThatIsGone) {
  FakeJvm jvm;
  jvm.answer = absl::FailedPreconditionError("JDK 11: no Compiler.perfmap");
  JvmPerfMaps maps({{"*"}}, jvm.Runner());
  maps.Tick(7, absl::Now(), 0);
  AwaitRequests(maps, 1);
  for (int i = 1; i <= 3; ++i) maps.Tick(7, absl::Now() + absl::Hours(i), 99);
  EXPECT_EQ(maps.stats().requests, 1u);
  EXPECT_EQ(maps.stats().given_up, 1u);

  {
    absl::MutexLock lock(&jvm.mu);
    jvm.answer = absl::NotFoundError("gone for now");
  }
  maps.Tick(8, absl::Now(), 0);
  AwaitRequests(maps, 2);
  maps.Tick(8, absl::Now() + absl::Hours(1), 0);
  AwaitRequests(maps, 3);
  EXPECT_EQ(maps.stats().given_up, 1u);
  // Forgotten: asked again from the start when it comes back as a target.
  maps.Forget(7);
  {
    absl::MutexLock lock(&jvm.mu);
    jvm.answer = absl::OkStatus();
  }
  maps.Tick(7, absl::Now(), 0);
  AwaitRequests(maps, 4);
  EXPECT_EQ(maps.stats().maps, 1u);
}

}  // namespace
}  // namespace strata::agent::jvm
