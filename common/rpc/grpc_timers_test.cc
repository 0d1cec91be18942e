#include "common/rpc/grpc_timers.h"

#include <grpc/event_engine/event_engine.h>
#include <grpcpp/alarm.h>
#include <grpcpp/completion_queue.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "common/testing/wait_for.h"
#include "gtest/gtest.h"

namespace strata::rpc {
namespace {

// Threads of this process whose name starts with `prefix`: gRPC's iomgr timer threads
// ("grpc_global_timer", cut to the kernel's 15 characters), its EventEngine's
// ("timer_manager").
int ThreadsNamed(const std::string& prefix) {
  int count = 0;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(task.path() / "comm");
    std::string name;
    std::getline(comm, name);
    count += name.rfind(prefix, 0) == 0 ? 1 : 0;
  }
  return count;
}
int GrpcTimerThreads() { return ThreadsNamed("grpc_global_tim"); }

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
  // gRPC has joined its threads, but a joined thread leaves /proc/self/task a moment later
  // (the join returns when the kernel clears its tid, before it drops the task).
  EXPECT_TRUE(testing::WaitFor([] { return GrpcTimerThreads() == 0; }));

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

  // A channel's EventEngine is the ticked one: no timer thread of its own, even while the
  // channel fails to connect and backs off (a port nothing listens on).
  auto channel = grpc::CreateChannel("127.0.0.1:1", grpc::InsecureChannelCredentials());
  channel->GetState(/*try_to_connect=*/true);
  // (Not WaitForStateChange: its deadline is a gRPC timer, which nothing here would tick.)
  for (int i = 0; i < 10; ++i) {
    TickGrpcTimers();
    channel->GetState(/*try_to_connect=*/true);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(ThreadsNamed("timer_manager"), 0);
}

using grpc_event_engine::experimental::EventEngine;

TEST(GrpcTimersTest, TheTickedEventEngineRunsTasksOnlyInTicksOnceDue) {
  using Clock = std::chrono::steady_clock;
  std::unique_ptr<EventEngine> engine = NewTickedEventEngine();
  int ran_now = 0, ran_later = 0, ran_cancelled = 0;
  Clock::time_point later_ran_at;
  engine->Run([&] { ++ran_now; });
  EXPECT_EQ(ran_now, 0);  // never on the caller's thread
  // Due times are checked against when the task ran, not against how fast this thread gets
  // to its next tick (it may be slow: under qemu, on a loaded machine).
  constexpr auto kLater = std::chrono::milliseconds(30);
  const Clock::time_point later_added = Clock::now();
  const EventEngine::TaskHandle later = engine->RunAfter(kLater, [&] {
    ++ran_later;
    later_ran_at = Clock::now();
  });
  const EventEngine::TaskHandle cancelled =
      engine->RunAfter(std::chrono::minutes(10), [&] { ++ran_cancelled; });
  ASSERT_TRUE(RunGrpcTimersOnCaller().ok());  // for TickGrpcTimers to run the tasks
  TickGrpcTimers();
  EXPECT_EQ(ran_now, 1);
  EXPECT_TRUE(engine->Cancel(cancelled));  // not due: still pending
  EXPECT_FALSE(engine->Cancel(cancelled));  // already gone
  ASSERT_TRUE(testing::WaitFor([&] {
    TickGrpcTimers();
    return ran_later == 1;
  }));
  EXPECT_GE(later_ran_at - later_added, kLater);  // not before it was due
  EXPECT_FALSE(engine->Cancel(later));  // ran
  TickGrpcTimers();
  EXPECT_EQ(ran_now + ran_later + ran_cancelled, 2);

  // A task that adds another: the new one waits for the next tick, and a closure object runs
  // as well as a callable.
  struct Count : EventEngine::Closure {
    int runs = 0;
    void Run() override { ++runs; }
  } closure;
  engine->Run([&] { engine->Run(&closure); });
  TickGrpcTimers();
  EXPECT_EQ(closure.runs, 0);
  TickGrpcTimers();
  EXPECT_EQ(closure.runs, 1);
  // What a client never asks of it fails cleanly.
  EXPECT_FALSE(engine->IsWorkerThread());
}

}  // namespace
}  // namespace strata::rpc
