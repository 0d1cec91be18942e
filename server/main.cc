// strata-server: receives agent streams, stores profiles in an embedded RocksDB directory and
// answers queries (gRPC, plus HTTP for /healthz, /metrics and the JSON mirror).
#include <signal.h>
#include <sys/resource.h>

#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <tuple>

#include <grpcpp/grpcpp.h>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "common/base/byte_size.h"
#include "common/base/config_file.h"
#include "server/capture/capture_service.h"
#include "server/aggregate/window_aggregator.h"
#include "server/auth/authorizer.h"
#include "server/auth/tls_credentials.h"
#include "server/http/http_server.h"
#include "server/ingest/ingest_service.h"
#include "server/query/query_service.h"
#include "server/server_metrics.h"
#include "server/store/backup.h"
#include "server/store/store.h"
#include "spdlog/spdlog.h"

namespace {

int Run(int argc, char** argv) {
  CLI::App app{"strata-server: continuous profiling server"};
  // Loopback by default: a server reachable from elsewhere needs TLS and authentication (or an
  // explicit --insecure), see below.
  std::string listen = "127.0.0.1:7070";
  std::string http = "127.0.0.1:7071";
  std::string data = "./var/strata";
  std::string log_level = "info";
  bool sync = false;
  std::string capture_retention = "7d";
  std::string raw_retention = "7d", minute_retention = "30d", hour_retention = "365d";
  strata::server::aggregate::AggregatorOptions aggregation;
  app.add_option("--listen", listen, "gRPC address for agents and clients (host:port)");
  app.add_option("--http", http, "HTTP address for /healthz, /metrics and the UI; empty: off")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("--data", data, "RocksDB data directory (created if missing)");
  strata::server::auth::ServerTlsFiles tls;
  strata::server::auth::AuthorizerOptions auth_options;
  bool insecure = false, metrics_open = false;
  std::string certificate_role = "agent";
  app.add_option("--tls-cert", tls.cert_file,
                 "PEM certificate (chain) of the server: TLS 1.2+ on the gRPC and HTTP "
                 "listeners; re-read when the file changes");
  app.add_option("--tls-key", tls.key_file, "PEM private key of --tls-cert");
  app.add_option("--tls-client-ca", tls.client_ca_file,
                 "PEM CA of client certificates: agents (and people) present certificates that "
                 "chain to it; a certificate's identity is its first DNS name, else its CN");
  app.add_option("--tls-client-role", certificate_role,
                 "role of a client certificate the tokens file does not list: agent, reader, "
                 "operator, or none (only listed certificates)")
      ->check(CLI::IsMember({"agent", "reader", "operator", "none"}))
      ->capture_default_str();
  app.add_option("--auth-file", auth_options.auth_file,
                 "tokens file: bearer tokens (hashed) and client certificates with their roles "
                 "(agent, reader, operator); re-read when it changes")
      ->check(CLI::ExistingFile);
  app.add_flag("--insecure", insecure,
               "allow listening on a non-loopback address without TLS and authentication");
  app.add_flag("--metrics-open", metrics_open, "serve /metrics without authentication");
  app.add_option("--query-rate", auth_options.query_rate,
                 "query requests per second per principal (gRPC and /api/v1; 0: unlimited)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--query-burst", auth_options.query_burst,
                 "query requests a principal may make at once above --query-rate")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--sync", sync, "fsync the write-ahead log on every batch");
  app.add_option("--log-level", log_level, "trace|debug|info|warn|error");
  app.add_option("--capture-retention", capture_retention,
                 "keep ad hoc captures this long after they end (e.g. 7d, 12h; 0: forever)")
      ->capture_default_str();
  app.add_option("--retention-raw", raw_retention, "keep 10 s windows this long (0: forever)")
      ->capture_default_str();
  app.add_option("--retention-minute", minute_retention,
                 "keep the 1-minute rollups this long (0: forever)")
      ->capture_default_str();
  app.add_option("--retention-hour", hour_retention,
                 "keep the 1-hour rollups this long (0: forever)")
      ->capture_default_str();
  app.add_option("--table-entries", aggregation.max_entries,
                 "distinct (host, stack) entries per service in the aggregation tables; a "
                 "fuller table is written early")
      ->capture_default_str()
      ->check(CLI::Range(1u, 1u << 24));
  app.add_option("--hot-threshold", aggregation.hot_threshold,
                 "samples per 10 s window that make a context hot (sorted first, ranked for "
                 "phase changes)")
      ->capture_default_str();
  app.add_option("--phase-factor", aggregation.phase_change_factor,
                 "how far apart two reordered hot contexts must be to report a phase change")
      ->capture_default_str()
      ->check(CLI::Range(2u, 1000000u));
  std::string table_memory = "512MiB";
  std::string session_memory = "2GiB";
  app.add_option("--session-memory", session_memory,
                 "memory for connected agents' call graphs and decode caches; past it, idle "
                 "graphs are dropped and reloaded from the store when needed")
      ->capture_default_str();
  std::string max_message = "16MiB";
  strata::server::ingest::IngestLimits limits;
  app.add_option("--table-memory", table_memory,
                 "memory for all aggregation tables together; past it, batches of new services "
                 "are refused with RESOURCE_EXHAUSTED until idle tables are released")
      ->capture_default_str();
  app.add_option("--max-message-bytes", max_message, "largest gRPC message accepted")
      ->capture_default_str();
  app.add_option("--max-graph-nodes", limits.max_graph_nodes,
                 "functions in one agent's call graph")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--max-graph-edges", limits.max_graph_edges, "call edges in one agent's graph")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--max-batch-services", limits.max_batch_services,
                 "distinct services named by one sample batch")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--max-batch-contexts", limits.max_batch_contexts,
                 "distinct calling contexts in one sample batch")
      ->capture_default_str()
      ->check(CLI::Range(1u, 1u << 22));
  app.add_option("--max-batch-targets", limits.max_batch_targets,
                 "targets (processes) in one sample batch or heartbeat")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--max-sequence-gap", limits.max_sequence_gap,
                 "largest jump of an agent's batch sequence number that is accepted")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--max-label-sets", limits.max_label_sets,
                 "distinct target label sets per service; past it samples are stored under "
                 "strata_overflow=label_sets")
      ->capture_default_str()
      ->check(CLI::Range(1u, 10'000'000u));
  int http_max_connections = 1024;
  app.add_option("--http-max-connections", http_max_connections,
                 "HTTP connections open at once; more are closed when accepted")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  uint32_t max_agents = 20'000;
  uint32_t max_streams_per_principal = 16;
  app.add_option("--max-streams-per-principal", max_streams_per_principal,
                 "agent streams one authenticated principal (certificate or token) may hold")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  uint32_t max_capture_hz = 1000;
  std::string max_capture_duration = "1h";
  app.add_option("--max-capture-hz", max_capture_hz,
                 "highest sampling rate a capture may ask of the agents")
      ->capture_default_str()
      ->check(CLI::Range(1u, 10000u));
  app.add_option("--max-capture-duration", max_capture_duration,
                 "longest capture a client may start (at most 1h)")
      ->capture_default_str();
  uint32_t ingest_threads = 0;
  app.add_option("--max-agents", max_agents,
                 "agent streams held at once; more are refused with RESOURCE_EXHAUSTED and a "
                 "retry delay")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--ingest-threads", ingest_threads,
                 "threads that decode and commit agent batches (0: one per core)")
      ->capture_default_str();
  // Maintenance commands on a data directory, instead of serving.
  std::string backup_to, restore_from;
  uint32_t backup_keep = 7;
  CLI::App* backup = app.add_subcommand(
      "backup", "copy the store in --data into a backup directory (incremental, checksummed; "
                "the server may keep running)");
  backup->add_option("--data", data, "the server's data directory")->capture_default_str();
  backup->add_option("--to", backup_to, "backup directory (created if missing)")->required();
  backup->add_option("--keep", backup_keep, "backups to keep there (0: all)")->capture_default_str();
  CLI::App* restore = app.add_subcommand(
      "restore", "restore the latest backup into a new data directory (the server stopped)");
  restore->add_option("--from", restore_from, "backup directory")->required();
  restore->add_option("--data", data, "new data directory (must be empty or missing)")
      ->required();
  CLI::App* hash_token = app.add_subcommand(
      "hash-token", "read a token on standard input and print the line of it for the tokens "
                    "file (the token itself is never stored)");
  std::string hash_name = "NAME", hash_role = "reader";
  hash_token->add_option("--name", hash_name, "principal name")->capture_default_str();
  hash_token->add_option("--role", hash_role, "agent, reader or operator")
      ->check(CLI::IsMember({"agent", "reader", "operator"}))
      ->capture_default_str();
  app.require_subcommand(0, 1);
  strata::base::AddConfigFile(app);
  CLI11_PARSE(app, argc, argv);
  if (*hash_token) {
    std::string token;
    std::getline(std::cin, token);
    while (!token.empty() && (token.back() == '\r' || token.back() == ' ')) token.pop_back();
    if (token.empty()) {
      std::fprintf(stderr, "strata-server hash-token: no token on standard input\n");
      return 2;
    }
    std::printf("token %s %s %s\n", hash_name.c_str(), hash_role.c_str(),
                strata::server::auth::FormatTokenHash(strata::server::auth::HashToken(token))
                    .c_str());
    return 0;
  }
  if (*backup) {
    strata::server::store::BackupInfo info;
    absl::Status st = strata::server::store::BackupStore(data, backup_to, backup_keep, &info);
    if (!st.ok()) {
      std::fprintf(stderr, "strata-server backup: %s\n", std::string(st.message()).c_str());
      return 1;
    }
    std::printf("backup %u of %s in %s: %llu bytes; %u backups kept\n", info.backup_id,
                data.c_str(), backup_to.c_str(), static_cast<unsigned long long>(info.bytes),
                info.backups);
    return 0;
  }
  if (*restore) {
    absl::Status st = strata::server::store::RestoreStore(restore_from, data);
    if (!st.ok()) {
      std::fprintf(stderr, "strata-server restore: %s\n", std::string(st.message()).c_str());
      return 1;
    }
    std::printf("restored the latest backup of %s into %s\n", restore_from.c_str(), data.c_str());
    return 0;
  }
  uint64_t table_bytes = 0, message_bytes = 0, session_bytes = 0;
  for (auto [flag, text, out] : {std::tuple{"--table-memory", &table_memory, &table_bytes},
                                 std::tuple{"--max-message-bytes", &max_message, &message_bytes},
                                 std::tuple{"--session-memory", &session_memory, &session_bytes}}) {
    auto bytes = strata::base::ParseByteSize(*text);
    if (!bytes.ok()) {
      std::fprintf(stderr, "strata-server: %s: %s\n", flag,
                   std::string(bytes.status().message()).c_str());
      return 2;
    }
    *out = *bytes;
  }
  auto capture_duration = strata::server::capture::ParseRetention(max_capture_duration);
  if (!capture_duration.ok() || *capture_duration <= absl::ZeroDuration() ||
      *capture_duration > absl::Hours(1)) {
    std::fprintf(stderr, "strata-server: --max-capture-duration must be between 1ms and 1h\n");
    return 2;
  }
  if (message_bytes < 4096 || message_bytes > (1u << 30)) {
    std::fprintf(stderr, "strata-server: --max-message-bytes must be in [4KiB, 1GiB]\n");
    return 2;
  }
  aggregation.memory_budget_bytes = table_bytes;
  limits.max_message_bytes = static_cast<uint32_t>(message_bytes);
  auto retention = strata::server::capture::ParseRetention(capture_retention);
  if (!retention.ok()) {
    std::fprintf(stderr, "strata-server: --capture-retention: %s\n",
                 std::string(retention.status().message()).c_str());
    return 2;
  }
  // Retention per resolution, enforced when RocksDB compacts (see StoreOptions).
  int64_t retention_ms[3];
  const std::pair<const char*, const std::string*> retention_flags[3] = {
      {"--retention-raw", &raw_retention},
      {"--retention-minute", &minute_retention},
      {"--retention-hour", &hour_retention}};
  for (int i = 0; i < 3; ++i) {
    auto d = strata::server::capture::ParseRetention(*retention_flags[i].second);
    if (!d.ok()) {
      std::fprintf(stderr, "strata-server: %s: %s\n", retention_flags[i].first,
                   std::string(d.status().message()).c_str());
      return 2;
    }
    retention_ms[i] = absl::ToInt64Milliseconds(*d);
  }
  spdlog::set_level(spdlog::level::from_str(log_level));

  // Who may call, and over what. Refuse a server reachable from other machines that anyone
  // there could read, write or capture from.
  const bool tls_on = !tls.cert_file.empty() || !tls.key_file.empty();
  if (!tls_on && !tls.client_ca_file.empty()) {
    std::fprintf(stderr, "strata-server: --tls-client-ca needs --tls-cert and --tls-key\n");
    return 2;
  }
  auth_options.client_certificates = !tls.client_ca_file.empty();
  if (certificate_role == "none") {
    auth_options.certificate_role.reset();
  } else {
    auth_options.certificate_role = strata::server::auth::ParseRole(certificate_role);
  }
  auto authorizer_or = strata::server::auth::Authorizer::Create(auth_options);
  if (!authorizer_or.ok()) {
    std::fprintf(stderr, "strata-server: %s\n",
                 std::string(authorizer_or.status().message()).c_str());
    return 2;
  }
  std::unique_ptr<strata::server::auth::Authorizer> authorizer = std::move(*authorizer_or);
  for (const std::string* address : {&listen, &http}) {
    if (address->empty() || strata::server::auth::IsLoopbackAddress(*address) || insecure) continue;
    if (!tls_on || !authorizer->enabled()) {
      std::fprintf(stderr,
                   "strata-server: refusing to listen on %s without %s: give --tls-cert and "
                   "--tls-key, and --auth-file or --tls-client-ca (see deploy/gen-certs.sh), "
                   "or --insecure\n",
                   address->c_str(),
                   !tls_on && !authorizer->enabled() ? "TLS and authentication"
                   : !tls_on                        ? "TLS"
                                                    : "authentication");
      return 2;
    }
  }
  std::shared_ptr<grpc::ServerCredentials> grpc_credentials = grpc::InsecureServerCredentials();
  if (tls_on) {
    auto credentials = strata::server::auth::MakeServerCredentials(tls);
    if (!credentials.ok()) {
      std::fprintf(stderr, "strata-server: %s\n",
                   std::string(credentials.status().message()).c_str());
      return 2;
    }
    grpc_credentials = *credentials;
  }
  // Every agent stream and HTTP connection is a file descriptor, beside RocksDB's files:
  // take all the kernel allows this process rather than the shell's default 1024.
  if (rlimit files{}; getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
    files.rlim_cur = files.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &files) != 0) spdlog::warn("cannot raise the open-file limit");
  }

  // Signals are taken synchronously by the main thread below; block them before any thread
  // starts so none of gRPC's or Beast's threads receives them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  strata::server::store::StoreOptions store_options;
  store_options.sync = sync;
  store_options.raw_retention_ms = retention_ms[0];
  store_options.minute_retention_ms = retention_ms[1];
  store_options.hour_retention_ms = retention_ms[2];
  auto store_or = strata::server::store::Store::Open(data, store_options);
  if (!store_or.ok()) {
    std::fprintf(stderr, "strata-server: cannot open data directory %s: %s\n", data.c_str(),
                 store_or.status().ToString().c_str());
    return 1;
  }
  std::unique_ptr<strata::server::store::Store> store = std::move(*store_or);
  // Writes samples an earlier process acknowledged but did not flush (see the journal).
  auto aggregator_or =
      strata::server::aggregate::WindowAggregator::Create(store.get(), aggregation);
  if (!aggregator_or.ok()) {
    std::fprintf(stderr, "strata-server: aggregation: %s\n",
                 aggregator_or.status().ToString().c_str());
    return 1;
  }
  std::unique_ptr<strata::server::aggregate::WindowAggregator> aggregator =
      std::move(*aggregator_or);
  aggregator->Start();

  strata::server::registry::AgentRegistry registry;
  strata::server::ingest::IngestMetrics metrics;
  strata::server::ingest::IngestService ingest(store.get(), &registry, &metrics,
                                       {.authorizer = authorizer.get(),
                                        .max_streams_per_principal = max_streams_per_principal,
                                        .committer = aggregator.get(),
                                        .limits = limits,
                                        .max_agents = max_agents,
                                        .worker_threads = ingest_threads,
                                        .session_memory_bytes = session_bytes});
  strata::server::query::QueryService query(store.get(), &registry, aggregator.get(),
                                     authorizer.get());
  strata::server::capture::CaptureService::Options capture_options;
  capture_options.retention = *retention;
  capture_options.max_frequency_hz = max_capture_hz;
  capture_options.max_duration = *capture_duration;
  capture_options.authorizer = authorizer.get();
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
  builder.AddListeningPort(listen, grpc_credentials, &bound_port);
  builder.RegisterService(&ingest);
  builder.RegisterService(&query);
  builder.RegisterService(&capture);
  builder.SetMaxReceiveMessageSize(static_cast<int>(limits.max_message_bytes));
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || bound_port == 0) {
    std::fprintf(stderr, "strata-server: cannot listen on %s\n", listen.c_str());
    return 1;
  }

  strata::server::http::HttpServer http_server;
  strata::server::RegisterHttpRoutes(
      &http_server, store.get(), &metrics, &query, aggregator.get(),
      {.authorizer = authorizer.get(),
       .metrics_open = metrics_open,
       .capture_limit_refusals = [&capture] { return capture.limit_refusals(); }});
  if (!http.empty()) {
    strata::server::http::HttpServerOptions http_options;
    http_options.max_connections = http_max_connections;
    http_options.tls = {tls.cert_file, tls.key_file, tls.client_ca_file};
    if (auto st = http_server.Start(http, http_options); !st.ok()) {
      std::fprintf(stderr, "strata-server: %s\n", std::string(st.message()).c_str());
      server->Shutdown();
      return 1;
    }
  }
  spdlog::info("strata-server listening on {} (port {}), HTTP on {}, data in {}; {}, {}", listen,
               bound_port, http.empty() ? "off" : http, data, tls_on ? "TLS" : "plaintext",
               authorizer->enabled() ? "authentication required" : "no authentication");
  // The HTTP port first: whoever waits for "ready" (tests, scripts with port 0) finds both.
  if (!http.empty()) std::printf("strata-server HTTP on port %d\n", http_server.port());
  std::printf("strata-server ready on port %d\n", bound_port);
  std::fflush(stdout);

  int sig = 0;
  sigwait(&signals, &sig);
  spdlog::info("signal {}: shutting down", sig);
  // Agents' streams end here; every batch acknowledged so far is already committed.
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(3));
  http_server.Stop();
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

}  // namespace

int main(int argc, char** argv) { return Run(argc, argv); }
