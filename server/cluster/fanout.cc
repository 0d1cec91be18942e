#include "server/cluster/fanout.h"

#include <algorithm>
#include <future>
#include <map>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/base/clock.h"
#include "common/base/saturating.h"
#include "common/rpc/grpc_status.h"
#include "server/auth/grpc_auth.h"
#include "server/query/query_service.h"

namespace strata::server::cluster {
namespace {

absl::StatusOr<query::ProfileQuery> FromRequest(const v1::LocalProfileRequest& request) {
  auto q = query::ToProfileQuery(request.filter(), base::NowMs());
  if (!q.ok()) return q.status();
  if (request.hosts_size() > 0) q->hosts.emplace(request.hosts().begin(), request.hosts().end());
  return q;
}

std::string NodeName(const RingMember& m) { return absl::StrCat(m.id, " (", m.address, ")"); }

absl::Status FromGrpc(const grpc::Status& s) {
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

}  // namespace

ClusterService::ClusterService(Membership* membership, store::Store* store,
                               const aggregate::LiveSamples* live,
                               symbolize::Symbolizer* symbolizer, auth::Authorizer* authorizer,
                               uint32_t replication_factor, const ReplicationMetrics* metrics)
    : membership_(membership), store_(store), live_(live), authorizer_(authorizer),
      replication_factor_(replication_factor), metrics_(metrics),
      reader_(store, live, symbolizer) {}

absl::StatusOr<v1::HostTotalsResponse> ClusterService::RunHostTotals(
    const v1::LocalProfileRequest& request) {
  auto q = FromRequest(request);
  if (!q.ok()) return q.status();
  v1::HostTotalsResponse response;
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
  response.set_total(profile->total);
  for (const query::ResolvedFunction& f : profile->functions) {
    v1::LocalFunction* out = response.add_functions();
    out->set_id(f.id);
    out->set_name(f.name);
    out->set_module(f.module);
  }
  for (const query::ResolvedStack& s : profile->stacks) {
    v1::LocalStack* out = response.add_stacks();
    out->set_stack_id(s.stack_id);
    out->set_count(s.count);
    out->set_truncated(s.truncated);
    out->mutable_frames()->Add(s.frames.begin(), s.frames.end());
  }
  for (const std::string& h : profile->hosts) response.add_hosts(h);
  return response;
}

absl::StatusOr<v1::ListServicesResponse> ClusterService::RunLocalServices() {
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

grpc::Status ClusterService::HostTotals(grpc::ServerContext* context,
                                        const v1::LocalProfileRequest* request,
                                        v1::HostTotalsResponse* response) {
  auto p = auth::AuthorizeCall(authorizer_, context, auth::Role::kReader, "cluster queries");
  if (!p.ok()) return rpc::ToGrpcStatus(p.status());
  auto r = RunHostTotals(*request);
  if (!r.ok()) return rpc::ToGrpcStatus(r.status());
  *response = std::move(*r);
  return grpc::Status::OK;
}

grpc::Status ClusterService::LocalProfile(grpc::ServerContext* context,
                                          const v1::LocalProfileRequest* request,
                                          v1::LocalProfileResponse* response) {
  auto p = auth::AuthorizeCall(authorizer_, context, auth::Role::kReader, "cluster queries");
  if (!p.ok()) return rpc::ToGrpcStatus(p.status());
  auto r = RunLocalProfile(*request);
  if (!r.ok()) return rpc::ToGrpcStatus(r.status());
  *response = std::move(*r);
  return grpc::Status::OK;
}

grpc::Status ClusterService::LocalServices(grpc::ServerContext* context,
                                           const v1::ListServicesRequest*,
                                           v1::ListServicesResponse* response) {
  auto p = auth::AuthorizeCall(authorizer_, context, auth::Role::kReader, "cluster queries");
  if (!p.ok()) return rpc::ToGrpcStatus(p.status());
  auto r = RunLocalServices();
  if (!r.ok()) return rpc::ToGrpcStatus(r.status());
  *response = std::move(*r);
  return grpc::Status::OK;
}

namespace {
constexpr char kRoutedMetadata[] = "x-strata-routed-by";
}  // namespace

grpc::Status RunCaptureElsewhere(Membership* membership, NodeChannels* channels,
                                 grpc::ServerContext* context,
                                 const v1::RunCaptureRequest& request,
                                 grpc::ServerWriter<v1::CaptureProgress>* writer) {
  if (context->client_metadata().count(kRoutedMetadata) > 0) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND, "routed once already");
  }
  const std::shared_ptr<const Ring> ring = membership->ring();
  grpc::Status last(grpc::StatusCode::NOT_FOUND, "no other node");
  for (const RingMember& m : ring->members()) {
    if (m.id == membership->options().node_id) continue;
    auto stub = v1::Capture::NewStub(channels->Get(m.address));
    grpc::ClientContext client;
    client.AddMetadata(kRoutedMetadata, membership->options().node_id);
    // The caller's credentials go along: the node that runs the capture checks them.
    for (const auto& [key, value] : context->client_metadata()) {
      if (key == "authorization") client.AddMetadata("authorization", std::string(value.data(), value.size()));
    }
    auto reader = stub->Run(&client, request);
    v1::CaptureProgress progress;
    bool relayed = false;
    while (reader->Read(&progress)) {
      relayed = true;
      if (!writer->Write(progress)) {
        client.TryCancel();
        break;
      }
    }
    grpc::Status s = reader->Finish();
    if (relayed || s.error_code() != grpc::StatusCode::NOT_FOUND) return s;
    last = s;
  }
  return last;
}

std::string RenderClusterMetrics(ClusterService& service) {
  const v1::ClusterStatusResponse status = service.RunStatus();
  const MembershipStats m = service.membership().stats();
  const ReplicationMetrics& r = service.metrics();
  std::string out;
  auto metric = [&](const char* name, const char* type, const char* help, auto value) {
    absl::StrAppend(&out, "# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n", name,
                    " ", value, "\n");
  };
  uint32_t live = 0, down = 0;
  double ownership = 0;
  for (const v1::ClusterNodeStatus& n : status.nodes()) {
    (n.state() == "live" ? live : down) += 1;
    if (n.id() == status.self_id()) ownership = n.ownership();
  }
  absl::StrAppend(&out, "# HELP strata_cluster_nodes Nodes this node knows, by state.\n",
                  "# TYPE strata_cluster_nodes gauge\n", "strata_cluster_nodes{state=\"live\"} ",
                  live, "\nstrata_cluster_nodes{state=\"down\"} ", down, "\n");
  metric("strata_cluster_lease_held", "gauge",
         "1 while this node's etcd lease is fresh (it acknowledges batches only then).",
         status.lease_held() ? 1 : 0);
  metric("strata_cluster_ownership_ratio", "gauge",
         "Share of the ring's hash space this node is the first owner of.", ownership);
  metric("strata_cluster_replication_factor", "gauge", "Owners of each host.",
         status.replication_factor());
  metric("strata_cluster_ring_changes_total", "counter", "Ring changes seen.", m.ring_changes);
  metric("strata_cluster_etcd_errors_total", "counter", "Failed lease refreshes.",
         m.etcd_errors);
  metric("strata_cluster_lease_regrants_total", "counter",
         "Times this node's lease expired and was granted anew.", m.lease_regrants);
  metric("strata_cluster_watch_restarts_total", "counter", "Membership watches restarted.",
         m.watch_restarts);
  metric("strata_cluster_replicated_streams", "gauge",
         "Agent streams taken here whose host has other owners.", r.replicated_streams.load());
  metric("strata_cluster_batches_replicated_total", "counter",
         "Batch copies confirmed by another owner (forwarded batches).",
         r.batches_replicated.load());
  metric("strata_cluster_bytes_replicated_total", "counter",
         "Bytes of the batches forwarded to other owners.", r.bytes_replicated.load());
  metric("strata_cluster_graph_catch_ups_total", "counter",
         "Agent graphs sent to an owner that lacked them (new owner after a ring change).",
         r.graph_catch_ups.load());
  metric("strata_cluster_replica_failures_total", "counter",
         "Batches an owner did not confirm: left unacknowledged for the agent to resend.",
         r.replica_failures.load());
  return out;
}

FanoutSource::FanoutSource(Membership* membership, NodeChannels* channels, ClusterService* local,
                           uint32_t replication_factor, absl::Duration timeout)
    : membership_(membership), channels_(channels), local_(local),
      replication_factor_(replication_factor), timeout_(timeout) {}

namespace {

// Calls every node of `nodes` at once: `local(i)` for this node, `remote(stub, context,
// response, i)` (a Cluster stub method) for the others, node i's answer at index i.
template <typename Response, typename Local, typename Remote>
std::vector<absl::StatusOr<Response>> CallNodes(const std::vector<RingMember>& nodes,
                                                const std::string& self, NodeChannels* channels,
                                                absl::Duration timeout, Local local,
                                                Remote remote) {
  std::vector<std::future<absl::StatusOr<Response>>> calls;
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (nodes[i].id == self) {
      calls.push_back(std::async(std::launch::deferred, [&local, i] { return local(i); }));
      continue;
    }
    calls.push_back(std::async(std::launch::async, [&, i] {
      auto stub = v1::Cluster::NewStub(channels->Get(nodes[i].address));
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
      Response response;
      grpc::Status s = remote(stub.get(), &context, &response, i);
      if (!s.ok()) return absl::StatusOr<Response>(FromGrpc(s));
      return absl::StatusOr<Response>(std::move(response));
    }));
  }
  std::vector<absl::StatusOr<Response>> out;
  for (auto& c : calls) out.push_back(c.get());
  return out;
}

}  // namespace

absl::StatusOr<query::Profile> FanoutSource::Load(const query::ProfileQuery& query) {
  const std::shared_ptr<const Ring> ring = membership_->ring();
  const std::vector<RingMember>& nodes = ring->members();
  const std::string& self = membership_->options().node_id;
  v1::LocalProfileRequest request;
  *request.mutable_filter() = query::ToProfileFilter(query);
  if (query.hosts) request.mutable_hosts()->Add(query.hosts->begin(), query.hosts->end());

  std::vector<std::string> unreachable;
  auto note_failure = [&](const RingMember& m, const absl::Status& s) {
    unreachable.push_back(absl::StrCat(NodeName(m), ": ", s.message()));
  };
  // Phase 1: who has how much of each host.
  auto totals = CallNodes<v1::HostTotalsResponse>(
      nodes, self, channels_, timeout_, [&](size_t) { return local_->RunHostTotals(request); },
      [&](v1::Cluster::Stub* stub, grpc::ClientContext* c, v1::HostTotalsResponse* r, size_t) {
        return stub->HostTotals(c, request, r);
      });
  std::map<std::string, std::pair<uint64_t, size_t>> best;  // host -> (samples, node index)
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (!totals[i].ok()) {
      // The query itself is wrong: every node would say so.
      if (absl::IsInvalidArgument(totals[i].status())) return totals[i].status();
      note_failure(nodes[i], totals[i].status());
      continue;
    }
    for (const auto& [host, samples] : totals[i]->hosts()) {
      auto [it, inserted] = best.try_emplace(host, samples, i);
      // Ties go to the node first in ID order: any replica would do.
      if (!inserted && samples > it->second.first) it->second = {samples, i};
    }
  }
  // Phase 2: each node's profile of the hosts taken from it.
  std::vector<std::vector<std::string>> hosts_of(nodes.size());
  for (const auto& [host, pick] : best) hosts_of[pick.second].push_back(host);
  std::vector<RingMember> asked;
  std::vector<v1::LocalProfileRequest> requests;
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (hosts_of[i].empty()) continue;
    asked.push_back(nodes[i]);
    v1::LocalProfileRequest r = request;
    r.clear_hosts();
    r.mutable_hosts()->Add(hosts_of[i].begin(), hosts_of[i].end());
    requests.push_back(std::move(r));
  }
  auto parts = CallNodes<v1::LocalProfileResponse>(
      asked, self, channels_, timeout_,
      [&](size_t i) { return local_->RunLocalProfile(requests[i]); },
      [&](v1::Cluster::Stub* stub, grpc::ClientContext* c, v1::LocalProfileResponse* r,
          size_t i) { return stub->LocalProfile(c, requests[i], r); });

  query::Profile profile;
  absl::flat_hash_map<uint64_t, uint32_t> function_index;
  // Stack IDs are content hashes, the same on every node for the same frames: merged by ID
  // (the frames are compared, so a collision cannot merge two different stacks).
  absl::flat_hash_map<uint64_t, size_t> stack_index;
  std::vector<std::string> hosts;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (!parts[i].ok()) {
      note_failure(asked[i], parts[i].status());
      continue;
    }
    const v1::LocalProfileResponse& part = *parts[i];
    base::SaturatingAddTo(profile.total, part.total());
    std::vector<uint32_t> remap;
    for (const v1::LocalFunction& f : part.functions()) {
      auto [it, inserted] =
          function_index.try_emplace(f.id(), static_cast<uint32_t>(profile.functions.size()));
      if (inserted) {
        query::ResolvedFunction fn;
        fn.id = f.id();
        fn.name = f.name();
        fn.module = f.module();
        profile.functions.push_back(std::move(fn));
      }
      remap.push_back(it->second);
    }
    for (const v1::LocalStack& s : part.stacks()) {
      std::vector<uint32_t> frames;
      frames.reserve(s.frames_size());
      for (uint32_t f : s.frames()) {
        if (f >= remap.size()) return absl::DataLossError("a node sent a malformed profile");
        frames.push_back(remap[f]);
      }
      auto [it, inserted] = stack_index.try_emplace(s.stack_id(), profile.stacks.size());
      if (!inserted && profile.stacks[it->second].frames == frames &&
          profile.stacks[it->second].truncated == s.truncated()) {
        base::SaturatingAddTo(profile.stacks[it->second].count, s.count());
      } else {
        profile.stacks.push_back({s.stack_id(), s.count(), s.truncated(), std::move(frames)});
      }
    }
    hosts.insert(hosts.end(), part.hosts().begin(), part.hosts().end());
  }
  std::sort(profile.stacks.begin(), profile.stacks.end(),
            [](const query::ResolvedStack& a, const query::ResolvedStack& b) {
              return a.count != b.count ? a.count > b.count : a.stack_id < b.stack_id;
            });
  std::sort(hosts.begin(), hosts.end());
  hosts.erase(std::unique(hosts.begin(), hosts.end()), hosts.end());
  profile.hosts = std::move(hosts);
  for (const std::string& h : profile.hosts) profile.host_samples.push_back(best[h].first);
  // Down nodes hold history; with fewer of them than replicas, each host has one up.
  const std::vector<RingMember> departed = membership_->departed();
  if (!departed.empty() && departed.size() + unreachable.size() >= replication_factor_) {
    for (const RingMember& m : departed) {
      unreachable.push_back(absl::StrCat(NodeName(m), ": down (lease expired)"));
    }
  }
  profile.unreachable_nodes = std::move(unreachable);
  if (best.empty() && profile.unreachable_nodes.empty() && query.capture_id.empty()) {
    // As a single server says it: no node knows the service.
    return absl::NotFoundError(absl::StrCat("unknown service '", query.service, "'"));
  }
  return profile;
}

absl::StatusOr<std::vector<store::ServiceSummary>> FanoutSource::Services(
    std::vector<std::string>* unreachable) {
  const std::shared_ptr<const Ring> ring = membership_->ring();
  const std::vector<RingMember>& nodes = ring->members();
  v1::ListServicesRequest request;
  auto answers = CallNodes<v1::ListServicesResponse>(
      nodes, membership_->options().node_id, channels_, timeout_,
      [&](size_t) { return local_->RunLocalServices(); },
      [&](v1::Cluster::Stub* stub, grpc::ClientContext* c, v1::ListServicesResponse* r, size_t) {
        return stub->LocalServices(c, request, r);
      });
  std::map<std::string, store::ServiceSummary> merged;
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (!answers[i].ok()) {
      unreachable->push_back(absl::StrCat(NodeName(nodes[i]), ": ", answers[i].status().message()));
      continue;
    }
    for (const v1::ServiceInfo& s : answers[i]->services()) {
      auto [it, inserted] = merged.try_emplace(
          s.name(), store::ServiceSummary{s.name(), s.first_ms(), s.last_ms(), s.total_samples()});
      if (inserted) continue;
      it->second.first_window_ms = std::min(it->second.first_window_ms, s.first_ms());
      it->second.last_window_ms = std::max(it->second.last_window_ms, s.last_ms());
      it->second.total_samples = std::max(it->second.total_samples, s.total_samples());
    }
  }
  // Totals: each service's samples per host, each host from its fullest replica, as profiles
  // are counted (a sum over nodes would count replicas twice).
  std::vector<store::ServiceSummary> out;
  for (auto& [name, summary] : merged) {
    v1::LocalProfileRequest totals_request;
    v1::ProfileFilter* filter = totals_request.mutable_filter();
    filter->set_service(name);
    filter->mutable_range()->set_from_ms(summary.first_window_ms);
    filter->mutable_range()->set_to_ms(summary.last_window_ms + 1);
    filter->set_type(v1::PROFILE_WALL);  // every profile type, as ListServices counts
    auto totals = CallNodes<v1::HostTotalsResponse>(
        nodes, membership_->options().node_id, channels_, timeout_,
        [&](size_t) { return local_->RunHostTotals(totals_request); },
        [&](v1::Cluster::Stub* stub, grpc::ClientContext* c, v1::HostTotalsResponse* r, size_t) {
          return stub->HostTotals(c, totals_request, r);
        });
    std::map<std::string, uint64_t> best;
    bool complete = true;
    for (const auto& t : totals) {
      if (!t.ok()) {
        complete = false;
        continue;
      }
      for (const auto& [host, samples] : t->hosts()) {
        best[host] = std::max(best[host], samples);
      }
    }
    if (complete) {
      summary.total_samples = 0;
      for (const auto& [host, samples] : best) base::SaturatingAddTo(summary.total_samples, samples);
    }
    out.push_back(std::move(summary));
  }
  return out;
}

}  // namespace strata::server::cluster
