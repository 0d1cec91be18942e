// server/app: what strata-server is made of, and how it is configured. ServerOptions holds one
// options struct per component; server_flags.h fills it from the command line and config
// file (the only place flags are defined and checked) and server_app.h builds and wires the
// components from it.
//
// Where a component has an options struct of its own, it is used here as it is; its wiring
// fields (pointers to other components, callbacks) are left empty and filled by ServerApp.
#ifndef STRATA_SERVER_APP_SERVER_OPTIONS_H_
#define STRATA_SERVER_APP_SERVER_OPTIONS_H_

#include <cstdint>
#include <string>

#include "absl/time/time.h"
#include "common/rpc/client_security.h"
#include "server/aggregate/window_aggregator.h"
#include "server/auth/authorizer.h"
#include "server/auth/tls_credentials.h"
#include "server/capture/capture_service.h"
#include "server/cluster/replication.h"
#include "server/cluster/ring.h"
#include "server/ingest/ingest_service.h"
#include "server/regress/regressions_service.h"
#include "server/store/store.h"
#include "server/symbolize/symbolizer.h"

namespace strata::server::app {

// The data directory: the RocksDB store, and the uploaded debug files beside it.
struct StorageOptions {
  std::string data_dir = "./var/strata";
  store::StoreOptions store;  // fsync, retention per resolution, rollups
};

// The gRPC listener (agents' streams, queries, captures, debug files) and ingest.
struct IngestOptions {
  std::string listen = "127.0.0.1:7070";
  ingest::IngestService::Options service;  // limits, memory and threads
  // gRPC messages compressed by the client (gzip, deflate) accepted. gRPC 1.51 inflates a
  // message whole before max_message_bytes applies, so a client can make the server take
  // about 1000 times what it sent: off unless every client is trusted.
  bool accept_compressed = false;
};

// The HTTP listener: /healthz, /metrics, the JSON API and the web UI.
struct HttpOptions {
  std::string listen = "127.0.0.1:7071";  // empty: no HTTP
  int max_connections = 1024;
  bool metrics_open = false;  // /metrics without authentication
};

// Who may call, and over what: TLS on both listeners, tokens and client certificates.
struct SecurityOptions {
  auth::ServerTlsFiles tls;
  auth::AuthorizerOptions authorizer;
  bool insecure = false;  // listen beyond loopback without TLS or authentication

  bool tls_on() const { return !tls.cert_file.empty() || !tls.key_file.empty(); }
  // Whether callers must present credentials (the Authorizer's enabled()).
  bool authenticates() const {
    return !authorizer.auth_file.empty() || authorizer.client_certificates;
  }
};

// Names for frames the agents could not name: local debug directories, debuginfod, uploads.
struct SymbolizeOptions {
  symbolize::SymbolizerOptions symbolizer;  // debug directories, debuginfod URLs
  uint32_t debuginfod_timeout_s = 10;
  uint64_t max_debuginfo_bytes = uint64_t{2} << 30;  // largest upload
};

// A node of a cluster whose membership lives in etcd; off without etcd endpoints.
struct ClusterOptions {
  std::string etcd_endpoints;  // comma-separated; empty: a single server
  std::string node_id;
  std::string advertise;  // host:port others reach this node's gRPC at
  std::string prefix = "/strata";
  uint32_t tokens = cluster::kDefaultTokens;
  absl::Duration lease_ttl = absl::Seconds(10);
  cluster::ReplicationOptions replication;
  absl::Duration query_timeout = absl::Seconds(10);
  absl::Duration debuginfo_sync = absl::Seconds(30);
  rpc::ClientSecurityOptions node_client;  // how this node calls the other nodes
  rpc::ClientSecurityOptions etcd_client;  // and etcd

  bool enabled() const { return !etcd_endpoints.empty(); }
};

struct ServerOptions {
  std::string log_level = "info";
  StorageOptions storage;
  aggregate::AggregatorOptions aggregation;
  IngestOptions ingest;
  HttpOptions http;
  SecurityOptions security;
  capture::CaptureService::Options capture;  // retention and the caps on what clients ask
  SymbolizeOptions symbolize;
  ClusterOptions cluster;
  // What the query warm-up reads of each service after start-up (QueryService::WarmUp;
  // zero: none).
  absl::Duration query_warmup = absl::Hours(24 * 7);
  // Releases found by themselves and compared with the one before (server/regress).
  bool regressions = true;
  regress::RegressionsOptions regression;
  double regression_fdr = 0.05;
};

}  // namespace strata::server::app

#endif  // STRATA_SERVER_APP_SERVER_OPTIONS_H_
