// strata-agent's components, built and wired from AgentOptions: the spool (and the identity
// and call graph it resumes), the profiler, the shipper, the capture controller and the
// interval loop that drives them.
//
// AgentApp owns every component. They are members declared in the order they are built, so
// they are destroyed in the reverse order: each borrows only components declared before it.
// Create() loads what the options name (credentials); Start() opens the spool and the
// profiler's sources and starts shipping; Run() profiles until told to stop, then ships the
// last window and waits (a bounded time) for the server's acknowledgements.
#ifndef STRATA_AGENT_APP_AGENT_APP_H_
#define STRATA_AGENT_APP_AGENT_APP_H_

#include <atomic>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "agent/app/agent_options.h"
#include "agent/core/capture_controller.h"
#include "agent/core/context_graph.h"
#include "agent/core/profiler.h"
#include "agent/core/shipper.h"
#include "agent/spool/spool.h"

namespace strata::agent::app {

// The ID of an agent started without --agent-id: "<host>-<8 hex digits>", the digits a
// checksum of the boot ID, this process's PID namespace, pid and start time. A process keeps
// it when it executes itself again for a new call graph (the server sees one agent, a new
// incarnation); another process, or the same pid after a reboot, gets another. Random digits
// where /proc does not say.
std::string GeneratedAgentId(const std::string& host);

class AgentApp {
 public:
  // An error is the operator's: credentials that do not load.
  static absl::StatusOr<std::unique_ptr<AgentApp>> Create(AgentOptions options);
  ~AgentApp();
  AgentApp(const AgentApp&) = delete;
  AgentApp& operator=(const AgentApp&) = delete;

  // An error is the host's: a spool that cannot be opened, perf events refused.
  absl::Status Start();
  // Ends Run()'s current wait early (after Start()). Async-signal-safe: a signal handler
  // may write to this descriptor instead.
  int wake_fd() const { return profiler_->wake_fd(); }
  // Profiles until `stop` is set, then flushes. Returns the process's exit status, or
  // kRunAgain when the agent should start again with a new call graph (IntervalLoop::
  // new_graph_due): its spool is empty then, so the next start is a new incarnation.
  int Run(const std::atomic<bool>& stop);
  static constexpr int kRunAgain = 75;  // EX_TEMPFAIL, should the restart be left to systemd

 private:
  explicit AgentApp(AgentOptions options);

  AgentOptions options_;
  std::unique_ptr<spool::Spool> spool_;
  std::unique_ptr<ContextGraph> graph_;  // the spool's: restored from it, or new
  spool::SpoolRecovery recovery_;
  std::unique_ptr<Profiler> profiler_;
  std::unique_ptr<Shipper> shipper_;
  std::unique_ptr<CaptureController> captures_;
};

}  // namespace strata::agent::app

#endif  // STRATA_AGENT_APP_AGENT_APP_H_
