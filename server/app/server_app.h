// strata-server's components, built and wired from ServerOptions: the store and the
// aggregation in front of it, cluster membership and replication, ingest, symbolization,
// queries, captures, and the gRPC and HTTP listeners.
//
// ServerApp owns every component. They are members declared in the order they are built, so
// they are destroyed in the reverse order: each borrows components declared before it (the
// store, the aggregator, the registry, the authorizer...), which outlive it. Two links point
// the other way, set once both ends exist: the query service's cluster fan-out and ingest's
// observers that tell the capture service of stored samples. Both are used only by calls,
// and the gRPC and HTTP servers, declared last, stop first. Create() builds the
// first members, from what the options name; Start() the rest, in declaration order.
// Shutdown() stops them in the order that loses nothing before they are destroyed.
#ifndef STRATA_SERVER_APP_SERVER_APP_H_
#define STRATA_SERVER_APP_SERVER_APP_H_

#include <signal.h>

#include <atomic>
#include <memory>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/aggregate/window_aggregator.h"
#include "server/app/security.h"
#include "server/app/server_options.h"
#include "server/auth/tls_credentials.h"
#include "server/capture/capture_service.h"
#include "server/cluster/fanout.h"
#include "server/cluster/membership.h"
#include "server/cluster/otlp_placement.h"
#include "server/cluster/replication.h"
#include "server/http/http_server.h"
#include "server/ingest/ingest_service.h"
#include "server/otlp/otlp_service.h"
#include "server/query/query_service.h"
#include "server/regress/regressions_service.h"
#include "server/registry/agent_registry.h"
#include "server/store/store.h"
#include "server/symbolize/debuginfo_service.h"
#include "server/symbolize/debuginfo_store.h"
#include "server/symbolize/symbolizer.h"

namespace strata::server::app {

class ServerApp {
 public:
  // Loads what the options name (tokens file, certificates, a cluster node's credentials)
  // and checks them against each other. An error is the operator's to fix: strata-server
  // exits with status 2.
  static absl::StatusOr<std::unique_ptr<ServerApp>> Create(const ServerOptions& options);

  // Opens the data directory, joins the cluster, builds and wires the services and starts
  // listening, then prints the ports ("strata-server ready on port N" last). SIGINT and
  // SIGTERM are blocked first, in this thread and so in every thread started after, for
  // Run() to take. An error (exit status 1) names what could not be opened. Call once.
  absl::Status Start();

  // After Start(): serves until SIGINT or SIGTERM, then Shutdown(); the exit status.
  int Run();

  // Once, after Start() succeeded: leaves the cluster, then stops in the order that loses
  // nothing: streams end (every batch acknowledged so far is already committed), HTTP stops,
  // the aggregator writes its open windows, the store closes. An error when the store did not
  // close cleanly.
  absl::Status Shutdown();

  ~ServerApp();
  ServerApp(const ServerApp&) = delete;
  ServerApp& operator=(const ServerApp&) = delete;

 private:
  ServerApp(const ServerOptions& options, ServerSecurity security);

  // The steps of Start().
  absl::Status OpenStore();      // the store and the aggregator
  absl::Status JoinCluster();    // membership and placement, in a cluster
  absl::Status BuildServices();  // ingest, symbolization, queries
  void BuildClusterServices();   // the Cluster service, fan-out queries, debug file sync
  capture::CaptureService::Options CaptureOptions();
  absl::Status BuildRegressions();  // the release watcher, over the query service
  absl::Status Listen();         // gRPC, then HTTP
  void StopQueryWarmUp();

  // Built by Create(): what the options name, and what needs nothing else.
  const ServerOptions options_;
  const std::unique_ptr<auth::Authorizer> authorizer_;
  std::shared_ptr<grpc::ServerCredentials> grpc_credentials_;
  rpc::ClientSecurity etcd_security_;  // moved into the membership when it joins
  cluster::NodeChannels node_channels_;  // calls to the other nodes
  cluster::ReplicationMetrics replication_metrics_;
  registry::AgentRegistry registry_;
  ingest::IngestMetrics ingest_metrics_;

  // Built by Start(), in this order.
  std::unique_ptr<store::Store> store_;
  // Reset by Shutdown() once it has written its open windows, before the store closes.
  std::unique_ptr<aggregate::WindowAggregator> aggregator_;
  // In a cluster only (null otherwise): membership_, placement_, otlp_placement_,
  // cluster_service_, fanout_ and debuginfo_sync_.
  std::unique_ptr<cluster::Membership> membership_;
  std::unique_ptr<cluster::ClusterPlacement> placement_;
  std::unique_ptr<cluster::ClusterOtlpPlacement> otlp_placement_;
  std::unique_ptr<ingest::IngestService> ingest_;
  std::unique_ptr<otlp::OtlpService> otlp_;  // OTLP profiles, into the same pipeline
  std::unique_ptr<symbolize::DebugInfoStore> debuginfo_store_;
  std::unique_ptr<symbolize::Symbolizer> symbolizer_;
  std::unique_ptr<symbolize::DebugInfoService> debuginfo_;
  std::unique_ptr<query::QueryService> query_;
  std::unique_ptr<cluster::ClusterService> cluster_service_;
  std::unique_ptr<cluster::FanoutSource> fanout_;
  std::unique_ptr<cluster::DebugInfoSync> debuginfo_sync_;
  std::unique_ptr<capture::CaptureService> capture_;
  std::unique_ptr<regress::RegressionsService> regressions_;  // null with --regressions false
  // With --tls-cert: the staged files grpc_credentials_ watch; outlives grpc_server_.
  std::unique_ptr<auth::ServerTls> grpc_tls_;
  std::unique_ptr<grpc::Server> grpc_server_;
  std::unique_ptr<http::HttpServer> http_server_;
  // Reads recent profiles into memory after start-up (QueryService::WarmUp); stopped and
  // joined by Shutdown() or the destructor, before the query service goes.
  std::atomic<bool> stop_query_warmup_{false};
  std::thread query_warmup_;

  sigset_t shutdown_signals_;  // blocked by Start(), taken by Run()
  // gRPC's listener gave up (grpc_log.h): Run() shuts down and returns 1.
  std::atomic<bool> listener_lost_{false};
  int grpc_port_ = 0;
};

}  // namespace strata::server::app

#endif  // STRATA_SERVER_APP_SERVER_APP_H_
