#include "server/server_metrics.h"

#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "common/base/clock.h"
#include "common/base/escape.h"
#include "server/commit/profile_type.h"
#include "server/grafana/querier.h"
#include "server/web/assets.h"

namespace strata::server {
namespace {

http::HttpResponse Json(const google::protobuf::Message& message) {
  http::HttpResponse r;
  r.content_type = "application/json";
  google::protobuf::util::JsonPrintOptions options;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(message, &r.body, options);
  return r;
}

// `s` as the contents of a JSON string: quotes, backslashes, control characters and bytes
// that are not UTF-8 escaped, and at most `max_bytes` of it (status messages may quote what
// a client sent, such as a regular expression).
std::string JsonEscape(absl::string_view s, size_t max_bytes = 1024) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  const size_t n = std::min(s.size(), max_bytes);
  for (size_t i = 0; i < n;) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    size_t len = 1;
    if (c >= 0xC2 && c <= 0xF4) len = c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    bool sequence = len > 1 && i + len <= n;
    for (size_t k = 1; sequence && k < len; ++k) {
      sequence = (static_cast<unsigned char>(s[i + k]) & 0xC0) == 0x80;
    }
    if (sequence) {
      out.append(s.data() + i, len);
      i += len;
      continue;
    }
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c >= 0x20 && c < 0x7f) {
      out.push_back(static_cast<char>(c));
    } else {
      out += "\\u00";
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
    ++i;
  }
  if (s.size() > n) absl::StrAppend(&out, "...(", s.size(), " bytes)");
  return out;
}

http::HttpResponse Error(const absl::Status& status) {
  int code = 500;
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument: code = 400; break;
    case absl::StatusCode::kNotFound: code = 404; break;
    case absl::StatusCode::kUnauthenticated: code = 401; break;
    case absl::StatusCode::kPermissionDenied: code = 403; break;
    case absl::StatusCode::kResourceExhausted: code = 429; break;
    default: break;
  }
  return JsonErrorResponse(code, std::string(status.message()));
}

// Parses an integer query parameter within [min, max]; 400 naming the parameter otherwise.
// Only digits and a leading minus are taken: SimpleAtoi alone would also accept spaces and
// a plus sign.
absl::StatusOr<int64_t> IntParam(const std::string& key, const std::string& value, int64_t min,
                                 int64_t max) {
  const size_t digits_from = !value.empty() && value[0] == '-' ? 1 : 0;
  const bool digits =
      value.size() > digits_from &&
      std::all_of(value.begin() + digits_from, value.end(),
                  [](char c) { return absl::ascii_isdigit(static_cast<unsigned char>(c)); });
  int64_t v = 0;
  if (!digits || !absl::SimpleAtoi(value, &v) || v < min || v > max) {
    return absl::InvalidArgumentError(absl::StrCat("bad ", key, " '", base::EscapeForLog(value, 64),
                                                   "': an integer in [", min, ", ", max,
                                                   "] is expected"));
  }
  return v;
}

// Fills a ProfileFilter from ?service=&from_ms=&to_ms=&since_s=&host=&focus=&ignore=&select=
// &type= (cpu, off-cpu, wall), each key optionally prefixed (the diff's base profile uses
// "base_"). A key read here must be in kFilterKeys too, or Taking() refuses it.
absl::Status FilterFromQuery(const http::HttpRequest& req, v1::ProfileFilter* filter,
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
  filter->set_selector(get("select"));
  if (std::string type = get("type"); !type.empty()) {
    v1::ProfileType t;
    if (!commit::ParseProfileType(type, &t)) {
      return absl::InvalidArgumentError(absl::StrCat("unknown ", prefix, "type '",
                                                     base::EscapeForLog(type, 64),
                                                     "' (cpu, off-cpu, wall)"));
    }
    filter->set_type(t);
  }
  std::optional<int64_t> from_ms, to_ms;
  for (auto [key, out] : {std::pair{"from_ms", &from_ms}, std::pair{"to_ms", &to_ms}}) {
    const std::string s = get(key);
    if (s.empty()) continue;
    auto v = IntParam(prefix + key, s, 0, query::kMaxQueryMs);
    if (!v.ok()) return v.status();
    *out = *v;
  }
  if (std::string s = get("since_s"); !s.empty()) {
    if (from_ms) {
      return absl::InvalidArgumentError(
          absl::StrCat("give ", prefix, "since_s or ", prefix, "from_ms, not both"));
    }
    // Ten years in seconds; in milliseconds still far from overflowing.
    constexpr int64_t kTenYears = int64_t{10} * 366 * 24 * 3600;
    auto v = IntParam(prefix + "since_s", s, 1, kTenYears);
    if (!v.ok()) return v.status();
    from_ms = std::max<int64_t>(0, base::NowMs() - *v * 1000);
  }
  if (from_ms && to_ms && *from_ms > *to_ms) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, "from_ms (or ", prefix,
                                                   "since_s) is after ", prefix, "to_ms"));
  }
  if (from_ms) filter->mutable_range()->set_from_ms(*from_ms);
  if (to_ms) filter->mutable_range()->set_to_ms(*to_ms);
  return absl::OkStatus();
}

// The keys FilterFromQuery reads, before any prefix.
constexpr const char* kFilterKeys[] = {"service", "host",  "focus",   "ignore", "capture",
                                       "select",  "type",  "from_ms", "to_ms",  "since_s"};

// `handler`, answering 400 to a query key it does not take instead: a misspelt or guessed key
// (since=1h for since_s=3600) would otherwise be ignored, and the query answered for the
// default range as if it had been asked. It takes `keys`, and the filter's keys under each of
// `filter_prefixes` ("" for the plain ones).
http::HttpServer::Handler Taking(std::vector<std::string> keys,
                                 const std::vector<std::string>& filter_prefixes,
                                 http::HttpServer::Handler handler) {
  for (const std::string& prefix : filter_prefixes) {
    for (const char* key : kFilterKeys) keys.push_back(prefix + key);
  }
  std::sort(keys.begin(), keys.end());
  return [keys = std::move(keys), handler = std::move(handler)](const http::HttpRequest& req) {
    for (const auto& [key, value] : req.query) {
      if (!std::binary_search(keys.begin(), keys.end(), key)) {
        return Error(absl::InvalidArgumentError(
            absl::StrCat("unknown parameter '", base::EscapeForLog(key, 64), "'",
                         keys.empty() ? " (this endpoint takes none)"
                                      : absl::StrCat(" (this endpoint takes ",
                                                     absl::StrJoin(keys, ", "), ")"))));
      }
    }
    return handler(req);
  };
}

// ?limit= (or another count): 0 or absent means the query's default.
absl::StatusOr<uint32_t> LimitFromQuery(const http::HttpRequest& req, const char* key = "limit") {
  auto it = req.query.find(key);
  if (it == req.query.end() || it->second.empty()) return 0;
  auto v = IntParam(key, it->second, 0, 1'000'000);
  if (!v.ok()) return v.status();
  return static_cast<uint32_t>(*v);
}

http::HttpResponse Raw(const std::string& content_type, std::string body) {
  http::HttpResponse r;
  r.content_type = content_type;
  r.body = std::move(body);
  return r;
}

// ?NAME=1|true|0|false; absent or empty: false.
absl::StatusOr<bool> FlagFromQuery(const http::HttpRequest& req, const std::string& name) {
  auto it = req.query.find(name);
  if (it == req.query.end() || it->second.empty() || it->second == "0" || it->second == "false") {
    return false;
  }
  if (it->second == "1" || it->second == "true") return true;
  return absl::InvalidArgumentError(absl::StrCat(
      name, " must be 1, true, 0 or false, not '", base::EscapeForLog(it->second, 64), "'"));
}

// ?by=line (self samples per source line) | function (the default).
absl::StatusOr<bool> ByLineFromQuery(const http::HttpRequest& req) {
  auto it = req.query.find("by");
  if (it == req.query.end() || it->second.empty() || it->second == "function") return false;
  if (it->second == "line") return true;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown by '", base::EscapeForLog(it->second, 64), "' (function, line)"));
}

// ?by= and ?language_self= of a TopRequest or DiffRequest.
template <typename Request>
absl::Status LineOptionsFromQuery(const http::HttpRequest& req, Request* request) {
  auto by_line = ByLineFromQuery(req);
  if (!by_line.ok()) return by_line.status();
  auto language_self = FlagFromQuery(req, "language_self");
  if (!language_self.ok()) return language_self.status();
  request->set_by_line(*by_line);
  request->set_language_self(*language_self);
  return absl::OkStatus();
}

absl::StatusOr<v1::FlameGraphRequest::Format> FlameFormat(const http::HttpRequest& req) {
  auto it = req.query.find("format");
  if (it == req.query.end() || it->second == "json") return v1::FlameGraphRequest::JSON;
  v1::FlameGraphRequest::Format format;
  if (it->second == "tree") return v1::FlameGraphRequest::TREE;
  if (!v1::FlameGraphRequest::Format_Parse(absl::AsciiStrToUpper(it->second), &format)) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown format '", base::EscapeForLog(it->second, 64),
                     "' (svg, html, folded, json, tree)"));
  }
  return format;
}


// `handler` behind the authorizer: 401 with a Basic challenge (browsers prompt for the token
// as the password) when credentials are missing or unknown, 403 for a role that does not
// allow `action`, 429 over the principal's query rate.
http::HttpServer::Handler Guard(auth::Authorizer* authorizer, auth::Role need, const char* action,
                          bool rate_limited, http::HttpServer::Handler handler) {
  if (authorizer == nullptr || !authorizer->enabled()) return handler;
  return [=](const http::HttpRequest& req) {
    auto principal =
        authorizer->Authorize({req.authorization, req.peer_identity}, need, action);
    absl::Status st = principal.status();
    if (st.ok() && rate_limited) st = authorizer->AdmitQuery(*principal);
    if (st.ok()) return handler(req);
    http::HttpResponse r = Error(st);
    if (absl::IsUnauthenticated(st)) {
      r.headers.emplace_back("WWW-Authenticate", "Basic realm=\"Strata\", charset=\"UTF-8\"");
    }
    return r;
  };
}

// The Prometheus text of /metrics: ingest, authorization, captures, HTTP, store and
// aggregation counters.
http::HttpResponse RenderMetrics(const http::HttpServer* http, store::Store* store,
                                 ingest::IngestMetrics* metrics,
                                 const aggregate::WindowAggregator* aggregator,
                                 const HttpAccess& access) {
  http::HttpResponse r;
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
  counter("strata_ingest_reads_held_total",
          "Times an agent stream was not read while its replies backed up unread.",
          metrics->reads_held);
  counter("strata_ingest_label_sets_refused_total",
          "Target label sets refused past --max-label-sets (stored as strata_overflow).",
          ingest::LabelSetsRefused());
  auto gauge = [&](const char* name, const char* help, auto value) {
    absl::StrAppend(&r.body, "# HELP ", name, " ", help, "\n# TYPE ", name, " gauge\n", name,
                    " ", value, "\n");
  };
  gauge("strata_ingest_connected_agents", "Agent streams open now.", metrics->connected.load());
  gauge("strata_ingest_queued_messages", "Agent messages waiting for an ingest worker.",
        metrics->queued.load());
  gauge("strata_memory_agent_session_bytes",
        "Agent sessions' call graphs and decode caches (estimate; --session-memory).",
        metrics->session_bytes.load());
  counter("strata_ingest_sessions_unloaded_total",
          "Agent graphs dropped for the session memory budget (reloaded on the next batch).",
          metrics->sessions_unloaded);
  counter("strata_ingest_graphs_deleted_total",
          "Stored agent call graphs deleted, unused for longer than --graph-retention.",
          metrics->graphs_deleted);
  counter("strata_ingest_streams_refused_total",
          "Agent streams refused over --max-agents (RESOURCE_EXHAUSTED).",
          metrics->streams_refused);
  counter("strata_ingest_principal_streams_refused_total",
          "Agent streams refused over --max-streams-per-principal.",
          metrics->principal_streams_refused);
  counter("strata_ingest_identity_refused_total",
          "Agents refused for writing as another principal's agent ID or host.",
          metrics->identity_refused);
  if (access.authorizer != nullptr) {
    const auth::AuthStats a = access.authorizer->stats();
    counter("strata_auth_unauthenticated_total",
            "Calls refused for missing, malformed or unknown credentials (401).",
            a.unauthenticated);
    counter("strata_auth_permission_denied_total",
            "Calls refused for a role that does not allow them (403).", a.permission_denied);
    counter("strata_auth_rate_limited_total",
            "Query calls refused over the principal's --query-rate (429).", a.rate_limited);
    counter("strata_auth_reloads_total", "Changes of the tokens file taken.", a.reloads);
    counter("strata_auth_reload_errors_total",
            "Changes of the tokens file refused (the previous one stays).", a.reload_errors);
  }
  counter("strata_ingest_acks_total", "Batches acknowledged to agents.", metrics->acks);
  counter("strata_ingest_redirects_total",
          "Agent streams sent to their host's owners (cluster).", metrics->redirects);
  counter("strata_ingest_replica_streams_total",
          "Streams taken as another cluster node's replica.", metrics->replica_streams);
  counter("strata_ingest_replication_failures_total",
          "Batches not acknowledged because an owner did not confirm them.",
          metrics->replication_failures);
  if (access.otlp != nullptr) {
    const otlp::OtlpMetrics& o = *access.otlp;
    counter("strata_otlp_requests_total", "OTLP Export requests received (replica calls too).",
            o.requests);
    counter("strata_otlp_rejected_requests_total",
            "OTLP Export requests refused (malformed, over a limit, wrong role).",
            o.rejected_requests);
    counter("strata_otlp_samples_total", "Samples stored from OTLP exports.", o.samples);
    counter("strata_otlp_duplicate_commits_total",
            "(host, window) parts of retried OTLP requests not stored again.",
            o.duplicate_commits);
    counter("strata_otlp_forwarded_total",
            "OTLP requests forwarded to another owner of their hosts and confirmed (cluster).",
            o.forwarded);
    counter("strata_otlp_forward_failures_total",
            "OTLP requests another owner did not confirm (answered UNAVAILABLE).",
            o.forward_failures);
  }
  if (access.regressions != nullptr) r.body += access.regressions->RenderMetrics();
  if (access.more_metrics) r.body += access.more_metrics();
  if (access.capture_limit_refusals) {
    counter("strata_capture_limit_refusals_total",
            "Captures refused for asking more than --max-capture-hz or "
            "--max-capture-duration.",
            access.capture_limit_refusals());
  }
  if (access.symbolizer != nullptr) {
    const symbolize::SymbolizerStats sy = access.symbolizer->stats();
    counter("strata_symbolize_lookups_total",
            "Frames the agents could not name, looked up in debug files by build ID.",
            sy.lookups);
    counter("strata_symbolize_named_total", "... of which named.", sy.named);
    counter("strata_symbolize_files_loaded_total",
            "Debug files read (uploads, local debug directories, debuginfod).", sy.files_loaded);
    counter("strata_symbolize_debuginfod_fetches_total", "Build IDs asked of debuginfod.",
            sy.debuginfod_fetches);
    counter("strata_symbolize_debuginfod_found_total", "... of which debuginfod had.",
            sy.debuginfod_found);
    counter("strata_symbolize_load_milliseconds_total",
            "Time spent finding, fetching and reading debug files.", sy.load_ns / 1'000'000);
    gauge("strata_symbolize_missing_build_ids", "Build IDs looked up and found nowhere.",
          access.symbolizer->Missing().size());
  }
  if (access.debuginfo != nullptr) {
    counter("strata_debuginfo_uploads_total", "Debug files uploaded and stored.",
            access.debuginfo->uploads());
    counter("strata_debuginfo_refused_uploads_total",
            "Uploads refused (not ELF, no build ID, no symbols, too large, mismatched).",
            access.debuginfo->refused_uploads());
  }
  counter("strata_ingest_resource_exhausted_total",
          "Agent streams ended for lack of memory (table budget), with a retry delay.",
          metrics->resource_exhausted);
  metrics->queue_wait.AppendPrometheus(&r.body, "strata_ingest_queue_wait_seconds",
                                       "Time an agent message waited for an ingest worker.");
  metrics->batch_apply.AppendPrometheus(&r.body, "strata_ingest_batch_apply_seconds",
                                        "Time to decode and commit one sample batch.");
  const http::HttpServerStats h = http->stats();
  gauge("strata_http_open_connections", "HTTP connections open now.", h.open_connections);
  counter("strata_http_refused_connections_total",
          "HTTP connections closed at once: over the connection limit.", h.refused_connections);
  counter("strata_http_timed_out_connections_total",
          "HTTP connections closed by a header, body or idle deadline.", h.timed_out);
  counter("strata_http_bad_requests_total", "Unparsable, oversized or non-UTF-8 requests.",
          h.bad_requests);
  counter("strata_http_connections_total", "HTTP connections accepted and served.",
          h.connections);
  counter("strata_http_requests_total", "HTTP requests read.", h.requests);
  counter("strata_http_tls_handshake_failures_total",
          "HTTPS connections closed in the TLS handshake (plaintext, old TLS, bad "
          "certificate).", h.tls_handshake_failures);
  const store::StoreStats st = store->Stats();
  gauge("strata_memory_rocksdb_memtable_bytes", "RocksDB memtables.", st.memtable_bytes);
  gauge("strata_memory_rocksdb_block_cache_bytes", "RocksDB block cache in use.",
        st.block_cache_bytes);
  gauge("strata_memory_rocksdb_table_reader_bytes", "RocksDB index and filter blocks.",
        st.table_reader_bytes);
  gauge("strata_memory_hour_block_bytes", "In-memory hour aggregates for long queries.",
        st.hour_block_bytes);
  gauge("strata_memory_minute_block_bytes",
        "In-memory minute aggregates for the edges of ranges and short queries.",
        st.minute_block_bytes);
  gauge("strata_memory_span_bytes",
        "In-memory sums of the whole hours or minutes of recent queries.", st.span_bytes);
  counter("strata_store_write_errors_total",
          "Writes the store refused (disk full, I/O errors): those batches were not "
          "acknowledged and come again.", st.write_errors);
  counter("strata_store_write_resumes_total",
          "Times the store resumed writing after such errors.", st.write_resumes);
  counter("strata_store_rollup_minute_cells_total",
          "Cells the background roller wrote to the minute rollup.", st.rollup_minute_cells);
  counter("strata_store_rollup_hour_cells_total",
          "Cells the background roller wrote to the hour rollup.", st.rollup_hour_cells);
  if (aggregator != nullptr) {
    const aggregate::AggregatorStats a = aggregator->stats();
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
    gauge("strata_aggregation_live_entries", "Entries in the sorted tables.", a.live_entries);
    gauge("strata_aggregation_tables", "Aggregation tables (services with recent samples).",
          a.tables);
    gauge("strata_memory_table_bytes", "Memory of all aggregation tables (--table-memory).",
          a.table_bytes);
    counter("strata_aggregation_tables_grown_total", "Tables doubled as their service grew.",
            a.tables_grown);
    counter("strata_aggregation_tables_released_total",
            "Idle tables released (written out, memory returned).", a.tables_released);
    counter("strata_aggregation_growth_refused_total",
            "Full tables not grown for the memory budget (written early instead).",
            a.growth_refused);
    counter("strata_aggregation_budget_refusals_total",
            "Batches refused with RESOURCE_EXHAUSTED: no room for a new table.",
            a.budget_refusals);
  }
  absl::StrAppend(&r.body, "# HELP strata_store_bytes Approximate bytes on disk.\n",
                  "# TYPE strata_store_bytes gauge\nstrata_store_bytes ",
                  store->ApproximateBytesOnDisk(), "\n");
  return r;
}

// /api/v1: the JSON mirror of the query service, each route guarded by `reader`.
template <typename Guarded>
void RegisterQueryRoutes(http::HttpServer* http, query::QueryService* query, Guarded reader) {
  http->Route("/api/v1/services", reader(Taking({}, {}, [query](const http::HttpRequest&) {
    auto r = query->RunListServices();
    return r.ok() ? Json(*r) : Error(r.status());
  })));
  http->Route("/api/v1/agents", reader(Taking({}, {}, [query](const http::HttpRequest&) {
    return Json(query->RunListAgents());
  })));
  // ?service=: the service's label keys and their values (for selectors).
  http->Route("/api/v1/labels",
              reader(Taking({"service"}, {}, [query](const http::HttpRequest& req) {
    v1::ListLabelsRequest request;
    if (auto it = req.query.find("service"); it != req.query.end()) request.set_service(it->second);
    auto r = query->RunListLabels(request);
    return r.ok() ? Json(*r) : Error(r.status());
  })));
  http->Route("/api/v1/top",
              reader(Taking({"limit", "by", "sort", "language_self"}, {""},
                            [query](const http::HttpRequest& req) {
    v1::TopRequest request;
    if (auto st = FilterFromQuery(req, request.mutable_filter()); !st.ok()) return Error(st);
    auto limit = LimitFromQuery(req);
    if (!limit.ok()) return Error(limit.status());
    request.set_limit(*limit);
    if (auto st = LineOptionsFromQuery(req, &request); !st.ok()) return Error(st);
    if (auto it = req.query.find("sort"); it != req.query.end() && !it->second.empty()) {
      if (it->second == "total") {
        request.set_sort(v1::TopRequest::TOTAL);
      } else if (it->second != "self") {
        return Error(absl::InvalidArgumentError(absl::StrCat(
            "unknown sort '", base::EscapeForLog(it->second, 64), "' (self, total)")));
      }
    }
    auto r = query->RunTop(request);
    return r.ok() ? Json(*r) : Error(r.status());
  })));
  http->Route("/api/v1/hot-paths",
              reader(Taking({"limit"}, {""}, [query](const http::HttpRequest& req) {
    v1::HotPathsRequest request;
    if (auto st = FilterFromQuery(req, request.mutable_filter()); !st.ok()) return Error(st);
    auto limit = LimitFromQuery(req);
    if (!limit.ok()) return Error(limit.status());
    request.set_limit(*limit);
    auto r = query->RunHotPaths(request);
    return r.ok() ? Json(*r) : Error(r.status());
  })));
  // ?format=json (default; nested tree) | svg | html | folded | tree (the proto's node table).
  http->Route("/api/v1/flamegraph",
              reader(Taking({"format", "max_nodes", "lines"}, {""},
                            [query](const http::HttpRequest& req) {
    v1::FlameGraphRequest request;
    if (auto st = FilterFromQuery(req, request.mutable_filter()); !st.ok()) return Error(st);
    auto format = FlameFormat(req);
    if (!format.ok()) return Error(format.status());
    request.set_format(*format);
    auto max_nodes = LimitFromQuery(req, "max_nodes");
    if (!max_nodes.ok()) return Error(max_nodes.status());
    request.set_max_nodes(*max_nodes);
    auto lines = FlagFromQuery(req, "lines");
    if (!lines.ok()) return Error(lines.status());
    request.set_lines(*lines);
    auto r = query->RunFlameGraph(request);
    if (!r.ok()) return Error(r.status());
    if (*format == v1::FlameGraphRequest::TREE) return Json(*r);
    return Raw(r->content_type(), std::move(*r->mutable_rendered()));
  })));
  // The compared profile takes the usual keys, the base profile the same keys prefixed with
  // "base_" (base_service, base_from_ms, ...); see QueryService::RunDiff for defaults.
  http->Route("/api/v1/diff",
              reader(Taking({"limit", "by", "language_self"}, {"", "base_"},
                            [query](const http::HttpRequest& req) {
    v1::DiffRequest request;
    if (auto st = FilterFromQuery(req, request.mutable_filter()); !st.ok()) return Error(st);
    if (auto st = FilterFromQuery(req, request.mutable_base(), "base_"); !st.ok()) {
      return Error(st);
    }
    // Without base_select the base has the compared profile's selector (as in the CLI);
    // base_select= (empty) compares against all targets.
    if (!req.query.contains("base_select")) {
      request.mutable_base()->set_selector(request.filter().selector());
    }
    // Likewise the profile type: base_type=cpu with type=off-cpu compares the two.
    if (!req.query.contains("base_type")) request.mutable_base()->set_type(request.filter().type());
    auto limit = LimitFromQuery(req);
    if (!limit.ok()) return Error(limit.status());
    request.set_limit(*limit);
    if (auto st = LineOptionsFromQuery(req, &request); !st.ok()) return Error(st);
    auto r = query->RunDiff(request);
    return r.ok() ? Json(*r) : Error(r.status());
  })));
  // Each group takes the usual keys prefixed "baseline_" or "candidate_" (baseline_select,
  // candidate_since_s, ...); unprefixed keys (service, since_s, host, ...) are both groups'
  // defaults. See QueryService::RunCompare.
  http->Route("/api/v1/compare",
              reader(Taking({"limit", "window_s", "windows_independent", "language_self", "fdr",
                             "confidence", "min_share", "baseline_requests",
                             "candidate_requests"},
                            {"", "baseline_", "candidate_"}, [query](const http::HttpRequest& req) {
    v1::CompareRequest request;
    v1::ProfileFilter shared;
    if (auto st = FilterFromQuery(req, &shared); !st.ok()) return Error(st);
    request.set_service(shared.service());
    for (const auto& [prefix, group] : {std::pair{"baseline_", request.mutable_baseline()},
                                        std::pair{"candidate_", request.mutable_candidate()}}) {
      if (auto st = FilterFromQuery(req, group, prefix); !st.ok()) return Error(st);
      auto given = [&, p = std::string(prefix)](const char* key) {
        return req.query.contains(p + key);
      };
      if (group->host().empty()) group->set_host(shared.host());
      if (group->focus().empty()) group->set_focus(shared.focus());
      if (group->ignore().empty()) group->set_ignore(shared.ignore());
      if (!given("select")) group->set_selector(shared.selector());
      if (!given("type")) group->set_type(shared.type());
      if (!group->has_range()) *group->mutable_range() = shared.range();
    }
    auto limit = LimitFromQuery(req);
    auto window = LimitFromQuery(req, "window_s");
    auto independent = FlagFromQuery(req, "windows_independent");
    auto language_self = FlagFromQuery(req, "language_self");
    for (const absl::Status& st :
         {limit.status(), window.status(), independent.status(), language_self.status()}) {
      if (!st.ok()) return Error(st);
    }
    request.set_limit(*limit);
    request.set_window_s(*window);
    request.set_windows_independent(*independent);
    request.set_language_self(*language_self);
    for (const auto& [key, set] : {std::pair{"fdr", &v1::CompareRequest::set_fdr},
                                   std::pair{"confidence", &v1::CompareRequest::set_confidence},
                                   std::pair{"min_share", &v1::CompareRequest::set_min_share}}) {
      auto it = req.query.find(key);
      if (it == req.query.end() || it->second.empty()) continue;
      double v = 0;
      // min_share is a percentage, checked by the query.
      const double max = std::string_view(key) == "min_share" ? 100 : 1;
      if (!absl::SimpleAtod(it->second, &v) || !(v > 0 && v < max)) {
        return Error(absl::InvalidArgumentError(absl::StrCat("bad ", key, " '",
                                                             base::EscapeForLog(it->second, 64),
                                                             "': a number in (0, ", max,
                                                             ") is expected")));
      }
      (request.*set)(v);
    }
    for (const auto& [key, set] :
         {std::pair{"baseline_requests", &v1::CompareRequest::set_baseline_requests},
          std::pair{"candidate_requests", &v1::CompareRequest::set_candidate_requests}}) {
      if (auto it = req.query.find(key); it != req.query.end() && !it->second.empty()) {
        auto v = IntParam(key, it->second, 0, int64_t{1} << 62);
        if (!v.ok()) return Error(v.status());
        (request.*set)(static_cast<uint64_t>(*v));
      }
    }
    auto r = query->RunCompare(request);
    return r.ok() ? Json(*r) : Error(r.status());
  })));
  // ?step_ms= (0 or absent: about 100 intervals) &group_by=LABEL|host &limit= (series).
  http->Route("/api/v1/series",
              reader(Taking({"step_ms", "group_by", "limit"}, {""},
                            [query](const http::HttpRequest& req) {
    v1::SeriesRequest request;
    if (auto st = FilterFromQuery(req, request.mutable_filter()); !st.ok()) return Error(st);
    if (auto it = req.query.find("step_ms"); it != req.query.end() && !it->second.empty()) {
      auto step = IntParam("step_ms", it->second, 0, int64_t{366} * 24 * 3600 * 1000);
      if (!step.ok()) return Error(step.status());
      request.set_step_ms(*step);
    }
    if (auto it = req.query.find("group_by"); it != req.query.end()) {
      request.set_group_by(it->second);
    }
    auto limit = LimitFromQuery(req);
    if (!limit.ok()) return Error(limit.status());
    request.set_limit(*limit);
    auto r = query->RunSeries(request);
    return r.ok() ? Json(*r) : Error(r.status());
  })));
  http->Route("/api/v1/quality", reader(Taking({}, {""}, [query](const http::HttpRequest& req) {
    v1::QualityRequest request;
    if (auto st = FilterFromQuery(req, request.mutable_filter()); !st.ok()) return Error(st);
    auto r = query->RunQuality(request);
    return r.ok() ? Json(*r) : Error(r.status());
  })));
  // Grafana's Pyroscope data source: Connect calls of querier.v1.QuerierService.
  for (const std::string& path : grafana::QuerierPaths()) {
    http->Route(path, reader([query](const http::HttpRequest& req) {
      return grafana::ServeQuerierCall(query, req);
    }));
  }
  http->Route("/api/v1/export",
              reader(Taking({"format"}, {""}, [query](const http::HttpRequest& req) {
    v1::ExportRequest request;
    if (auto st = FilterFromQuery(req, request.mutable_filter()); !st.ok()) return Error(st);
    if (auto it = req.query.find("format"); it != req.query.end() && it->second != "pprof") {
      return Error(absl::InvalidArgumentError(
          absl::StrCat("unknown export format '", base::EscapeForLog(it->second, 64),
                       "' (pprof)")));
    }
    auto r = query->RunExport(request);
    if (!r.ok()) return Error(r.status());
    return Raw(r->content_type(), std::move(*r->mutable_data()));
  })));
}

// The web UI: static assets compiled into the binary, a copy away, so served inline.
void RegisterWebUi(http::HttpServer* http, auth::Authorizer* authorizer) {
  for (const web::Asset& asset : web::Assets()) {
    http::HttpResponse response{200, std::string(asset.content_type), std::string(asset.body)};
    http->Route(std::string(asset.path),
                Guard(authorizer, auth::Role::kReader, "the web UI", /*rate_limited=*/false,
                      [response](const http::HttpRequest&) { return response; }),
                http::HttpServer::Dispatch::kInline);
  }
}

}  // namespace

http::HttpResponse JsonErrorResponse(int status, const std::string& message) {
  http::HttpResponse r;
  r.status = status;
  r.content_type = "application/json";
  r.body = absl::StrCat("{\"error\":\"", JsonEscape(message), "\"}");
  return r;
}

void RegisterHttpRoutes(http::HttpServer* http, store::Store* store, ingest::IngestMetrics* metrics,
                        query::QueryService* query, const aggregate::WindowAggregator* aggregator,
                        const HttpAccess& access) {
  auth::Authorizer* const authorizer = access.authorizer;
  auto reader = [authorizer](http::HttpServer::Handler h) {
    return Guard(authorizer, auth::Role::kReader, "queries", /*rate_limited=*/true, std::move(h));
  };
  // Health checks answer on the I/O threads and metrics on a thread of their own: neither
  // waits behind slow queries. Metrics may wait briefly (the aggregator's lock, RocksDB
  // properties), which must not hold an I/O thread.
  http->Route(
      "/healthz",
      [](const http::HttpRequest&) {
        return http::HttpResponse{200, "text/plain", "ok\n"};
      },
      http::HttpServer::Dispatch::kInline);
  // Readiness, for a load balancer or Kubernetes' readinessProbe: not while the store cannot
  // write, when every batch sent here would be refused. (/healthz stays the liveness check: a
  // restart does not make a full disk write.)
  http->Route(
      "/readyz",
      [store](const http::HttpRequest&) {
        if (store->WritesFailing()) {
          return http::HttpResponse{503, "text/plain",
                                    "not ready: the store cannot write (disk full or failing)\n"};
        }
        return http::HttpResponse{200, "text/plain", "ready\n"};
      },
      http::HttpServer::Dispatch::kInline);
  http::HttpServer::Handler metrics_handler = [http, store, metrics, aggregator,
                                               access](const http::HttpRequest&) {
    return RenderMetrics(http, store, metrics, aggregator, access);
  };
  if (!access.metrics_open) {
    metrics_handler = Guard(authorizer, auth::Role::kReader, "metrics", /*rate_limited=*/false,
                            std::move(metrics_handler));
  }
  http->Route("/metrics", std::move(metrics_handler), http::HttpServer::Dispatch::kPriority);
  RegisterQueryRoutes(http, query, reader);
  if (regress::RegressionsService* regressions = access.regressions; regressions != nullptr) {
    // ?service=&since_s= (default: every verdict).
    http->Route("/api/v1/regressions",
                reader(Taking({"service", "since_s"}, {},
                              [regressions](const http::HttpRequest& req) {
      v1::ListRegressionsRequest request;
      if (auto it = req.query.find("service"); it != req.query.end()) {
        request.set_service(it->second);
      }
      if (auto it = req.query.find("since_s"); it != req.query.end() && !it->second.empty()) {
        auto s = IntParam("since_s", it->second, 1, int64_t{1} << 32);
        if (!s.ok()) return Error(s.status());
        request.set_since_ms(std::max<int64_t>(0, base::NowMs() - *s * 1000));
      }
      auto r = regressions->RunList(request);
      return r.ok() ? Json(*r) : Error(r.status());
    })));
  }
  RegisterWebUi(http, authorizer);
}

}  // namespace strata::server
