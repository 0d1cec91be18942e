// HTTP routes of strata-server: /healthz (liveness), /readyz (readiness), Prometheus /metrics, the
// JSON mirror of the query API (/api/v1/services, agents, top, hot-paths, flamegraph, diff, export)
// and the web UI (/, /ui/...), behind the Authorizer (HttpAccess). The routes borrow the store,
// metrics, query service and aggregator (may be null), which must outlive the HttpServer.
#ifndef STRATA_SERVER_SERVER_METRICS_H_
#define STRATA_SERVER_SERVER_METRICS_H_

#include <cstdint>
#include <functional>

#include "server/aggregate/window_aggregator.h"
#include "server/auth/authorizer.h"
#include "server/http/http_server.h"
#include "server/ingest/ingest_service.h"
#include "server/otlp/otlp_service.h"
#include "server/query/query_service.h"
#include "server/regress/regressions_service.h"
#include "server/store/store.h"
#include "server/symbolize/debuginfo_service.h"
#include "server/symbolize/symbolizer.h"

namespace strata::server {

// Who may use the routes. /healthz and /readyz are always open; the web UI and /api/v1 need
// role reader (and count against the caller's query rate), /metrics too unless `metrics_open`.
struct HttpAccess {
  auth::Authorizer* authorizer = nullptr;  // null: open
  bool metrics_open = false;
  std::function<uint64_t()> capture_limit_refusals;  // for /metrics; optional
  // Symbolization and debug-info uploads, for /metrics; optional.
  const symbolize::Symbolizer* symbolizer = nullptr;
  const symbolize::DebugInfoService* debuginfo = nullptr;
  // OTLP profiles ingest, for /metrics; optional.
  const otlp::OtlpMetrics* otlp = nullptr;
  // Release verdicts: /api/v1/regressions, and their metrics; optional.
  regress::RegressionsService* regressions = nullptr;
  // More Prometheus text for /metrics (a cluster node's ring state); optional.
  std::function<std::string()> more_metrics;
};

// `{"error":"MESSAGE"}` with `status`, as every /api/v1 route answers its errors: the HTTP
// server's own answers (HttpServerOptions::error_response) take the same form.
http::HttpResponse JsonErrorResponse(int status, const std::string& message);

void RegisterHttpRoutes(http::HttpServer* http, store::Store* store, ingest::IngestMetrics* metrics,
                        query::QueryService* query,
                        const aggregate::WindowAggregator* aggregator = nullptr,
                        const HttpAccess& access = {});

}  // namespace strata::server

#endif  // STRATA_SERVER_SERVER_METRICS_H_
