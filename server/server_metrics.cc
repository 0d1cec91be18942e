#include "server/server_metrics.h"

#include <google/protobuf/util/json_util.h>

#include "absl/strings/numbers.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "server/web/assets.h"

namespace strata::server {
namespace {

HttpResponse Json(const google::protobuf::Message& message) {
  HttpResponse r;
  r.content_type = "application/json";
  google::protobuf::util::JsonPrintOptions options;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(message, &r.body, options);
  return r;
}

HttpResponse Error(const absl::Status& status) {
  HttpResponse r;
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument: r.status = 400; break;
    case absl::StatusCode::kNotFound: r.status = 404; break;
    default: r.status = 500;
  }
  r.content_type = "application/json";
  std::string escaped;
  for (char c : status.message()) {
    if (c == '"' || c == '\\') escaped.push_back('\\');
    if (static_cast<unsigned char>(c) >= 0x20) escaped.push_back(c);
  }
  r.body = absl::StrCat("{\"error\":\"", escaped, "\"}");
  return r;
}

// Fills a ProfileFilter from ?service=&from_ms=&to_ms=&since_s=&host=&focus=&ignore=, each
// key optionally prefixed (the diff's base profile uses "base_").
absl::Status FilterFromQuery(const HttpRequest& req, v1::ProfileFilter* filter,
                             const std::string& prefix = "") {
  auto get = [&](const char* key) -> std::string {
    auto it = req.query.find(prefix + key);
    return it == req.query.end() ? "" : it->second;
  };
  filter->set_service(get("service"));
  filter->set_host(get("host"));
  filter->set_focus(get("focus"));
  filter->set_ignore(get("ignore"));
  filter->set_capture_id(get("capture"));
  int64_t v = 0;
  for (auto [key, setter] :
       {std::pair<const char*, void (v1::TimeRange::*)(int64_t)>{"from_ms", &v1::TimeRange::set_from_ms},
        {"to_ms", &v1::TimeRange::set_to_ms}}) {
    std::string s = get(key);
    if (s.empty()) continue;
    if (!absl::SimpleAtoi(s, &v)) {
      return absl::InvalidArgumentError(absl::StrCat("bad ", prefix, key, " '", s, "'"));
    }
    (filter->mutable_range()->*setter)(v);
  }
  if (std::string s = get("since_s"); !s.empty()) {
    if (!absl::SimpleAtoi(s, &v) || v <= 0) {
      return absl::InvalidArgumentError(absl::StrCat("bad ", prefix, "since_s '", s, "'"));
    }
    const int64_t now = std::chrono::duration_cast<std::chrono::milliseconds>(
                            std::chrono::system_clock::now().time_since_epoch())
                            .count();
    filter->mutable_range()->set_from_ms(now - v * 1000);
  }
  return absl::OkStatus();
}

uint32_t LimitFromQuery(const HttpRequest& req, const char* key = "limit") {
  auto it = req.query.find(key);
  uint32_t limit = 0;
  if (it != req.query.end()) (void)absl::SimpleAtoi(it->second, &limit);
  return limit;
}

HttpResponse Raw(const std::string& content_type, std::string body) {
  HttpResponse r;
  r.content_type = content_type;
  r.body = std::move(body);
  return r;
}

absl::StatusOr<v1::FlameGraphRequest::Format> FlameFormat(const HttpRequest& req) {
  auto it = req.query.find("format");
  if (it == req.query.end() || it->second == "json") return v1::FlameGraphRequest::JSON;
  v1::FlameGraphRequest::Format format;
  if (it->second == "tree") return v1::FlameGraphRequest::TREE;
  if (!v1::FlameGraphRequest::Format_Parse(absl::AsciiStrToUpper(it->second), &format)) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown format '", it->second, "' (svg, html, folded, json, tree)"));
  }
  return format;
}

}  // namespace

void RegisterHttpRoutes(HttpServer* http, store::Store* store, IngestMetrics* metrics,
                        QueryService* query, const WindowAggregator* aggregator) {
  http->Route("/healthz", [](const HttpRequest&) { return HttpResponse{200, "text/plain", "ok\n"}; });
  http->Route("/metrics", [store, metrics, aggregator](const HttpRequest&) {
    HttpResponse r;
    r.content_type = "text/plain; version=0.0.4";
    auto counter = [&](const char* name, const char* help, uint64_t value) {
      absl::StrAppend(&r.body, "# HELP ", name, " ", help, "\n# TYPE ", name, " counter\n", name,
                      " ", value, "\n");
    };
    counter("strata_ingest_streams_total", "Agent streams accepted.", metrics->streams);
    counter("strata_ingest_batches_total", "Sample batches applied.", metrics->batches);
    counter("strata_ingest_duplicate_batches_total", "Resent batches acknowledged again.",
            metrics->duplicate_batches);
    counter("strata_ingest_samples_total", "Samples applied.", metrics->samples);
    counter("strata_ingest_contexts_total", "Distinct contexts applied (per batch).",
            metrics->contexts);
    counter("strata_ingest_rejected_messages_total", "Messages rejected as malformed.",
            metrics->rejected_messages);
    counter("strata_ingest_resyncs_total", "Graph resyncs requested.", metrics->resyncs);
    if (aggregator != nullptr) {
      const AggregatorStats a = aggregator->stats();
      counter("strata_aggregation_windows_closed_total",
              "Service windows written from the sorted tables to the store.", a.windows_closed);
      counter("strata_aggregation_capacity_flushes_total",
              "Tables written early because a batch would not fit.", a.capacity_flushes);
      counter("strata_aggregation_direct_cells_total",
              "Counts written directly (closed window, or more than a table holds).", a.direct_cells);
      counter("strata_aggregation_phase_changes_total", "Phase-change events recorded.",
              a.phase_events);
      counter("strata_aggregation_journal_records_total",
              "Batches whose counts went to the tables (one journal record each).",
              a.journal_records);
      absl::StrAppend(&r.body,
                      "# HELP strata_aggregation_live_entries Entries in the sorted tables.\n",
                      "# TYPE strata_aggregation_live_entries gauge\n",
                      "strata_aggregation_live_entries ", a.live_entries, "\n");
    }
    absl::StrAppend(&r.body, "# HELP strata_store_bytes Approximate bytes on disk.\n",
                    "# TYPE strata_store_bytes gauge\nstrata_store_bytes ",
                    store->ApproximateBytesOnDisk(), "\n");
    return r;
  });
  http->Route("/api/v1/services", [query](const HttpRequest&) {
    auto r = query->RunListServices();
    return r.ok() ? Json(*r) : Error(r.status());
  });
  http->Route("/api/v1/agents", [query](const HttpRequest&) { return Json(query->RunListAgents()); });
  http->Route("/api/v1/top", [query](const HttpRequest& req) {
    v1::TopRequest request;
    if (auto st = FilterFromQuery(req, request.mutable_filter()); !st.ok()) return Error(st);
    request.set_limit(LimitFromQuery(req));
    if (auto it = req.query.find("sort"); it != req.query.end() && it->second == "total") {
      request.set_sort(v1::TopRequest::TOTAL);
    }
    auto r = query->RunTop(request);
    return r.ok() ? Json(*r) : Error(r.status());
  });
  http->Route("/api/v1/hot-paths", [query](const HttpRequest& req) {
    v1::HotPathsRequest request;
    if (auto st = FilterFromQuery(req, request.mutable_filter()); !st.ok()) return Error(st);
    request.set_limit(LimitFromQuery(req));
    auto r = query->RunHotPaths(request);
    return r.ok() ? Json(*r) : Error(r.status());
  });
  // ?format=json (default; nested tree) | svg | html | folded | tree (the proto's node table).
  http->Route("/api/v1/flamegraph", [query](const HttpRequest& req) {
    v1::FlameGraphRequest request;
    if (auto st = FilterFromQuery(req, request.mutable_filter()); !st.ok()) return Error(st);
    auto format = FlameFormat(req);
    if (!format.ok()) return Error(format.status());
    request.set_format(*format);
    request.set_max_nodes(LimitFromQuery(req, "max_nodes"));
    auto r = query->RunFlameGraph(request);
    if (!r.ok()) return Error(r.status());
    if (*format == v1::FlameGraphRequest::TREE) return Json(*r);
    return Raw(r->content_type(), std::move(*r->mutable_rendered()));
  });
  // The compared profile takes the usual keys, the base profile the same keys prefixed with
  // "base_" (base_service, base_from_ms, ...); see QueryService::RunDiff for defaults.
  http->Route("/api/v1/diff", [query](const HttpRequest& req) {
    v1::DiffRequest request;
    if (auto st = FilterFromQuery(req, request.mutable_filter()); !st.ok()) return Error(st);
    if (auto st = FilterFromQuery(req, request.mutable_base(), "base_"); !st.ok()) {
      return Error(st);
    }
    request.set_limit(LimitFromQuery(req));
    auto r = query->RunDiff(request);
    return r.ok() ? Json(*r) : Error(r.status());
  });
  http->Route("/api/v1/export", [query](const HttpRequest& req) {
    v1::ExportRequest request;
    if (auto st = FilterFromQuery(req, request.mutable_filter()); !st.ok()) return Error(st);
    if (auto it = req.query.find("format"); it != req.query.end() && it->second != "pprof") {
      return Error(absl::InvalidArgumentError(
          absl::StrCat("unknown export format '", it->second, "' (pprof)")));
    }
    auto r = query->RunExport(request);
    if (!r.ok()) return Error(r.status());
    return Raw(r->content_type(), std::move(*r->mutable_data()));
  });
  // The web UI: static assets compiled into the binary.
  for (const web::Asset& asset : web::Assets()) {
    HttpResponse response{200, std::string(asset.content_type), std::string(asset.body)};
    http->Route(std::string(asset.path), [response](const HttpRequest&) { return response; });
  }
}

}  // namespace strata::server
