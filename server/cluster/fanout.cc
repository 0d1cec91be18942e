#include "server/cluster/fanout.h"

#include <algorithm>
#include <fstream>
#include <future>
#include <map>
#include <optional>
#include <set>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "common/base/clock.h"
#include "common/base/saturating.h"
#include "common/rpc/grpc_status.h"
#include "server/auth/grpc_auth.h"
#include "server/query/lines.h"
#include "server/query/query_service.h"
#include "spdlog/spdlog.h"

namespace strata::server::cluster {
namespace {

absl::StatusOr<query::ProfileQuery> FromRequest(const v1::LocalProfileRequest& request) {
  auto q = query::ToProfileQuery(request.filter(), base::NowMs());
  if (!q.ok()) return q.status();
  if (request.hosts_size() > 0) q->hosts.emplace(request.hosts().begin(), request.hosts().end());
  return q;
}

std::string NodeName(const RingMember& m) { return absl::StrCat(m.id, " (", m.address, ")"); }

// What a fan-out asks the nodes for `query`: its filter, and the hosts it is narrowed to.
v1::LocalProfileRequest RequestFor(const query::ProfileQuery& query) {
  v1::LocalProfileRequest request;
  *request.mutable_filter() = query::ToProfileFilter(query);
  if (query.hosts) request.mutable_hosts()->Add(query.hosts->begin(), query.hosts->end());
  return request;
}

absl::Status FromGrpc(const grpc::Status& s) {
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
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

v1::ListAgentsResponse ClusterService::RunLocalAgents() { return query::ListAgentsOf(registry_); }

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
  auto q = query::ToProfileQuery(request.filter(), base::NowMs());
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

template <typename Response, typename Run>
grpc::Status ClusterService::AsNode(grpc::ServerContext* context, Run run, Response* response) {
  auto p = auth::AuthorizeCall(authorizer_, context, auth::Role::kNode, "cluster queries");
  if (!p.ok()) return rpc::ToGrpcStatus(p.status());
  return rpc::Respond(std::move(run), response);
}

grpc::Status ClusterService::HostTotals(grpc::ServerContext* context,
                                        const v1::LocalProfileRequest* request,
                                        v1::HostTotalsResponse* response) {
  return AsNode(context, [&] { return RunHostTotals(*request); }, response);
}

grpc::Status ClusterService::LocalProfile(grpc::ServerContext* context,
                                          const v1::LocalProfileRequest* request,
                                          v1::LocalProfileResponse* response) {
  return AsNode(context, [&] { return RunLocalProfile(*request); }, response);
}

grpc::Status ClusterService::LocalServices(grpc::ServerContext* context,
                                           const v1::ListServicesRequest*,
                                           v1::ListServicesResponse* response) {
  return AsNode(context, [&] { return RunLocalServices(); }, response);
}

grpc::Status ClusterService::LocalAgents(grpc::ServerContext* context, const v1::ListAgentsRequest*,
                                         v1::ListAgentsResponse* response) {
  return AsNode(
      context, [&] { return absl::StatusOr<v1::ListAgentsResponse>(RunLocalAgents()); },
      response);
}

grpc::Status ClusterService::LocalLabelSets(grpc::ServerContext* context,
                                            const v1::ListLabelsRequest* request,
                                            v1::LocalLabelSetsResponse* response) {
  return AsNode(context, [&] { return RunLocalLabelSets(*request); }, response);
}

grpc::Status ClusterService::LocalPhases(grpc::ServerContext* context,
                                         const v1::PhasesRequest* request,
                                         v1::PhasesResponse* response) {
  return AsNode(context, [&] { return RunLocalPhases(*request); }, response);
}

grpc::Status ClusterService::LocalUnwindCounts(grpc::ServerContext* context,
                                               const v1::LocalProfileRequest* request,
                                               v1::LocalUnwindCountsResponse* response) {
  return AsNode(context, [&] { return RunLocalUnwindCounts(*request); }, response);
}

grpc::Status ClusterService::LocalLeafAddresses(grpc::ServerContext* context,
                                                const v1::LocalProfileRequest* request,
                                                v1::LocalLeafAddressesResponse* response) {
  return AsNode(context, [&] { return RunLocalLeafAddresses(*request); }, response);
}

grpc::Status ClusterService::LocalTopLines(grpc::ServerContext* context,
                                           const v1::LocalProfileRequest* request,
                                           v1::TopResponse* response) {
  return AsNode(context, [&] { return RunLocalTopLines(*request); }, response);
}

namespace {
constexpr char kRoutedMetadata[] = "x-strata-routed-by";

// A call this node makes to another on a client's behalf: marked routed (the other node
// answers from itself alone), with this node's credentials.
void PrepareRouted(Membership* membership, NodeChannels* channels, grpc::ClientContext* client,
                   std::optional<absl::Duration> timeout) {
  client->AddMetadata(kRoutedMetadata, membership->options().node_id);
  if (timeout) client->set_deadline(absl::ToChronoTime(absl::Now() + *timeout));
  channels->Authorize(client);
}

bool IsRouted(const grpc::ServerContext* context) {
  return context != nullptr && context->client_metadata().count(kRoutedMetadata) > 0;
}
}  // namespace

grpc::Status RunCaptureElsewhere(Membership* membership, NodeChannels* channels,
                                 grpc::ServerContext* context,
                                 const v1::RunCaptureRequest& request,
                                 grpc::ServerWriter<v1::CaptureProgress>* writer) {
  if (IsRouted(context)) return grpc::Status(grpc::StatusCode::NOT_FOUND, "routed once already");
  const std::shared_ptr<const Ring> ring = membership->ring();
  grpc::Status last(grpc::StatusCode::NOT_FOUND, "no other node");
  for (const RingMember& m : ring->members()) {
    if (m.id == membership->options().node_id) continue;
    auto stub = v1::Capture::NewStub(channels->Get(m.address));
    grpc::ClientContext client;
    // This node checked the caller (role operator); the node that runs the capture checks
    // this node's credentials (role node).
    PrepareRouted(membership, channels, &client, std::nullopt);
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

std::vector<v1::CaptureRecord> ListCapturesElsewhere(Membership* membership,
                                                     NodeChannels* channels,
                                                     grpc::ServerContext* context,
                                                     absl::Duration timeout,
                                                     std::vector<std::string>* unreachable) {
  std::vector<v1::CaptureRecord> out;
  if (IsRouted(context)) return out;
  const std::shared_ptr<const Ring> ring = membership->ring();
  for (const RingMember& m : ring->members()) {
    if (m.id == membership->options().node_id) continue;
    auto stub = v1::Capture::NewStub(channels->Get(m.address));
    grpc::ClientContext client;
    PrepareRouted(membership, channels, &client, timeout);
    v1::ListCapturesResponse r;
    grpc::Status s = stub->List(&client, v1::ListCapturesRequest(), &r);
    if (!s.ok()) {
      unreachable->push_back(absl::StrCat(NodeName(m), ": ", s.error_message()));
      continue;
    }
    for (v1::CaptureRecord& c : *r.mutable_captures()) out.push_back(std::move(c));
  }
  return out;
}

grpc::Status GetCaptureElsewhere(Membership* membership, NodeChannels* channels,
                                 grpc::ServerContext* context, absl::Duration timeout,
                                 const v1::GetCaptureRequest& request, v1::CaptureRecord* record) {
  grpc::Status last(grpc::StatusCode::NOT_FOUND, "no other node");
  if (IsRouted(context)) return last;
  const std::shared_ptr<const Ring> ring = membership->ring();
  for (const RingMember& m : ring->members()) {
    if (m.id == membership->options().node_id) continue;
    auto stub = v1::Capture::NewStub(channels->Get(m.address));
    grpc::ClientContext client;
    PrepareRouted(membership, channels, &client, timeout);
    grpc::Status s = stub->Get(&client, request, record);
    if (s.error_code() != grpc::StatusCode::NOT_FOUND) return s;
    last = s;
  }
  return last;
}

namespace {

// Sends the debug file at `path` to `to` as an upload marked routed (not copied further), in
// the call `client`.
grpc::Status SendDebugFile(Membership* membership, NodeChannels* channels, const RingMember& to,
                           const std::string& path, const std::string& file_name,
                           const std::string& build_id, grpc::ClientContext* client) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return grpc::Status(grpc::StatusCode::INTERNAL, absl::StrCat("cannot read ", path));
  auto stub = v1::DebugInfo::NewStub(channels->Get(to.address));
  PrepareRouted(membership, channels, client, absl::Minutes(10));
  v1::UploadDebugInfoResponse response;
  auto writer = stub->Upload(client, &response);
  v1::DebugInfoChunk chunk;
  chunk.set_file_name(file_name);
  chunk.set_expected_build_id(build_id);
  std::string buffer(1 << 20, '\0');
  while (in.read(buffer.data(), static_cast<std::streamsize>(buffer.size())) || in.gcount() > 0) {
    chunk.set_data(buffer.data(), static_cast<size_t>(in.gcount()));
    if (!writer->Write(chunk)) break;  // the node ended the call: Finish says why
    chunk.Clear();
  }
  writer->WritesDone();
  return writer->Finish();
}

}  // namespace

std::vector<std::string> CopyDebugInfoElsewhere(Membership* membership, NodeChannels* channels,
                                                grpc::ServerContext* context,
                                                const std::string& path,
                                                const std::string& file_name,
                                                const std::string& build_id) {
  std::vector<std::string> unreachable;
  if (IsRouted(context)) return unreachable;
  const std::shared_ptr<const Ring> ring = membership->ring();
  for (const RingMember& m : ring->members()) {
    if (m.id == membership->options().node_id) continue;
    grpc::ClientContext client;
    grpc::Status s = SendDebugFile(membership, channels, m, path, file_name, build_id, &client);
    if (!s.ok()) unreachable.push_back(absl::StrCat(NodeName(m), ": ", s.error_message()));
  }
  return unreachable;
}

DebugInfoSync::DebugInfoSync(Membership* membership, NodeChannels* channels,
                             LocalFiles local_files, absl::Duration interval)
    : membership_(membership), channels_(channels), local_files_(std::move(local_files)),
      interval_(interval) {
  membership_->AddObserver([wakeup = wakeup_](const std::shared_ptr<const Ring>&) {
    absl::MutexLock lock(&wakeup->mu);
    wakeup->ring_changed = true;
  });
  thread_ = std::thread([this] { Loop(); });
}

DebugInfoSync::~DebugInfoSync() {
  {
    absl::MutexLock lock(&wakeup_->mu);
    wakeup_->stop = true;
    if (wakeup_->call != nullptr) wakeup_->call->TryCancel();
  }
  thread_.join();
}

bool DebugInfoSync::Begin(grpc::ClientContext* call) {
  absl::MutexLock lock(&wakeup_->mu);
  wakeup_->call = call;
  return !wakeup_->stop;
}

void DebugInfoSync::End() {
  absl::MutexLock lock(&wakeup_->mu);
  wakeup_->call = nullptr;
}

void DebugInfoSync::Loop() {
  // A node that just joined may not serve yet: a ring change starts a round a little later.
  constexpr absl::Duration kAfterRingChange = absl::Seconds(2);
  Wakeup& w = *wakeup_;
  absl::Time next = absl::Now() + kAfterRingChange;
  while (true) {
    {
      absl::MutexLock lock(&w.mu);
      w.mu.AwaitWithDeadline(absl::Condition(
                                 +[](Wakeup* w) ABSL_NO_THREAD_SAFETY_ANALYSIS {
                                   return w->stop || w->ring_changed;
                                 },
                                 &w),
                             next);
      if (w.stop) return;
      if (w.ring_changed) {
        w.ring_changed = false;
        next = std::min(next, absl::Now() + kAfterRingChange);
        continue;
      }
      if (absl::Now() < next) continue;
    }
    Round round = RunOnce();
    for (const std::string& f : round.failures) {
      spdlog::warn("cluster: debug info sync: {}", f);
    }
    next = absl::Now() + interval_;
  }
}

DebugInfoSync::Round DebugInfoSync::RunOnce() {
  Round round;
  const std::string& self = membership_->options().node_id;
  const std::shared_ptr<const Ring> ring = membership_->ring();
  // Who holds which build ID, among the live nodes that answered.
  std::map<std::string, std::set<std::string>> holders;
  std::set<std::string> answered{self};
  std::map<std::string, LocalDebugFile> mine;
  for (LocalDebugFile& f : local_files_()) {
    holders[f.build_id].insert(self);
    mine.emplace(f.build_id, std::move(f));
  }
  for (const RingMember& m : ring->members()) {
    if (m.id == self) continue;
    auto stub = v1::DebugInfo::NewStub(channels_->Get(m.address));
    grpc::ClientContext client;
    PrepareRouted(membership_, channels_, &client, absl::Seconds(10));
    v1::ListDebugInfoResponse listed;
    if (!Begin(&client)) return round;
    grpc::Status s = stub->List(&client, v1::ListDebugInfoRequest(), &listed);
    End();
    if (!s.ok()) {
      round.failures.push_back(absl::StrCat(NodeName(m), ": listing: ", s.error_message()));
      continue;
    }
    answered.insert(m.id);
    for (const v1::DebugInfoFile& f : listed.uploaded()) holders[f.build_id()].insert(m.id);
  }
  for (const auto& [build_id, file] : mine) {
    const std::set<std::string>& have = holders[build_id];
    if (*have.begin() != self) continue;  // a holder with a smaller ID sends it
    for (const RingMember& m : ring->members()) {
      if (!answered.contains(m.id) || have.contains(m.id)) continue;
      grpc::ClientContext client;
      if (!Begin(&client)) return round;
      grpc::Status s =
          SendDebugFile(membership_, channels_, m, file.path, file.file_name, build_id, &client);
      End();
      if (s.ok()) {
        ++round.sent;
        spdlog::info("cluster: debug file {} ({}) sent to {}, which lacked it", build_id,
                     file.file_name, NodeName(m));
      } else {
        round.failures.push_back(
            absl::StrCat(NodeName(m), ": sending ", build_id, ": ", s.error_message()));
      }
    }
  }
  sent_.fetch_add(round.sent, std::memory_order_relaxed);
  failures_.fetch_add(round.failures.size(), std::memory_order_relaxed);
  return round;
}

std::string RenderClusterMetrics(ClusterService& service, const DebugInfoSync* debuginfo_sync) {
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
  metric("strata_cluster_replica_skipped_total", "counter",
         "Batches refused at once: an owner had just failed to confirm one within the replica "
         "timeout.",
         r.replica_skipped.load());
  if (debuginfo_sync != nullptr) {
    metric("strata_cluster_debuginfo_sent_total", "counter",
           "Uploaded debug files sent to a live node that lacked them.",
           debuginfo_sync->files_sent());
    metric("strata_cluster_debuginfo_sync_failures_total", "counter",
           "Nodes not listed or files not sent by the debug info sync (retried next round).",
           debuginfo_sync->failures());
  }
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
      channels->Authorize(&context);
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

template <typename Response, typename Local, typename Remote>
absl::StatusOr<FanoutSource::Answers<Response>> FanoutSource::Ask(
    const std::vector<RingMember>& nodes, Local local, Remote remote,
    std::vector<std::string>* unreachable) {
  auto answers = CallNodes<Response>(nodes, membership_->options().node_id, channels_, timeout_,
                                     local, remote);
  Answers<Response> out;
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (!answers[i].ok()) {
      // The request itself is wrong: every node would say so.
      if (absl::IsInvalidArgument(answers[i].status())) return answers[i].status();
      unreachable->push_back(absl::StrCat(NodeName(nodes[i]), ": ", answers[i].status().message()));
      continue;
    }
    out.emplace_back(nodes[i].id, *std::move(answers[i]));
  }
  return out;
}

template <typename Response, typename Local, typename Remote>
absl::StatusOr<FanoutSource::Answers<Response>> FanoutSource::AskAll(
    Local local, Remote remote, std::vector<std::string>* unreachable) {
  const std::shared_ptr<const Ring> ring = membership_->ring();
  auto answers = Ask<Response>(
      ring->members(), [&](size_t) { return local(); },
      [&](v1::Cluster::Stub* stub, grpc::ClientContext* c, Response* r, size_t) {
        return remote(stub, c, r);
      },
      unreachable);
  NoteDeparted(unreachable);
  return answers;
}

template <typename Response, typename Local, typename Remote>
absl::StatusOr<FanoutSource::Answers<Response>> FanoutSource::AskPicked(
    const HostPick& pick, Local local, Remote remote, std::vector<std::string>* unreachable) {
  auto answers = Ask<Response>(
      pick.nodes, [&](size_t i) { return local(pick.requests[i]); },
      [&](v1::Cluster::Stub* stub, grpc::ClientContext* c, Response* r, size_t i) {
        return remote(stub, c, pick.requests[i], r);
      },
      unreachable);
  NoteDeparted(unreachable);
  return answers;
}

void FanoutSource::NoteDeparted(std::vector<std::string>* unreachable) const {
  // Down nodes hold history; with fewer of them than replicas, each host has one up.
  const std::vector<RingMember> departed = membership_->departed();
  if (!departed.empty() && departed.size() + unreachable->size() >= replication_factor_) {
    for (const RingMember& m : departed) {
      unreachable->push_back(absl::StrCat(NodeName(m), ": down (lease expired)"));
    }
  }
}

absl::StatusOr<FanoutSource::HostPick> FanoutSource::PickHosts(
    const v1::LocalProfileRequest& request, std::vector<std::string>* unreachable) {
  const std::shared_ptr<const Ring> ring = membership_->ring();
  const std::vector<RingMember>& nodes = ring->members();
  auto totals = Ask<v1::HostTotalsResponse>(
      nodes, [&](size_t) { return local_->RunHostTotals(request); },
      [&](v1::Cluster::Stub* stub, grpc::ClientContext* c, v1::HostTotalsResponse* r, size_t) {
        return stub->HostTotals(c, request, r);
      },
      unreachable);
  if (!totals.ok()) return totals.status();
  std::map<std::string, size_t> index_of;  // node ID -> index in `nodes`
  for (size_t i = 0; i < nodes.size(); ++i) index_of[nodes[i].id] = i;
  std::map<std::string, std::pair<uint64_t, size_t>> best;  // host -> (samples, node index)
  for (const auto& [node, answer] : *totals) {
    const size_t i = index_of[node];
    for (const auto& [host, samples] : answer.hosts()) {
      auto [it, inserted] = best.try_emplace(host, samples, i);
      // Ties go to the node first in ID order: any replica would do.
      if (!inserted && samples > it->second.first) it->second = {samples, i};
    }
  }
  std::vector<std::vector<std::string>> hosts_of(nodes.size());
  HostPick pick;
  for (const auto& [host, chosen] : best) {
    hosts_of[chosen.second].push_back(host);
    pick.host_samples[host] = chosen.first;
  }
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (hosts_of[i].empty()) continue;
    pick.nodes.push_back(nodes[i]);
    v1::LocalProfileRequest r = request;
    r.clear_hosts();
    r.mutable_hosts()->Add(hosts_of[i].begin(), hosts_of[i].end());
    pick.requests.push_back(std::move(r));
  }
  return pick;
}

absl::StatusOr<query::Profile> FanoutSource::Load(const query::ProfileQuery& query) {
  v1::LocalProfileRequest request = RequestFor(query);
  request.set_build_ids(query.build_ids);
  request.set_lines(query.lines);
  request.set_call_sites(query.call_sites);

  std::vector<std::string> unreachable;
  auto pick = PickHosts(request, &unreachable);
  if (!pick.ok()) return pick.status();
  // Phase 2: each node's profile of the hosts taken from it.
  auto parts = AskPicked<v1::LocalProfileResponse>(
      *pick, [&](const v1::LocalProfileRequest& r) { return local_->RunLocalProfile(r); },
      [&](v1::Cluster::Stub* stub, grpc::ClientContext* c, const v1::LocalProfileRequest& r,
          v1::LocalProfileResponse* out) { return stub->LocalProfile(c, r, out); },
      &unreachable);
  if (!parts.ok()) return parts.status();

  query::Profile profile;
  // Functions by ID (content hashes, the same on every node) and, in a profile with source
  // lines, by line too: one function's lines share its ID.
  absl::flat_hash_map<std::tuple<uint64_t, std::string, std::string, uint32_t, bool>, uint32_t>
      function_index;
  // Stack IDs are content hashes too, the same on every node for the same frames; a stack
  // split over its leaf's lines keeps its ID in each part, so stacks merge by ID and frames
  // (the frames are compared, so a collision cannot merge two different stacks either).
  absl::flat_hash_map<uint64_t, absl::InlinedVector<size_t, 1>> stack_index;
  std::vector<std::string> hosts;
  // Call sites are part of a stack's identity: the same on every node for one stack ID.
  absl::flat_hash_map<uint64_t, std::vector<uint64_t>> call_sites;
  for (const auto& [node, part] : *parts) {
    base::SaturatingAddTo(profile.total, part.total());
    std::vector<uint32_t> remap;
    for (const v1::LocalFunction& f : part.functions()) {
      auto [it, inserted] = function_index.try_emplace(
          std::tuple{f.id(), f.name(), f.file(), f.line(), f.inlined()},
          static_cast<uint32_t>(profile.functions.size()));
      if (inserted) {
        query::ResolvedFunction fn;
        fn.id = f.id();
        fn.name = f.name();
        fn.module = f.module();
        fn.file = f.file();
        fn.line = f.line();
        fn.inlined = f.inlined();
        fn.build_id = f.build_id();
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
      if (query.call_sites) {
        call_sites.try_emplace(s.stack_id(), s.call_sites().begin(), s.call_sites().end());
      }
      absl::InlinedVector<size_t, 1>& same_id = stack_index[s.stack_id()];
      auto same = std::find_if(same_id.begin(), same_id.end(), [&](size_t k) {
        return profile.stacks[k].frames == frames && profile.stacks[k].truncated == s.truncated();
      });
      if (same != same_id.end()) {
        base::SaturatingAddTo(profile.stacks[*same].count, s.count());
      } else {
        same_id.push_back(profile.stacks.size());
        profile.stacks.push_back({s.stack_id(), s.count(), s.truncated(), std::move(frames)});
      }
    }
    hosts.insert(hosts.end(), part.hosts().begin(), part.hosts().end());
  }
  std::sort(profile.stacks.begin(), profile.stacks.end(),
            [](const query::ResolvedStack& a, const query::ResolvedStack& b) {
              return a.count != b.count ? a.count > b.count : a.stack_id < b.stack_id;
            });
  if (query.call_sites) {
    profile.call_sites.reserve(profile.stacks.size());
    for (const query::ResolvedStack& s : profile.stacks) {
      profile.call_sites.push_back(call_sites[s.stack_id]);
    }
  }
  std::sort(hosts.begin(), hosts.end());
  hosts.erase(std::unique(hosts.begin(), hosts.end()), hosts.end());
  profile.hosts = std::move(hosts);
  for (const std::string& h : profile.hosts) profile.host_samples.push_back(pick->host_samples[h]);
  profile.unreachable_nodes = std::move(unreachable);
  if (pick->host_samples.empty() && profile.unreachable_nodes.empty() &&
      query.capture_id.empty()) {
    // As a single server says it: no node knows the service.
    return absl::NotFoundError(absl::StrCat("unknown service '", query.service, "'"));
  }
  return profile;
}

absl::StatusOr<std::vector<store::ServiceSummary>> FanoutSource::Services(
    std::vector<std::string>* unreachable) {
  auto answers = AskAll<v1::ListServicesResponse>(
      [&] { return local_->RunLocalServices(); },
      [&](v1::Cluster::Stub* stub, grpc::ClientContext* c, v1::ListServicesResponse* r) {
        return stub->LocalServices(c, v1::ListServicesRequest(), r);
      },
      unreachable);
  if (!answers.ok()) return answers.status();
  std::map<std::string, store::ServiceSummary> merged;
  for (const auto& [node, answer] : *answers) {
    for (const v1::ServiceInfo& s : answer.services()) {
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
    // A node missing here was named above: the total stays the largest node's then.
    std::vector<std::string> missing;
    auto pick = PickHosts(totals_request, &missing);
    if (pick.ok() && missing.empty()) {
      summary.total_samples = 0;
      for (const auto& [host, samples] : pick->host_samples) {
        base::SaturatingAddTo(summary.total_samples, samples);
      }
    }
    out.push_back(std::move(summary));
  }
  return out;
}

v1::ListAgentsResponse FanoutSource::Agents() {
  std::vector<std::string> unreachable;
  auto answers = AskAll<v1::ListAgentsResponse>(
      [&] { return absl::StatusOr<v1::ListAgentsResponse>(local_->RunLocalAgents()); },
      [&](v1::Cluster::Stub* stub, grpc::ClientContext* c, v1::ListAgentsResponse* r) {
        return stub->LocalAgents(c, v1::ListAgentsRequest(), r);
      },
      &unreachable);
  if (!answers.ok()) return v1::ListAgentsResponse();  // a ListAgentsRequest is never wrong
  // An agent is connected on the node holding its stream and known (gone) where it was
  // before: the connected record wins, else the one with the latest batch.
  std::map<std::string, v1::AgentInfo> merged;
  for (auto& [node, answer] : *answers) {
    for (v1::AgentInfo& a : *answer.mutable_agents()) {
      auto [it, inserted] = merged.try_emplace(a.agent_id(), a);
      if (inserted) continue;
      const v1::AgentInfo& have = it->second;
      if ((a.connected() && !have.connected()) ||
          (a.connected() == have.connected() && a.last_batch_ms() > have.last_batch_ms())) {
        it->second = std::move(a);
      }
    }
  }
  v1::ListAgentsResponse out;
  for (auto& [id, a] : merged) *out.add_agents() = std::move(a);
  for (auto& n : unreachable) out.add_unreachable_nodes(std::move(n));
  return out;
}

absl::StatusOr<std::vector<labels::LabelSet>> FanoutSource::LabelSets(
    const std::string& service, std::vector<std::string>* unreachable) {
  v1::ListLabelsRequest request;
  request.set_service(service);
  auto answers = AskAll<v1::LocalLabelSetsResponse>(
      [&] { return local_->RunLocalLabelSets(request); },
      [&](v1::Cluster::Stub* stub, grpc::ClientContext* c, v1::LocalLabelSetsResponse* r) {
        return stub->LocalLabelSets(c, request, r);
      },
      unreachable);
  if (!answers.ok()) return answers.status();
  std::set<labels::LabelSet> sets;
  for (const auto& [node, answer] : *answers) {
    for (const v1::LocalLabelSet& s : answer.sets()) {
      labels::LabelSet set(s.labels().begin(), s.labels().end());
      std::sort(set.begin(), set.end());
      sets.insert(std::move(set));
    }
  }
  return std::vector<labels::LabelSet>(sets.begin(), sets.end());
}

absl::StatusOr<v1::PhasesResponse> FanoutSource::Phases(const query::ProfileQuery& query) {
  v1::PhasesRequest request;
  *request.mutable_filter() = query::ToProfileFilter(query);
  std::vector<std::string> unreachable;
  auto answers = AskAll<v1::PhasesResponse>(
      [&] { return local_->RunLocalPhases(request); },
      [&](v1::Cluster::Stub* stub, grpc::ClientContext* c, v1::PhasesResponse* r) {
        return stub->LocalPhases(c, request, r);
      },
      &unreachable);
  if (!answers.ok()) return answers.status();
  // Nodes holding the same hosts (two nodes at RF 2 hold all of them) observe the same
  // change, at their own times: it is listed once.
  std::set<std::string> seen;
  v1::PhasesResponse out;
  for (auto& [node, answer] : *answers) {
    for (v1::PhaseChange& change : *answer.mutable_changes()) {
      v1::PhaseChange what = change;
      what.clear_detected_ms();
      std::string key;
      (void)what.SerializeToString(&key);
      if (!seen.insert(std::move(key)).second) continue;
      change.set_node(node);
      *out.add_changes() = std::move(change);
    }
  }
  std::stable_sort(out.mutable_changes()->begin(), out.mutable_changes()->end(),
                   [](const v1::PhaseChange& a, const v1::PhaseChange& b) {
                     return a.window_start_ms() != b.window_start_ms()
                                ? a.window_start_ms() < b.window_start_ms()
                                : a.detected_ms() < b.detected_ms();
                   });
  for (auto& n : unreachable) out.add_unreachable_nodes(std::move(n));
  return out;
}

absl::StatusOr<store::UnwindCounts> FanoutSource::UnwindCounts(
    const query::ProfileQuery& query, std::vector<std::string>* unreachable) {
  const v1::LocalProfileRequest request = RequestFor(query);
  auto answers = AskAll<v1::LocalUnwindCountsResponse>(
      [&] { return local_->RunLocalUnwindCounts(request); },
      [&](v1::Cluster::Stub* stub, grpc::ClientContext* c, v1::LocalUnwindCountsResponse* r) {
        return stub->LocalUnwindCounts(c, request, r);
      },
      unreachable);
  if (!answers.ok()) return answers.status();
  // Each agent from the node holding the most of its stacks: a replica that missed batches
  // holds fewer, and a sum over replicas would count the rest twice.
  std::map<std::string, const v1::UnwindCounters*> best;
  for (const auto& [node, answer] : *answers) {
    for (const auto& [agent, counts] : answer.agents()) {
      auto [it, inserted] = best.try_emplace(agent, &counts);
      if (!inserted && counts.stacks() > it->second->stacks()) it->second = &counts;
    }
  }
  store::UnwindCounts sum;
  for (const auto& [agent, c] : best) {
    sum.Add({c->stacks(), c->truncated(), c->verify_failures(), c->jit_frames_cfi(),
             c->jit_frames_fp(), c->lost(), c->python_frames(), c->python_stale()});
  }
  return sum;
}

absl::StatusOr<v1::TopResponse> FanoutSource::TopLines(const query::ProfileQuery& query,
                                                       uint32_t limit) {
  std::vector<std::string> unreachable;
  auto pick = PickHosts(RequestFor(query), &unreachable);
  if (!pick.ok()) return pick.status();
  auto parts = AskPicked<v1::TopResponse>(
      *pick, [&](const v1::LocalProfileRequest& r) { return local_->RunLocalTopLines(r); },
      [&](v1::Cluster::Stub* stub, grpc::ClientContext* c, const v1::LocalProfileRequest& r,
          v1::TopResponse* out) { return stub->LocalTopLines(c, r, out); },
      &unreachable);
  if (!parts.ok()) return parts.status();
  v1::TopResponse out;
  // Lines by their frames (function, module, file, line, inlined each), self summed.
  std::map<std::string, v1::LineStat> lines;
  for (auto& [node, part] : *parts) {
    out.set_total_samples(base::SaturatingAdd(out.total_samples(), part.total_samples()));
    out.set_unresolved_samples(
        base::SaturatingAdd(out.unresolved_samples(), part.unresolved_samples()));
    for (v1::LineStat& line : *part.mutable_lines()) {
      std::string key;
      for (const v1::Frame& f : line.frames()) {
        absl::StrAppend(&key, f.function(), "\n", f.module(), "\n", f.file(), "\n", f.line(),
                        "\n", f.inlined(), "\n");
      }
      auto [it, inserted] = lines.try_emplace(std::move(key), std::move(line));
      if (!inserted) it->second.set_self(base::SaturatingAdd(it->second.self(), line.self()));
    }
  }
  std::vector<const v1::LineStat*> sorted;
  for (const auto& [key, line] : lines) sorted.push_back(&line);
  std::stable_sort(sorted.begin(), sorted.end(), [](const v1::LineStat* a, const v1::LineStat* b) {
    return a->self() > b->self();
  });
  for (size_t i = 0; i < sorted.size() && i < limit; ++i) *out.add_lines() = *sorted[i];
  for (auto& n : unreachable) out.add_unreachable_nodes(std::move(n));
  return out;
}

absl::StatusOr<query::LeafAddressCounts> FanoutSource::LeafAddresses(
    const query::ProfileQuery& query, query::FunctionLookup* functions,
    std::vector<std::string>* unreachable) {
  auto pick = PickHosts(RequestFor(query), unreachable);
  if (!pick.ok()) return pick.status();
  auto parts = AskPicked<v1::LocalLeafAddressesResponse>(
      *pick, [&](const v1::LocalProfileRequest& r) { return local_->RunLocalLeafAddresses(r); },
      [&](v1::Cluster::Stub* stub, grpc::ClientContext* c, const v1::LocalProfileRequest& r,
          v1::LocalLeafAddressesResponse* out) { return stub->LocalLeafAddresses(c, r, out); },
      unreachable);
  if (!parts.ok()) return parts.status();
  query::LeafAddressCounts sum;
  for (const auto& [node, part] : *parts) {
    for (const v1::LocalFunctionRecord& f : part.functions()) {
      functions->Add(f.id(), {f.name(), f.module(), f.build_id(), f.start_offset()});
    }
    for (const v1::LocalLeafAddress& a : part.addresses()) {
      base::SaturatingAddTo(sum[{a.function_id(), a.offset()}], a.samples());
    }
  }
  return sum;
}

}  // namespace strata::server::cluster
