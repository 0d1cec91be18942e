// strata-server: receives agent streams, stores profiles in an embedded RocksDB directory and
// answers queries (gRPC, plus HTTP for /healthz, /metrics and the JSON mirror).
#include <signal.h>
#include <sys/resource.h>

#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <tuple>

#include <grpcpp/grpcpp.h>

#include "CLI/CLI.hpp"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/base/byte_size.h"
#include "common/base/config_file.h"
#include "server/capture/capture_service.h"
#include "server/cluster/fanout.h"
#include "server/cluster/membership.h"
#include "server/cluster/replication.h"
#include "common/base/duration.h"
#include "common/rpc/client_security.h"
#include "server/aggregate/window_aggregator.h"
#include "server/auth/authorizer.h"
#include "server/auth/tls_credentials.h"
#include "server/http/http_server.h"
#include "server/ingest/ingest_service.h"
#include "server/query/query_service.h"
#include "server/server_metrics.h"
#include "server/store/backup.h"
#include "server/store/store.h"
#include "server/symbolize/debuginfo_service.h"
#include "server/symbolize/debuginfo_store.h"
#include "server/symbolize/symbolizer.h"
#include "spdlog/spdlog.h"

namespace {

namespace auth = strata::server::auth;

std::string DebuginfodUrlsFromEnvironment() {
  const char* urls = std::getenv("DEBUGINFOD_URLS");
  return urls == nullptr ? std::string() : std::string(urls);
}

// Every flag of `strata-server` (serving) and of its maintenance commands.
struct ServerFlags {
  // Loopback by default: a server reachable from elsewhere needs TLS and authentication (or an
  // explicit --insecure), see CheckExposure.
  std::string listen = "127.0.0.1:7070";
  std::string http = "127.0.0.1:7071";
  std::string data = "./var/strata";
  std::string log_level = "info";
  bool sync = false;
  std::string capture_retention = "7d";
  std::string raw_retention = "7d", minute_retention = "30d", hour_retention = "365d";
  strata::server::aggregate::AggregatorOptions aggregation;
  auth::ServerTlsFiles tls;
  auth::AuthorizerOptions auth_options;
  bool insecure = false, metrics_open = false;
  std::string certificate_role = "agent";
  std::string table_memory = "512MiB";
  std::string session_memory = "2GiB";
  std::string max_message = "16MiB";
  strata::server::ingest::IngestLimits limits;
  int http_max_connections = 1024;
  uint32_t max_agents = 20'000;
  uint32_t max_streams_per_principal = 16;
  uint32_t max_capture_hz = 1000;
  std::string max_capture_duration = "1h";
  uint32_t ingest_threads = 0;
  // Debug information for frames the agents could not name (server/symbolize).
  std::vector<std::string> debug_dirs = {"/usr/lib/debug"};
  std::string debuginfod_urls = DebuginfodUrlsFromEnvironment();
  uint32_t debuginfod_timeout_s = 10;
  std::string max_debuginfo = "2GiB";
  // Maintenance commands.
  std::string backup_to, restore_from;
  uint32_t backup_keep = 7;
  std::string hash_name = "NAME", hash_role = "reader";
  std::string forget_node;  // forget-node's node ID
  // Cluster (server/cluster): off without --cluster-etcd.
  std::string cluster_etcd, node_id, advertise, cluster_prefix = "/strata";
  uint32_t replication_factor = 2;
  uint32_t cluster_tokens = strata::server::cluster::kDefaultTokens;
  std::string cluster_lease_ttl = "10s", cluster_query_timeout = "10s",
              cluster_replica_timeout = "5s", cluster_debuginfo_sync = "30s";
  // How this node calls the other nodes, and etcd (BuildNodeSecurity).
  strata::rpc::ClientSecurityOptions node_client, etcd_client;
};

// What the flags' texts mean, checked: sizes, durations and retention periods.
struct ServeSettings {
  absl::Duration cluster_lease_ttl, cluster_query_timeout, cluster_replica_timeout,
      cluster_debuginfo_sync;
  uint64_t session_bytes = 0;
  uint64_t max_debuginfo_bytes = 0;
  absl::Duration capture_retention;
  absl::Duration max_capture_duration;
  strata::server::store::StoreOptions store;
};

// How a node (or forget-node) reaches etcd over TLS: --cluster-etcd-ca/-cert/-key.
void AddEtcdTlsFlags(CLI::App& app, strata::rpc::ClientSecurityOptions& etcd) {
  app.add_option("--cluster-etcd-ca", etcd.ca_file,
                 "PEM CA of etcd's certificate: reach etcd over TLS (https:// endpoints)");
  app.add_option("--cluster-etcd-cert", etcd.cert_file,
                 "client certificate presented to etcd, for its --client-cert-auth (a node's "
                 "default: the certificate it presents to the other nodes)");
  app.add_option("--cluster-etcd-key", etcd.key_file, "PEM private key of --cluster-etcd-cert");
}

void AddServeFlags(CLI::App& app, ServerFlags& f) {
  app.add_option("--listen", f.listen, "gRPC address for agents and clients (host:port)");
  app.add_option("--http", f.http, "HTTP address for /healthz, /metrics and the UI; empty: off")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("--data", f.data, "RocksDB data directory (created if missing)");
  app.add_option("--tls-cert", f.tls.cert_file,
                 "PEM certificate (chain) of the server: TLS 1.2+ on the gRPC and HTTP "
                 "listeners; re-read when the file changes");
  app.add_option("--tls-key", f.tls.key_file, "PEM private key of --tls-cert");
  app.add_option("--tls-client-ca", f.tls.client_ca_file,
                 "PEM CA of client certificates: agents (and people) present certificates that "
                 "chain to it; a certificate's identity is its first DNS name, else its CN");
  app.add_option("--tls-client-role", f.certificate_role,
                 "role of a client certificate the tokens file does not list: agent, reader, "
                 "operator, or none (only listed certificates)")
      ->check(CLI::IsMember({"agent", "reader", "operator", "none"}))
      ->capture_default_str();
  app.add_option("--auth-file", f.auth_options.auth_file,
                 "tokens file: bearer tokens (hashed) and client certificates with their roles "
                 "(agent, reader, operator, node); re-read when it changes")
      ->check(CLI::ExistingFile);
  app.add_flag("--insecure", f.insecure,
               "allow listening on a non-loopback address without TLS and authentication");
  app.add_flag("--metrics-open", f.metrics_open, "serve /metrics without authentication");
  app.add_option("--query-rate", f.auth_options.query_rate,
                 "query requests per second per principal (gRPC and /api/v1; 0: unlimited)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--query-burst", f.auth_options.query_burst,
                 "query requests a principal may make at once above --query-rate")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--sync", f.sync, "fsync the write-ahead log on every batch");
  app.add_option("--log-level", f.log_level, "trace|debug|info|warn|error");
  app.add_option("--capture-retention", f.capture_retention,
                 "keep ad hoc captures this long after they end (e.g. 7d, 12h; 0: forever)")
      ->capture_default_str();
  app.add_option("--retention-raw", f.raw_retention, "keep 10 s windows this long (0: forever)")
      ->capture_default_str();
  app.add_option("--retention-minute", f.minute_retention,
                 "keep the 1-minute rollups this long (0: forever)")
      ->capture_default_str();
  app.add_option("--retention-hour", f.hour_retention,
                 "keep the 1-hour rollups this long (0: forever)")
      ->capture_default_str();
  app.add_option("--table-entries", f.aggregation.max_entries,
                 "distinct (host, stack) entries per service in the aggregation tables; a "
                 "fuller table is written early")
      ->capture_default_str()
      ->check(CLI::Range(1u, 1u << 24));
  app.add_option("--hot-threshold", f.aggregation.hot_threshold,
                 "samples per 10 s window that make a context hot (sorted first, ranked for "
                 "phase changes)")
      ->capture_default_str();
  app.add_option("--phase-factor", f.aggregation.phase_change_factor,
                 "how far apart two reordered hot contexts must be to report a phase change")
      ->capture_default_str()
      ->check(CLI::Range(2u, 1000000u));
  app.add_option("--session-memory", f.session_memory,
                 "memory for connected agents' call graphs and decode caches; past it, idle "
                 "graphs are dropped and reloaded from the store when needed")
      ->capture_default_str();
  app.add_option("--table-memory", f.table_memory,
                 "memory for all aggregation tables together; past it, batches of new services "
                 "are refused with RESOURCE_EXHAUSTED until idle tables are released")
      ->capture_default_str();
  app.add_option("--max-message-bytes", f.max_message, "largest gRPC message accepted")
      ->capture_default_str();
  app.add_option("--max-graph-nodes", f.limits.max_graph_nodes,
                 "functions in one agent's call graph")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--max-graph-edges", f.limits.max_graph_edges, "call edges in one agent's graph")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--max-batch-services", f.limits.max_batch_services,
                 "distinct services named by one sample batch")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--max-batch-contexts", f.limits.max_batch_contexts,
                 "distinct calling contexts in one sample batch")
      ->capture_default_str()
      ->check(CLI::Range(1u, 1u << 22));
  app.add_option("--max-batch-targets", f.limits.max_batch_targets,
                 "targets (processes) in one sample batch or heartbeat")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--max-sequence-gap", f.limits.max_sequence_gap,
                 "largest jump of an agent's batch sequence number that is accepted")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--max-label-sets", f.limits.max_label_sets,
                 "distinct target label sets per service; past it samples are stored under "
                 "strata_overflow=label_sets")
      ->capture_default_str()
      ->check(CLI::Range(1u, 10'000'000u));
  app.add_option("--http-max-connections", f.http_max_connections,
                 "HTTP connections open at once; more are closed when accepted")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--max-streams-per-principal", f.max_streams_per_principal,
                 "agent streams one authenticated principal (certificate or token) may hold")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--max-capture-hz", f.max_capture_hz,
                 "highest sampling rate a capture may ask of the agents")
      ->capture_default_str()
      ->check(CLI::Range(1u, 10000u));
  app.add_option("--max-capture-duration", f.max_capture_duration,
                 "longest capture a client may start (at most 1h)")
      ->capture_default_str();
  app.add_option("--max-agents", f.max_agents,
                 "agent streams held at once; more are refused with RESOURCE_EXHAUSTED and a "
                 "retry delay")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--cluster-etcd", f.cluster_etcd,
                 "etcd endpoints (http://HOST:2379, or https:// with --cluster-etcd-ca; "
                 "comma-separated): run as a node of a cluster whose membership lives there; "
                 "off: a single server");
  app.add_option("--node-id", f.node_id, "this node's ID in the cluster (stable across restarts)");
  app.add_option("--advertise", f.advertise,
                 "host:port agents and other nodes reach this node's gRPC at (default: --listen)");
  app.add_option("--replication-factor", f.replication_factor,
                 "nodes that hold each host's samples (a batch is acknowledged when all live "
                 "ones have it)")
      ->capture_default_str()
      ->check(CLI::Range(1u, 5u));
  app.add_option("--cluster-tokens", f.cluster_tokens, "virtual tokens of this node on the ring")
      ->capture_default_str()
      ->check(CLI::Range(1u, 4096u));
  app.add_option("--cluster-lease-ttl", f.cluster_lease_ttl,
                 "a node whose lease is not refreshed this long leaves the ring")
      ->capture_default_str();
  app.add_option("--cluster-prefix", f.cluster_prefix, "key prefix of this cluster in etcd")
      ->capture_default_str();
  app.add_option("--cluster-query-timeout", f.cluster_query_timeout,
                 "how long a fan-out query waits for a node before naming it unreachable")
      ->capture_default_str();
  app.add_option("--cluster-debuginfo-sync", f.cluster_debuginfo_sync,
                 "how often uploaded debug files are compared across the nodes and sent to "
                 "those that lack them (also soon after a node joins)")
      ->capture_default_str();
  app.add_option("--cluster-replica-timeout", f.cluster_replica_timeout,
                 "how long a batch waits for another owner's confirmation")
      ->capture_default_str();
  app.add_option("--cluster-tls-ca", f.node_client.ca_file,
                 "PEM CA of the other nodes' certificates: this node calls them over TLS "
                 "(required when the nodes serve TLS)");
  app.add_option("--cluster-tls-cert", f.node_client.cert_file,
                 "client certificate this node presents to the others (default: --tls-cert, "
                 "see deploy/gen-certs.sh --node)");
  app.add_option("--cluster-tls-key", f.node_client.key_file,
                 "PEM private key of --cluster-tls-cert (default: --tls-key)");
  app.add_option("--cluster-token-file", f.node_client.token_file,
                 "file whose first line is the bearer token this node presents to the others "
                 "(role node in their --auth-file)");
  AddEtcdTlsFlags(app, f.etcd_client);
  app.add_option("--ingest-threads", f.ingest_threads,
                 "threads that decode and commit agent batches (0: one per core)")
      ->capture_default_str();
  app.add_option("--debug-dirs", f.debug_dirs,
                 "directories of debug files by build ID (.build-id/ab/cdef.debug), searched "
                 "after uploads")
      ->capture_default_str();
  app.add_option("--debuginfod-urls", f.debuginfod_urls,
                 "debuginfod servers (space-separated) asked for debug files not found "
                 "locally; default $DEBUGINFOD_URLS")
      ->capture_default_str();
  app.add_option("--debuginfod-timeout", f.debuginfod_timeout_s,
                 "seconds a debuginfod server may take to start answering")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--max-debuginfo-bytes", f.max_debuginfo, "largest debug file accepted by upload")
      ->capture_default_str();
}

// Maintenance commands on a data directory or a token, instead of serving.
struct MaintenanceCommands {
  CLI::App* backup = nullptr;
  CLI::App* restore = nullptr;
  CLI::App* hash_token = nullptr;
  CLI::App* forget_node = nullptr;
};

MaintenanceCommands AddMaintenanceCommands(CLI::App& app, ServerFlags& f) {
  MaintenanceCommands m;
  CLI::App* backup = m.backup = app.add_subcommand(
      "backup", "copy the store in --data into a backup directory (incremental, checksummed; "
                "the server may keep running)");
  backup->add_option("--data", f.data, "the server's data directory")->capture_default_str();
  backup->add_option("--to", f.backup_to, "backup directory (created if missing)")->required();
  backup->add_option("--keep", f.backup_keep, "backups to keep there (0: all)")->capture_default_str();
  CLI::App* restore = m.restore = app.add_subcommand(
      "restore", "restore the latest backup into a new data directory (the server stopped)");
  restore->add_option("--from", f.restore_from, "backup directory")->required();
  restore->add_option("--data", f.data, "new data directory (must be empty or missing)")
      ->required();
  CLI::App* hash_token = m.hash_token = app.add_subcommand(
      "hash-token", "read a token on standard input and print the line of it for the tokens "
                    "file (the token itself is never stored)");
  hash_token->add_option("--name", f.hash_name, "principal name")->capture_default_str();
  hash_token->add_option("--role", f.hash_role, "agent, reader, operator or node")
      ->check(CLI::IsMember({"agent", "reader", "operator", "node"}))
      ->capture_default_str();
  CLI::App* forget = m.forget_node = app.add_subcommand(
      "forget-node", "remove a stopped node from a cluster for good: no node lists it as down "
                     "any more (a node that starts again with its ID joins as before)");
  forget->add_option("node", f.forget_node, "the node's --node-id")->required();
  forget->add_option("--cluster-etcd", f.cluster_etcd, "the cluster's etcd endpoints")
      ->required();
  forget->add_option("--cluster-prefix", f.cluster_prefix, "the cluster's key prefix in etcd")
      ->capture_default_str();
  AddEtcdTlsFlags(*forget, f.etcd_client);
  return m;
}

absl::StatusOr<strata::rpc::ClientSecurity> BuildEtcdSecurity(ServerFlags& f);

// Runs the maintenance command given, if any: its exit status, or nullopt to serve.
std::optional<int> RunMaintenance(const MaintenanceCommands& m, ServerFlags& f) {
  if (*m.forget_node) {
    auto security = BuildEtcdSecurity(f);
    if (!security.ok()) {
      std::fprintf(stderr, "strata-server forget-node: %s\n",
                   std::string(security.status().message()).c_str());
      return 2;
    }
    auto etcd = strata::server::cluster::EtcdClient::Create(
        f.cluster_etcd, {.call_timeout = absl::Seconds(10), .security = *std::move(security)});
    absl::Status forgotten =
        etcd.ok() ? strata::server::cluster::Membership::Forget(**etcd, f.cluster_prefix,
                                                                f.forget_node)
                  : etcd.status();
    if (!forgotten.ok()) {
      std::fprintf(stderr, "strata-server forget-node: %s\n",
                   std::string(forgotten.message()).c_str());
      return absl::IsInvalidArgument(forgotten) ? 2 : 1;
    }
    std::printf("node %s forgotten: no node lists it any more\n", f.forget_node.c_str());
    return 0;
  }
  if (*m.hash_token) {
    std::string token;
    std::getline(std::cin, token);
    while (!token.empty() && (token.back() == '\r' || token.back() == ' ')) token.pop_back();
    if (token.empty()) {
      std::fprintf(stderr, "strata-server hash-token: no token on standard input\n");
      return 2;
    }
    std::printf("token %s %s %s\n", f.hash_name.c_str(), f.hash_role.c_str(),
                auth::FormatTokenHash(auth::HashToken(token))
                    .c_str());
    return 0;
  }
  // Uploaded debug files live beside the store, by build ID: copied as files, not versioned.
  auto with_debug_files = [](absl::Status store, const std::string& from,
                             const std::string& to) -> absl::StatusOr<size_t> {
    if (!store.ok()) return store;
    absl::StatusOr<size_t> copied =
        strata::server::symbolize::CopyDebugFiles(from + "/debuginfo", to + "/debuginfo");
    if (!copied.ok()) {
      return absl::Status(copied.status().code(),
                          absl::StrCat("debug files: ", copied.status().message()));
    }
    return copied;
  };
  if (*m.backup) {
    strata::server::store::BackupInfo info;
    absl::StatusOr<size_t> debug_files = with_debug_files(
        strata::server::store::BackupStore(f.data, f.backup_to, f.backup_keep, &info), f.data,
        f.backup_to);
    if (!debug_files.ok()) {
      std::fprintf(stderr, "strata-server backup: %s\n",
                   std::string(debug_files.status().message()).c_str());
      return 1;
    }
    std::printf("backup %u of %s in %s: %llu bytes; %u backups kept; %zu debug files copied\n",
                info.backup_id, f.data.c_str(), f.backup_to.c_str(),
                static_cast<unsigned long long>(info.bytes), info.backups, *debug_files);
    return 0;
  }
  if (*m.restore) {
    absl::StatusOr<size_t> debug_files = with_debug_files(
        strata::server::store::RestoreStore(f.restore_from, f.data), f.restore_from, f.data);
    if (!debug_files.ok()) {
      std::fprintf(stderr, "strata-server restore: %s\n",
                   std::string(debug_files.status().message()).c_str());
      return 1;
    }
    std::printf("restored the latest backup of %s into %s (%zu debug files)\n",
                f.restore_from.c_str(), f.data.c_str(), *debug_files);
    return 0;
  }
  return std::nullopt;
}

// libdebuginfod reads its settings from the environment at every lookup: set them once,
// before any thread starts. Its cache goes under the data directory unless the operator
// chose one.
void ConfigureDebuginfod(const ServerFlags& f) {
  if (f.debuginfod_urls.empty()) {
    unsetenv("DEBUGINFOD_URLS");
    return;
  }
  setenv("DEBUGINFOD_URLS", f.debuginfod_urls.c_str(), 1);
  setenv("DEBUGINFOD_TIMEOUT", std::to_string(f.debuginfod_timeout_s).c_str(), 1);
  setenv("DEBUGINFOD_CACHE_PATH", (f.data + "/debuginfod-cache").c_str(), /*overwrite=*/0);
}

// Checks the flags whose texts need parsing; a message for the operator on failure.
absl::StatusOr<ServeSettings> CheckFlags(ServerFlags& f) {
  ServeSettings settings;
  uint64_t table_bytes = 0, message_bytes = 0;
  for (auto [flag, text, out] :
       {std::tuple{"--table-memory", &f.table_memory, &table_bytes},
        std::tuple{"--max-message-bytes", &f.max_message, &message_bytes},
        std::tuple{"--session-memory", &f.session_memory, &settings.session_bytes},
        std::tuple{"--max-debuginfo-bytes", &f.max_debuginfo, &settings.max_debuginfo_bytes}}) {
    auto bytes = strata::base::ParseByteSize(*text);
    if (!bytes.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(flag, ": ", bytes.status().message()));
    }
    *out = *bytes;
  }
  for (auto [flag, text, out] :
       {std::tuple{"--cluster-lease-ttl", &f.cluster_lease_ttl, &settings.cluster_lease_ttl},
        std::tuple{"--cluster-query-timeout", &f.cluster_query_timeout,
                   &settings.cluster_query_timeout},
        std::tuple{"--cluster-replica-timeout", &f.cluster_replica_timeout,
                   &settings.cluster_replica_timeout},
        std::tuple{"--cluster-debuginfo-sync", &f.cluster_debuginfo_sync,
                   &settings.cluster_debuginfo_sync}}) {
    auto ms = strata::base::ParseDuration(*text);
    if (!ms.ok() || *ms <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, ": '", *text, "' is not a positive duration (e.g. 10s)"));
    }
    *out = absl::Milliseconds(*ms);
  }
  if (!f.cluster_etcd.empty()) {
    if (f.node_id.empty()) return absl::InvalidArgumentError("--cluster-etcd needs --node-id");
    if (f.advertise.empty()) f.advertise = f.listen;
  }
  auto capture_duration = strata::server::capture::ParseRetention(f.max_capture_duration);
  if (!capture_duration.ok() || *capture_duration <= absl::ZeroDuration() ||
      *capture_duration > absl::Hours(1)) {
    return absl::InvalidArgumentError("--max-capture-duration must be between 1ms and 1h");
  }
  settings.max_capture_duration = *capture_duration;
  if (message_bytes < 4096 || message_bytes > (1u << 30)) {
    return absl::InvalidArgumentError("--max-message-bytes must be in [4KiB, 1GiB]");
  }
  f.aggregation.memory_budget_bytes = table_bytes;
  f.limits.max_message_bytes = static_cast<uint32_t>(message_bytes);
  auto retention = strata::server::capture::ParseRetention(f.capture_retention);
  if (!retention.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--capture-retention: ", retention.status().message()));
  }
  settings.capture_retention = *retention;
  // Retention per resolution, enforced when RocksDB compacts (see StoreOptions).
  settings.store.sync = f.sync;
  // Rollups are summed from the raw cells in the background, 30 s after each minute ends
  // (windows close about 10 s after theirs; later ones roll up at their commit).
  settings.store.rollup_interval_ms = 5'000;
  for (auto [flag, text, out] :
       {std::tuple{"--retention-raw", &f.raw_retention, &settings.store.raw_retention_ms},
        std::tuple{"--retention-minute", &f.minute_retention,
                   &settings.store.minute_retention_ms},
        std::tuple{"--retention-hour", &f.hour_retention, &settings.store.hour_retention_ms}}) {
    auto d = strata::server::capture::ParseRetention(*text);
    if (!d.ok()) return absl::InvalidArgumentError(absl::StrCat(flag, ": ", d.status().message()));
    *out = absl::ToInt64Milliseconds(*d);
  }
  return settings;
}

// Who may call, and over what.
struct Security {
  std::unique_ptr<auth::Authorizer> authorizer;
  std::shared_ptr<grpc::ServerCredentials> grpc_credentials;
  bool tls_on = false;
};

// Builds the authorizer and the gRPC credentials, and refuses a server reachable from other
// machines that anyone there could read, write or capture from.
absl::StatusOr<Security> BuildSecurity(ServerFlags& f) {
  Security security;
  security.tls_on = !f.tls.cert_file.empty() || !f.tls.key_file.empty();
  if (!security.tls_on && !f.tls.client_ca_file.empty()) {
    return absl::InvalidArgumentError("--tls-client-ca needs --tls-cert and --tls-key");
  }
  f.auth_options.client_certificates = !f.tls.client_ca_file.empty();
  if (f.certificate_role == "none") {
    f.auth_options.certificate_role.reset();
  } else {
    f.auth_options.certificate_role = auth::ParseRole(f.certificate_role);
  }
  auto authorizer = auth::Authorizer::Create(f.auth_options);
  if (!authorizer.ok()) return authorizer.status();
  security.authorizer = std::move(*authorizer);
  const bool auth_on = security.authorizer->enabled();
  for (const std::string* address : {&f.listen, &f.http}) {
    if (address->empty() || auth::IsLoopbackAddress(*address) || f.insecure) continue;
    if (!security.tls_on || !auth_on) {
      return absl::FailedPreconditionError(absl::StrCat(
          "refusing to listen on ", *address, " without ",
          !security.tls_on && !auth_on ? "TLS and authentication"
          : !security.tls_on           ? "TLS"
                                       : "authentication",
          ": give --tls-cert and --tls-key, and --auth-file or --tls-client-ca (see "
          "deploy/gen-certs.sh), or --insecure"));
    }
  }
  security.grpc_credentials = grpc::InsecureServerCredentials();
  if (security.tls_on) {
    auto credentials = auth::MakeServerCredentials(f.tls);
    if (!credentials.ok()) return credentials.status();
    security.grpc_credentials = *credentials;
  }
  return security;
}

// How a cluster node calls the other nodes: over TLS when the nodes serve it, and, when they
// authenticate their callers, as a principal of role node (a client certificate or a token).
// A node whose own tokens file does not give its token role node is refused at start: the
// other nodes, configured alike, would refuse every replica it sends.
struct NodeSecurity {
  strata::rpc::ClientSecurity nodes;  // calls to the other nodes
  strata::rpc::ClientSecurity etcd;   // calls to etcd
};

// How a cluster node reaches etcd: over TLS with --cluster-etcd-ca, presenting the node's own
// certificate unless --cluster-etcd-cert names another. The endpoints are checked against it
// here, by the etcd client's own rules, so a mismatch is a flag error at start.
absl::StatusOr<strata::rpc::ClientSecurity> BuildEtcdSecurity(ServerFlags& f) {
  strata::rpc::ClientSecurityOptions& etcd = f.etcd_client;
  if (etcd.ca_file.empty() && (!etcd.cert_file.empty() || !etcd.key_file.empty())) {
    return absl::InvalidArgumentError("--cluster-etcd-cert needs --cluster-etcd-ca");
  }
  if (!etcd.ca_file.empty() && etcd.cert_file.empty() && etcd.key_file.empty()) {
    etcd.cert_file = f.node_client.cert_file;
    etcd.key_file = f.node_client.key_file;
  }
  auto security = strata::rpc::ClientSecurity::Load(etcd);
  if (!security.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("etcd's TLS: ", security.status().message()));
  }
  if (auto client = strata::server::cluster::EtcdClient::Create(f.cluster_etcd,
                                                                {.security = *security});
      !client.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--cluster-etcd: ", client.status().message(), " (TLS to etcd: --cluster-etcd-ca)"));
  }
  return security;
}

absl::StatusOr<NodeSecurity> BuildNodeSecurity(ServerFlags& f, const Security& security) {
  strata::rpc::ClientSecurityOptions& node = f.node_client;
  if (f.cluster_etcd.empty()) return NodeSecurity();
  if (security.tls_on && node.ca_file.empty()) {
    return absl::InvalidArgumentError(
        "a cluster node serving TLS calls the other nodes over TLS: give --cluster-tls-ca (the "
        "CA of their certificates)");
  }
  if (!node.ca_file.empty() && node.cert_file.empty() && node.key_file.empty()) {
    node.cert_file = f.tls.cert_file;
    node.key_file = f.tls.key_file;
  }
  if (security.authorizer->enabled()) {
    const bool certificate = f.auth_options.client_certificates && !node.cert_file.empty();
    if (node.token_file.empty() && !certificate) {
      return absl::InvalidArgumentError(
          "a cluster node that authenticates its callers must present credentials of role "
          "node to the other nodes: give --cluster-token-file (a token listed with role node "
          "in every node's --auth-file), or a node certificate (--cluster-tls-cert, listed as "
          "`cert NAME node`) with --tls-client-ca");
    }
    if (!node.token_file.empty()) {
      auto token = strata::rpc::ReadTokenFile(node.token_file);
      if (!token.ok()) return token.status();
      auto principal = security.authorizer->Authenticate({.authorization = "Bearer " + *token});
      if (!principal.ok()) {
        return absl::InvalidArgumentError(
            "the token of --cluster-token-file is not in --auth-file: list it with role node "
            "(strata-server hash-token --role node)");
      }
      if (principal->role != auth::Role::kNode) {
        return absl::InvalidArgumentError(absl::StrCat(
            "the token of --cluster-token-file is ", principal->Describe(), " with role ",
            auth::RoleName(principal->role), " in --auth-file; nodes need role node"));
      }
    }
  }
  auto nodes = strata::rpc::ClientSecurity::Load(node);
  if (!nodes.ok()) return nodes.status();
  auto etcd = BuildEtcdSecurity(f);
  if (!etcd.ok()) return etcd.status();
  return NodeSecurity{*std::move(nodes), *std::move(etcd)};
}

// Every agent stream and HTTP connection is a file descriptor, beside RocksDB's files: take all
// the kernel allows this process rather than the shell's default 1024.
void RaiseOpenFileLimit() {
  if (rlimit files{}; getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
    files.rlim_cur = files.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &files) != 0) spdlog::warn("cannot raise the open-file limit");
  }
}

// Signals are taken synchronously by the main thread (sigwait); blocked before any thread
// starts so none of gRPC's or Beast's threads receives them.
sigset_t BlockShutdownSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  return signals;
}

// The shutdown order that loses nothing: streams end (every batch acknowledged so far is
// already committed), HTTP stops, the aggregator writes its open windows, the store closes.
int StopCleanly(grpc::Server* server, strata::server::http::HttpServer* http_server,
                std::unique_ptr<strata::server::aggregate::WindowAggregator> aggregator,
                strata::server::store::Store* store) {
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(3));
  http_server->Stop();
  aggregator->Stop();
  if (auto st = aggregator->FlushAll(); !st.ok()) {
    // The journal still holds the open windows; the next start writes them.
    spdlog::error("writing the open windows: {}", st.ToString());
  }
  const strata::server::aggregate::AggregatorStats aggregated = aggregator->stats();
  spdlog::info("aggregation: {} windows closed, {} capacity flushes, {} cells written "
               "directly, {} phase changes",
               aggregated.windows_closed, aggregated.capacity_flushes, aggregated.direct_cells,
               aggregated.phase_events);
  aggregator.reset();
  if (auto st = store->Close(); !st.ok()) {
    spdlog::error("closing the store: {}", st.ToString());
    return 1;
  }
  spdlog::info("stopped cleanly");
  return 0;
}

// Serves until SIGINT or SIGTERM, then shuts down cleanly: the server's exit status.
int Serve(const ServerFlags& f, const ServeSettings& settings, Security& security,
          NodeSecurity node_security) {
  auth::Authorizer* authorizer = security.authorizer.get();
  const sigset_t signals = BlockShutdownSignals();

  auto store_or = strata::server::store::Store::Open(f.data, settings.store);
  if (!store_or.ok()) {
    std::fprintf(stderr, "strata-server: cannot open data directory %s: %s\n", f.data.c_str(),
                 store_or.status().ToString().c_str());
    return 1;
  }
  std::unique_ptr<strata::server::store::Store> store = std::move(*store_or);
  // Writes samples an earlier process acknowledged but did not flush (see the journal).
  auto aggregator_or =
      strata::server::aggregate::WindowAggregator::Create(store.get(), f.aggregation);
  if (!aggregator_or.ok()) {
    std::fprintf(stderr, "strata-server: aggregation: %s\n",
                 aggregator_or.status().ToString().c_str());
    return 1;
  }
  std::unique_ptr<strata::server::aggregate::WindowAggregator> aggregator =
      std::move(*aggregator_or);
  aggregator->Start();

  namespace cluster = strata::server::cluster;
  std::unique_ptr<cluster::Membership> membership;
  cluster::NodeChannels node_channels(std::move(node_security.nodes));
  cluster::ReplicationMetrics replication_metrics;
  std::unique_ptr<cluster::ClusterPlacement> placement;
  if (!f.cluster_etcd.empty()) {
    auto joined = cluster::Membership::Join({.etcd_endpoints = f.cluster_etcd,
                                             .etcd_security = std::move(node_security.etcd),
                                             .prefix = f.cluster_prefix,
                                             .node_id = f.node_id,
                                             .advertise = f.advertise,
                                             .tokens = f.cluster_tokens,
                                             .lease_ttl = settings.cluster_lease_ttl});
    if (!joined.ok()) {
      std::fprintf(stderr, "strata-server: %s\n", std::string(joined.status().message()).c_str());
      return 1;
    }
    membership = std::move(*joined);
    placement = std::make_unique<cluster::ClusterPlacement>(
        membership.get(), store.get(), &node_channels,
        cluster::ReplicationOptions{f.replication_factor, settings.cluster_replica_timeout},
        &replication_metrics);
    spdlog::info("cluster: node {} at {} joined {} ({} nodes, replication factor {})", f.node_id,
                 f.advertise, f.cluster_etcd, membership->ring()->members().size(),
                 f.replication_factor);
  }
  strata::server::registry::AgentRegistry registry;
  strata::server::ingest::IngestMetrics metrics;
  strata::server::ingest::IngestService ingest(store.get(), &registry, &metrics,
                                       {.authorizer = authorizer,
                                        .max_streams_per_principal = f.max_streams_per_principal,
                                        .committer = aggregator.get(),
                                        .limits = f.limits,
                                        .max_agents = f.max_agents,
                                        .worker_threads = f.ingest_threads,
                                        .session_memory_bytes = settings.session_bytes,
                                        .placement = placement.get()});
  auto debuginfo_store = strata::server::symbolize::DebugInfoStore::Open(
      f.data + "/debuginfo", settings.max_debuginfo_bytes);
  if (!debuginfo_store.ok()) {
    std::fprintf(stderr, "strata-server: debug info directory: %s\n",
                 std::string(debuginfo_store.status().message()).c_str());
    return 1;
  }
  strata::server::symbolize::Symbolizer symbolizer(
      {.debug_dirs = f.debug_dirs, .debuginfod_urls = f.debuginfod_urls},
      debuginfo_store->get());
  strata::server::symbolize::DebugInfoService::CopyElsewhere copy_debuginfo;
  if (membership != nullptr) {
    copy_debuginfo = [&](grpc::ServerContext* context, const std::string& path,
                         const std::string& file_name, const std::string& build_id) {
      return cluster::CopyDebugInfoElsewhere(membership.get(), &node_channels, context, path,
                                             file_name, build_id);
    };
  }
  strata::server::symbolize::DebugInfoService debuginfo(debuginfo_store->get(), &symbolizer,
                                                         authorizer, std::move(copy_debuginfo));
  strata::server::query::QueryService query(store.get(), &registry, aggregator.get(),
                                     authorizer, &symbolizer);
  std::unique_ptr<cluster::ClusterService> cluster_service;
  std::unique_ptr<cluster::FanoutSource> fanout;
  std::unique_ptr<cluster::DebugInfoSync> debuginfo_sync;
  if (membership != nullptr) {
    cluster_service = std::make_unique<cluster::ClusterService>(
        membership.get(), store.get(), &registry, aggregator.get(), &symbolizer, authorizer,
        f.replication_factor, &replication_metrics);
    fanout = std::make_unique<cluster::FanoutSource>(membership.get(), &node_channels,
                                                     cluster_service.get(), f.replication_factor,
                                                     settings.cluster_query_timeout);
    query.SetProfileSource(fanout.get());
    strata::server::symbolize::DebugInfoStore* uploads = debuginfo_store->get();
    debuginfo_sync = std::make_unique<cluster::DebugInfoSync>(
        membership.get(), &node_channels,
        [uploads] {
          std::vector<cluster::LocalDebugFile> files;
          for (const auto& info : uploads->List()) {
            if (std::optional<std::string> path = uploads->PathOf(info.build_id)) {
              files.push_back({info.build_id, info.file_name, *path});
            }
          }
          return files;
        },
        settings.cluster_debuginfo_sync);
  }
  strata::server::capture::CaptureService::Options capture_options;
  capture_options.retention = settings.capture_retention;
  capture_options.max_frequency_hz = f.max_capture_hz;
  capture_options.max_duration = settings.max_capture_duration;
  capture_options.authorizer = authorizer;
  if (membership != nullptr) {
    capture_options.run_elsewhere = [&](grpc::ServerContext* context, const auto& request,
                                        auto* writer) {
      return cluster::RunCaptureElsewhere(membership.get(), &node_channels, context, request,
                                          writer);
    };
    capture_options.list_elsewhere = [&](grpc::ServerContext* context, auto* unreachable) {
      return cluster::ListCapturesElsewhere(membership.get(), &node_channels, context,
                                            settings.cluster_query_timeout, unreachable);
    };
    capture_options.get_elsewhere = [&](grpc::ServerContext* context, const auto& request,
                                        auto* record) {
      return cluster::GetCaptureElsewhere(membership.get(), &node_channels, context,
                                          settings.cluster_query_timeout, request, record);
    };
  }
  capture_options.deleter = [store = store.get()](const std::string& capture_id) {
    strata::server::store::WriteBatch wb;
    wb.DeleteCapture(capture_id);
    return store->Commit(&wb);
  };
  strata::server::capture::CaptureService capture(store.get(), &registry, capture_options);
  ingest.AddBatchObserver([&capture](const strata::server::ingest::AppliedBatch& batch) {
    if (batch.duplicate || batch.batch->capture_id().empty()) return;
    uint64_t samples = 0;
    for (const auto& c : batch.contexts) samples += c.count;
    capture.OnSamplesStored(batch.agent->agent_id, batch.batch->capture_id(), samples);
  });
  ingest.AddCaptureStatusObserver(
      [&capture](const std::string& agent_id, const auto& status) {
        capture.OnStatus(agent_id, status);
      });
  capture.Start();

  grpc::ServerBuilder builder;
  int bound_port = 0;
  builder.AddListeningPort(f.listen, security.grpc_credentials, &bound_port);
  builder.RegisterService(&ingest);
  builder.RegisterService(&query);
  builder.RegisterService(&capture);
  builder.RegisterService(&debuginfo);
  if (cluster_service != nullptr) builder.RegisterService(cluster_service.get());
  builder.SetMaxReceiveMessageSize(static_cast<int>(f.limits.max_message_bytes));
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || bound_port == 0) {
    std::fprintf(stderr, "strata-server: cannot listen on %s\n", f.listen.c_str());
    return 1;
  }

  strata::server::http::HttpServer http_server;
  strata::server::RegisterHttpRoutes(
      &http_server, store.get(), &metrics, &query, aggregator.get(),
      {.authorizer = authorizer,
       .metrics_open = f.metrics_open,
       .capture_limit_refusals = [&capture] { return capture.limit_refusals(); },
       .symbolizer = &symbolizer,
       .debuginfo = &debuginfo,
       .more_metrics = membership == nullptr ? std::function<std::string()>() : [&] {
         return cluster::RenderClusterMetrics(*cluster_service, debuginfo_sync.get());
       }});
  if (!f.http.empty()) {
    strata::server::http::HttpServerOptions http_options;
    http_options.max_connections = f.http_max_connections;
    http_options.tls = {f.tls.cert_file, f.tls.key_file, f.tls.client_ca_file};
    if (auto st = http_server.Start(f.http, http_options); !st.ok()) {
      std::fprintf(stderr, "strata-server: %s\n", std::string(st.message()).c_str());
      server->Shutdown();
      return 1;
    }
  }
  spdlog::info("strata-server listening on {} (port {}), HTTP on {}, data in {}; {}, {}", f.listen,
               bound_port, f.http.empty() ? "off" : f.http, f.data, security.tls_on ? "TLS" : "plaintext",
               authorizer->enabled() ? "authentication required" : "no authentication");
  // The HTTP port first: whoever waits for "ready" (tests, scripts with port 0) finds both.
  if (!f.http.empty()) std::printf("strata-server HTTP on port %d\n", http_server.port());
  std::printf("strata-server ready on port %d\n", bound_port);
  std::fflush(stdout);

  int sig = 0;
  sigwait(&signals, &sig);
  spdlog::info("signal {}: shutting down", sig);
  if (membership != nullptr) membership->Leave();
  return StopCleanly(server.get(), &http_server, std::move(aggregator), store.get());
}

int Run(int argc, char** argv) {
  CLI::App app{"strata-server: continuous profiling server"};
  ServerFlags flags;
  AddServeFlags(app, flags);
  const MaintenanceCommands maintenance = AddMaintenanceCommands(app, flags);
  app.require_subcommand(0, 1);
  strata::base::AddConfigFile(app);
  CLI11_PARSE(app, argc, argv);
  if (std::optional<int> status = RunMaintenance(maintenance, flags)) return *status;
  auto settings = CheckFlags(flags);
  if (!settings.ok()) {
    std::fprintf(stderr, "strata-server: %s\n", std::string(settings.status().message()).c_str());
    return 2;
  }
  spdlog::set_level(spdlog::level::from_str(flags.log_level));
  auto security = BuildSecurity(flags);
  if (!security.ok()) {
    std::fprintf(stderr, "strata-server: %s\n", std::string(security.status().message()).c_str());
    return 2;
  }
  auto node_security = BuildNodeSecurity(flags, *security);
  if (!node_security.ok()) {
    std::fprintf(stderr, "strata-server: %s\n",
                 std::string(node_security.status().message()).c_str());
    return 2;
  }
  RaiseOpenFileLimit();
  ConfigureDebuginfod(flags);
  return Serve(flags, *settings, *security, *std::move(node_security));
}

}  // namespace

int main(int argc, char** argv) {
  // Debian's Abseil checks every Mutex acquisition for lock-order cycles, a debugging aid
  // that costs every ingest worker on every batch (as in the agent).
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  return Run(argc, argv);
}
