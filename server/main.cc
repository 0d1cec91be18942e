// strata-server: receives agent streams, stores profiles in an embedded RocksDB directory and
// answers queries (gRPC, plus HTTP for /healthz, /metrics and the JSON mirror). The flags and
// the components live in server/app; this file parses and runs.
#include <cstdio>
#include <optional>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/base/config_file.h"
#include "common/base/process_memory.h"
#include "server/app/maintenance.h"
#include "server/app/server_app.h"
#include "server/app/server_flags.h"
#include "spdlog/spdlog.h"

namespace {

namespace app = strata::server::app;

// Prints `status` for the operator and returns `exit_status`.
int Fail(const absl::Status& status, int exit_status) {
  std::fprintf(stderr, "strata-server: %s\n", std::string(status.message()).c_str());
  return exit_status;
}

int Run(int argc, char** argv) {
  CLI::App cli{"strata-server: continuous profiling server"};
  app::ServerFlags flags;
  app::AddServeFlags(cli, flags);
  app::MaintenanceCommands maintenance(cli, flags.options);
  cli.require_subcommand(0, 1);
  strata::base::AddConfigFile(cli);
  CLI11_PARSE(cli, argc, argv);
  if (std::optional<int> status = maintenance.Run()) return *status;

  // Flags that do not fit together, and files that do not load, exit with status 2; what
  // cannot be opened or bound at start, with status 1.
  absl::StatusOr<app::ServerOptions> options = app::ServerOptionsFromFlags(flags);
  if (!options.ok()) return Fail(options.status(), 2);
  spdlog::set_level(spdlog::level::from_str(options->log_level));
  absl::StatusOr<std::unique_ptr<app::ServerApp>> server = app::ServerApp::Create(*options);
  if (!server.ok()) return Fail(server.status(), 2);
  if (absl::Status started = (*server)->Start(); !started.ok()) return Fail(started, 1);
  return (*server)->Run();
}

}  // namespace

int main(int argc, char** argv) {
  // Debian's Abseil checks every Mutex acquisition for lock-order cycles, a debugging aid
  // that costs every ingest worker on every batch (as in the agent).
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  // A query builds and drops tens of megabytes: the next one reuses them rather than fault
  // in fresh pages (process_memory.h).
  if (absl::Status kept = strata::base::RetainFreedMemory(); !kept.ok()) {
    spdlog::warn("freed memory goes back to the kernel at once: {}", kept.ToString());
  }
  return Run(argc, argv);
}
