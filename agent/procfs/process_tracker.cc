#include "agent/procfs/process_tracker.h"

#include <unistd.h>

#include <algorithm>
#include <iterator>
#include <utility>

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

}  // namespace

ProcessTracker::ProcessTracker(ServiceMatcher matcher)
    : ProcessTracker(std::move(matcher), Options()) {}

ProcessTracker::ProcessTracker(ServiceMatcher matcher, Options options)
    : matcher_(std::move(matcher)), options_(options) {}

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
  absl::flat_hash_set<pid_t> alive;
  alive.reserve(pids->size());

  for (pid_t pid : *pids) {
    if (options_.exclude_self && pid == self) continue;
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
  return changes;
}

}  // namespace strata::agent::procfs
