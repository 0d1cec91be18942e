#include "server/grafana/querier.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <set>

#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/escape.h"
#include "common/labels/labels.h"
#include "server/commit/batch_committer.h"
#include "server/commit/profile_type.h"
#include "server/query/pprof.h"
#include "server/query/series.h"

namespace strata::server::grafana {
namespace {

constexpr char kService[] = "/querier.v1.QuerierService/";
constexpr char kServiceLabel[] = "service_name";
// Largest pprof a merged profile may inflate to.
constexpr size_t kMaxProfileBytes = size_t{256} << 20;
// Matchers of one LabelNames, LabelValues or Series request: each lists the label sets of
// the services it names again (Grafana sends one or a few).
constexpr int kMaxMatchers = 100;

struct KnownType {
  v1::ProfileType type;
  const char* name;
  const char* sample_type;
};
constexpr KnownType kTypes[] = {
    {v1::PROFILE_CPU, "process_cpu", "cpu"},
    {v1::PROFILE_OFF_CPU, "off_cpu", "off_cpu"},
    {v1::PROFILE_WALL, "wall", "wall"},
};
std::string TypeId(const KnownType& t) {
  return absl::StrCat(t.name, ":samples:count:", t.sample_type, ":nanoseconds");
}

// ---- Connect framing -------------------------------------------------------------------------

// Connect's name of a status code (connectrpc.com/docs/protocol#error-codes).
const char* ConnectCode(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kInvalidArgument: return "invalid_argument";
    case absl::StatusCode::kNotFound: return "not_found";
    case absl::StatusCode::kUnauthenticated: return "unauthenticated";
    case absl::StatusCode::kPermissionDenied: return "permission_denied";
    case absl::StatusCode::kResourceExhausted: return "resource_exhausted";
    case absl::StatusCode::kUnimplemented: return "unimplemented";
    case absl::StatusCode::kUnavailable: return "unavailable";
    case absl::StatusCode::kDeadlineExceeded: return "deadline_exceeded";
    case absl::StatusCode::kDataLoss: return "data_loss";
    default: return "internal";
  }
}
int HttpStatusOf(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kInvalidArgument: return 400;
    case absl::StatusCode::kNotFound: return 404;
    case absl::StatusCode::kUnauthenticated: return 401;
    case absl::StatusCode::kPermissionDenied: return 403;
    case absl::StatusCode::kResourceExhausted: return 429;
    case absl::StatusCode::kUnimplemented: return 501;
    case absl::StatusCode::kUnavailable: return 503;
    case absl::StatusCode::kDeadlineExceeded: return 504;
    default: return 500;
  }
}

http::HttpResponse ConnectError(const absl::Status& status) {
  google::protobuf::Value message;
  message.set_string_value(std::string(status.message()));
  std::string quoted;
  (void)google::protobuf::util::MessageToJsonString(message, &quoted);
  http::HttpResponse r;
  r.status = HttpStatusOf(status.code());
  r.content_type = "application/json";
  r.body = absl::StrCat("{\"code\":\"", ConnectCode(status.code()), "\",\"message\":", quoted,
                        "}");
  return r;
}

enum class Codec { kProto, kJson };

absl::StatusOr<Codec> CodecOf(const http::HttpRequest& request) {
  std::string type = absl::AsciiStrToLower(request.content_type);
  if (size_t semicolon = type.find(';'); semicolon != std::string::npos) type.resize(semicolon);
  type = std::string(absl::StripAsciiWhitespace(type));
  if (type == "application/proto") return Codec::kProto;
  if (type == "application/json") return Codec::kJson;
  return absl::InvalidArgumentError(absl::StrCat(
      "unsupported Content-Type '", base::EscapeForLog(request.content_type, 64),
      "' (application/proto, application/json)"));
}

absl::Status Decode(Codec codec, const std::string& body, google::protobuf::Message* out) {
  if (codec == Codec::kProto) {
    if (!out->ParseFromString(body)) {
      return absl::InvalidArgumentError(
          absl::StrCat("the body is not a ", out->GetTypeName(), " message"));
    }
    return absl::OkStatus();
  }
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = true;
  auto st = google::protobuf::util::JsonStringToMessage(body.empty() ? "{}" : body, out, options);
  if (!st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("the body is not a JSON ", out->GetTypeName(),
                                                   ": ", st.ToString()));
  }
  return absl::OkStatus();
}

http::HttpResponse Encode(Codec codec, const google::protobuf::Message& message) {
  http::HttpResponse r;
  if (codec == Codec::kProto) {
    r.content_type = "application/proto";
    message.SerializeToString(&r.body);
  } else {
    r.content_type = "application/json";
    (void)google::protobuf::util::MessageToJsonString(message, &r.body);
  }
  return r;
}

// ---- mapping ----------------------------------------------------------------------------------

// The services a selection covers: its own, or every service.
absl::StatusOr<std::vector<std::string>> ServicesOf(query::QueryService* query,
                                                    const Selection& selection) {
  if (!selection.service.empty()) return std::vector<std::string>{selection.service};
  auto services = query->RunListServices();
  if (!services.ok()) return services.status();
  std::vector<std::string> out;
  for (const v1::ServiceInfo& s : services->services()) out.push_back(s.name());
  return out;
}

// Every matcher parsed (none: one empty selection).
absl::StatusOr<std::vector<Selection>> SelectionsOf(
    const google::protobuf::RepeatedPtrField<std::string>& matchers) {
  if (matchers.size() > kMaxMatchers) {
    return absl::InvalidArgumentError(
        absl::StrCat(matchers.size(), " matchers: at most ", kMaxMatchers, " a request"));
  }
  std::vector<Selection> out;
  for (const std::string& m : matchers) {
    auto s = ParseLabelSelector(m);
    if (!s.ok()) return s.status();
    out.push_back(*std::move(s));
  }
  if (out.empty()) out.emplace_back();
  return out;
}

// The label sets of the selections' services that match their selectors, each with its
// service; reserved labels dropped.
absl::StatusOr<std::vector<std::pair<std::string, labels::LabelSet>>> MatchingSets(
    query::QueryService* query, const std::vector<Selection>& selections) {
  std::vector<std::pair<std::string, labels::LabelSet>> out;
  for (const Selection& selection : selections) {
    auto selector = labels::Selector::Parse(selection.selector);
    if (!selector.ok()) return selector.status();
    auto services = ServicesOf(query, selection);
    if (!services.ok()) return services.status();
    for (const std::string& service : *services) {
      std::vector<std::string> unreachable;
      auto sets = query->LabelSetsOf(service, &unreachable);
      if (absl::IsNotFound(sets.status())) continue;
      if (!sets.ok()) return sets.status();
      for (labels::LabelSet& set : *sets) {
        std::erase_if(set, [](const labels::Label& l) { return commit::IsReservedLabelKey(l.first); });
        if (selector->Matches(set)) out.emplace_back(service, std::move(set));
      }
    }
  }
  return out;
}

absl::StatusOr<v1::ProfileFilter> FilterOf(std::string_view type_id, std::string_view selector,
                                           int64_t start, int64_t end) {
  auto type = ProfileTypeOf(type_id);
  if (!type.ok()) return type.status();
  auto selection = ParseLabelSelector(selector);
  if (!selection.ok()) return selection.status();
  if (selection->service.empty()) {
    return absl::InvalidArgumentError(
        "the label selector must name a service: {service_name=\"...\"}");
  }
  if (start < 0 || end < 0 || start > query::kMaxQueryMs || end > query::kMaxQueryMs) {
    return absl::InvalidArgumentError(absl::StrCat(
        "start and end must be Unix milliseconds from 0 to ", query::kMaxQueryMs));
  }
  v1::ProfileFilter filter;
  filter.set_service(selection->service);
  filter.set_selector(selection->selector);
  filter.set_type(*type);
  filter.mutable_range()->set_from_ms(start);
  filter.mutable_range()->set_to_ms(end);
  return filter;
}

// ---- the calls ----------------------------------------------------------------------------

absl::StatusOr<querier::v1::ProfileTypesResponse> ProfileTypes(
    query::QueryService*, const querier::v1::ProfileTypesRequest&) {
  querier::v1::ProfileTypesResponse response;
  for (const KnownType& t : kTypes) {
    types::v1::ProfileType* out = response.add_profile_types();
    out->set_id(TypeId(t));
    out->set_name(t.name);
    out->set_sample_type("samples");
    out->set_sample_unit("count");
    out->set_period_type(t.sample_type);
    out->set_period_unit("nanoseconds");
  }
  return response;
}

absl::StatusOr<types::v1::LabelNamesResponse> LabelNames(
    query::QueryService* query, const types::v1::LabelNamesRequest& request) {
  auto selections = SelectionsOf(request.matchers());
  if (!selections.ok()) return selections.status();
  auto sets = MatchingSets(query, *selections);
  if (!sets.ok()) return sets.status();
  std::set<std::string> names{kServiceLabel};
  for (const auto& [service, set] : *sets) {
    for (const auto& [key, value] : set) names.insert(key);
  }
  types::v1::LabelNamesResponse response;
  for (const std::string& n : names) response.add_names(n);
  return response;
}

absl::StatusOr<types::v1::LabelValuesResponse> LabelValues(
    query::QueryService* query, const types::v1::LabelValuesRequest& request) {
  auto selections = SelectionsOf(request.matchers());
  if (!selections.ok()) return selections.status();
  std::set<std::string> values;
  auto sets = MatchingSets(query, *selections);
  if (!sets.ok()) return sets.status();
  for (const auto& [service, set] : *sets) {
    if (request.name() == kServiceLabel) {
      values.insert(service);
      continue;
    }
    for (const auto& [key, value] : set) {
      if (key == request.name()) values.insert(value);
    }
  }
  types::v1::LabelValuesResponse response;
  for (const std::string& v : values) response.add_names(v);
  return response;
}

absl::StatusOr<querier::v1::SeriesResponse> Series(query::QueryService* query,
                                                   const querier::v1::SeriesRequest& request) {
  auto selections = SelectionsOf(request.matchers());
  if (!selections.ok()) return selections.status();
  auto sets = MatchingSets(query, *selections);
  if (!sets.ok()) return sets.status();
  const std::set<std::string> wanted(request.label_names().begin(), request.label_names().end());
  std::set<labels::LabelSet> seen;
  querier::v1::SeriesResponse response;
  for (auto& [service, set] : *sets) {
    set.emplace_back(kServiceLabel, service);
    std::sort(set.begin(), set.end());
    if (!wanted.empty()) {
      std::erase_if(set, [&](const labels::Label& l) { return !wanted.contains(l.first); });
    }
    if (!seen.insert(set).second) continue;
    types::v1::Labels* out = response.add_labels_set();
    for (const auto& [key, value] : set) {
      types::v1::LabelPair* pair = out->add_labels();
      pair->set_name(key);
      pair->set_value(value);
    }
  }
  return response;
}

// The merged pprof profile of `filter` (Strata's pprof export, inflated).
absl::StatusOr<google::v1::Profile> MergedProfile(query::QueryService* query,
                                                  v1::ProfileFilter filter) {
  v1::ExportRequest pprof;
  *pprof.mutable_filter() = std::move(filter);
  auto exported = query->RunExport(pprof);
  if (!exported.ok()) return exported.status();
  auto raw = query::Gunzip(exported->data(), kMaxProfileBytes);
  if (!raw.ok()) return absl::InternalError(raw.status().message());
  google::v1::Profile profile;
  if (!profile.ParseFromString(*raw)) return absl::InternalError("the pprof export did not parse");
  return profile;
}

absl::StatusOr<querier::v1::SelectMergeStacktracesResponse> SelectMergeStacktraces(
    query::QueryService* query, const querier::v1::SelectMergeStacktracesRequest& request) {
  if (request.format() != querier::v1::PROFILE_FORMAT_UNSPECIFIED &&
      request.format() != querier::v1::PROFILE_FORMAT_FLAMEGRAPH &&
      request.format() != querier::v1::PROFILE_FORMAT_PPROF) {
    return absl::UnimplementedError("the flame graph and pprof formats are served");
  }
  if (request.has_stack_trace_selector() || request.profile_id_selector_size() > 0 ||
      request.trace_id_selector_size() > 0 || request.span_selector_size() > 0) {
    return absl::UnimplementedError(
        "stack trace, profile, trace and span selectors are not supported");
  }
  auto filter = FilterOf(request.profile_typeid(), request.label_selector(), request.start(),
                         request.end());
  if (!filter.ok()) return filter.status();
  querier::v1::SelectMergeStacktracesResponse response;
  if (request.format() == querier::v1::PROFILE_FORMAT_PPROF) {
    auto profile = MergedProfile(query, *std::move(filter));
    if (!profile.ok()) return profile.status();
    *response.mutable_pprof()->mutable_profile() = *std::move(profile);
    return response;
  }
  v1::FlameGraphRequest flame;
  *flame.mutable_filter() = *std::move(filter);
  if (request.has_max_nodes() && request.max_nodes() > 0) {
    flame.set_max_nodes(static_cast<uint32_t>(std::min<int64_t>(request.max_nodes(), UINT32_MAX)));
  }
  auto tree = query->RunFlameGraph(flame);
  if (!tree.ok()) return tree.status();
  *response.mutable_flamegraph() = ToFlameGraph(*tree);
  return response;
}

absl::StatusOr<querier::v1::SelectSeriesResponse> SelectSeries(
    query::QueryService* query, const querier::v1::SelectSeriesRequest& request) {
  if (request.group_by_size() > 1) {
    return absl::InvalidArgumentError("series are grouped by one label at most");
  }
  if (request.has_stack_trace_selector()) {
    return absl::UnimplementedError("stack trace selectors are not supported");
  }
  auto filter = FilterOf(request.profile_typeid(), request.label_selector(), request.start(),
                         request.end());
  if (!filter.ok()) return filter.status();
  // Pyroscope's step is in seconds; Strata's intervals are whole commit windows, and at most
  // kMaxSeriesIntervals of them.
  const int64_t window = commit::kWindowMs;
  const int64_t span = std::max<int64_t>(request.end() - request.start(), 1);
  // (Clamped before the conversion: a double beyond int64 does not convert. A NaN fails
  // both comparisons, so it is tested apart.)
  const double step_s = std::isnan(request.step()) ? 0.0 : std::clamp(request.step(), 0.0, 1e15);
  int64_t step_ms = static_cast<int64_t>(std::ceil(step_s * 1000));
  step_ms = std::max(step_ms, (span + query::kMaxSeriesIntervals - 1) / query::kMaxSeriesIntervals);
  step_ms = std::max<int64_t>(window, (step_ms + window - 1) / window * window);
  v1::SeriesRequest series;
  *series.mutable_filter() = *std::move(filter);
  series.set_step_ms(step_ms);
  if (request.group_by_size() == 1) series.set_group_by(request.group_by(0));
  series.set_limit(request.has_limit() && request.limit() > 0
                       ? static_cast<uint32_t>(std::min<int64_t>(request.limit(), 10'000))
                       : 10'000);
  auto answer = query->RunSeries(series);
  if (!answer.ok()) return answer.status();
  querier::v1::SelectSeriesResponse response;
  for (const v1::SampleSeries& s : answer->series()) {
    if (s.other()) continue;  // Pyroscope's limit drops the rest
    types::v1::Series* out = response.add_series();
    types::v1::LabelPair* service = out->add_labels();
    service->set_name(kServiceLabel);
    service->set_value(series.filter().service());
    if (!series.group_by().empty()) {
      types::v1::LabelPair* group = out->add_labels();
      group->set_name(series.group_by());
      group->set_value(s.value());
    }
    for (int i = 0; i < s.counts_size(); ++i) {
      types::v1::Point* p = out->add_points();
      p->set_value(static_cast<double>(s.counts(i)));
      p->set_timestamp(answer->from_ms() + i * answer->step_ms());
    }
  }
  return response;
}

absl::StatusOr<google::v1::Profile> SelectMergeProfile(
    query::QueryService* query, const querier::v1::SelectMergeProfileRequest& request) {
  if (request.has_stack_trace_selector() || request.profile_id_selector_size() > 0 ||
      request.trace_id_selector_size() > 0) {
    return absl::UnimplementedError("stack trace, profile and trace selectors are not supported");
  }
  auto filter = FilterOf(request.profile_typeid(), request.label_selector(), request.start(),
                         request.end());
  if (!filter.ok()) return filter.status();
  return MergedProfile(query, *std::move(filter));
}

// One method: decode, run, encode.
template <typename Request, typename Response>
http::HttpResponse Call(absl::StatusOr<Response> (*run)(query::QueryService*, const Request&),
                        query::QueryService* query, Codec codec, const std::string& body) {
  Request request;
  if (absl::Status st = Decode(codec, body, &request); !st.ok()) return ConnectError(st);
  absl::StatusOr<Response> response = run(query, request);
  if (!response.ok()) return ConnectError(response.status());
  return Encode(codec, *response);
}

using Handler = std::function<http::HttpResponse(query::QueryService*, Codec, const std::string&)>;

const std::map<std::string, Handler>& Methods() {
  static const auto* methods = new std::map<std::string, Handler>{
      {"ProfileTypes", [](auto* q, Codec c, const auto& b) { return Call(&ProfileTypes, q, c, b); }},
      {"LabelNames", [](auto* q, Codec c, const auto& b) { return Call(&LabelNames, q, c, b); }},
      {"LabelValues", [](auto* q, Codec c, const auto& b) { return Call(&LabelValues, q, c, b); }},
      {"Series", [](auto* q, Codec c, const auto& b) { return Call(&Series, q, c, b); }},
      {"SelectMergeStacktraces",
       [](auto* q, Codec c, const auto& b) { return Call(&SelectMergeStacktraces, q, c, b); }},
      {"SelectSeries", [](auto* q, Codec c, const auto& b) { return Call(&SelectSeries, q, c, b); }},
      {"SelectMergeProfile",
       [](auto* q, Codec c, const auto& b) { return Call(&SelectMergeProfile, q, c, b); }},
  };
  return *methods;
}

// One term's value, unquoted; `*pos` moves past it.
absl::StatusOr<std::string> QuotedValue(std::string_view text, size_t* pos) {
  if (*pos >= text.size() || (text[*pos] != '"' && text[*pos] != '\'')) {
    return absl::InvalidArgumentError("a label value must be quoted");
  }
  const char quote = text[(*pos)++];
  std::string value;
  while (*pos < text.size() && text[*pos] != quote) {
    char c = text[(*pos)++];
    if (c == '\\' && *pos < text.size()) c = text[(*pos)++];
    value.push_back(c);
  }
  if (*pos >= text.size()) return absl::InvalidArgumentError("unterminated label value");
  ++*pos;
  return value;
}

// A regex of literals and ".*" as a Strata glob.
absl::StatusOr<std::string> GlobOf(const std::string& name, const std::string& regex) {
  std::string glob;
  for (size_t i = 0; i < regex.size(); ++i) {
    if (regex.compare(i, 2, ".*") == 0) {
      glob.push_back('*');
      ++i;
    } else if (regex[i] == '\\' && i + 1 < regex.size() && !absl::ascii_isalnum(regex[i + 1])) {
      glob.push_back(regex[++i]);
    } else if (std::string_view("^$.|?+*()[]{}\\").find(regex[i]) != std::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          "label ", name, ": the regex '", base::EscapeForLog(regex, 64),
          "' is more than literals and '.*', which Strata's selectors cannot express"));
    } else {
      glob.push_back(regex[i]);
    }
  }
  return glob;
}

}  // namespace

std::vector<std::string> QuerierPaths() {
  std::vector<std::string> paths;
  for (const auto& [method, handler] : Methods()) paths.push_back(absl::StrCat(kService, method));
  return paths;
}

http::HttpResponse ServeQuerierCall(query::QueryService* query, const http::HttpRequest& request) {
  if (request.method != "POST") {
    http::HttpResponse r = ConnectError(absl::InvalidArgumentError("Connect calls are POSTs"));
    r.status = 405;
    return r;
  }
  auto codec = CodecOf(request);
  if (!codec.ok()) {
    http::HttpResponse r = ConnectError(codec.status());
    r.status = 415;
    return r;
  }
  const std::string method = request.path.substr(std::min(request.path.size(),
                                                          std::string_view(kService).size()));
  auto it = Methods().find(method);
  if (request.path.rfind(kService, 0) != 0 || it == Methods().end()) {
    return ConnectError(absl::UnimplementedError(
        absl::StrCat("unknown method '", base::EscapeForLog(request.path, 96), "'")));
  }
  return it->second(query, *codec, request.body);
}

absl::StatusOr<Selection> ParseLabelSelector(std::string_view text) {
  auto trim = [](std::string_view t) {
    while (!t.empty() && absl::ascii_isspace(static_cast<unsigned char>(t.front()))) t.remove_prefix(1);
    while (!t.empty() && absl::ascii_isspace(static_cast<unsigned char>(t.back()))) t.remove_suffix(1);
    return t;
  };
  text = trim(text);
  if (!text.empty() && text.front() == '{') {
    if (text.back() != '}') return absl::InvalidArgumentError("unbalanced '{' in the selector");
    text = trim(text.substr(1, text.size() - 2));
  }
  Selection out;
  std::vector<std::string> terms;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t name_end = pos;
    while (name_end < text.size() &&
           (absl::ascii_isalnum(text[name_end]) || text[name_end] == '_' || text[name_end] == '.' ||
            text[name_end] == '-' || text[name_end] == '/')) {
      ++name_end;
    }
    const std::string name(text.substr(pos, name_end - pos));
    if (name.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("a label name is expected at '", base::EscapeForLog(text.substr(pos), 32), "'"));
    }
    pos = name_end;
    while (pos < text.size() && text[pos] == ' ') ++pos;
    std::string op;
    for (const char* candidate : {"=~", "!~", "!=", "="}) {
      if (text.substr(pos).rfind(candidate, 0) == 0) {
        op = candidate;
        break;
      }
    }
    if (op.empty()) return absl::InvalidArgumentError(absl::StrCat("label ", name, ": an operator (=, !=, =~, !~) is expected"));
    pos += op.size();
    while (pos < text.size() && text[pos] == ' ') ++pos;
    auto value = QuotedValue(text, &pos);
    if (!value.ok()) return absl::InvalidArgumentError(absl::StrCat("label ", name, ": ", value.status().message()));
    while (pos < text.size() && text[pos] == ' ') ++pos;
    if (pos < text.size()) {
      if (text[pos] != ',') return absl::InvalidArgumentError(absl::StrCat("',' is expected after label ", name));
      ++pos;
      while (pos < text.size() && text[pos] == ' ') ++pos;
    }
    if (name == kServiceLabel) {
      if (op != "=") {
        return absl::InvalidArgumentError("service_name takes '=' and one service");
      }
      out.service = *value;
      continue;
    }
    std::string pattern = *value;
    if (op == "=~" || op == "!~") {
      auto glob = GlobOf(name, *value);
      if (!glob.ok()) return glob.status();
      pattern = *glob;
    }
    if (pattern.find(',') != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat("label ", name, ": values with ',' cannot be selected"));
    }
    terms.push_back(absl::StrCat(name, op[0] == '!' ? "!=" : "=", pattern));
  }
  out.selector = absl::StrJoin(terms, ",");
  if (auto parsed = labels::Selector::Parse(out.selector); !parsed.ok()) return parsed.status();
  return out;
}

absl::StatusOr<v1::ProfileType> ProfileTypeOf(std::string_view id) {
  std::vector<std::string> known;
  for (const KnownType& t : kTypes) {
    if (TypeId(t) == id) return t.type;
    known.push_back(TypeId(t));
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown profile type '",
                                                 base::EscapeForLog(id, 96), "' (known: ",
                                                 absl::StrJoin(known, ", "), ")"));
}

querier::v1::FlameGraph ToFlameGraph(const v1::FlameGraphResponse& tree) {
  querier::v1::FlameGraph out;
  if (tree.nodes_size() == 0) return out;
  std::map<std::string, int64_t> name_index;
  auto index_of = [&](const std::string& name) {
    auto [it, added] = name_index.try_emplace(name, out.names_size());
    if (added) out.add_names(name);
    return it->second;
  };
  index_of("total");
  const int n = tree.nodes_size();
  std::vector<int> depth(n, 0);
  std::vector<int64_t> x(n, 0), next_child_x(n, 0), level_end;
  int64_t max_self = 0;
  for (int i = 0; i < n; ++i) {
    const v1::FlameNode& node = tree.nodes(i);
    if (i > 0) {
      const int parent = static_cast<int>(node.parent());
      depth[i] = depth[parent] + 1;
      x[i] = next_child_x[parent];
      next_child_x[parent] += static_cast<int64_t>(node.total());
    }
    next_child_x[i] = x[i] + static_cast<int64_t>(node.self());  // self first, then children
    while (out.levels_size() <= depth[i]) {
      out.add_levels();
      level_end.push_back(0);
    }
    const std::string name =
        i == 0 ? "total" : tree.functions(static_cast<int>(node.function())).function();
    querier::v1::Level* level = out.mutable_levels(depth[i]);
    level->add_values(x[i] - level_end[depth[i]]);
    level->add_values(static_cast<int64_t>(node.total()));
    level->add_values(static_cast<int64_t>(node.self()));
    level->add_values(index_of(name));
    level_end[depth[i]] = x[i] + static_cast<int64_t>(node.total());
    max_self = std::max<int64_t>(max_self, static_cast<int64_t>(node.self()));
  }
  out.set_total(static_cast<int64_t>(tree.nodes(0).total()));
  out.set_max_self(max_self);
  return out;
}

}  // namespace strata::server::grafana
