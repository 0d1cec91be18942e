// Keeps the agent's set of target processes and their threads up to date.
//
// The owner (the agent's main loop) either calls Rescan() periodically, e.g. once a second, or,
// where the kernel's process events are available (process_events.h), calls Rescan() once and
// then Update() with each batch of events (Rescan() reads all of /proc, Update() only what the
// events name). Each call reports what changed since the previous one: processes that started
// (or were pinned with Track()), processes that exited, processes that exec'd (reported as
// removed and then added, since their mappings and service may have changed), and threads that
// appeared or exited in the target processes. A process is identified by (pid, start time) so
// that pid reuse is seen as exit + start. Non-target processes are remembered by (pid, start
// time, executable) so that their command line and environment are read once, not every scan; a
// change of executable (exec) makes them be evaluated again.
//
// Not thread-safe; owned and driven by one thread.

#ifndef STRATA_AGENT_PROCFS_PROCESS_TRACKER_H_
#define STRATA_AGENT_PROCFS_PROCESS_TRACKER_H_

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "agent/procfs/process_events.h"
#include "agent/procfs/service_matcher.h"

namespace strata::agent::procfs {

struct TrackedProcess {
  pid_t pid = 0;
  uint64_t start_time = 0;  // clock ticks after boot (see ReadStartTime)
  std::string executable;
  std::vector<std::string> command_line;
  std::string comm;
  std::string service;
  std::vector<pid_t> threads;  // ascending, as of the last scan
  // The variables of kLabelEnvVars the process was started with (name, value), read from
  // /proc/PID/environ once when it became a target (at most kMaxEnvironBytes of it).
  std::vector<std::pair<std::string, std::string>> environment;
};

// Environment variables the agent derives target labels from (agent/core/target_labels.h).
inline constexpr std::string_view kLabelEnvVars[] = {
    "STRATA_LABELS", "POD_NAME", "POD_NAMESPACE", "POD_UID", "HOSTNAME",
    "KUBERNETES_SERVICE_HOST"};
// Bound on the environment read per process, and on one kept value.
inline constexpr size_t kMaxEnvironBytes = 256 << 10;
inline constexpr size_t kMaxEnvValueBytes = 4096;

struct ThreadRef {
  pid_t pid = 0;
  pid_t tid = 0;
  bool operator==(const ThreadRef&) const = default;
};

struct ProcessChanges {
  // Removed processes come first in the order of application: an exec'd process appears in
  // both lists, removed (old image) then added (new image).
  std::vector<TrackedProcess> removed;
  // New targets, with all their threads (those threads are not repeated in threads_added).
  std::vector<TrackedProcess> added;
  // Threads that appeared or exited in targets that were already tracked and still are.
  std::vector<ThreadRef> threads_added;
  std::vector<ThreadRef> threads_removed;

  bool empty() const {
    return removed.empty() && added.empty() && threads_added.empty() && threads_removed.empty();
  }
};

class ProcessTracker {
 public:
  struct Options {
    // Do not profile the agent itself.
    bool exclude_self = true;
  };

  explicit ProcessTracker(ServiceMatcher matcher);
  ProcessTracker(ServiceMatcher matcher, Options options);

  // Makes `pid` a target under `service` regardless of the rules (ad hoc capture of one pid).
  // Takes effect at the next Rescan() or Update(). Pinned targets stay pinned for the life of
  // that process (pid + start time); they are not re-pinned if the pid is reused.
  void Track(pid_t pid, std::string service);
  // Undoes Track(); the process is reported removed at the next Rescan() or Update() unless a
  // rule matches.
  void Untrack(pid_t pid);

  // Reads /proc and returns the changes since the previous call. Processes that vanish while
  // being read are treated as gone. Fails only if /proc itself cannot be listed.
  absl::StatusOr<ProcessChanges> Rescan();

  // Applies a batch of process events (process_events.h) and returns the changes since the
  // previous call as Rescan() would, reading /proc only for the processes the events name and
  // those of has_pending(). Processes are read after the whole batch, so the order of its
  // events does not matter. An exec that the last read of the process did not see is reported
  // as removed + added when the executable or the command line changed; an exec event for the
  // image that read already saw (/proc shows the new image before the kernel stamps the exec
  // event) changes nothing. Thread
  // starts and exits of targets come from the events, without listing /proc/PID/task (a
  // started thread is checked to still exist). A zombie counts as exited: its exit event is all
  // the notice there is. Runs Rescan() instead when the batch overflowed or before the first
  // Rescan(); fails only where that Rescan() fails.
  absl::StatusOr<ProcessChanges> Update(const ProcessEventBatch& events);

  // Whether Update() has processes to read even without events: pins changed by Track() or
  // Untrack(), or processes caught in the middle of exec. The owner then calls Update() with an
  // empty batch on its periodic tick.
  bool has_pending() const { return !reevaluate_.empty() || !retry_.empty(); }

  // Current targets by pid, as of the last Rescan() or Update().
  const absl::flat_hash_map<pid_t, TrackedProcess>& targets() const { return targets_; }

  // The processes whose events can matter, ascending, when only pinned processes can be
  // targets (no rules): the pinned ones and the current targets. nullopt when any process may
  // become one. The owner passes it to ProcessEvents::WatchOnly() before each Update().
  std::optional<std::vector<pid_t>> PidsOfInterest() const;

  // Processes whose /proc entries Rescan() and Update() have read so far. With no rules (only
  // pinned pids), other processes' events and entries are skipped unread: on a host busy with
  // fork and exec, an agent profiling one pid does not read /proc for every compiler run.
  uint64_t processes_read() const { return processes_read_; }

 private:
  struct Seen {
    uint64_t start_time = 0;
    std::string executable;
  };

  // Reads everything about `pid` and decides whether it is a target; false if it is not or
  // vanished meanwhile. `*settled` (when given) is false when the decision rests on an empty
  // command line or environment: a process caught in the middle of exec has its new
  // executable before its new arguments and environment, so it is looked at again.
  bool Evaluate(pid_t pid, uint64_t start_time, const std::string& executable,
                TrackedProcess* out, bool* settled = nullptr);

  // Update()'s reading of one process the events name, after the events of the whole batch:
  // the same decisions as one step of Rescan(). `exec_ns` (0: none) is when the process last
  // exec'd; it forces a new evaluation unless the process was read after it. Adds `pid` to
  // `*listed` when its thread list was read from /proc here, so the batch's thread events for it
  // are moot.
  void Refresh(pid_t pid, uint64_t exec_ns, ProcessChanges* changes,
               absl::flat_hash_set<pid_t>* listed);
  // Whether `pid` can be a target at all: any process when rules may match, else only pinned
  // processes and current targets.
  bool MayBeTarget(pid_t pid) const;
  // Drops everything known about a process that is gone; a target is reported removed.
  void Forget(pid_t pid, ProcessChanges* changes);

  // Evaluations of one process that Update() redoes while they are unsettled (see Evaluate)
  // before it takes the answer; the process's exec event makes it be evaluated again anyway.
  static constexpr int kMaxRetries = 5;

  ServiceMatcher matcher_;
  Options options_;
  bool scanned_ = false;  // Rescan() has run: Update() has a baseline
  // Event timestamps are the kernel's CLOCK_MONOTONIC, comparable with ours unless this process
  // is in a time namespace that shifts it; then every exec event is taken as news.
  bool compare_timestamps_ = true;
  uint64_t scan_ns_ = 0;  // when the last Rescan() started
  absl::flat_hash_map<pid_t, uint64_t> read_ns_;  // when Update() last evaluated the pid
  absl::flat_hash_map<pid_t, TrackedProcess> targets_;
  absl::flat_hash_map<pid_t, Seen> ignored_;
  absl::flat_hash_map<pid_t, std::string> pinned_;  // pid -> service
  absl::flat_hash_map<pid_t, uint64_t> pinned_start_;  // pid -> start time once seen
  absl::flat_hash_set<pid_t> reevaluate_;  // pins changed since the last scan
  absl::flat_hash_map<pid_t, int> retry_;  // unsettled evaluations -> how many so far
  uint64_t processes_read_ = 0;
};

}  // namespace strata::agent::procfs

#endif  // STRATA_AGENT_PROCFS_PROCESS_TRACKER_H_
