#include "common/rpc/grpc_timers.h"

#include <grpc/event_engine/event_engine.h>
#include <grpc/grpc.h>

#include <stdlib.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/base/call_once.h"
#include "absl/synchronization/mutex.h"

// gRPC's iomgr (src/core/lib/iomgr/timer_manager.h), exported by libgrpc with C++ linkage.
// Weak: a gRPC without them leaves them null.
void grpc_timer_manager_set_threading(bool enabled) __attribute__((weak));
void grpc_timer_manager_tick() __attribute__((weak));

namespace strata::rpc {
namespace {

using grpc_event_engine::experimental::EndpointConfig;
using grpc_event_engine::experimental::EventEngine;
using grpc_event_engine::experimental::MemoryAllocator;
using grpc_event_engine::experimental::MemoryAllocatorFactory;

std::atomic<bool> g_caller_runs_timers{false};

// The tasks of every TickedEventEngine, run by TickGrpcTimers(). A handful at most (a
// subchannel's reconnect retry): a map scanned at each tick.
class TaskQueue {
 public:
  using Task = std::variant<EventEngine::Closure*, absl::AnyInvocable<void()>>;

  EventEngine::TaskHandle Add(std::chrono::steady_clock::time_point due, Task task) {
    absl::MutexLock lock(&mu_);
    const intptr_t id = ++last_id_;
    tasks_.emplace(id, Entry{due, std::move(task)});
    return {{id, kMagic}};
  }
  // True if the task had not run and now never will.
  bool Cancel(EventEngine::TaskHandle handle) {
    if (handle.keys[1] != kMagic) return false;
    absl::MutexLock lock(&mu_);
    return tasks_.erase(handle.keys[0]) == 1;
  }
  // Runs the tasks that are due, without the lock (a task may add or cancel others).
  void RunDue() {
    std::vector<Task> due;
    {
      absl::MutexLock lock(&mu_);
      if (tasks_.empty()) return;
      const auto now = std::chrono::steady_clock::now();
      for (auto it = tasks_.begin(); it != tasks_.end();) {
        if (it->second.due > now) {
          ++it;
          continue;
        }
        due.push_back(std::move(it->second.task));
        it = tasks_.erase(it);
      }
    }
    for (Task& task : due) {
      if (auto* closure = std::get_if<EventEngine::Closure*>(&task)) {
        (*closure)->Run();
      } else {
        std::get<absl::AnyInvocable<void()>>(task)();
      }
    }
  }

 private:
  static constexpr intptr_t kMagic = 0x5374726174615451;  // tells our handles from others
  struct Entry {
    std::chrono::steady_clock::time_point due;
    Task task;
  };
  absl::Mutex mu_;
  intptr_t last_id_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<intptr_t, Entry> tasks_ ABSL_GUARDED_BY(mu_);
};

TaskQueue& Tasks() {
  static TaskQueue* const tasks = new TaskQueue();  // outlives every engine and thread
  return *tasks;
}

// gRPC 1.51's default EventEngine starts a timer thread that wakes every second; a client
// uses the engine only for a subchannel's reconnect retry (RunAfter, Cancel). This one runs
// its tasks in TickGrpcTimers(), never inline (gRPC calls it with its locks held). It makes no
// connections and no listeners: gRPC 1.51's client connects through iomgr.
class TickedEventEngine final : public EventEngine {
 public:
  absl::StatusOr<std::unique_ptr<Listener>> CreateListener(
      Listener::AcceptCallback, absl::AnyInvocable<void(absl::Status)>, const EndpointConfig&,
      std::unique_ptr<MemoryAllocatorFactory>) override {
    return absl::UnimplementedError("the agent's EventEngine makes no listeners");
  }
  ConnectionHandle Connect(OnConnectCallback on_connect, const ResolvedAddress&,
                           const EndpointConfig&, MemoryAllocator, Duration) override {
    // Called back exactly once, asynchronously, as the interface asks.
    Run([cb = std::move(on_connect)]() mutable {
      cb(absl::UnimplementedError("the agent's EventEngine makes no connections"));
    });
    return {{0, 0}};
  }
  bool CancelConnect(ConnectionHandle) override { return false; }
  bool IsWorkerThread() override { return false; }
  std::unique_ptr<DNSResolver> GetDNSResolver(const DNSResolver::ResolverOptions&) override {
    return nullptr;
  }
  void Run(Closure* closure) override {
    Tasks().Add(std::chrono::steady_clock::now(),
                TaskQueue::Task(std::in_place_index<0>, closure));
  }
  void Run(absl::AnyInvocable<void()> closure) override {
    Tasks().Add(std::chrono::steady_clock::now(), std::move(closure));
  }
  TaskHandle RunAfter(Duration when, Closure* closure) override {
    return Tasks().Add(std::chrono::steady_clock::now() + when,
                       TaskQueue::Task(std::in_place_index<0>, closure));
  }
  TaskHandle RunAfter(Duration when, absl::AnyInvocable<void()> closure) override {
    return Tasks().Add(std::chrono::steady_clock::now() + when, std::move(closure));
  }
  bool Cancel(TaskHandle handle) override { return Tasks().Cancel(handle); }
};

}  // namespace

std::unique_ptr<grpc_event_engine::experimental::EventEngine> NewTickedEventEngine() {
  return std::make_unique<TickedEventEngine>();
}

absl::Status RunGrpcTimersOnCaller() {
  if (grpc_timer_manager_set_threading == nullptr || grpc_timer_manager_tick == nullptr) {
    return absl::UnimplementedError("this gRPC does not let its timers run on another thread");
  }
  static absl::once_flag once;
  absl::call_once(once, [] {
    // Before any channel asks for gRPC's default engine (and its timer thread).
    grpc_event_engine::experimental::SetEventEngineFactory(NewTickedEventEngine);
    // A connection gRPC makes on its own (a reconnect after the server went away) is driven
    // only by the channel's backup poller, a timer that now runs at the caller's ticks: at
    // gRPC's 5 s period a TLS handshake, a few reads long, outlasts the connect deadline every
    // time, and the agent never reconnects. At the ticks' period it takes a second. (Read at
    // initialisation; an operator's own setting stands.)
    setenv("GRPC_CLIENT_CHANNEL_BACKUP_POLL_INTERVAL_MS",
           std::to_string(absl::ToInt64Milliseconds(kGrpcTimerTick)).c_str(), /*overwrite=*/0);
    // gRPC's initialisation starts the timer threads: initialise first, and for good.
    grpc_init();
    grpc_timer_manager_set_threading(false);
    g_caller_runs_timers.store(true, std::memory_order_release);
  });
  return absl::OkStatus();
}

bool GrpcTimersRunOnCaller() { return g_caller_runs_timers.load(std::memory_order_acquire); }

void TickGrpcTimers() {
  if (!GrpcTimersRunOnCaller()) return;
  grpc_timer_manager_tick();
  Tasks().RunDue();
}

}  // namespace strata::rpc
