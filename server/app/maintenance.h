// strata-server's maintenance commands, run instead of serving: backup and restore of a data
// directory, hash-token for the tokens file, forget-node for a cluster. They share --data and
// the etcd flags with serving (ServerOptions).
#ifndef STRATA_SERVER_APP_MAINTENANCE_H_
#define STRATA_SERVER_APP_MAINTENANCE_H_

#include <cstdint>
#include <optional>
#include <string>

#include "CLI/CLI.hpp"
#include "server/app/server_options.h"

namespace strata::server::app {

class MaintenanceCommands {
 public:
  // Adds the commands to `app`, their shared flags bound to `options`; both must outlive
  // the parse and Run().
  MaintenanceCommands(CLI::App& app, ServerOptions& options);
  MaintenanceCommands(const MaintenanceCommands&) = delete;
  MaintenanceCommands& operator=(const MaintenanceCommands&) = delete;

  // After parsing: runs the command given, if any, and returns its exit status; nullopt to
  // serve.
  std::optional<int> Run();

 private:
  int Backup();
  int Restore();
  int HashToken();
  int ForgetNode();

  ServerOptions& options_;
  CLI::App* backup_ = nullptr;
  CLI::App* restore_ = nullptr;
  CLI::App* hash_token_ = nullptr;
  CLI::App* forget_node_ = nullptr;
  std::string backup_to_, restore_from_;
  uint32_t backup_keep_ = 7;
  std::string hash_name_ = "NAME", hash_role_ = "reader";
  std::string forgotten_node_;  // forget-node's node ID
};

}  // namespace strata::server::app

#endif  // STRATA_SERVER_APP_MAINTENANCE_H_
