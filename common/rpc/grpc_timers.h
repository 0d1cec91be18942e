// common/rpc/grpc_timers: gRPC's timers run by a thread of the process instead of gRPC's own.
//
// gRPC 1.51's iomgr runs its timers (connect deadlines, reconnect backoff, the channel's
// backup poller) on timer threads that wake at least once a second whatever is pending: a
// timer shard looks at most a second ahead, and one with nothing due in that window asks to
// be checked again at its end. In a process whose only other work is a wake-up a second (the
// agent at 10 s intervals) those threads cost a quarter to a third of its CPU. A process that
// waits on gRPC from one thread of its own can run them there instead:
// RunGrpcTimersOnCaller() stops gRPC's timer threads for the rest of the process's life, and
// from then on a timer runs only when a thread calls TickGrpcTimers() after its deadline.
// That thread (the agent's shipper) ticks whenever it wakes, and at least every
// kGrpcTimerTick while it waits on anything a timer can end (a connection being made, the
// backoff between connections). Anything else that waits on a gRPC timer (a synchronous
// call's deadline, Channel::WaitForStateChange) then ends only at such a tick: that thread
// must be the process's only one to wait on gRPC.
//
// gRPC 1.51 also starts a timer thread, waking every second, in its default EventEngine, which
// a client uses only for a subchannel's reconnect retry: RunGrpcTimersOnCaller() installs an
// engine (NewTickedEventEngine) whose tasks run in TickGrpcTimers() as well.
//
// Uses iomgr functions gRPC exports but does not declare in its public headers; where they
// are missing (another gRPC), RunGrpcTimersOnCaller() fails and gRPC keeps its threads.
#ifndef STRATA_COMMON_RPC_GRPC_TIMERS_H_
#define STRATA_COMMON_RPC_GRPC_TIMERS_H_

#include <memory>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace grpc_event_engine::experimental {
class EventEngine;
}  // namespace grpc_event_engine::experimental

namespace strata::rpc {

// The longest a timer may wait past its deadline while the ticking thread waits on gRPC.
inline constexpr absl::Duration kGrpcTimerTick = absl::Milliseconds(250);

// Stops gRPC's timer threads; every later timer waits for TickGrpcTimers(). Holds gRPC
// initialised for the process's life (a later first initialisation would start the threads
// again). Idempotent. Unimplemented if this gRPC cannot be driven so.
absl::Status RunGrpcTimersOnCaller();
// Whether RunGrpcTimersOnCaller() succeeded.
bool GrpcTimersRunOnCaller();
// Runs the timers whose deadline has passed, on the calling thread, if the caller runs
// them; otherwise nothing. Any thread; not with a lock a gRPC completion could need.
void TickGrpcTimers();

// The EventEngine RunGrpcTimersOnCaller() has gRPC create: its tasks (Run, RunAfter) run in
// TickGrpcTimers() once due, never on the thread that adds them; it makes no connections,
// listeners or DNS resolvers (gRPC 1.51's client makes those through iomgr).
std::unique_ptr<grpc_event_engine::experimental::EventEngine> NewTickedEventEngine();

}  // namespace strata::rpc

#endif  // STRATA_COMMON_RPC_GRPC_TIMERS_H_
