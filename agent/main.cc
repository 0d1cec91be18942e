// strata-agent: profiles the processes of this host that match its rules and ships their
// calling contexts to strata-server. The flags and the components live in agent/app; this
// file parses and runs.
//
//   strata-agent --server HOST:PORT[,HOST:PORT...] [--pid PID]... [--service NAME=REGEX]...
//                [--frequency HZ] [--interval SECONDS] [--unwind-verify full|boundary|off]
//                [--capture-cpu-budget PERCENT]
//                [--sampling per-cpu|per-thread] [--inproc auto|on|off] [--inproc-dir DIR]
//                [--kernel-stacks auto|on|off] [--off-cpu] [--off-cpu-threshold-us US]
//                [--python-frames on|off] [--python-read-period-ms MS]
//                [--jvm-perf-map SERVICE|*]... [--jvm-perf-map-period SECONDS]
//                [--spool-dir DIR] [--spool-max-bytes SIZE]
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "agent/app/agent_app.h"
#include "agent/app/agent_flags.h"
#include "common/base/config_file.h"
#include "spdlog/spdlog.h"

namespace {

namespace app = strata::agent::app;

std::atomic<bool> g_stop{false};
// The profiler's wake-up descriptor: the main loop may sleep until the next interval, and the
// signal may be delivered to another thread.
std::atomic<int> g_wake_fd{-1};
void OnSignal(int) {
  g_stop.store(true);
  const uint64_t one = 1;
  const int fd = g_wake_fd.load();
  if (fd >= 0) (void)!write(fd, &one, sizeof(one));
}

sigset_t StopSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  return set;
}

// SIGINT and SIGTERM stop the agent as at the end of a run (the last window shipped) from the
// start on. A run that executed itself again blocked them first (see Run): one sent meanwhile
// waited, and arrives now that it is handled.
void HandleStopSignals() {
  struct sigaction sa = {};
  sa.sa_handler = OnSignal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  const sigset_t stop = StopSignals();
  pthread_sigmask(SIG_UNBLOCK, &stop, nullptr);
}

// Prints `status` for the operator and returns `exit_status`.
int Fail(const absl::Status& status, int exit_status) {
  std::fprintf(stderr, "strata-agent: %s\n", std::string(status.message()).c_str());
  return exit_status;
}

int Run(int argc, char** argv) {
  HandleStopSignals();
  CLI::App cli{"strata-agent: continuous profiling agent"};
  app::AgentFlags flags;
  app::AddAgentFlags(cli, flags);
  strata::base::AddConfigFile(cli);
  CLI11_PARSE(cli, argc, argv);
  spdlog::set_level(spdlog::level::from_str(flags.log_level));

  // Flags that do not fit together, and credentials that do not load, exit with status 2;
  // what cannot be opened at start (the spool, perf events), with status 1.
  absl::StatusOr<app::AgentOptions> options = app::AgentOptionsFromFlags(flags);
  if (!options.ok()) return Fail(options.status(), 2);
  absl::StatusOr<std::unique_ptr<app::AgentApp>> agent = app::AgentApp::Create(*options);
  if (!agent.ok()) return Fail(agent.status(), 2);
  if (absl::Status started = (*agent)->Start(); !started.ok()) return Fail(started, 1);

  g_wake_fd.store((*agent)->wake_fd());
  const int status = (*agent)->Run(g_stop);
  if (status != app::AgentApp::kRunAgain) return status;
  // A new call graph: the same program and flags again, in this process. The descriptors
  // (perf events, the spool's lock) close on exec. Where exec fails, the exit status asks a
  // supervisor (systemd's Restart=) for the restart. The stop signals stay blocked through
  // the exec (the mask is kept), so that one sent before the new run handles them is not
  // fatal.
  g_wake_fd.store(-1);
  agent->reset();
  const sigset_t stop = StopSignals();
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  if (g_stop.load()) return 0;  // asked to stop meanwhile
  spdlog::default_logger()->flush();
  execv("/proc/self/exe", argv);
  return Fail(absl::ErrnoToStatus(errno, "cannot start again (exec /proc/self/exe)"), status);
}

}  // namespace

int main(int argc, char** argv) {
  // Debian's Abseil checks every Mutex acquisition for lock-order cycles, a debugging aid
  // that showed as 2-3 % of the agent's CPU.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  return Run(argc, argv);
}
