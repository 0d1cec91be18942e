#include "agent/procfs/process_tracker.h"

#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <iterator>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "agent/procfs/procfs.h"

namespace strata::agent::procfs {
namespace {

// Appends (pid, tid) for every tid in `a` that is not in `b`; both ascending.
void AppendDifference(pid_t pid, const std::vector<pid_t>& a, const std::vector<pid_t>& b,
                      std::vector<ThreadRef>* out) {
  std::vector<pid_t> diff;
  std::set_difference(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(diff));
  for (pid_t tid : diff) out->push_back(ThreadRef{pid, tid});
}

// Start time of `pid`, or nullopt if it is gone or a zombie: a zombie has exited and its exit
// event is the last word about it (nothing tells when it is reaped).
std::optional<uint64_t> ReadLiveStartTime(pid_t pid) {
  absl::StatusOr<std::string> stat = ReadProcFile(absl::StrCat("/proc/", pid, "/stat"));
  if (!stat.ok()) return std::nullopt;
  // "PID (COMM) STATE ...": comm may contain ')' itself.
  const size_t paren = stat->rfind(')');
  if (paren == std::string::npos || paren + 2 >= stat->size()) return std::nullopt;
  const char state = (*stat)[paren + 2];
  if (state == 'Z' || state == 'X' || state == 'x') return std::nullopt;
  absl::StatusOr<uint64_t> start_time = ParseStatStartTime(*stat);
  if (!start_time.ok()) return std::nullopt;
  return *start_time;
}

uint64_t MonotonicNs() {
  timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return static_cast<uint64_t>(now.tv_sec) * 1000000000 + static_cast<uint64_t>(now.tv_nsec);
}

// Whether this process's CLOCK_MONOTONIC is shifted from the kernel's (time namespaces): the
// file has a line "monotonic SECONDS NANOSECONDS".
bool MonotonicClockShifted() {
  absl::StatusOr<std::string> offsets = ReadProcFile("/proc/self/timens_offsets");
  if (!offsets.ok()) return false;  // no time namespaces in this kernel
  std::string_view text = *offsets;
  const size_t at = text.find("monotonic");
  if (at == std::string_view::npos) return false;
  text.remove_prefix(at + std::string_view("monotonic").size());
  text = text.substr(0, text.find('\n'));
  return text.find_first_not_of(" 0") != std::string_view::npos;
}

// Exec events of unknown time: always news.
constexpr uint64_t kUnknownTime = UINT64_MAX;

bool ThreadExists(pid_t pid, pid_t tid) {
  return access(absl::StrCat("/proc/", pid, "/task/", tid).c_str(), F_OK) == 0;
}

}  // namespace

ProcessTracker::ProcessTracker(ServiceMatcher matcher)
    : ProcessTracker(std::move(matcher), Options()) {}

ProcessTracker::ProcessTracker(ServiceMatcher matcher, Options options)
    : matcher_(std::move(matcher)),
      options_(options),
      compare_timestamps_(!MonotonicClockShifted()) {}

void ProcessTracker::Track(pid_t pid, std::string service) {
  pinned_[pid] = std::move(service);
  pinned_start_.erase(pid);
  ignored_.erase(pid);
  reevaluate_.insert(pid);
}

void ProcessTracker::Untrack(pid_t pid) {
  pinned_.erase(pid);
  pinned_start_.erase(pid);
  reevaluate_.insert(pid);
}

bool ProcessTracker::Evaluate(pid_t pid, uint64_t start_time, const std::string& executable,
                              TrackedProcess* out, bool* settled) {
  if (settled != nullptr) *settled = true;
  std::optional<std::string> service;
  if (auto pin = pinned_.find(pid); pin != pinned_.end()) {
    auto [it, inserted] = pinned_start_.try_emplace(pid, start_time);
    if (inserted || it->second == start_time) {
      service = pin->second;
    } else {
      // The pinned process is gone and its pid was reused.
      pinned_.erase(pin);
      pinned_start_.erase(it);
    }
  }
  std::vector<std::string> command_line;
  if (absl::StatusOr<std::vector<std::string>> argv = ReadCommandLine(pid); argv.ok()) {
    command_line = std::move(*argv);
  }
  // The environment is read at most once per evaluation, bounded (matching and labels).
  std::optional<std::string> environ;
  bool environ_unreadable = false;
  auto read_environ = [&]() -> const std::string& {
    if (!environ) {
      absl::StatusOr<std::string> text =
          ReadProcFile(absl::StrCat("/proc/", pid, "/environ"), kMaxEnvironBytes);
      environ_unreadable = !text.ok();
      environ = text.ok() ? *std::move(text) : std::string();
    }
    return *environ;
  };
  if (!service.has_value()) {
    if (executable.empty()) return false;  // kernel thread, or not ours to read
    ProcessIdentity identity{executable, command_line, std::nullopt};
    bool empty_environment = false;
    if (matcher_.uses_env_var()) {
      // Unreadable environments (other users' processes without privileges) just do not match.
      const std::string& env = read_environ();
      identity.env_service = FindEnvironValue(env, kServiceEnvVar);
      empty_environment = env.empty() && !environ_unreadable;
    }
    service = matcher_.Match(identity);
    if (!service.has_value()) {
      if (settled != nullptr) *settled = !command_line.empty() && !empty_environment;
      return false;
    }
  }
  absl::StatusOr<std::vector<pid_t>> threads = ListThreads(pid);
  if (!threads.ok() || threads->empty()) return false;  // exited meanwhile
  out->pid = pid;
  out->start_time = start_time;
  out->executable = executable;
  out->command_line = std::move(command_line);
  out->comm = ReadComm(pid).value_or("");
  out->service = std::move(*service);
  out->threads = std::move(*threads);
  out->environment.clear();
  const std::string& env = read_environ();
  for (std::string_view name : kLabelEnvVars) {
    std::optional<std::string> value = FindEnvironValue(env, name);
    if (value && value->size() <= kMaxEnvValueBytes) {
      out->environment.emplace_back(std::string(name), std::move(*value));
    }
  }
  return true;
}

absl::StatusOr<ProcessChanges> ProcessTracker::Rescan() {
  absl::StatusOr<std::vector<pid_t>> pids = ListProcesses();
  if (!pids.ok()) return pids.status();
  const pid_t self = getpid();
  ProcessChanges changes;
  retry_.clear();  // this scan looks at every process
  scan_ns_ = MonotonicNs();
  read_ns_.clear();  // older than scan_ns_
  absl::flat_hash_set<pid_t> alive;
  alive.reserve(pids->size());

  for (pid_t pid : *pids) {
    if (options_.exclude_self && pid == self) continue;
    if (!MayBeTarget(pid)) continue;
    ++processes_read_;
    absl::StatusOr<uint64_t> start_time = ReadStartTime(pid);
    if (!start_time.ok()) continue;  // exited between listing and reading
    alive.insert(pid);
    // Kernel threads and processes we may not inspect have no readable executable.
    std::string executable = ReadExecutable(pid).value_or("");
    const bool reevaluate = reevaluate_.erase(pid) > 0;

    if (auto it = targets_.find(pid); it != targets_.end()) {
      TrackedProcess& known = it->second;
      if (known.start_time == *start_time && known.executable == executable) {
        TrackedProcess fresh;
        if (reevaluate) {
          if (!Evaluate(pid, *start_time, executable, &fresh) ||
              fresh.service != known.service) {
            changes.removed.push_back(std::move(known));
            targets_.erase(it);
            if (!fresh.threads.empty()) {
              changes.added.push_back(fresh);
              targets_.emplace(pid, std::move(fresh));
            } else {
              ignored_[pid] = Seen{*start_time, executable};
            }
            continue;
          }
        }
        absl::StatusOr<std::vector<pid_t>> threads = ListThreads(pid);
        if (!threads.ok()) continue;  // exiting; the next scan reports it
        AppendDifference(pid, *threads, known.threads, &changes.threads_added);
        AppendDifference(pid, known.threads, *threads, &changes.threads_removed);
        known.threads = std::move(*threads);
        continue;
      }
      // Exec (new executable) or pid reuse (new start time): the old process is gone.
      changes.removed.push_back(std::move(known));
      targets_.erase(it);
    } else if (auto seen = ignored_.find(pid);
               !reevaluate && seen != ignored_.end() &&
               seen->second.start_time == *start_time && seen->second.executable == executable) {
      continue;
    }

    TrackedProcess process;
    bool settled = true;
    if (Evaluate(pid, *start_time, executable, &process, &settled)) {
      ignored_.erase(pid);
      changes.added.push_back(process);
      targets_.emplace(pid, std::move(process));
    } else if (settled) {
      ignored_[pid] = Seen{*start_time, std::move(executable)};
    } else {
      ignored_.erase(pid);  // mid-exec: decide on a later scan
      retry_.try_emplace(pid, 0);
    }
  }

  for (auto it = targets_.begin(); it != targets_.end();) {
    if (alive.contains(it->first)) {
      ++it;
      continue;
    }
    changes.removed.push_back(std::move(it->second));
    targets_.erase(it++);
  }
  absl::erase_if(ignored_, [&](const auto& entry) { return !alive.contains(entry.first); });
  // A pin lasts as long as its process.
  absl::erase_if(pinned_, [&](const auto& entry) { return !alive.contains(entry.first); });
  absl::erase_if(pinned_start_, [&](const auto& entry) { return !alive.contains(entry.first); });
  reevaluate_.clear();
  scanned_ = true;
  return changes;
}

void ProcessTracker::Forget(pid_t pid, ProcessChanges* changes) {
  if (auto it = targets_.find(pid); it != targets_.end()) {
    changes->removed.push_back(std::move(it->second));
    targets_.erase(it);
  }
  ignored_.erase(pid);
  pinned_.erase(pid);  // a pin lasts as long as its process
  pinned_start_.erase(pid);
  retry_.erase(pid);
  read_ns_.erase(pid);
}

std::optional<std::vector<pid_t>> ProcessTracker::PidsOfInterest() const {
  if (!matcher_.matches_nothing()) return std::nullopt;
  std::vector<pid_t> pids;
  pids.reserve(pinned_.size() + targets_.size());
  for (const auto& [pid, service] : pinned_) pids.push_back(pid);
  for (const auto& [pid, process] : targets_) pids.push_back(pid);
  std::sort(pids.begin(), pids.end());
  pids.erase(std::unique(pids.begin(), pids.end()), pids.end());
  return pids;
}

bool ProcessTracker::MayBeTarget(pid_t pid) const {
  return !matcher_.matches_nothing() || pinned_.contains(pid) || targets_.contains(pid);
}

void ProcessTracker::Refresh(pid_t pid, uint64_t exec_ns, ProcessChanges* changes,
                             absl::flat_hash_set<pid_t>* listed) {
  ++processes_read_;
  // An exec that happened before the process was last evaluated is in that evaluation already
  // (e.g. its fork event came first and the read found the new image): not news.
  bool exec = exec_ns != 0;
  if (exec && exec_ns != kUnknownTime && compare_timestamps_) {
    uint64_t last_read = scan_ns_;
    if (auto it = read_ns_.find(pid); it != read_ns_.end()) {
      last_read = std::max(last_read, it->second);
    }
    exec = exec_ns >= last_read;
  }
  const bool reevaluate = (reevaluate_.erase(pid) > 0) || exec;
  const uint64_t now = MonotonicNs();  // before reading: what happens later is news
  std::optional<uint64_t> start_time = ReadLiveStartTime(pid);
  if (!start_time.has_value()) {
    Forget(pid, changes);
    return;
  }
  std::string executable = ReadExecutable(pid).value_or("");

  if (auto it = targets_.find(pid); it != targets_.end()) {
    TrackedProcess& known = it->second;
    if (known.start_time == *start_time && known.executable == executable) {
      if (!reevaluate) return;  // the batch's thread events say what changed
      // A pin changed, or an exec that may be the one the last read already saw: /proc
      // shows the new image before the kernel stamps its exec event, so a read can fall in
      // between. As in Rescan(), the service decides whether it stays a target; after an
      // exec, a new command line too.
      read_ns_[pid] = now;
      TrackedProcess fresh;
      if (Evaluate(pid, *start_time, executable, &fresh) && fresh.service == known.service &&
          (!exec || fresh.command_line == known.command_line)) {
        AppendDifference(pid, fresh.threads, known.threads, &changes->threads_added);
        AppendDifference(pid, known.threads, fresh.threads, &changes->threads_removed);
        known.threads = std::move(fresh.threads);
        listed->insert(pid);
        return;
      }
      changes->removed.push_back(std::move(known));
      targets_.erase(it);
      if (!fresh.threads.empty()) {
        changes->added.push_back(fresh);
        targets_.emplace(pid, std::move(fresh));
        listed->insert(pid);
      } else {
        ignored_[pid] = Seen{*start_time, std::move(executable)};
      }
      return;
    }
    // Exec or pid reuse: the old process is gone.
    changes->removed.push_back(std::move(known));
    targets_.erase(it);
  } else if (auto seen = ignored_.find(pid);
             !reevaluate && seen != ignored_.end() && seen->second.start_time == *start_time &&
             seen->second.executable == executable) {
    return;
  }

  read_ns_[pid] = now;
  TrackedProcess process;
  bool settled = true;
  if (Evaluate(pid, *start_time, executable, &process, &settled)) {
    ignored_.erase(pid);
    retry_.erase(pid);
    changes->added.push_back(process);
    targets_.emplace(pid, std::move(process));
    listed->insert(pid);
  } else if (settled || ++retry_[pid] > kMaxRetries) {
    ignored_[pid] = Seen{*start_time, std::move(executable)};
    retry_.erase(pid);
  } else {
    ignored_.erase(pid);  // mid-exec: looked at again by the next Update()
  }
}

absl::StatusOr<ProcessChanges> ProcessTracker::Update(const ProcessEventBatch& events) {
  if (events.overflowed || !scanned_) return Rescan();
  const pid_t self = getpid();

  // Processes to read once the whole batch is known, and thread changes of targets. Reading
  // /proc only after the batch makes the order of its events irrelevant for processes (the
  // kernel may queue a child's exec or exit before its fork): what /proc shows now decides.
  // Thread events are netted: a thread that started and exited in the batch is no change.
  absl::flat_hash_map<pid_t, uint64_t> touched;  // pid -> newest exec time, 0 if none
  struct ThreadDelta {
    absl::flat_hash_set<pid_t> started;
    absl::flat_hash_set<pid_t> exited;
  };
  absl::flat_hash_map<pid_t, ThreadDelta> threads;
  for (const ProcessEvent& event : events.events) {
    if (options_.exclude_self && event.pid == self) continue;
    switch (event.type) {
      case ProcessEventType::kProcessStarted:
        if (MayBeTarget(event.pid)) touched.try_emplace(event.pid, 0);
        break;
      case ProcessEventType::kExec: {
        if (!MayBeTarget(event.pid)) break;
        uint64_t& exec_ns = touched[event.pid];
        exec_ns = std::max(exec_ns, event.timestamp_ns == 0 ? kUnknownTime : event.timestamp_ns);
        break;
      }
      case ProcessEventType::kProcessExited:
        // Processes never seen (e.g. started and gone between two scans) need no read.
        if (touched.contains(event.pid) || targets_.contains(event.pid) ||
            ignored_.contains(event.pid) || pinned_.contains(event.pid) ||
            retry_.contains(event.pid)) {
          touched.try_emplace(event.pid, 0);
        }
        break;
      case ProcessEventType::kThreadStarted:
        if (targets_.contains(event.pid)) threads[event.pid].started.insert(event.tid);
        break;
      case ProcessEventType::kThreadExited:
        if (targets_.contains(event.pid)) {
          ThreadDelta& delta = threads[event.pid];
          if (delta.started.erase(event.tid) == 0) delta.exited.insert(event.tid);
        }
        break;
    }
  }
  for (pid_t pid : reevaluate_) touched.try_emplace(pid, 0);
  for (const auto& [pid, count] : retry_) touched.try_emplace(pid, 0);
  if (options_.exclude_self) touched.erase(self);

  // Ascending pids, as Rescan() reports them.
  std::vector<std::pair<pid_t, uint64_t>> order(touched.begin(), touched.end());
  std::sort(order.begin(), order.end());
  ProcessChanges changes;
  absl::flat_hash_set<pid_t> listed;
  for (const auto& [pid, exec_ns] : order) Refresh(pid, exec_ns, &changes, &listed);
  reevaluate_.clear();

  std::vector<pid_t> thread_pids;
  for (const auto& [pid, delta] : threads) thread_pids.push_back(pid);
  std::sort(thread_pids.begin(), thread_pids.end());
  for (pid_t pid : thread_pids) {
    auto it = targets_.find(pid);
    if (it == targets_.end() || listed.contains(pid)) continue;
    std::vector<pid_t>& known = it->second.threads;  // ascending
    ThreadDelta& delta = threads[pid];
    std::vector<pid_t> exited(delta.exited.begin(), delta.exited.end());
    std::sort(exited.begin(), exited.end());
    for (pid_t tid : exited) {
      auto at = std::lower_bound(known.begin(), known.end(), tid);
      if (at == known.end() || *at != tid) continue;  // already gone when the target was read
      known.erase(at);
      changes.threads_removed.push_back(ThreadRef{pid, tid});
    }
    std::vector<pid_t> started(delta.started.begin(), delta.started.end());
    std::sort(started.begin(), started.end());
    for (pid_t tid : started) {
      auto at = std::lower_bound(known.begin(), known.end(), tid);
      if (at != known.end() && *at == tid) continue;  // listed when the target was read
      // Its exit may have been queued before its start, or be on its way: only a thread that
      // still exists is added (its exit event then follows).
      if (!ThreadExists(pid, tid)) continue;
      known.insert(at, tid);
      changes.threads_added.push_back(ThreadRef{pid, tid});
    }
  }
  return changes;
}

}  // namespace strata::agent::procfs
