#include "server/query/query_service.h"

#include <algorithm>
#include <chrono>
#include <set>

#include "absl/strings/str_cat.h"

namespace strata::server {
namespace {

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

constexpr uint32_t kDefaultLimit = 20;
constexpr uint32_t kMaxLimit = 100'000;

uint32_t EffectiveLimit(uint32_t requested) {
  if (requested == 0) return kDefaultLimit;
  return std::min(requested, kMaxLimit);
}

void SetFrame(const ResolvedFunction& f, v1::Frame* out) {
  out->set_function(f.name);
  out->set_module(f.module);
}

}  // namespace

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

absl::StatusOr<ProfileQuery> ToProfileQuery(const v1::ProfileFilter& filter, int64_t now_ms) {
  ProfileQuery q;
  q.service = filter.service();
  q.from_ms = filter.range().from_ms();
  q.to_ms = filter.range().to_ms() == 0 ? now_ms + 1 : filter.range().to_ms();
  if (q.from_ms < 0 || q.to_ms < 0) return absl::InvalidArgumentError("negative time range");
  // Windows are addressed by their start: widen `from` to the window holding it.
  q.from_ms = WindowStart(q.from_ms);
  q.host = filter.host();
  q.capture_id = filter.capture_id();
  q.focus = filter.focus();
  q.ignore = filter.ignore();
  return q;
}

QueryService::QueryService(store::Store* store, AgentRegistry* registry)
    : store_(store), registry_(registry), reader_(store) {}

absl::StatusOr<Profile> QueryService::LoadProfile(const v1::ProfileFilter& filter) {
  auto query = ToProfileQuery(filter, NowMs());
  if (!query.ok()) return query.status();
  return reader_.Load(*query);
}

std::vector<std::string> QueryService::ArchsOf(const Profile& profile) {
  std::set<std::string> archs;
  auto agents = store_->ListAgents();
  if (!agents.ok()) return {};
  for (const auto& a : *agents) {
    if (std::binary_search(profile.hosts.begin(), profile.hosts.end(), a.host)) {
      archs.insert(a.arch);
    }
  }
  return {archs.begin(), archs.end()};
}

absl::StatusOr<v1::TopResponse> QueryService::RunTop(const v1::TopRequest& request) {
  auto profile = LoadProfile(request.filter());
  if (!profile.ok()) return profile.status();
  v1::TopResponse response;
  response.set_total_samples(profile->total);
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
  v1::HotPathsResponse response;
  response.set_total_samples(profile->total);
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

absl::StatusOr<v1::ListServicesResponse> QueryService::RunListServices() {
  auto services = store_->ListServices();
  if (!services.ok()) return services.status();
  v1::ListServicesResponse response;
  for (const auto& s : *services) {
    auto* info = response.add_services();
    info->set_name(s.service);
    info->set_total_samples(s.total_samples);
    info->set_first_ms(s.first_window_ms);
    info->set_last_ms(s.last_window_ms + kWindowMs);
  }
  return response;
}

v1::ListAgentsResponse QueryService::RunListAgents() {
  v1::ListAgentsResponse response;
  for (auto& a : registry_->List()) *response.add_agents() = std::move(a);
  return response;
}

grpc::Status QueryService::ListServices(grpc::ServerContext*, const v1::ListServicesRequest*,
                                        v1::ListServicesResponse* response) {
  auto r = RunListServices();
  if (!r.ok()) return ToGrpcStatus(r.status());
  *response = std::move(*r);
  return grpc::Status::OK;
}

grpc::Status QueryService::ListAgents(grpc::ServerContext*, const v1::ListAgentsRequest*,
                                      v1::ListAgentsResponse* response) {
  *response = RunListAgents();
  return grpc::Status::OK;
}

grpc::Status QueryService::Top(grpc::ServerContext*, const v1::TopRequest* request,
                               v1::TopResponse* response) {
  auto r = RunTop(*request);
  if (!r.ok()) return ToGrpcStatus(r.status());
  *response = std::move(*r);
  return grpc::Status::OK;
}

grpc::Status QueryService::HotPaths(grpc::ServerContext*, const v1::HotPathsRequest* request,
                                    v1::HotPathsResponse* response) {
  auto r = RunHotPaths(*request);
  if (!r.ok()) return ToGrpcStatus(r.status());
  *response = std::move(*r);
  return grpc::Status::OK;
}

absl::StatusOr<v1::PhasesResponse> QueryService::RunPhases(const v1::PhasesRequest& request) {
  auto query = ToProfileQuery(request.filter(), NowMs());
  if (!query.ok()) return query.status();
  if (query->service.empty()) return absl::InvalidArgumentError("a service is required");
  auto events = store_->ScanPhaseEvents(query->service, query->from_ms, query->to_ms);
  if (!events.ok()) return events.status();
  v1::PhasesResponse response;
  for (const auto& e : *events) {
    v1::PhaseChange change;
    if (!change.ParseFromString(e.payload)) {
      return absl::DataLossError(absl::StrCat("corrupt phase event of ", query->service,
                                              " at window ", e.window_start_ms));
    }
    *response.add_changes() = std::move(change);
  }
  return response;
}

grpc::Status QueryService::Phases(grpc::ServerContext*, const v1::PhasesRequest* request,
                                  v1::PhasesResponse* response) {
  auto r = RunPhases(*request);
  if (!r.ok()) return ToGrpcStatus(r.status());
  *response = std::move(*r);
  return grpc::Status::OK;
}

}  // namespace strata::server
