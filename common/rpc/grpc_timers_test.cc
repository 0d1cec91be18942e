#include "common/rpc/grpc_timers.h"

#include <grpcpp/alarm.h>
#include <grpcpp/completion_queue.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>

#include "common/testing/wait_for.h"
#include "gtest/gtest.h"

namespace strata::rpc {
namespace {

// Threads of this process named like gRPC's iomgr timer threads ("grpc_global_timer", cut to
// the kernel's 15 characters).
int GrpcTimerThreads() {
  int count = 0;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(task.path() / "comm");
    std::string name;
    std::getline(comm, name);
    count += name.rfind("grpc_global_tim", 0) == 0 ? 1 : 0;
  }
  return count;
}

// The process's gRPC timers, before and after the caller takes them over: one test, since
// the take-over lasts for the process's life.
TEST(GrpcTimersTest, TimersRunOnlyWhenTheCallerTicksOnceItRunsThem) {
  grpc::CompletionQueue cq;  // initialises gRPC
  void* tag = nullptr;
  bool ok = false;
  auto in = [](int ms) {
    return std::chrono::system_clock::now() + std::chrono::milliseconds(ms);
  };

  // gRPC's own threads run a timer at its deadline.
  ASSERT_FALSE(GrpcTimersRunOnCaller());
  ASSERT_TRUE(testing::WaitFor([] { return GrpcTimerThreads() > 0; }))
      << "gRPC started no timer thread";
  grpc::Alarm before;
  before.Set(&cq, in(20), &before);
  ASSERT_EQ(cq.AsyncNext(&tag, &ok, in(10'000)), grpc::CompletionQueue::GOT_EVENT);
  EXPECT_EQ(tag, &before);
  EXPECT_TRUE(ok);
  TickGrpcTimers();  // nothing to do while gRPC runs them

  ASSERT_TRUE(RunGrpcTimersOnCaller().ok());
  ASSERT_TRUE(RunGrpcTimersOnCaller().ok());  // idempotent
  EXPECT_TRUE(GrpcTimersRunOnCaller());
  EXPECT_EQ(GrpcTimerThreads(), 0);

  // A timer past its deadline waits for the caller's tick: polling the queue does not run it.
  grpc::Alarm after;
  after.Set(&cq, in(20), &after);
  EXPECT_EQ(cq.AsyncNext(&tag, &ok, in(300)), grpc::CompletionQueue::TIMEOUT);
  TickGrpcTimers();
  ASSERT_EQ(cq.AsyncNext(&tag, &ok, in(10'000)), grpc::CompletionQueue::GOT_EVENT);
  EXPECT_EQ(tag, &after);
  EXPECT_TRUE(ok);

  // One not yet due stays pending through a tick.
  grpc::Alarm later;
  later.Set(&cq, in(60'000), &later);
  TickGrpcTimers();
  EXPECT_EQ(cq.AsyncNext(&tag, &ok, in(50)), grpc::CompletionQueue::TIMEOUT);
  later.Cancel();
  ASSERT_EQ(cq.AsyncNext(&tag, &ok, in(10'000)), grpc::CompletionQueue::GOT_EVENT);
  EXPECT_EQ(tag, &later);
  EXPECT_FALSE(ok);  // cancelled, not fired
  EXPECT_EQ(GrpcTimerThreads(), 0);
}

}  // namespace
}  // namespace strata::rpc
