#include "server/app/server_app.h"

#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/base/clock.h"
#include "common/base/log.h"
#include "server/app/grpc_log.h"
#include "server/commit/batch_committer.h"
#include "server/regress/verdict.h"
#include "server/server_metrics.h"

namespace strata::server::app {
namespace {

// Every agent stream and HTTP connection is a file descriptor, beside RocksDB's files: take all
// the kernel allows this process rather than the shell's default 1024.
void RaiseOpenFileLimit() {
  if (rlimit files{}; getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
    files.rlim_cur = files.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &files) != 0) LogWarn("cannot raise the open-file limit");
  }
}

// libdebuginfod reads its settings from the environment at every lookup: set them once,
// before any thread starts. Its cache goes under the data directory unless the operator
// chose one.
void ConfigureDebuginfod(const ServerOptions& options) {
  const std::string& urls = options.symbolize.symbolizer.debuginfod_urls;
  if (urls.empty()) {
    unsetenv("DEBUGINFOD_URLS");
    return;
  }
  setenv("DEBUGINFOD_URLS", urls.c_str(), 1);
  setenv("DEBUGINFOD_TIMEOUT", std::to_string(options.symbolize.debuginfod_timeout_s).c_str(), 1);
  setenv("DEBUGINFOD_CACHE_PATH", (options.storage.data_dir + "/debuginfod-cache").c_str(),
         /*overwrite=*/0);
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

// `status` with what failed in front of its text (and its code's name when `with_code`).
absl::Status Failed(const std::string& what, const absl::Status& status, bool with_code) {
  return absl::Status(status.code(),
                      what + (with_code ? status.ToString() : std::string(status.message())));
}

}  // namespace

absl::StatusOr<std::unique_ptr<ServerApp>> ServerApp::Create(const ServerOptions& options) {
  absl::StatusOr<ServerSecurity> security = LoadSecurity(options);
  if (!security.ok()) return security.status();
  return std::unique_ptr<ServerApp>(new ServerApp(options, *std::move(security)));
}

ServerApp::ServerApp(const ServerOptions& options, ServerSecurity security)
    : options_(options),
      authorizer_(std::move(security.authorizer)),
      grpc_credentials_(std::move(security.grpc_credentials)),
      etcd_security_(std::move(security.etcd_client)),
      node_channels_(std::move(security.node_client)) {}

ServerApp::~ServerApp() { StopQueryWarmUp(); }

void ServerApp::StopQueryWarmUp() {
  stop_query_warmup_ = true;
  if (query_warmup_.joinable()) query_warmup_.join();
}

absl::Status ServerApp::Start() {
  RaiseOpenFileLimit();
  ConfigureDebuginfod(options_);
  shutdown_signals_ = BlockShutdownSignals();
  RouteGrpcLog([this](std::string_view message) {
    listener_lost_ = true;
    rlimit files{};
    getrlimit(RLIMIT_NOFILE, &files);
    LogError("gRPC stopped taking connections on {} ({}; open-file limit {}): shutting down "
             "to be restarted",
             options_.ingest.listen, message, files.rlim_cur);
    kill(getpid(), SIGTERM);  // taken by Run()'s sigwait
  });
  if (absl::Status opened = OpenStore(); !opened.ok()) return opened;
  if (absl::Status joined = JoinCluster(); !joined.ok()) return joined;
  if (absl::Status built = BuildServices(); !built.ok()) return built;
  capture_ = std::make_unique<capture::CaptureService>(store_.get(), &registry_, CaptureOptions());
  ingest_->AddBatchObserver([capture = capture_.get()](const ingest::AppliedBatch& batch) {
    if (batch.duplicate || batch.batch->capture_id().empty()) return;
    uint64_t samples = 0;
    for (const auto& c : batch.contexts) samples += c.count;
    capture->OnSamplesStored(batch.agent->agent_id, batch.batch->capture_id(), samples);
  });
  ingest_->AddCaptureStatusObserver(
      [capture = capture_.get()](const std::string& agent_id, const auto& status) {
        capture->OnStatus(agent_id, status);
      });
  capture_->Start();
  if (absl::Status listening = Listen(); !listening.ok()) return listening;
  if (options_.query_warmup > absl::ZeroDuration()) {
    // Behind the listeners: queries are served meanwhile, the warm-up only makes them faster.
    query_warmup_ = std::thread([this] {
      const absl::Time started = absl::Now();
      const int64_t range_ms = absl::ToInt64Milliseconds(options_.query_warmup);
      const size_t services = query_->WarmUp(base::NowMs(), range_ms, stop_query_warmup_);
      LogInfo("query warm-up: {} services read in {}", services,
              absl::FormatDuration(absl::Now() - started));
    });
  }
  return absl::OkStatus();
}

absl::Status ServerApp::OpenStore() {
  const std::string& data = options_.storage.data_dir;
  // After an unclean stop RocksDB first replays its write-ahead log, which can take a while.
  LogInfo("opening the store in {}", data);
  auto store = store::Store::Open(data, options_.storage.store);
  if (!store.ok()) {
    return Failed(absl::StrCat("cannot open data directory ", data, ": "), store.status(),
                  /*with_code=*/true);
  }
  store_ = std::move(*store);
  // Writes samples an earlier process acknowledged but did not flush (see the journal).
  auto aggregator = aggregate::WindowAggregator::Create(store_.get(), options_.aggregation);
  if (!aggregator.ok()) return Failed("aggregation: ", aggregator.status(), /*with_code=*/true);
  aggregator_ = std::move(*aggregator);
  aggregator_->Start();
  return absl::OkStatus();
}

absl::Status ServerApp::JoinCluster() {
  const ClusterOptions& cluster = options_.cluster;
  if (!cluster.enabled()) return absl::OkStatus();
  auto joined = cluster::Membership::Join({.etcd_endpoints = cluster.etcd_endpoints,
                                           .etcd_security = std::move(etcd_security_),
                                           .prefix = cluster.prefix,
                                           .node_id = cluster.node_id,
                                           .advertise = cluster.advertise,
                                           .tokens = cluster.tokens,
                                           .lease_ttl = cluster.lease_ttl});
  if (!joined.ok()) return joined.status();
  membership_ = std::move(*joined);
  placement_ = std::make_unique<cluster::ClusterPlacement>(
      membership_.get(), store_.get(), &node_channels_, cluster.replication,
      &replication_metrics_);
  otlp_placement_ = std::make_unique<cluster::ClusterOtlpPlacement>(
      membership_.get(), &node_channels_, cluster.replication);
  LogInfo("cluster: node {} at {} joined {} ({} nodes, replication factor {})",
               cluster.node_id, cluster.advertise, cluster.etcd_endpoints,
               membership_->ring()->members().size(), cluster.replication.replication_factor);
  return absl::OkStatus();
}

absl::Status ServerApp::BuildServices() {
  ingest::IngestService::Options ingest_options = options_.ingest.service;
  ingest_options.authorizer = authorizer_.get();
  ingest_options.committer = aggregator_.get();
  ingest_options.placement = placement_.get();
  ingest_ = std::make_unique<ingest::IngestService>(store_.get(), &registry_, &ingest_metrics_,
                                                    std::move(ingest_options));
  otlp::OtlpService::Options otlp_options;
  otlp_options.authorizer = authorizer_.get();
  otlp_options.committer = aggregator_.get();
  otlp_options.limits = options_.ingest.service.limits;
  otlp_options.placement = otlp_placement_.get();
  otlp_ = std::make_unique<otlp::OtlpService>(store_.get(), std::move(otlp_options));
  auto debuginfo_store = symbolize::DebugInfoStore::Open(
      options_.storage.data_dir + "/debuginfo", options_.symbolize.max_debuginfo_bytes);
  if (!debuginfo_store.ok()) {
    return Failed("debug info directory: ", debuginfo_store.status(), /*with_code=*/false);
  }
  debuginfo_store_ = std::move(*debuginfo_store);
  symbolizer_ = std::make_unique<symbolize::Symbolizer>(options_.symbolize.symbolizer,
                                                        debuginfo_store_.get());
  symbolize::DebugInfoService::CopyElsewhere copy_debuginfo;
  if (membership_ != nullptr) {
    copy_debuginfo = [this](grpc::ServerContext* context, const std::string& path,
                            const std::string& file_name, const std::string& build_id) {
      return cluster::CopyDebugInfoElsewhere(membership_.get(), &node_channels_, context, path,
                                             file_name, build_id);
    };
  }
  debuginfo_ = std::make_unique<symbolize::DebugInfoService>(
      debuginfo_store_.get(), symbolizer_.get(), authorizer_.get(), std::move(copy_debuginfo));
  query_ = std::make_unique<query::QueryService>(store_.get(), &registry_, aggregator_.get(),
                                                 authorizer_.get(), symbolizer_.get());
  if (membership_ != nullptr) BuildClusterServices();
  return BuildRegressions();
}

void ServerApp::BuildClusterServices() {
  const ClusterOptions& cluster = options_.cluster;
  const uint32_t replication_factor = cluster.replication.replication_factor;
  cluster_service_ = std::make_unique<cluster::ClusterService>(
      membership_.get(), store_.get(), &registry_, aggregator_.get(), symbolizer_.get(),
      authorizer_.get(), replication_factor, &replication_metrics_);
  fanout_ = std::make_unique<cluster::FanoutSource>(membership_.get(), &node_channels_,
                                                    cluster_service_.get(), replication_factor,
                                                    cluster.query_timeout);
  query_->SetProfileSource(fanout_.get());
  debuginfo_sync_ = std::make_unique<cluster::DebugInfoSync>(
      membership_.get(), &node_channels_,
      [uploads = debuginfo_store_.get()] {
        std::vector<cluster::LocalDebugFile> files;
        for (const auto& info : uploads->List()) {
          if (std::optional<std::string> path = uploads->PathOf(info.build_id)) {
            files.push_back({info.build_id, info.file_name, *path});
          }
        }
        return files;
      },
      cluster.debuginfo_sync);
}

absl::Status ServerApp::BuildRegressions() {
  if (!options_.regressions) return absl::OkStatus();
  regress::ReleaseWatcherInputs inputs;
  query::QueryService* query = query_.get();
  inputs.services = [query]() -> absl::StatusOr<std::vector<std::string>> {
    absl::StatusOr<v1::ListServicesResponse> services = query->RunListServices();
    if (!services.ok()) return services.status();
    std::vector<std::string> names;
    for (const v1::ServiceInfo& s : services->services()) names.push_back(s.name());
    return names;
  };
  inputs.label_values = [query](const std::string& service)
      -> absl::StatusOr<std::map<std::string, std::vector<std::string>>> {
    v1::ListLabelsRequest request;
    request.set_service(service);
    absl::StatusOr<v1::ListLabelsResponse> labels = query->RunListLabels(request);
    if (!labels.ok()) return labels.status();
    std::map<std::string, std::vector<std::string>> values;
    for (const v1::LabelValues& key : labels->labels()) {
      values[key.key()].assign(key.values().begin(), key.values().end());
    }
    return values;
  };
  inputs.running = [query](const std::string& service, const std::string& label,
                           int64_t from_ms, int64_t to_ms)
      -> absl::StatusOr<std::vector<std::string>> {
    v1::SeriesRequest request;
    request.mutable_filter()->set_service(service);
    request.mutable_filter()->mutable_range()->set_from_ms(from_ms);
    request.mutable_filter()->mutable_range()->set_to_ms(to_ms);
    request.set_group_by(label);
    request.set_limit(1000);  // releases running at once: a few
    absl::StatusOr<v1::SeriesResponse> series = query->RunSeries(request);
    if (!series.ok()) return series.status();
    std::vector<std::string> values;
    for (const v1::SampleSeries& s : series->series()) {
      if (!s.other() && s.total() > 0 && !s.value().empty()) values.push_back(s.value());
    }
    return values;
  };
  inputs.phases = [query](const std::string& service, int64_t from_ms,
                          int64_t to_ms) -> absl::StatusOr<std::vector<int64_t>> {
    v1::PhasesRequest request;
    request.mutable_filter()->set_service(service);
    request.mutable_filter()->mutable_range()->set_from_ms(from_ms);
    request.mutable_filter()->mutable_range()->set_to_ms(to_ms);
    absl::StatusOr<v1::PhasesResponse> phases = query->RunPhases(request);
    if (!phases.ok()) return phases.status();
    std::vector<int64_t> starts;
    for (const v1::PhaseChange& change : phases->changes()) {
      starts.push_back(change.window_start_ms());
    }
    return starts;
  };
  const double fdr = options_.regression_fdr;
  inputs.compare =
      [query, fdr](const regress::ComparisonPlan& plan) -> absl::StatusOr<v1::ReleaseVerdict> {
    absl::StatusOr<v1::CompareResponse> comparison =
        query->RunCompare(regress::CompareRequestFor(plan, fdr));
    if (!comparison.ok()) return comparison.status();
    return regress::VerdictOf(*comparison);
  };
  regress::RegressionsOptions options = options_.regression;
  // The aggregator ranks each window against the one before: a change it reports may have
  // begun in either.
  options.watcher.phase_onset = absl::Milliseconds(2 * commit::kWindowMs);
  if (membership_ != nullptr) {
    // In a cluster the node first in the ring checks for everyone (its queries read every
    // node), so that each verdict is computed, kept and posted once.
    cluster::Membership* membership = membership_.get();
    const std::string self = options_.cluster.node_id;
    options.should_check = [membership, self] {
      std::shared_ptr<const cluster::Ring> ring = membership->ring();
      return ring != nullptr && !ring->empty() && ring->members().front().id == self;
    };
    const absl::Duration timeout = options_.cluster.query_timeout;
    options.list_elsewhere = [this, timeout](grpc::ServerContext* context,
                                             const v1::ListRegressionsRequest& request,
                                             std::vector<std::string>* unreachable) {
      return cluster::ListRegressionsElsewhere(membership_.get(), &node_channels_, context,
                                               timeout, request, unreachable);
    };
    // Every node keeps a copy of every release record: a node that takes over checking
    // continues from them, and lists them while the one that computed them is down.
    options.other_nodes = [membership] { return cluster::OtherNodes(*membership); };
    options.copy_to = [this, timeout](const std::string& node,
                                      const std::vector<v1::ReleaseVerdict>& releases) {
      return cluster::CopyReleasesTo(membership_.get(), &node_channels_, timeout, node,
                                     releases);
    };
    options.records_elsewhere = [this, timeout](std::vector<std::string>* unreachable) {
      return cluster::ReleaseRecordsElsewhere(membership_.get(), &node_channels_, timeout,
                                              unreachable);
    };
  }
  auto service = regress::RegressionsService::Create(std::move(options), std::move(inputs),
                                                     store_.get(), authorizer_.get());
  if (!service.ok()) return service.status();
  regressions_ = std::move(*service);
  if (cluster_service_ != nullptr) {
    regress::RegressionsService* regressions = regressions_.get();
    cluster_service_->SetReleaseRecords(
        {.keep = [regressions](const std::vector<v1::ReleaseVerdict>& releases) {
           return regressions->Keep(releases);
         },
         .list = [regressions] { return regressions->Releases(); }});
  }
  return absl::OkStatus();
}

capture::CaptureService::Options ServerApp::CaptureOptions() {
  capture::CaptureService::Options capture_options = options_.capture;
  capture_options.authorizer = authorizer_.get();
  if (membership_ != nullptr) {
    const absl::Duration timeout = options_.cluster.query_timeout;
    capture_options.run_elsewhere = [this](grpc::ServerContext* context, const auto& request,
                                           auto* writer) {
      return cluster::RunCaptureElsewhere(membership_.get(), &node_channels_, context, request,
                                          writer);
    };
    capture_options.list_elsewhere = [this, timeout](grpc::ServerContext* context,
                                                     auto* unreachable) {
      return cluster::ListCapturesElsewhere(membership_.get(), &node_channels_, context, timeout,
                                            unreachable);
    };
    capture_options.get_elsewhere = [this, timeout](grpc::ServerContext* context,
                                                    const auto& request, auto* record) {
      return cluster::GetCaptureElsewhere(membership_.get(), &node_channels_, context, timeout,
                                          request, record);
    };
    capture_options.cancel_elsewhere = [this, timeout](grpc::ServerContext* context,
                                                       const auto& request) {
      return cluster::CancelCaptureElsewhere(membership_.get(), &node_channels_, context,
                                             timeout, request);
    };
  }
  capture_options.deleter = [store = store_.get()](const std::string& capture_id) {
    store::WriteBatch wb;
    wb.DeleteCapture(capture_id);
    return store->Commit(&wb);
  };
  return capture_options;
}

absl::Status ServerApp::Listen() {
  const std::string& listen = options_.ingest.listen;
  if (options_.security.tls_on()) {
    // In the data directory, which the store's lock keeps to this server: the one directory
    // every deployment lets it write (the Kubernetes manifests make the root read-only).
    auto tls = auth::ServerTls::Create(
        options_.security.tls, (std::filesystem::path(options_.storage.data_dir) / "tls").string());
    if (!tls.ok()) return tls.status();
    grpc_tls_ = *std::move(tls);
    grpc_credentials_ = grpc_tls_->credentials();
  }
  grpc::ServerBuilder builder;
  builder.AddListeningPort(listen, grpc_credentials_, &grpc_port_);
  builder.RegisterService(ingest_.get());
  builder.RegisterService(otlp_.get());
  builder.RegisterService(query_.get());
  builder.RegisterService(capture_.get());
  builder.RegisterService(debuginfo_.get());
  if (regressions_ != nullptr) builder.RegisterService(regressions_.get());
  if (cluster_service_ != nullptr) builder.RegisterService(cluster_service_.get());
  builder.SetMaxReceiveMessageSize(
      static_cast<int>(options_.ingest.service.limits.max_message_bytes));
  if (!options_.ingest.accept_compressed) {
    // Refused at the call's headers (UNIMPLEMENTED, "Compression algorithm 'gzip' is
    // disabled"), before any message is inflated: see IngestOptions::accept_compressed.
    builder.SetCompressionAlgorithmSupportStatus(GRPC_COMPRESS_DEFLATE, false);
    builder.SetCompressionAlgorithmSupportStatus(GRPC_COMPRESS_GZIP, false);
  }
  // No bandwidth probe: it pings every agent at each batch (a frame to write and one to read
  // on both ends, per interval per agent) to size a receive window that batches of a few
  // kilobytes never fill.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  // A connection that never finishes its TLS or HTTP/2 handshake holds an open file, of the
  // limit past which gRPC stops listening (grpc_log.h), for 20 s rather than gRPC's 120.
  builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS, 20'000);
  // gRPC listens with SO_REUSEPORT by default: a second server on the port would start, and
  // the kernel would spread agents and queries over the two stores.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  grpc_server_ = builder.BuildAndStart();
  if (!grpc_server_ || grpc_port_ == 0) {
    return absl::UnavailableError(absl::StrCat(
        "cannot listen on ", listen, " (another process listens there, or no such address)"));
  }

  const HttpOptions& http = options_.http;
  http_server_ = std::make_unique<http::HttpServer>();
  RegisterHttpRoutes(
      http_server_.get(), store_.get(), &ingest_metrics_, query_.get(), aggregator_.get(),
      {.authorizer = authorizer_.get(),
       .metrics_open = http.metrics_open,
       .capture_limit_refusals = [capture = capture_.get()] { return capture->limit_refusals(); },
       .symbolizer = symbolizer_.get(),
       .debuginfo = debuginfo_.get(),
       .otlp = &otlp_->metrics(),
       .regressions = regressions_.get(),
       .more_metrics = membership_ == nullptr ? std::function<std::string()>() : [this] {
         return cluster::RenderClusterMetrics(*cluster_service_, debuginfo_sync_.get());
       }});
  if (!http.listen.empty()) {
    http::HttpServerOptions http_options;
    http_options.max_connections = http.max_connections;
    http_options.error_response = JsonErrorResponse;
    const auth::ServerTlsFiles& tls = options_.security.tls;
    http_options.tls = {tls.cert_file, tls.key_file, tls.client_ca_file};
    if (absl::Status started = http_server_->Start(http.listen, http_options); !started.ok()) {
      grpc_server_->Shutdown();
      return started;
    }
  }
  LogInfo("strata-server listening on {} (port {}), HTTP on {}, data in {}; {}, {}", listen,
               grpc_port_, http.listen.empty() ? "off" : http.listen, options_.storage.data_dir,
               options_.security.tls_on() ? "TLS" : "plaintext",
               authorizer_->enabled() ? "authentication required" : "no authentication");
  // The HTTP port first: whoever waits for "ready" (tests, scripts with port 0) finds both.
  if (!http.listen.empty()) std::printf("strata-server HTTP on port %d\n", http_server_->port());
  if (regressions_ != nullptr) regressions_->Start();
  std::printf("strata-server ready on port %d\n", grpc_port_);
  std::fflush(stdout);
  return absl::OkStatus();
}

int ServerApp::Run() {
  int sig = 0;
  sigwait(&shutdown_signals_, &sig);
  LogInfo("signal {}: shutting down", sig);
  if (!Shutdown().ok()) return 1;
  LogInfo("stopped cleanly");
  // For the supervisor (systemd's Restart=on-failure, a Kubernetes pod) to start it again.
  return listener_lost_ ? 1 : 0;
}

absl::Status ServerApp::Shutdown() {
  StopQueryWarmUp();
  if (regressions_ != nullptr) regressions_->Stop();
  if (membership_ != nullptr) membership_->Leave();
  grpc_server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(3));
  http_server_->Stop();
  aggregator_->Stop();
  if (absl::Status flushed = aggregator_->FlushAll(); !flushed.ok()) {
    // The journal still holds the open windows; the next start writes them.
    LogError("writing the open windows: {}", flushed.ToString());
  }
  const aggregate::AggregatorStats aggregated = aggregator_->stats();
  LogInfo("aggregation: {} windows closed, {} capacity flushes, {} cells written "
               "directly, {} phase changes",
               aggregated.windows_closed, aggregated.capacity_flushes, aggregated.direct_cells,
               aggregated.phase_events);
  aggregator_.reset();
  if (absl::Status closed = store_->Close(); !closed.ok()) {
    LogError("closing the store: {}", closed.ToString());
    return closed;
  }
  return absl::OkStatus();
}

}  // namespace strata::server::app
