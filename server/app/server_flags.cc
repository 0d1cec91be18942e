#include "server/app/server_flags.h"

#include <cmath>
#include <cstdlib>
#include <initializer_list>
#include <optional>
#include <tuple>
#include <type_traits>
#include <variant>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/byte_size.h"
#include "common/base/duration.h"
#include "common/base/host_port.h"
#include "server/auth/principal.h"

namespace strata::server::app {
namespace {

// One flag: where its value goes, its help text, whether --help (and --print-config) show its
// default, and how CLI11 checks it. Booleans are switches (add_flag) and show no default.
struct Flag {
  using Value = std::variant<std::string*, bool*, int*, uint32_t*, uint64_t*, double*,
                             std::vector<std::string>*>;
  const char* name;
  Value value;
  const char* help;
  bool show_default = true;
  std::optional<CLI::Validator> check = std::nullopt;
};
constexpr bool kNoDefault = false;

// Adds `flags` to `app` in order (the order of --help and --print-config).
void AddFlags(CLI::App& app, std::initializer_list<Flag> flags) {
  for (const Flag& flag : flags) {
    CLI::Option* option = std::visit(
        [&](auto* value) {
          if constexpr (std::is_same_v<decltype(value), bool*>) {
            // On by default (--regressions): said so by --help and --print-config.
            return app.add_flag(flag.name, *value, flag.help)
                ->default_str(*value ? "true" : "");
          } else {
            return app.add_option(flag.name, *value, flag.help);
          }
        },
        flag.value);
    if (flag.show_default) option->capture_default_str();
    if (flag.check) option->check(*flag.check);
  }
}

std::string DebuginfodUrlsFromEnvironment() {
  const char* urls = std::getenv("DEBUGINFOD_URLS");
  return urls == nullptr ? std::string() : std::string(urls);
}

// Memory and message sizes: each flag's text parsed into its option.
absl::Status ParseSizes(const ServerFlags& f, ServerOptions& o) {
  uint64_t table_bytes = 0, message_bytes = 0, session_bytes = 0;
  for (auto [flag, text, out] :
       {std::tuple{"--table-memory", &f.table_memory, &table_bytes},
        std::tuple{"--max-message-bytes", &f.max_message, &message_bytes},
        std::tuple{"--session-memory", &f.session_memory, &session_bytes},
        std::tuple{"--max-debuginfo-bytes", &f.max_debuginfo,
                   &o.symbolize.max_debuginfo_bytes}}) {
    auto bytes = base::ParseByteSize(*text);
    if (!bytes.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(flag, ": ", bytes.status().message()));
    }
    *out = *bytes;
  }
  if (message_bytes < 4096 || message_bytes > (1u << 30)) {
    return absl::InvalidArgumentError("--max-message-bytes must be in [4KiB, 1GiB]");
  }
  o.aggregation.memory_budget_bytes = table_bytes;
  o.ingest.service.limits.max_message_bytes = static_cast<uint32_t>(message_bytes);
  o.ingest.service.session_memory_bytes = session_bytes;
  return absl::OkStatus();
}

// A cluster node's timeouts and intervals.
absl::Status ParseDurations(const ServerFlags& f, ServerOptions& o) {
  ClusterOptions& cluster = o.cluster;
  regress::RegressionsOptions& regression = o.regression;
  for (auto [flag, text, out] :
       {std::tuple{"--regression-interval", &f.regression_interval,
                   &regression.check_interval},
        std::tuple{"--regression-window", &f.regression_window, &regression.watcher.window},
        std::tuple{"--regression-lookback", &f.regression_lookback,
                   &regression.watcher.baseline_lookback},
        std::tuple{"--regression-phase-unit", &f.regression_phase_unit,
                   &regression.watcher.phase_unit},
        std::tuple{"--cluster-lease-ttl", &f.cluster_lease_ttl, &cluster.lease_ttl},
        std::tuple{"--cluster-query-timeout", &f.cluster_query_timeout, &cluster.query_timeout},
        std::tuple{"--cluster-replica-timeout", &f.cluster_replica_timeout,
                   &cluster.replication.replica_timeout},
        std::tuple{"--cluster-debuginfo-sync", &f.cluster_debuginfo_sync,
                   &cluster.debuginfo_sync}}) {
    auto ms = base::ParseDuration(*text);
    if (!ms.ok() || *ms <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, ": '", *text, "' is not a positive duration (e.g. 10s)"));
    }
    *out = absl::Milliseconds(*ms);
  }
  return absl::OkStatus();
}

// How long captures may run and are kept, and how long the store keeps each resolution
// (enforced when RocksDB compacts, see StoreOptions).
absl::Status ParseRetentionPeriods(const ServerFlags& f, ServerOptions& o) {
  auto capture_duration = capture::ParseRetention(f.max_capture_duration);
  if (!capture_duration.ok() || *capture_duration <= absl::ZeroDuration() ||
      *capture_duration > absl::Hours(1)) {
    return absl::InvalidArgumentError("--max-capture-duration must be between 1ms and 1h");
  }
  o.capture.max_duration = *capture_duration;
  auto retention = capture::ParseRetention(f.capture_retention);
  if (!retention.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--capture-retention: ", retention.status().message()));
  }
  o.capture.retention = *retention;
  store::StoreOptions& store = o.storage.store;
  for (auto [flag, text, out] :
       {std::tuple{"--retention-raw", &f.raw_retention, &store.raw_retention_ms},
        std::tuple{"--retention-minute", &f.minute_retention, &store.minute_retention_ms},
        std::tuple{"--retention-hour", &f.hour_retention, &store.hour_retention_ms}}) {
    auto d = capture::ParseRetention(*text);
    if (!d.ok()) return absl::InvalidArgumentError(absl::StrCat(flag, ": ", d.status().message()));
    *out = absl::ToInt64Milliseconds(*d);
  }
  auto graphs = capture::ParseRetention(f.graph_retention);
  if (!graphs.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--graph-retention: ", graphs.status().message()));
  }
  o.ingest.service.graph_retention = *graphs;
  auto warmup = capture::ParseRetention(f.query_warmup);
  if (!warmup.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--query-warmup: ", warmup.status().message()));
  }
  o.query_warmup = *warmup;
  // Rollups are summed from the raw cells in the background, 30 s after each minute ends
  // (windows close about 10 s after theirs; later ones roll up at their commit).
  store.rollup_interval_ms = 5'000;
  return absl::OkStatus();
}

// TLS and authentication as asked, and no server reachable from other machines that anyone
// there could read, write or capture from.
absl::Status CheckSecurity(const std::string& certificate_role, ServerOptions& o) {
  SecurityOptions& security = o.security;
  if (!security.tls_on() && !security.tls.client_ca_file.empty()) {
    return absl::InvalidArgumentError("--tls-client-ca needs --tls-cert and --tls-key");
  }
  security.authorizer.client_certificates = !security.tls.client_ca_file.empty();
  security.authorizer.certificate_role =
      certificate_role == "none" ? std::nullopt : auth::ParseRole(certificate_role);
  const bool tls_on = security.tls_on(), auth_on = security.authenticates();
  for (const std::string* address : {&o.ingest.listen, &o.http.listen}) {
    if (address->empty() || auth::IsLoopbackAddress(*address) || security.insecure) continue;
    if (!tls_on || !auth_on) {
      return absl::FailedPreconditionError(absl::StrCat(
          "refusing to listen on ", *address, " without ",
          !tls_on && !auth_on ? "TLS and authentication"
          : !tls_on           ? "TLS"
                              : "authentication",
          ": give --tls-cert and --tls-key, and --auth-file or --tls-client-ca (see "
          "deploy/gen-certs.sh), or --insecure"));
    }
  }
  return absl::OkStatus();
}

// A cluster node's identity and how it calls the other nodes: over TLS when the nodes serve
// it, and, when they authenticate their callers, as a principal of role node (a client
// certificate or a token; ServerApp::Create checks the token against the tokens file).
absl::Status CheckCluster(ServerOptions& o) {
  ClusterOptions& cluster = o.cluster;
  if (!cluster.enabled()) return absl::OkStatus();
  if (cluster.node_id.empty()) return absl::InvalidArgumentError("--cluster-etcd needs --node-id");
  if (cluster.advertise.empty()) cluster.advertise = o.ingest.listen;
  rpc::ClientSecurityOptions& node = cluster.node_client;
  if (o.security.tls_on() && node.ca_file.empty()) {
    return absl::InvalidArgumentError(
        "a cluster node serving TLS calls the other nodes over TLS: give --cluster-tls-ca (the "
        "CA of their certificates)");
  }
  if (!node.ca_file.empty() && node.cert_file.empty() && node.key_file.empty()) {
    node.cert_file = o.security.tls.cert_file;
    node.key_file = o.security.tls.key_file;
  }
  const bool certificate =
      o.security.authorizer.client_certificates && !node.cert_file.empty();
  if (o.security.authenticates() && node.token_file.empty() && !certificate) {
    return absl::InvalidArgumentError(
        "a cluster node that authenticates its callers must present credentials of role "
        "node to the other nodes: give --cluster-token-file (a token listed with role node "
        "in every node's --auth-file), or a node certificate (--cluster-tls-cert, listed as "
        "`cert NAME node`) with --tls-client-ca");
  }
  return ResolveEtcdTls(cluster.etcd_client, node);
}

}  // namespace

ServerFlags::ServerFlags() {
  options.symbolize.symbolizer.debuginfod_urls = DebuginfodUrlsFromEnvironment();
}

void AddEtcdTlsFlags(CLI::App& app, rpc::ClientSecurityOptions& etcd) {
  AddFlags(app,
           {{"--cluster-etcd-ca", &etcd.ca_file,
             "PEM CA of etcd's certificate: reach etcd over TLS (https:// endpoints)", kNoDefault},
            {"--cluster-etcd-cert", &etcd.cert_file,
             "client certificate presented to etcd, for its --client-cert-auth (a node's "
             "default: the certificate it presents to the other nodes)",
             kNoDefault},
            {"--cluster-etcd-key", &etcd.key_file, "PEM private key of --cluster-etcd-cert",
             kNoDefault}});
}

namespace {

// The listeners, and who may call them.
void AddListenerFlags(CLI::App& app, ServerFlags& f) {
  ServerOptions& o = f.options;
  auth::AuthorizerOptions& auth = o.security.authorizer;
  AddFlags(app, {
    {"--listen", &o.ingest.listen, "gRPC address for agents and clients (host:port)", kNoDefault},
    {"--http", &o.http.listen, "HTTP address for /healthz, /metrics and the UI; empty: off",
     kNoDefault},
    {"--data", &o.storage.data_dir, "RocksDB data directory (created if missing)", kNoDefault},
    {"--tls-cert", &o.security.tls.cert_file,
     "PEM certificate (chain) of the server: TLS 1.2+ on the gRPC and HTTP listeners; re-read "
     "when the file changes", kNoDefault},
    {"--tls-key", &o.security.tls.key_file, "PEM private key of --tls-cert", kNoDefault},
    {"--tls-client-ca", &o.security.tls.client_ca_file,
     "PEM CA of client certificates: agents (and people) present certificates that chain to "
     "it; a certificate's identity is its first DNS name, else its CN", kNoDefault},
    {"--tls-client-role", &f.certificate_role,
     "role of a client certificate the tokens file does not list: agent, reader, operator, or "
     "none (only listed certificates)", true,
     CLI::IsMember({"agent", "reader", "operator", "none"})},
    {"--auth-file", &auth.auth_file,
     "tokens file: bearer tokens (hashed) and client certificates with their roles (agent, "
     "reader, operator, node); re-read when it changes", kNoDefault, CLI::ExistingFile},
    {"--insecure", &o.security.insecure,
     "allow listening on a non-loopback address without TLS and authentication"},
    {"--metrics-open", &o.http.metrics_open, "serve /metrics without authentication"},
    {"--query-rate", &auth.query_rate,
     "query requests per second per principal (gRPC and /api/v1; 0: unlimited)", true,
     CLI::NonNegativeNumber},
    {"--query-burst", &auth.query_burst,
     "query requests a principal may make at once above --query-rate", true,
     CLI::NonNegativeNumber},
  });
}

// The store: fsync, retention; and the log.
void AddStorageFlags(CLI::App& app, ServerFlags& f) {
  ServerOptions& o = f.options;
  AddFlags(app, {
    {"--sync", &o.storage.store.sync, "fsync the write-ahead log on every batch"},
    {"--log-level", &o.log_level, "trace|debug|info|warn|error", kNoDefault,
     CLI::IsMember({"trace", "debug", "info", "warn", "error"})},
    {"--capture-retention", &f.capture_retention,
     "keep ad hoc captures this long after they end (e.g. 7d, 12h; 0: forever)"},
    {"--retention-raw", &f.raw_retention, "keep 10 s windows this long (0: forever)"},
    {"--retention-minute", &f.minute_retention,
     "keep the 1-minute rollups this long (0: forever)"},
    {"--retention-hour", &f.hour_retention, "keep the 1-hour rollups this long (0: forever)"},
    {"--graph-retention", &f.graph_retention,
     "delete an agent incarnation's call graph once no batch of it was applied for this "
     "long and no stream holds it (0: keep every graph)"},
    {"--query-warmup", &f.query_warmup,
     "after start-up, read this much of each recently active service into memory in the "
     "background, so its first query is as fast as later ones (e.g. 7d, 24h; 0: off)"},
  });
}

// The aggregation tables, and what agents and clients may send or ask.
void AddLimitFlags(CLI::App& app, ServerFlags& f) {
  ServerOptions& o = f.options;
  aggregate::AggregatorOptions& aggregation = o.aggregation;
  ingest::IngestService::Options& ingest = o.ingest.service;
  AddFlags(app, {
    {"--table-entries", &aggregation.max_entries,
     "distinct (host, stack) entries per service in the aggregation tables; a fuller table is "
     "written early", true, CLI::Range(1u, 1u << 24)},
    {"--hot-threshold", &aggregation.hot_threshold,
     "samples per 10 s window that make a context hot (sorted first, ranked for phase "
     "changes)"},
    {"--phase-factor", &aggregation.phase_change_factor,
     "how far apart two reordered hot contexts must be to report a phase change", true,
     CLI::Range(2u, 1000000u)},
    {"--session-memory", &f.session_memory,
     "memory for connected agents' call graphs and decode caches; past it, idle graphs are "
     "dropped and reloaded from the store when needed"},
    {"--table-memory", &f.table_memory,
     "memory for all aggregation tables together; past it, batches of new services are "
     "refused with RESOURCE_EXHAUSTED until idle tables are released"},
    {"--max-message-bytes", &f.max_message, "largest gRPC message accepted"},
    {"--accept-compressed", &o.ingest.accept_compressed,
     "accept gRPC messages the client compressed (an OTel Collector's gzip); they are "
     "inflated whole before --max-message-bytes applies"},
    {"--max-graph-nodes", &ingest.limits.max_graph_nodes, "functions in one agent's call graph",
     true, CLI::PositiveNumber},
    {"--max-graph-edges", &ingest.limits.max_graph_edges, "call edges in one agent's graph",
     true, CLI::PositiveNumber},
    {"--max-graph-search-steps-per-edge", &ingest.limits.max_graph_search_steps_per_edge,
     "search steps classifying an agent graph's edges (back edge or not), per edge, with a "
     "floor for small graphs; past it the graph delta is refused",
     true, CLI::PositiveNumber},
    {"--max-batch-services", &ingest.limits.max_batch_services,
     "distinct services named by one sample batch", true, CLI::PositiveNumber},
    {"--max-batch-contexts", &ingest.limits.max_batch_contexts,
     "distinct calling contexts in one sample batch", true, CLI::Range(1u, 1u << 22)},
    {"--max-batch-targets", &ingest.limits.max_batch_targets,
     "targets (processes) in one sample batch or heartbeat", true, CLI::PositiveNumber},
    {"--max-sequence-gap", &ingest.limits.max_sequence_gap,
     "largest jump of an agent's batch sequence number that is accepted", true,
     CLI::PositiveNumber},
    {"--max-label-sets", &ingest.limits.max_label_sets,
     "distinct target label sets per service; past it samples are stored under "
     "strata_overflow=label_sets", true, CLI::Range(1u, 10'000'000u)},
    {"--http-max-connections", &o.http.max_connections,
     "HTTP connections open at once; more are closed when accepted", true, CLI::PositiveNumber},
    {"--max-streams-per-principal", &ingest.max_streams_per_principal,
     "agent streams one authenticated principal (certificate or token) may hold", true,
     CLI::PositiveNumber},
    {"--max-capture-hz", &o.capture.max_frequency_hz,
     "highest sampling rate a capture may ask of the agents", true, CLI::Range(1u, 10000u)},
    {"--max-capture-duration", &f.max_capture_duration,
     "longest capture a client may start (at most 1h)"},
    {"--max-agents", &ingest.max_agents,
     "agent streams held at once; more are refused with RESOURCE_EXHAUSTED and a retry delay",
     true, CLI::PositiveNumber},
  });
}

// A cluster node: its identity, the ring, timeouts, and how it calls the others and etcd.
void AddClusterFlags(CLI::App& app, ServerFlags& f) {
  ClusterOptions& cluster = f.options.cluster;
  AddFlags(app, {
    {"--cluster-etcd", &cluster.etcd_endpoints,
     "etcd endpoints (http://HOST:2379, or https:// with --cluster-etcd-ca; comma-separated): "
     "run as a node of a cluster whose membership lives there; off: a single server",
     kNoDefault},
    {"--node-id", &cluster.node_id, "this node's ID in the cluster (stable across restarts)",
     kNoDefault},
    {"--advertise", &cluster.advertise,
     "host:port agents and other nodes reach this node's gRPC at (default: --listen)",
     kNoDefault},
    {"--replication-factor", &cluster.replication.replication_factor,
     "nodes that hold each host's samples (a batch is acknowledged when all live ones have "
     "it)", true, CLI::Range(1u, 5u)},
    {"--cluster-tokens", &cluster.tokens, "virtual tokens of this node on the ring", true,
     CLI::Range(1u, 4096u)},
    {"--cluster-lease-ttl", &f.cluster_lease_ttl,
     "a node whose lease is not refreshed this long leaves the ring"},
    {"--cluster-prefix", &cluster.prefix, "key prefix of this cluster in etcd"},
    {"--cluster-query-timeout", &f.cluster_query_timeout,
     "how long a fan-out query waits for a node before naming it unreachable"},
    {"--cluster-debuginfo-sync", &f.cluster_debuginfo_sync,
     "how often uploaded debug files are compared across the nodes and sent to those that "
     "lack them (also soon after a node joins)"},
    {"--cluster-replica-timeout", &f.cluster_replica_timeout,
     "how long a batch waits for another owner's confirmation"},
    {"--cluster-tls-ca", &cluster.node_client.ca_file,
     "PEM CA of the other nodes' certificates: this node calls them over TLS (required when "
     "the nodes serve TLS)", kNoDefault},
    {"--cluster-tls-cert", &cluster.node_client.cert_file,
     "client certificate this node presents to the others (default: --tls-cert, see "
     "deploy/gen-certs.sh --node)", kNoDefault},
    {"--cluster-tls-key", &cluster.node_client.key_file,
     "PEM private key of --cluster-tls-cert (default: --tls-key)", kNoDefault},
    {"--cluster-token-file", &cluster.node_client.token_file,
     "file whose first line is the bearer token this node presents to the others (role node "
     "in their --auth-file)", kNoDefault},
  });
  AddEtcdTlsFlags(app, cluster.etcd_client);
}

// Ingest's threads, and names for the frames agents could not name.
void AddSymbolizeFlags(CLI::App& app, ServerFlags& f) {
  ingest::IngestService::Options& ingest = f.options.ingest.service;
  SymbolizeOptions& symbolize = f.options.symbolize;
  AddFlags(app, {
    {"--ingest-threads", &ingest.worker_threads,
     "threads that decode and commit agent batches (0: one per core)"},
    {"--debug-dirs", &symbolize.symbolizer.debug_dirs,
     "directories of debug files by build ID (.build-id/ab/cdef.debug), searched after "
     "uploads"},
    {"--debuginfod-urls", &symbolize.symbolizer.debuginfod_urls,
     "debuginfod servers (space-separated) asked for debug files not found locally; default "
     "$DEBUGINFOD_URLS"},
    {"--debuginfod-timeout", &symbolize.debuginfod_timeout_s,
     "seconds a debuginfod server may take to start answering", true, CLI::PositiveNumber},
    {"--max-debuginfo-bytes", &f.max_debuginfo, "largest debug file accepted by upload"},
  });
}

// Releases compared with the one before, by themselves.
void AddRegressionFlags(CLI::App& app, ServerFlags& f) {
  ServerOptions& o = f.options;
  AddFlags(app, {
    {"--regressions", &o.regressions,
     "compare each new release of a service (a new value of its version, else build_id "
     "label) with the one before as samples accrue, and keep the verdicts"},
    {"--regression-interval", &f.regression_interval,
     "how often releases are looked for and their comparisons run again"},
    {"--regression-window", &f.regression_window,
     "how long after a release appears its comparison runs before the verdict is final"},
    {"--regression-lookback", &f.regression_lookback,
     "how far before a release appeared the previous release's samples are taken"},
    {"--regression-phase-unit", &f.regression_phase_unit,
     "a phase change (and a release on one host) is compared per (host, span of this length)"},
    {"--regression-fdr", &o.regression_fdr,
     "false discovery rate over the functions compared (Benjamini-Hochberg)"},
    {"--regression-webhook", &o.regression.webhook_url,
     "http:// or https:// URL each changed verdict is POSTed to as JSON", kNoDefault},
    {"--regression-webhook-ca", &o.regression.webhook_ca_file,
     "PEM CA file an https webhook's certificate is verified against (default: the system's)",
     kNoDefault},
  });
}

}  // namespace

// In the order of --help and --print-config.
void AddServeFlags(CLI::App& app, ServerFlags& f) {
  AddListenerFlags(app, f);
  AddStorageFlags(app, f);
  AddLimitFlags(app, f);
  AddClusterFlags(app, f);
  AddSymbolizeFlags(app, f);
  AddRegressionFlags(app, f);
  app.get_option("--http")->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
}

absl::Status ResolveEtcdTls(rpc::ClientSecurityOptions& etcd,
                            const rpc::ClientSecurityOptions& node) {
  if (etcd.ca_file.empty() && (!etcd.cert_file.empty() || !etcd.key_file.empty())) {
    return absl::InvalidArgumentError("--cluster-etcd-cert needs --cluster-etcd-ca");
  }
  if (!etcd.ca_file.empty() && etcd.cert_file.empty() && etcd.key_file.empty()) {
    etcd.cert_file = node.cert_file;
    etcd.key_file = node.key_file;
  }
  return absl::OkStatus();
}

absl::StatusOr<ServerOptions> ServerOptionsFromFlags(const ServerFlags& flags) {
  ServerOptions options = flags.options;
  if (absl::Status sizes = ParseSizes(flags, options); !sizes.ok()) return sizes;
  if (absl::Status durations = ParseDurations(flags, options); !durations.ok()) {
    return durations;
  }
  for (const auto& [flag, address] :
       {std::pair{"--listen", &options.ingest.listen}, std::pair{"--http", &options.http.listen},
        std::pair{"--advertise", &options.cluster.advertise}}) {
    if (absl::Status port = base::CheckAddressPort(*address); !port.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(flag, ": ", port.message()));
    }
  }
  const auth::AuthorizerOptions& auth = options.security.authorizer;
  if (!std::isfinite(auth.query_rate) || !std::isfinite(auth.query_burst)) {
    return absl::InvalidArgumentError("--query-rate and --query-burst must be numbers");
  }
  if (!(options.regression_fdr > 0 && options.regression_fdr < 1)) {
    return absl::InvalidArgumentError("--regression-fdr must be between 0 and 1 (e.g. 0.05)");
  }
  if (!options.regression.webhook_url.empty()) {
    if (auto url = regress::ParseWebhookUrl(options.regression.webhook_url); !url.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--regression-webhook: ", url.status().message()));
    }
  }
  if (absl::Status retention = ParseRetentionPeriods(flags, options); !retention.ok()) {
    return retention;
  }
  if (absl::Status secure = CheckSecurity(flags.certificate_role, options); !secure.ok()) {
    return secure;
  }
  if (absl::Status node = CheckCluster(options); !node.ok()) return node;
  return options;
}

}  // namespace strata::server::app
