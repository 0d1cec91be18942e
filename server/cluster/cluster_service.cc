#include "server/cluster/cluster_service.h"

#include <algorithm>
#include <map>

#include "absl/container/flat_hash_set.h"
#include "common/base/clock.h"
#include "common/rpc/grpc_status.h"
#include "server/auth/grpc_auth.h"
#include "server/query/lines.h"
#include "server/query/query_service.h"
#include "server/query/series.h"

namespace strata::server::cluster {
namespace {

absl::StatusOr<query::ProfileQuery> FromRequest(const v1::LocalProfileRequest& request) {
  auto q = query::ToProfileQuery(request.filter(), base::NowMs(), /*asked_again=*/true);
  if (!q.ok()) return q.status();
  if (request.hosts_size() > 0) q->hosts.emplace(request.hosts().begin(), request.hosts().end());
  q->requests = request.requests();
  return q;
}

absl::Status NoRegressions() {
  return absl::FailedPreconditionError("this node runs no Regressions service");
}

}  // namespace

ClusterService::ClusterService(Membership* membership, store::Store* store,
                               registry::AgentRegistry* registry,
                               const aggregate::LiveSamples* live,
                               symbolize::Symbolizer* symbolizer, auth::Authorizer* authorizer,
                               uint32_t replication_factor, const ReplicationMetrics* metrics)
    : membership_(membership), store_(store), registry_(registry), live_(live),
      symbolizer_(symbolizer), authorizer_(authorizer),
      replication_factor_(replication_factor), metrics_(metrics),
      reader_(store, live, symbolizer) {}

absl::StatusOr<v1::HostTotalsResponse> ClusterService::RunHostTotals(
    const v1::LocalProfileRequest& request) {
  auto q = FromRequest(request);
  if (!q.ok()) return q.status();
  v1::HostTotalsResponse response;
  if (!q->capture_id.empty()) {
    response.set_capture_known(store_->meta().GetCapture(q->capture_id).ok());
  }
  auto hosts = reader_.HostSamples(*q);
  if (absl::IsNotFound(hosts.status())) return response;  // no samples of it here
  if (!hosts.ok()) return hosts.status();
  for (const auto& [host, samples] : *hosts) (*response.mutable_hosts())[host] = samples;
  return response;
}

absl::StatusOr<v1::LocalProfileResponse> ClusterService::RunLocalProfile(
    const v1::LocalProfileRequest& request) {
  auto q = FromRequest(request);
  if (!q.ok()) return q.status();
  v1::LocalProfileResponse response;
  auto profile = reader_.Load(*q);
  if (absl::IsNotFound(profile.status())) return response;
  if (!profile.ok()) return profile.status();
  if (request.lines()) {
    profile = query::ExpandLines(store_, symbolizer_, *q, *profile);
    if (!profile.ok()) return profile.status();
  }
  response.set_total(profile->total);
  for (const query::ResolvedFunction& f : profile->functions) {
    v1::LocalFunction* out = response.add_functions();
    out->set_id(f.id);
    out->set_name(f.name);
    out->set_module(f.module);
    out->set_file(f.file);
    out->set_line(f.line);
    out->set_inlined(f.inlined);
    if (request.build_ids()) {
      auto info = store_->interner().GetFunction(f.id);
      if (info.ok()) out->set_build_id(info->build_id);
    }
  }
  for (const query::ResolvedStack& s : profile->stacks) {
    v1::LocalStack* out = response.add_stacks();
    out->set_stack_id(s.stack_id);
    out->set_count(s.count);
    out->set_truncated(s.truncated);
    out->mutable_frames()->Add(s.frames.begin(), s.frames.end());
    if (request.call_sites()) {
      auto stack = store_->interner().GetStack(s.stack_id);
      if (!stack.ok()) return stack.status();
      out->mutable_call_sites()->Add(stack->call_sites.begin(), stack->call_sites.end());
    }
  }
  for (const std::string& h : profile->hosts) response.add_hosts(h);
  response.set_requests(profile->requests);
  return response;
}

absl::StatusOr<v1::ListServicesResponse> ClusterService::RunLocalServices(
    const v1::ListServicesRequest&) {
  auto services = query::ListServices(store_, live_);
  if (!services.ok()) return services.status();
  v1::ListServicesResponse response;
  for (const store::ServiceSummary& s : *services) {
    v1::ServiceInfo* info = response.add_services();
    info->set_name(s.service);
    info->set_total_samples(s.total_samples);
    info->set_first_ms(s.first_window_ms);
    info->set_last_ms(s.last_window_ms);
  }
  return response;
}

absl::StatusOr<v1::ListAgentsResponse> ClusterService::RunLocalAgents(
    const v1::ListAgentsRequest&) {
  return query::ListAgentsOf(registry_);
}

absl::StatusOr<v1::LocalLabelSetsResponse> ClusterService::RunLocalLabelSets(
    const v1::ListLabelsRequest& request) {
  auto sets = store_->interner().ListLabelSets(request.service());
  if (!sets.ok()) return sets.status();
  v1::LocalLabelSetsResponse response;
  for (const store::LabelSetRecord& r : *sets) {
    auto* labels = response.add_sets()->mutable_labels();
    for (const auto& [key, value] : r.labels) (*labels)[key] = value;
  }
  return response;
}

absl::StatusOr<v1::PhasesResponse> ClusterService::RunLocalPhases(
    const v1::PhasesRequest& request) {
  auto q = query::ToProfileQuery(request.filter(), base::NowMs(), /*asked_again=*/true);
  if (!q.ok()) return q.status();
  return query::PhasesOf(store_, *q);
}

absl::StatusOr<v1::LocalUnwindCountsResponse> ClusterService::RunLocalUnwindCounts(
    const v1::LocalProfileRequest& request) {
  auto q = FromRequest(request);
  if (!q.ok()) return q.status();
  std::map<std::string, store::UnwindCounts> by_agent;
  auto sum = store_->meta().SumUnwindCounts(q->service, q->from_ms, q->to_ms, &by_agent);
  if (!sum.ok()) return sum.status();
  v1::LocalUnwindCountsResponse response;
  for (const auto& [agent, c] : by_agent) {
    v1::UnwindCounters& out = (*response.mutable_agents())[agent];
    out.set_stacks(c.stacks);
    out.set_truncated(c.truncated);
    out.set_verify_failures(c.verify_failures);
    out.set_jit_frames_cfi(c.jit_frames_cfi);
    out.set_jit_frames_fp(c.jit_frames_fp);
    out.set_lost(c.lost);
    out.set_python_frames(c.python_frames);
    out.set_python_stale(c.python_stale);
  }
  return response;
}

absl::StatusOr<v1::TopResponse> ClusterService::RunLocalTopLines(
    const v1::LocalProfileRequest& request) {
  auto q = FromRequest(request);
  if (!q.ok()) return q.status();
  return query::TopLines(store_, symbolizer_, *q, UINT32_MAX);
}

absl::StatusOr<v1::SeriesResponse> ClusterService::RunLocalSeries(
    const v1::LocalProfileRequest& request) {
  auto q = FromRequest(request);
  if (!q.ok()) return q.status();
  // The coordinator resolved the step; a node checks it as the coordinator did.
  auto step = query::SeriesStep(q->from_ms, q->to_ms, request.series_step_ms());
  if (!step.ok()) return step.status();
  auto series = reader_.Series(*q, *step, request.series_group_by());
  if (absl::IsNotFound(series.status())) return v1::SeriesResponse();
  return series;
}

absl::StatusOr<v1::LocalLeafAddressesResponse> ClusterService::RunLocalLeafAddresses(
    const v1::LocalProfileRequest& request) {
  auto q = FromRequest(request);
  if (!q.ok()) return q.status();
  auto addresses = query::SumLeafAddressesOf(store_, *q);
  if (!addresses.ok()) return addresses.status();
  v1::LocalLeafAddressesResponse response;
  absl::flat_hash_set<uint64_t> functions;
  for (const auto& [address, samples] : *addresses) {
    v1::LocalLeafAddress* out = response.add_addresses();
    out->set_function_id(address.first);
    out->set_offset(address.second);
    out->set_samples(samples);
    if (!functions.insert(address.first).second) continue;
    auto info = store_->interner().GetFunction(address.first);
    if (!info.ok()) return info.status();
    v1::LocalFunctionRecord* record = response.add_functions();
    record->set_id(address.first);
    record->set_name(info->name);
    record->set_module(info->module);
    record->set_build_id(info->build_id);
    record->set_start_offset(info->start_offset);
  }
  return response;
}

absl::StatusOr<v1::KeepReleaseRecordsResponse> ClusterService::RunKeepReleaseRecords(
    const v1::ReleaseRecords& request) {
  if (!release_records_.keep) return NoRegressions();
  absl::StatusOr<size_t> kept = release_records_.keep(
      std::vector<v1::ReleaseVerdict>(request.releases().begin(), request.releases().end()));
  if (!kept.ok()) return kept.status();
  v1::KeepReleaseRecordsResponse response;
  response.set_kept(static_cast<uint32_t>(*kept));
  return response;
}

absl::StatusOr<v1::ReleaseRecords> ClusterService::RunLocalReleaseRecords(
    const v1::LocalReleaseRecordsRequest&) {
  if (!release_records_.list) return NoRegressions();
  v1::ReleaseRecords response;
  for (v1::ReleaseVerdict& r : release_records_.list()) *response.add_releases() = std::move(r);
  return response;
}

v1::ClusterStatusResponse ClusterService::RunStatus() {
  v1::ClusterStatusResponse r;
  r.set_self_id(membership_->options().node_id);
  r.set_replication_factor(replication_factor_);
  r.set_lease_held(membership_->lease_held());
  r.set_membership_revision(membership_->revision());
  const std::shared_ptr<const Ring> ring = membership_->ring();
  for (const RingMember& m : ring->members()) {
    v1::ClusterNodeStatus* n = r.add_nodes();
    n->set_id(m.id);
    n->set_address(m.address);
    n->set_state("live");
    n->set_tokens(m.tokens);
    n->set_ownership(ring->Ownership(m.id));
  }
  for (const RingMember& m : membership_->departed()) {
    v1::ClusterNodeStatus* n = r.add_nodes();
    n->set_id(m.id);
    n->set_address(m.address);
    n->set_state("down");
    n->set_tokens(m.tokens);
  }
  r.set_agents(
      static_cast<uint32_t>(std::max<int64_t>(metrics_->replicated_streams.load(), 0)));
  r.set_batches_replicated(metrics_->batches_replicated.load());
  return r;
}

grpc::Status ClusterService::Status(grpc::ServerContext* context, const v1::ClusterStatusRequest*,
                                    v1::ClusterStatusResponse* response) {
  auto p = auth::AuthorizeCall(authorizer_, context, auth::Role::kReader, "cluster status");
  if (!p.ok()) return rpc::ToGrpcStatus(p.status());
  *response = RunStatus();
  return grpc::Status::OK;
}

template <typename Request, typename Response>
grpc::Status ClusterService::AsNode(grpc::ServerContext* context,
                                    absl::StatusOr<Response> (ClusterService::*run)(const Request&),
                                    const Request* request, Response* response) {
  auto p = auth::AuthorizeCall(authorizer_, context, auth::Role::kNode, "cluster queries");
  if (!p.ok()) return rpc::ToGrpcStatus(p.status());
  return rpc::Respond([&] { return (this->*run)(*request); }, response);
}

grpc::Status ClusterService::HostTotals(grpc::ServerContext* context,
                                        const v1::LocalProfileRequest* request,
                                        v1::HostTotalsResponse* response) {
  return AsNode(context, &ClusterService::RunHostTotals, request, response);
}

grpc::Status ClusterService::LocalProfile(grpc::ServerContext* context,
                                          const v1::LocalProfileRequest* request,
                                          v1::LocalProfileResponse* response) {
  return AsNode(context, &ClusterService::RunLocalProfile, request, response);
}

grpc::Status ClusterService::LocalServices(grpc::ServerContext* context,
                                           const v1::ListServicesRequest* request,
                                           v1::ListServicesResponse* response) {
  return AsNode(context, &ClusterService::RunLocalServices, request, response);
}

grpc::Status ClusterService::LocalAgents(grpc::ServerContext* context,
                                         const v1::ListAgentsRequest* request,
                                         v1::ListAgentsResponse* response) {
  return AsNode(context, &ClusterService::RunLocalAgents, request, response);
}

grpc::Status ClusterService::LocalLabelSets(grpc::ServerContext* context,
                                            const v1::ListLabelsRequest* request,
                                            v1::LocalLabelSetsResponse* response) {
  return AsNode(context, &ClusterService::RunLocalLabelSets, request, response);
}

grpc::Status ClusterService::LocalPhases(grpc::ServerContext* context,
                                         const v1::PhasesRequest* request,
                                         v1::PhasesResponse* response) {
  return AsNode(context, &ClusterService::RunLocalPhases, request, response);
}

grpc::Status ClusterService::LocalUnwindCounts(grpc::ServerContext* context,
                                               const v1::LocalProfileRequest* request,
                                               v1::LocalUnwindCountsResponse* response) {
  return AsNode(context, &ClusterService::RunLocalUnwindCounts, request, response);
}

grpc::Status ClusterService::LocalLeafAddresses(grpc::ServerContext* context,
                                                const v1::LocalProfileRequest* request,
                                                v1::LocalLeafAddressesResponse* response) {
  return AsNode(context, &ClusterService::RunLocalLeafAddresses, request, response);
}

grpc::Status ClusterService::LocalSeries(grpc::ServerContext* context,
                                         const v1::LocalProfileRequest* request,
                                         v1::SeriesResponse* response) {
  return AsNode(context, &ClusterService::RunLocalSeries, request, response);
}

grpc::Status ClusterService::LocalTopLines(grpc::ServerContext* context,
                                           const v1::LocalProfileRequest* request,
                                           v1::TopResponse* response) {
  return AsNode(context, &ClusterService::RunLocalTopLines, request, response);
}

grpc::Status ClusterService::KeepReleaseRecords(grpc::ServerContext* context,
                                                const v1::ReleaseRecords* request,
                                                v1::KeepReleaseRecordsResponse* response) {
  return AsNode(context, &ClusterService::RunKeepReleaseRecords, request, response);
}

grpc::Status ClusterService::LocalReleaseRecords(grpc::ServerContext* context,
                                                 const v1::LocalReleaseRecordsRequest* request,
                                                 v1::ReleaseRecords* response) {
  return AsNode(context, &ClusterService::RunLocalReleaseRecords, request, response);
}

}  // namespace strata::server::cluster
