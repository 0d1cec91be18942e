#include "common/rpc/grpc_timers.h"

#include <grpc/grpc.h>

#include <atomic>

#include "absl/base/call_once.h"

// gRPC's iomgr (src/core/lib/iomgr/timer_manager.h), exported by libgrpc with C++ linkage.
// Weak: a gRPC without them leaves them null.
void grpc_timer_manager_set_threading(bool enabled) __attribute__((weak));
void grpc_timer_manager_tick() __attribute__((weak));

namespace strata::rpc {
namespace {

std::atomic<bool> g_caller_runs_timers{false};

}  // namespace

absl::Status RunGrpcTimersOnCaller() {
  if (grpc_timer_manager_set_threading == nullptr || grpc_timer_manager_tick == nullptr) {
    return absl::UnimplementedError("this gRPC does not let its timers run on another thread");
  }
  static absl::once_flag once;
  absl::call_once(once, [] {
    // gRPC's initialisation starts the timer threads: initialise first, and for good.
    grpc_init();
    grpc_timer_manager_set_threading(false);
    g_caller_runs_timers.store(true, std::memory_order_release);
  });
  return absl::OkStatus();
}

bool GrpcTimersRunOnCaller() { return g_caller_runs_timers.load(std::memory_order_acquire); }

void TickGrpcTimers() {
  if (GrpcTimersRunOnCaller()) grpc_timer_manager_tick();
}

}  // namespace strata::rpc
