// strata-server's flags: their names, defaults and help texts (AddServeFlags), and the checks
// that turn them into ServerOptions (ServerOptionsFromFlags). Every flag of the server is
// defined here; the maintenance commands (maintenance.h) share --data and the etcd flags.
#ifndef STRATA_SERVER_APP_SERVER_FLAGS_H_
#define STRATA_SERVER_APP_SERVER_FLAGS_H_

#include <string>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/rpc/client_security.h"
#include "server/app/server_options.h"

namespace strata::server::app {

// What CLI11 fills in. Values that need no parsing go straight into `options`; sizes,
// durations and the certificate role stay texts (as written, for --help and config files)
// until ServerOptionsFromFlags parses them.
struct ServerFlags {
  ServerFlags();  // --debuginfod-urls defaults to $DEBUGINFOD_URLS

  ServerOptions options;
  std::string certificate_role = "agent";
  std::string table_memory = "512MiB";
  std::string session_memory = "2GiB";
  std::string max_message = "16MiB";
  std::string max_debuginfo = "2GiB";
  std::string capture_retention = "7d";
  std::string max_capture_duration = "1h";
  std::string raw_retention = "7d", minute_retention = "30d", hour_retention = "365d";
  std::string graph_retention = "7d";
  std::string query_warmup = "7d";
  std::string cluster_lease_ttl = "10s", cluster_query_timeout = "10s",
              cluster_replica_timeout = "5s", cluster_debuginfo_sync = "30s";
  std::string regression_interval = "60s", regression_window = "30m",
              regression_lookback = "1h", regression_phase_unit = "1m";
};

// Adds the serving flags to `app`, bound to `flags` (which must outlive the parse).
void AddServeFlags(CLI::App& app, ServerFlags& flags);

// How a node (or forget-node) reaches etcd over TLS: --cluster-etcd-ca, -cert and -key.
void AddEtcdTlsFlags(CLI::App& app, rpc::ClientSecurityOptions& etcd);

// The options the parsed flags give, with the defaults that follow from other flags filled
// in; InvalidArgument (or FailedPrecondition for a server exposed to other machines without
// TLS and authentication) with a message for the operator naming the flags. Reads no files:
// ServerApp::Create loads what the options name.
absl::StatusOr<ServerOptions> ServerOptionsFromFlags(const ServerFlags& flags);

// Checks --cluster-etcd-ca, -cert and -key, and gives etcd the certificate this node shows
// the other nodes (`node`) unless another was named.
absl::Status ResolveEtcdTls(rpc::ClientSecurityOptions& etcd,
                            const rpc::ClientSecurityOptions& node);

}  // namespace strata::server::app

#endif  // STRATA_SERVER_APP_SERVER_FLAGS_H_
