// HTTP routes of strata-server: /healthz, Prometheus /metrics, the JSON mirror of the
// query API (/api/v1/services, agents, top, hot-paths, flamegraph, diff, export) and the web
// UI (/, /ui/...). The routes borrow the store, metrics, query service and aggregator (may be
// null), which must outlive the HttpServer.
#ifndef STRATA_SERVER_SERVER_METRICS_H_
#define STRATA_SERVER_SERVER_METRICS_H_

#include "server/aggregate/window_aggregator.h"
#include "server/http/http_server.h"
#include "server/ingest/ingest_service.h"
#include "server/query/query_service.h"
#include "server/store/store.h"

namespace strata::server {

void RegisterHttpRoutes(HttpServer* http, store::Store* store, IngestMetrics* metrics,
                        QueryService* query, const WindowAggregator* aggregator = nullptr);

}  // namespace strata::server

#endif  // STRATA_SERVER_SERVER_METRICS_H_
