#include "server/query/query_service.h"

#include "server/query/fdo.h"
#include "server/query/line_diff.h"
#include "server/query/lines.h"

#include <algorithm>
#include <future>
#include <limits>
#include <map>
#include <optional>
#include <set>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/base/clock.h"
#include "common/base/frame_kind.h"
#include "common/base/log.h"
#include "server/commit/batch_committer.h"
#include "server/commit/profile_type.h"
#include "server/query/compare_profiles.h"
#include "server/query/diff.h"
#include "server/query/flamegraph.h"
#include "server/query/otlp_export.h"
#include "server/query/pprof.h"
#include "server/query/quality.h"
#include "server/query/series.h"

namespace strata::server::query {
namespace {

constexpr uint32_t kDefaultLimit = 20;
constexpr uint32_t kMaxLimit = 100'000;

uint32_t EffectiveLimit(uint32_t requested) {
  if (requested == 0) return kDefaultLimit;
  return std::min(requested, kMaxLimit);
}

static_assert(static_cast<int>(base::FrameKind::kKernel) == v1::FRAME_KERNEL &&
              static_cast<int>(base::FrameKind::kJit) == v1::FRAME_JIT &&
              static_cast<int>(base::FrameKind::kPython) == v1::FRAME_PYTHON &&
              static_cast<int>(base::FrameKind::kJava) == v1::FRAME_JAVA);

std::string Rfc3339(int64_t ms) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::FromUnixMillis(ms), absl::UTCTimeZone());
}

}  // namespace

absl::StatusOr<ProfileQuery> ToProfileQuery(const v1::ProfileFilter& filter, int64_t now_ms,
                                            bool asked_again) {
  ProfileQuery q;
  q.service = filter.service();
  q.from_ms = filter.range().from_ms();
  q.to_ms = filter.range().to_ms() == 0 ? now_ms + 1 : filter.range().to_ms();
  if (q.from_ms < 0 || q.to_ms < 0) return absl::InvalidArgumentError("negative time range");
  if (q.from_ms > kMaxQueryMs || q.to_ms > kMaxQueryMs) {
    return absl::InvalidArgumentError(
        absl::StrCat("time range beyond ", kMaxQueryMs, " ms (Unix milliseconds)"));
  }
  // Samples are kept in windows addressed by their start, and a range takes the windows that
  // start in it. A window holding `from` but starting before it is left out, as one holding
  // `to` is taken: ranges that meet at T share no window, wherever T falls.
  if (q.from_ms > q.to_ms || (q.from_ms == q.to_ms && !asked_again)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "empty time range: from ", q.from_ms, " ms is not before to ", q.to_ms, " ms"));
  }
  if (q.from_ms > 0) {
    q.from_ms = std::min(commit::WindowStart(q.from_ms - 1) + commit::kWindowMs, q.to_ms);
  }
  q.host = filter.host();
  q.capture_id = filter.capture_id();
  q.focus = filter.focus();
  q.ignore = filter.ignore();
  q.selector = filter.selector();
  if (!v1::ProfileType_IsValid(filter.type())) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown profile type ", static_cast<int>(filter.type())));
  }
  q.type = filter.type();
  return q;
}

v1::ProfileFilter ToProfileFilter(const ProfileQuery& q) {
  v1::ProfileFilter f;
  f.set_service(q.service);
  f.mutable_range()->set_from_ms(q.from_ms);
  f.mutable_range()->set_to_ms(q.to_ms);
  f.set_host(q.host);
  f.set_focus(q.focus);
  f.set_ignore(q.ignore);
  f.set_capture_id(q.capture_id);
  f.set_selector(q.selector);
  f.set_type(q.type);
  return f;
}

QueryService::QueryService(store::Store* store, registry::AgentRegistry* registry,
                           const aggregate::LiveSamples* live, auth::Authorizer* authorizer,
                           symbolize::Symbolizer* symbolizer)
    : store_(store), registry_(registry), live_(live), authorizer_(authorizer),
      symbolizer_(symbolizer), reader_(store, live, symbolizer) {}

absl::StatusOr<auth::Principal> QueryService::AuthorizeQuery(
    const grpc::ServerContextBase* context) {
  return auth::AuthorizeCall(authorizer_, context, auth::Role::kReader, "queries",
                             /*rate_limited=*/true);
}

absl::StatusOr<Profile> QueryService::LoadProfile(const v1::ProfileFilter& filter) {
  auto query = ToProfileQuery(filter, base::NowMs());
  if (!query.ok()) return query.status();
  return Load(*query);
}

absl::StatusOr<Profile> QueryService::Load(const ProfileQuery& query) {
  if (source_ != nullptr) return source_->Load(query);  // its nodes expand the lines
  auto profile = reader_.Load(query);
  // A mistyped capture ID is not an empty capture.
  if (profile.ok() && profile->total == 0 && !query.capture_id.empty() &&
      absl::IsNotFound(store_->meta().GetCapture(query.capture_id).status())) {
    return absl::NotFoundError(absl::StrCat("unknown capture '", query.capture_id,
                                            "' (strata captures lists them)"));
  }
  if (!profile.ok() || !query.lines) return profile;
  return ExpandLines(store_, symbolizer_, query, *profile);
}

std::vector<std::string> QueryService::ArchsOf(const Profile& profile) {
  std::set<std::string> archs;
  auto agents = store_->meta().ListAgents();
  if (!agents.ok()) return {};
  for (const auto& a : *agents) {
    if (std::binary_search(profile.hosts.begin(), profile.hosts.end(), a.host)) {
      archs.insert(a.arch);
    }
  }
  return {archs.begin(), archs.end()};
}

absl::StatusOr<v1::TopResponse> QueryService::Lines(ProfileQuery query, bool language_self,
                                                    uint32_t limit) {
  if (!language_self) {
    if (source_ != nullptr) return source_->TopLines(query, limit);
    return TopLines(store_, symbolizer_, query, limit);
  }
  query.lines = true;
  auto profile = Load(query);
  if (!profile.ok()) return profile.status();
  return TopLinesOfStacks(*profile, limit);
}

absl::StatusOr<v1::TopResponse> QueryService::RunTop(const v1::TopRequest& request) {
  if (request.language_self() && !request.by_line()) {
    return absl::InvalidArgumentError("language_self counts lines: it needs by_line");
  }
  if (request.by_line()) {
    auto query = ToProfileQuery(request.filter(), base::NowMs());
    if (!query.ok()) return query.status();
    return Lines(*query, request.language_self(), EffectiveLimit(request.limit()));
  }
  auto profile = LoadProfile(request.filter());
  if (!profile.ok()) return profile.status();
  MergeFunctionsAcrossBuilds(&*profile);
  v1::TopResponse response;
  response.set_total_samples(profile->total);
  for (const auto& n : profile->unreachable_nodes) response.add_unreachable_nodes(n);
  auto totals = TopFunctions(*profile, request.sort() == v1::TopRequest::TOTAL);
  const uint32_t limit = EffectiveLimit(request.limit());
  for (size_t i = 0; i < totals.size() && i < limit; ++i) {
    auto* stat = response.add_functions();
    SetFrame(profile->functions[totals[i].function], stat->mutable_function());
    stat->set_self(totals[i].self);
    stat->set_total(totals[i].total);
  }
  for (auto& arch : ArchsOf(*profile)) response.add_archs(arch);
  return response;
}

absl::StatusOr<v1::HotPathsResponse> QueryService::RunHotPaths(
    const v1::HotPathsRequest& request) {
  auto profile = LoadProfile(request.filter());
  if (!profile.ok()) return profile.status();
  MergeFunctionsAcrossBuilds(&*profile);
  v1::HotPathsResponse response;
  response.set_total_samples(profile->total);
  for (const auto& n : profile->unreachable_nodes) response.add_unreachable_nodes(n);
  const uint32_t limit = EffectiveLimit(request.limit());
  for (size_t i = 0; i < profile->stacks.size() && i < limit; ++i) {
    const ResolvedStack& stack = profile->stacks[i];
    auto* path = response.add_paths();
    path->set_samples(stack.count);
    path->set_truncated(stack.truncated);
    for (uint32_t f : stack.frames) SetFrame(profile->functions[f], path->add_frames());
  }
  for (auto& arch : ArchsOf(*profile)) response.add_archs(arch);
  return response;
}

absl::Status QueryService::BoundToStoredRange(ProfileQuery* query) {
  if (query->from_ms != 0 || query->service.empty()) return absl::OkStatus();
  auto services = RunListServices();
  if (!services.ok()) return services.status();
  for (const v1::ServiceInfo& s : services->services()) {
    if (s.name() != query->service) continue;
    query->to_ms = std::max(std::min(query->to_ms, s.last_ms()), s.first_ms() + 1);
    query->from_ms = s.first_ms();
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::ListServicesResponse> QueryService::RunListServices() {
  std::vector<std::string> unreachable;
  auto services = source_ != nullptr ? source_->Services(&unreachable)
                                     : query::ListServices(store_, live_);
  if (!services.ok()) return services.status();
  v1::ListServicesResponse response;
  for (const auto& n : unreachable) response.add_unreachable_nodes(n);
  for (const auto& s : *services) {
    auto* info = response.add_services();
    info->set_name(s.service);
    info->set_total_samples(s.total_samples);
    info->set_first_ms(s.first_window_ms);
    info->set_last_ms(s.last_window_ms + commit::kWindowMs);
  }
  return response;
}

size_t QueryService::WarmUp(int64_t now_ms, int64_t range_ms, const std::atomic<bool>& stop) {
  absl::StatusOr<std::vector<store::ServiceSummary>> services = store_->samples().ListServices();
  if (!services.ok()) {
    LogWarn("query warm-up: listing the services: {}", services.status().ToString());
    return 0;
  }
  const int64_t from_ms = now_ms - range_ms;
  std::erase_if(*services, [&](const store::ServiceSummary& s) {
    return s.last_window_ms + commit::kWindowMs <= from_ms || s.first_window_ms >= now_ms;
  });
  std::sort(services->begin(), services->end(), [](const auto& a, const auto& b) {
    return a.last_window_ms > b.last_window_ms;
  });
  const size_t budget = store_->options().hour_block_cache_bytes / 2;
  size_t read = 0;
  for (const store::ServiceSummary& s : *services) {
    if (stop.load(std::memory_order_relaxed) || store_->Stats().hour_block_bytes >= budget) break;
    ProfileQuery query;
    query.service = s.service;
    query.from_ms = from_ms;
    query.to_ms = now_ms;
    // Only what a query reads is kept: an error here is the query's to report.
    if (reader_.Load(query).ok()) ++read;
  }
  return read;
}

v1::ListAgentsResponse QueryService::RunListAgents() {
  return source_ != nullptr ? source_->Agents() : ListAgentsOf(registry_);
}

v1::ListAgentsResponse ListAgentsOf(registry::AgentRegistry* registry) {
  v1::ListAgentsResponse response;
  for (registry::AgentStatus& a : registry->List()) {
    v1::AgentInfo* info = response.add_agents();
    info->set_agent_id(std::move(a.agent_id));
    info->set_host(std::move(a.host));
    info->set_arch(std::move(a.arch));
    info->set_version(std::move(a.version));
    info->set_connected(a.connected);
    info->set_last_batch_ms(a.last_batch_ms);
    info->set_batches(a.batches);
    *info->mutable_health() = std::move(a.health);
    for (const registry::TargetRef& t : a.targets) {
      info->add_targets(absl::StrCat(t.service, "/", t.pid));
    }
  }
  return response;
}

grpc::Status QueryService::ListServices(grpc::ServerContext* context, const v1::ListServicesRequest*,
                                        v1::ListServicesResponse* response) {
  if (auto p = AuthorizeQuery(context); !p.ok()) return ToGrpcStatus(p.status());
  auto r = RunListServices();
  if (!r.ok()) return ToGrpcStatus(r.status());
  *response = std::move(*r);
  return grpc::Status::OK;
}

grpc::Status QueryService::ListAgents(grpc::ServerContext* context, const v1::ListAgentsRequest*,
                                      v1::ListAgentsResponse* response) {
  if (auto p = AuthorizeQuery(context); !p.ok()) return ToGrpcStatus(p.status());
  *response = RunListAgents();
  return grpc::Status::OK;
}

grpc::Status QueryService::Top(grpc::ServerContext* context, const v1::TopRequest* request,
                               v1::TopResponse* response) {
  if (auto p = AuthorizeQuery(context); !p.ok()) return ToGrpcStatus(p.status());
  auto r = RunTop(*request);
  if (!r.ok()) return ToGrpcStatus(r.status());
  *response = std::move(*r);
  return grpc::Status::OK;
}

grpc::Status QueryService::HotPaths(grpc::ServerContext* context, const v1::HotPathsRequest* request,
                                    v1::HotPathsResponse* response) {
  if (auto p = AuthorizeQuery(context); !p.ok()) return ToGrpcStatus(p.status());
  auto r = RunHotPaths(*request);
  if (!r.ok()) return ToGrpcStatus(r.status());
  *response = std::move(*r);
  return grpc::Status::OK;
}

absl::StatusOr<v1::FlameGraphResponse> QueryService::RunFlameGraph(
    const v1::FlameGraphRequest& request) {
  auto query = ToProfileQuery(request.filter(), base::NowMs());
  if (!query.ok()) return query.status();
  query->lines = request.lines();
  auto profile = Load(*query);
  if (!profile.ok()) return profile.status();
  MergeFunctionsAcrossBuilds(&*profile);
  v1::FlameGraphResponse response;
  response.set_total_samples(profile->total);
  for (const auto& n : profile->unreachable_nodes) response.add_unreachable_nodes(n);
  for (auto& arch : ArchsOf(*profile)) response.add_archs(arch);
  const auto format = request.format();
  if (format == v1::FlameGraphRequest::FOLDED) {
    // Folded stacks are the stacks themselves: no tree, no pruning.
    response.set_rendered(RenderFolded(*profile));
    response.set_content_type("text/plain; charset=utf-8");
    return response;
  }
  const FlameTree tree = BuildFlameTree(*std::move(profile), request.max_nodes());
  response.set_pruned_nodes(tree.pruned);
  std::string title = request.title();
  if (title.empty()) {
    title = absl::StrCat(query->capture_id.empty() ? query->service : query->capture_id, "  ",
                         Rfc3339(query->from_ms), " .. ", Rfc3339(query->to_ms), "  (",
                         profile->total, " samples)");
  }
  switch (format) {
    case v1::FlameGraphRequest::SVG:
      response.set_rendered(RenderFlameSvg(tree, title));
      response.set_content_type("image/svg+xml");
      return response;
    case v1::FlameGraphRequest::HTML:
      response.set_rendered(RenderFlameHtml(tree, title));
      response.set_content_type("text/html; charset=utf-8");
      return response;
    case v1::FlameGraphRequest::JSON:
      response.set_rendered(RenderFlameJson(tree));
      response.set_content_type("application/json");
      return response;
    default:
      break;
  }
  for (const ResolvedFunction& f : tree.functions) SetFrame(f, response.add_functions());
  response.mutable_nodes()->Reserve(static_cast<int>(tree.nodes.size()));
  for (const FlameTreeNode& n : tree.nodes) {
    auto* node = response.add_nodes();
    node->set_function(n.function);
    node->set_parent(n.parent);
    node->set_total(n.total);
    node->set_self(n.self);
  }
  return response;
}

absl::StatusOr<v1::DiffResponse> QueryService::RunDiff(const v1::DiffRequest& request) {
  if (request.language_self() && !request.by_line()) {
    return absl::InvalidArgumentError("language_self counts lines: it needs by_line");
  }
  const int64_t now = base::NowMs();
  auto current = ToProfileQuery(request.filter(), now);
  if (!current.ok()) return current.status();
  v1::ProfileFilter base_filter = request.base();
  if (base_filter.service().empty() && base_filter.capture_id().empty()) {
    base_filter.set_service(request.filter().service());
  }
  // Two label selectors of one service (e.g. version=1 against version=2) are two targets
  // compared over the same range.
  const bool same_target = base_filter.service() == request.filter().service() &&
                           base_filter.capture_id() == request.filter().capture_id() &&
                           base_filter.selector() == request.filter().selector() &&
                           base_filter.type() == request.filter().type();
  if (base_filter.range().from_ms() == 0 && base_filter.range().to_ms() == 0) {
    if (same_target) {
      const int64_t length = current->to_ms - current->from_ms;
      if (current->from_ms - length < 0) {
        return absl::InvalidArgumentError("no base range before the compared range");
      }
      base_filter.mutable_range()->set_from_ms(current->from_ms - length);
      base_filter.mutable_range()->set_to_ms(current->from_ms);
    } else {
      base_filter.mutable_range()->set_from_ms(current->from_ms);
      base_filter.mutable_range()->set_to_ms(current->to_ms);
    }
  }
  auto base = ToProfileQuery(base_filter, now);
  if (!base.ok()) return base.status();
  if (same_target && base->from_ms == current->from_ms && base->to_ms == current->to_ms) {
    return absl::InvalidArgumentError("base and compared profiles are the same");
  }
  if (request.by_line()) {
    // Every line of both: a line one profile leaves out would seem to appear or vanish.
    auto lines = LoadBoth<v1::TopResponse>(*base, *current, [&](const ProfileQuery& q) {
      return Lines(q, request.language_self(), std::numeric_limits<uint32_t>::max());
    });
    if (!lines.ok()) return lines.status();
    return DiffLines(lines->first, lines->second, EffectiveLimit(request.limit()));
  }
  auto profiles =
      LoadBoth<Profile>(*base, *current, [&](const ProfileQuery& q) { return Load(q); });
  if (!profiles.ok()) return profiles.status();
  const auto& [base_profile, profile] = *profiles;

  const ProfileDiff diff = DiffProfiles(base_profile, profile, EffectiveLimit(request.limit()));
  v1::DiffResponse response;
  response.set_base_total_samples(diff.base_total);
  {
    std::set<std::string> unreachable(profile.unreachable_nodes.begin(),
                                      profile.unreachable_nodes.end());
    unreachable.insert(base_profile.unreachable_nodes.begin(),
                       base_profile.unreachable_nodes.end());
    for (const auto& n : unreachable) response.add_unreachable_nodes(n);
  }
  response.set_total_samples(diff.total);
  for (const FunctionChange& c : diff.functions) {
    auto* row = response.add_functions();
    SetFrame(c.function, row->mutable_function());
    row->set_base_self(c.base_self);
    row->set_self(c.self);
    row->set_base_total(c.base_total);
    row->set_total(c.total);
    row->set_self_delta_pct(c.self_delta_pct);
    row->set_total_delta_pct(c.total_delta_pct);
  }
  for (const PathChange& c : diff.paths) {
    auto* row = response.add_paths();
    for (const ResolvedFunction& f : c.frames) SetFrame(f, row->add_frames());
    row->set_base_samples(c.base_samples);
    row->set_samples(c.samples);
    row->set_delta_pct(c.delta_pct);
    row->set_truncated(c.truncated);
  }
  return response;
}

absl::StatusOr<v1::CompareResponse> QueryService::RunCompare(const v1::CompareRequest& request) {
  // The sampling rate is known while agents of this server profile the service.
  const std::string& service =
      request.baseline().service().empty() ? request.service() : request.baseline().service();
  const uint32_t sampling_hz =
      registry_->FindAgents(service, "", 0).empty() ? 0 : registry_->SamplingRate(service);
  return CompareRequested(request, base::NowMs(), EffectiveLimit(request.limit()),
                          [this](const ProfileQuery& q) { return Load(q); }, sampling_hz);
}

grpc::Status QueryService::Compare(grpc::ServerContext* context,
                                   const v1::CompareRequest* request,
                                   v1::CompareResponse* response) {
  if (auto p = AuthorizeQuery(context); !p.ok()) return ToGrpcStatus(p.status());
  return rpc::Respond([&] { return RunCompare(*request); }, response);
}

absl::StatusOr<v1::ExportResponse> QueryService::RunExport(const v1::ExportRequest& request) {
  if (request.format() != v1::ExportRequest::PPROF &&
      request.format() != v1::ExportRequest::LLVM_SAMPLE &&
      request.format() != v1::ExportRequest::OTLP) {
    return absl::InvalidArgumentError("unsupported export format");
  }
  auto query = ToProfileQuery(request.filter(), base::NowMs());
  if (!query.ok()) return query.status();
  if (absl::Status bounded = BoundToStoredRange(&*query); !bounded.ok()) return bounded;
  // In a cluster, leaf addresses and their functions' records come from the nodes.
  FunctionLookup functions(source_ != nullptr ? nullptr : store_);
  std::vector<std::string> unreachable;
  auto leaf_addresses = [&]() -> absl::StatusOr<LeafAddressCounts> {
    return source_ != nullptr ? source_->LeafAddresses(*query, &functions, &unreachable)
                              : SumLeafAddressesOf(store_, *query);
  };
  auto add_unreachable = [&](v1::ExportResponse* response) {
    std::sort(unreachable.begin(), unreachable.end());
    unreachable.erase(std::unique(unreachable.begin(), unreachable.end()), unreachable.end());
    for (const auto& n : unreachable) response->add_unreachable_nodes(n);
  };
  if (request.format() == v1::ExportRequest::LLVM_SAMPLE) {
    if (absl::Status s = CheckLeafAddressQuery(*query); !s.ok()) return s;
    auto addresses = leaf_addresses();
    if (!addresses.ok()) return addresses.status();
    auto profile = EncodeLlvmSampleProfile(&functions, symbolizer_, *addresses);
    if (!profile.ok()) return profile.status();
    if (profile->samples == 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "no samples with source lines in this range (", profile->unresolved,
          " samples of modules without DWARF on the server: strata debuginfo upload their "
          "unstripped binaries or debug files)"));
    }
    v1::ExportResponse response;
    response.set_data(std::move(profile->text));
    response.set_content_type("text/plain");
    response.set_total_samples(profile->samples);
    add_unreachable(&response);
    return response;
  }
  if (request.format() == v1::ExportRequest::OTLP) {
    auto response = RunOtlpExport(*query);
    if (response.ok()) add_unreachable(&*response);
    return response;
  }
  query->call_sites = query->build_ids = symbolizer_ != nullptr && source_ != nullptr;
  auto profile = Load(*query);
  if (!profile.ok()) return profile.status();
  if (source_ != nullptr) {
    // The call sites' functions are the profile's; the nodes send the leaves' records.
    for (const ResolvedFunction& f : profile->functions) {
      functions.Add(f.id, {f.name, f.module, f.build_id, 0});
    }
  }
  absl::flat_hash_map<uint32_t, std::vector<LeafLine>> leaf_lines;
  if (symbolizer_ != nullptr && query->capture_id.empty()) {
    auto addresses = leaf_addresses();
    if (!addresses.ok()) return addresses.status();
    auto lines = LeafLinesOf(&functions, symbolizer_, *addresses, *profile);
    if (!lines.ok()) return lines.status();
    leaf_lines = *std::move(lines);
  }
  auto call_sites = CallSiteLinesOf(store_, &functions, symbolizer_, *profile);
  if (!call_sites.ok()) return call_sites.status();
  auto data = EncodePprof(*profile, {query->from_ms, query->to_ms, query->type,
                                     registry_->SamplingRate(query->service), &leaf_lines,
                                     &*call_sites});
  if (!data.ok()) return data.status();
  v1::ExportResponse response;
  response.set_data(std::move(*data));
  response.set_content_type("application/vnd.google.protobuf+gzip");
  response.set_total_samples(profile->total);
  unreachable.insert(unreachable.end(), profile->unreachable_nodes.begin(),
                     profile->unreachable_nodes.end());
  add_unreachable(&response);
  return response;
}

grpc::Status QueryService::FlameGraph(grpc::ServerContext* context, const v1::FlameGraphRequest* request,
                                      v1::FlameGraphResponse* response) {
  if (auto p = AuthorizeQuery(context); !p.ok()) return ToGrpcStatus(p.status());
  return rpc::Respond([&] { return RunFlameGraph(*request); }, response);
}

grpc::Status QueryService::Diff(grpc::ServerContext* context, const v1::DiffRequest* request,
                                v1::DiffResponse* response) {
  if (auto p = AuthorizeQuery(context); !p.ok()) return ToGrpcStatus(p.status());
  return rpc::Respond([&] { return RunDiff(*request); }, response);
}

absl::StatusOr<v1::ExportResponse> QueryService::RunOtlpExport(const ProfileQuery& query) {
  ProfileQuery by_host = query;
  by_host.build_ids = source_ != nullptr;  // a cluster's nodes send them; here the store has them
  // One resource per host: each host's profile, with its lines. Without a host given, the
  // hosts are those of the whole profile, whose total and unreachable nodes are the answer's.
  std::vector<std::string> host_names = {query.host};
  std::optional<Profile> all;
  if (query.host.empty()) {
    auto profile = Load(by_host);
    if (!profile.ok()) return profile.status();
    all = *std::move(profile);
    host_names = all->hosts;
  }
  by_host.lines = true;
  std::vector<std::pair<std::string, Profile>> hosts;
  for (const std::string& host : host_names) {
    by_host.host = host;
    auto of_host = Load(by_host);
    if (!of_host.ok()) return of_host.status();
    hosts.emplace_back(host, *std::move(of_host));
  }
  if (source_ == nullptr) {
    FunctionLookup functions(store_);
    for (auto& [host, p] : hosts) {
      for (ResolvedFunction& f : p.functions) {
        if (auto info = functions.Get(f.id); info.ok()) f.build_id = (*info)->build_id;
      }
    }
  }
  OtlpExportOptions options;
  options.service = query.service.empty() ? query.capture_id : query.service;
  options.from_ms = query.from_ms;
  options.to_ms = query.to_ms;
  options.type = query.type;
  options.rate_hz = registry_->SamplingRate(query.service);
  auto data = EncodeOtlp(hosts, options);
  if (!data.ok()) return data.status();
  v1::ExportResponse response;
  response.set_data(std::move(*data));
  response.set_content_type("application/x-protobuf");
  const Profile& whole = all.has_value() ? *all : hosts.front().second;
  response.set_total_samples(whole.total);
  for (const auto& n : whole.unreachable_nodes) response.add_unreachable_nodes(n);
  return response;
}

grpc::Status QueryService::Export(grpc::ServerContext* context, const v1::ExportRequest* request,
                                  v1::ExportResponse* response) {
  if (auto p = AuthorizeQuery(context); !p.ok()) return ToGrpcStatus(p.status());
  return rpc::Respond([&] { return RunExport(*request); }, response);
}

absl::StatusOr<v1::ListLabelsResponse> QueryService::RunListLabels(
    const v1::ListLabelsRequest& request) {
  if (request.service().empty()) return absl::InvalidArgumentError("a service is required");
  std::vector<std::string> unreachable;
  auto all = LabelSetsOf(request.service(), &unreachable);
  if (!all.ok()) return all.status();
  const std::vector<labels::LabelSet>& sets = *all;
  // Every name has the empty set: a mistyped one would answer as a service without labels.
  if (sets.size() <= 1) {
    auto services = RunListServices();
    if (!services.ok()) return services.status();
    if (std::none_of(services->services().begin(), services->services().end(),
                     [&](const v1::ServiceInfo& s) { return s.name() == request.service(); })) {
      return absl::NotFoundError(absl::StrCat("unknown service '", request.service(), "'"));
    }
  }
  std::map<std::string, std::set<std::string>> values;
  for (const labels::LabelSet& set : sets) {
    for (const auto& [key, value] : set) {
      // Reserved labels (the profile type) are chosen by ProfileFilter.type, not selectors.
      if (!commit::IsReservedLabelKey(key)) values[key].insert(value);
    }
  }
  v1::ListLabelsResponse response;
  response.set_label_sets(static_cast<uint32_t>(sets.size()));
  for (const auto& n : unreachable) response.add_unreachable_nodes(n);
  for (const auto& [key, vs] : values) {
    v1::LabelValues* l = response.add_labels();
    l->set_key(key);
    for (const std::string& v : vs) l->add_values(v);
  }
  return response;
}

absl::StatusOr<std::vector<labels::LabelSet>> QueryService::LabelSetsOf(
    const std::string& service, std::vector<std::string>* unreachable) {
  if (source_ != nullptr) return source_->LabelSets(service, unreachable);
  auto records = store_->interner().ListLabelSets(service);
  if (!records.ok()) return records.status();
  std::vector<labels::LabelSet> sets;
  for (store::LabelSetRecord& r : *records) sets.push_back(std::move(r.labels));
  return sets;
}

grpc::Status QueryService::ListLabels(grpc::ServerContext* context,
                                      const v1::ListLabelsRequest* request,
                                      v1::ListLabelsResponse* response) {
  if (auto p = AuthorizeQuery(context); !p.ok()) return ToGrpcStatus(p.status());
  return rpc::Respond([&] { return RunListLabels(*request); }, response);
}

absl::StatusOr<v1::QualityResponse> QueryService::RunQuality(const v1::QualityRequest& request) {
  auto query = ToProfileQuery(request.filter(), base::NowMs());
  if (!query.ok()) return query.status();
  if (!query->capture_id.empty()) {
    return absl::InvalidArgumentError("stack quality is reported for services, not captures");
  }
  query->build_ids = true;
  auto profile = Load(*query);
  if (!profile.ok()) return profile.status();
  std::vector<std::string> build_ids;
  build_ids.reserve(profile->functions.size());
  for (const ResolvedFunction& f : profile->functions) {
    if (!f.build_id.empty() || source_ != nullptr) {
      build_ids.push_back(f.build_id);
      continue;
    }
    auto info = store_->interner().GetFunction(f.id);
    build_ids.push_back(info.ok() ? info->build_id : std::string());
  }
  v1::QualityResponse response = StackQuality(*profile, build_ids);
  std::vector<std::string> unreachable = profile->unreachable_nodes;
  auto counts = source_ != nullptr ? source_->UnwindCounts(*query, &unreachable)
                                   : store_->meta().SumUnwindCounts(query->service,
                                                                    query->from_ms, query->to_ms);
  if (!counts.ok()) return counts.status();
  std::sort(unreachable.begin(), unreachable.end());
  unreachable.erase(std::unique(unreachable.begin(), unreachable.end()), unreachable.end());
  for (const auto& n : unreachable) response.add_unreachable_nodes(n);
  response.set_agent_stacks(counts->stacks);
  response.set_agent_truncated(counts->truncated);
  response.set_verify_failures(counts->verify_failures);
  response.set_jit_frames_cfi(counts->jit_frames_cfi);
  response.set_jit_frames_fp(counts->jit_frames_fp);
  response.set_lost_samples(counts->lost);
  response.set_python_frames(counts->python_frames);
  response.set_python_stale(counts->python_stale);
  return response;
}

grpc::Status QueryService::Quality(grpc::ServerContext* context, const v1::QualityRequest* request,
                                   v1::QualityResponse* response) {
  if (auto p = AuthorizeQuery(context); !p.ok()) return ToGrpcStatus(p.status());
  return rpc::Respond([&] { return RunQuality(*request); }, response);
}

absl::StatusOr<v1::SeriesResponse> QueryService::RunSeries(const v1::SeriesRequest& request) {
  auto query = ToProfileQuery(request.filter(), base::NowMs());
  if (!query.ok()) return query.status();
  if (absl::Status bounded = BoundToStoredRange(&*query); !bounded.ok()) return bounded;
  if (query->from_ms == query->to_ms) {  // within one window, which it does not take
    v1::SeriesResponse none;
    none.set_from_ms(query->from_ms);
    none.set_step_ms(request.step_ms() > 0 ? request.step_ms() : commit::kWindowMs);
    return none;
  }
  auto step = SeriesStep(query->from_ms, query->to_ms, request.step_ms());
  if (!step.ok()) return step.status();
  auto response = source_ != nullptr ? source_->Series(*query, *step, request.group_by())
                                     : reader_.Series(*query, *step, request.group_by());
  if (!response.ok()) return response.status();
  RankSeries(request.limit(), &*response);
  return response;
}

grpc::Status QueryService::Series(grpc::ServerContext* context, const v1::SeriesRequest* request,
                                  v1::SeriesResponse* response) {
  if (auto p = AuthorizeQuery(context); !p.ok()) return ToGrpcStatus(p.status());
  return rpc::Respond([&] { return RunSeries(*request); }, response);
}

absl::StatusOr<v1::PhasesResponse> QueryService::RunPhases(const v1::PhasesRequest& request) {
  auto query = ToProfileQuery(request.filter(), base::NowMs());
  if (!query.ok()) return query.status();
  if (query->service.empty()) return absl::InvalidArgumentError("a service is required");
  return source_ != nullptr ? source_->Phases(*query) : PhasesOf(store_, *query);
}

grpc::Status QueryService::Phases(grpc::ServerContext* context, const v1::PhasesRequest* request,
                                  v1::PhasesResponse* response) {
  if (auto p = AuthorizeQuery(context); !p.ok()) return ToGrpcStatus(p.status());
  auto r = RunPhases(*request);
  if (!r.ok()) return ToGrpcStatus(r.status());
  *response = std::move(*r);
  return grpc::Status::OK;
}

}  // namespace strata::server::query
