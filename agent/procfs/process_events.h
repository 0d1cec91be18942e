// Process lifecycle events from the kernel, so that target discovery need not poll /proc.
//
// ProcessEvents subscribes to the Linux process connector (netlink, NETLINK_CONNECTOR with
// CN_IDX_PROC) and reports, per batch, which processes started, exec'd and exited and which
// threads started and exited. It carries pids only: what a process is (executable, command line,
// service) is still read from /proc, by ProcessTracker::Update() (process_tracker.h) and only for
// the pids the events name.
//
// The owner (agent/core's TargetDiscovery) opens it before its first ProcessTracker::Rescan(),
// so that nothing happening after that scan is missed, adds fd() to its epoll set
// (level-triggered) and, whenever it is readable, calls Read() and passes the batch to
// ProcessTracker::Update(). When the kernel dropped events (the socket's receive queue was full)
// the batch says so (`overflowed`) and Update() falls back to one full Rescan().
//
// The connector needs CAP_NET_ADMIN (older kernels) and serves only the initial pid and user
// namespaces, so inside most containers Open() fails and the owner keeps polling with Rescan().
//
// Not thread-safe; owned and driven by one thread. The socket is closed (and the subscription
// dropped) on destruction.

#ifndef STRATA_AGENT_PROCFS_PROCESS_EVENTS_H_
#define STRATA_AGENT_PROCFS_PROCESS_EVENTS_H_

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace strata::agent::procfs {

enum class ProcessEventType : uint8_t {
  kProcessStarted,  // fork/clone of a new process: pid == tid
  kThreadStarted,   // a new thread `tid` in process `pid`
  kExec,            // process `pid` exec'd (tid == pid: exec makes the caller the leader)
  kThreadExited,    // thread `tid` of process `pid` exited
  kProcessExited,   // the leader of `pid` exited (pid == tid); usually the whole process
};

struct ProcessEvent {
  ProcessEventType type = ProcessEventType::kProcessStarted;
  pid_t pid = 0;  // process (thread group) ID, as in /proc/PID
  pid_t tid = 0;  // thread ID; equals pid for process events
  // When it happened, CLOCK_MONOTONIC in nanoseconds (the kernel's ktime_get_ns()); 0 if
  // unknown. Tells whether a read of /proc already saw its effect.
  uint64_t timestamp_ns = 0;
  bool operator==(const ProcessEvent&) const = default;
};

struct ProcessEventBatch {
  // In the order the kernel queued them. Events of different CPUs may be queued out of causal
  // order (a child's exec or exit before its fork), so consumers must not rely on the order.
  std::vector<ProcessEvent> events;
  // Events were lost (the receive queue overflowed): consumers must rescan /proc once.
  bool overflowed = false;

  // Keeps the vector's capacity, so that a batch reused across reads does not allocate.
  void Clear() {
    events.clear();
    overflowed = false;
  }
  bool empty() const { return events.empty() && !overflowed; }
};

class ProcessEvents {
 public:
  struct Options {
    // Receive queue of the socket. The kernel doubles it and charges about 800 bytes per queued
    // event, so 1 MiB holds about 2500 events between two reads; more is an overflow, which
    // costs one full rescan, not correctness.
    int receive_buffer_bytes = 1 << 20;
    // Drops the event types the agent does not use (uid/gid/sid/ptrace/comm/coredump) in the
    // kernel with a socket filter, so that they cost neither queue space nor a wake-up.
    bool filter_unused_events = true;
    // How long Open() waits for the kernel to acknowledge the subscription. The kernel answers
    // synchronously when it accepts; no answer means it ignored us (another pid namespace).
    std::chrono::milliseconds subscribe_timeout{1000};
  };

  // Opens the socket and subscribes. UnavailableError when the kernel has no process connector
  // or ignores the subscription (not in the initial pid and user namespaces, as in most
  // containers); PermissionDeniedError without CAP_NET_ADMIN. Events that happen before Open()
  // returns are not reported: rescan /proc after it.
  static absl::StatusOr<std::unique_ptr<ProcessEvents>> Open();
  static absl::StatusOr<std::unique_ptr<ProcessEvents>> Open(const Options& options);

  ~ProcessEvents();
  ProcessEvents(const ProcessEvents&) = delete;
  ProcessEvents& operator=(const ProcessEvents&) = delete;

  // Non-blocking; readable when events are pending.
  int fd() const { return fd_; }

  // Appends every pending event to `out->events` without blocking, and sets `out->overflowed`
  // if the kernel reported lost events. It stops after kMaxMessagesPerRead messages so that an
  // event storm cannot keep the caller here; the fd then stays readable. Fails only on an
  // unexpected socket error.
  absl::Status Read(ProcessEventBatch* out);

  // Times the kernel reported lost events, since Open().
  uint64_t overflows() const { return overflows_; }

  // Keeps only the fork, exec and exit events of the given processes (their new threads,
  // exec, exits and their threads' exits), dropping every other process's in the kernel, so
  // that an agent profiling a few pids on a host busy with fork and exec is neither woken nor
  // queued for them. nullopt, or more than kMaxWatchedPids pids: every process's events (with
  // the unused event types still dropped). Events queued before the call are still read.
  // Takes effect at once; a no-op when the set is unchanged. When the kernel refuses a filter,
  // every process's events are kept from then on and the error is returned that once.
  absl::Status WatchOnly(std::optional<std::vector<pid_t>> pids);

  static constexpr size_t kMaxMessagesPerRead = 1 << 16;
  static constexpr size_t kMaxWatchedPids = 200;

 private:
  struct Receiver;  // recvmmsg() buffers, allocated once and reused by every Read()

  explicit ProcessEvents(int fd);
  // Sends PROC_CN_MCAST_LISTEN or _IGNORE, tagged with `ack`.
  absl::Status Subscribe(bool listen, uint32_t ack);
  // Waits up to `timeout` for the kernel's answer to Subscribe(true, ack); drops other events.
  absl::Status AwaitAck(uint32_t ack, std::chrono::milliseconds timeout);

  int fd_ = -1;
  bool listening_ = false;
  uint64_t overflows_ = 0;
  std::optional<std::vector<pid_t>> watched_;  // as last given to WatchOnly()
  bool pid_filter_failed_ = false;             // WatchOnly() keeps every process's events
  std::unique_ptr<Receiver> receiver_;
};

}  // namespace strata::agent::procfs

#endif  // STRATA_AGENT_PROCFS_PROCESS_EVENTS_H_
