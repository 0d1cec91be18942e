#include "server/cluster/scatter_gather.h"

#include <future>

#include "absl/strings/str_cat.h"
#include "common/rpc/grpc_status.h"

namespace strata::server::cluster {

using rpc::FromGrpcStatus;

ScatterGather::ScatterGather(Membership* membership, NodeChannels* channels,
                             ClusterService* local, uint32_t replication_factor,
                             absl::Duration timeout)
    : membership_(membership), channels_(channels), local_(local),
      replication_factor_(replication_factor), timeout_(timeout) {}

absl::StatusOr<std::vector<size_t>> ScatterGather::Ask(const std::vector<RingMember>& nodes,
                                                       const LocalPart& local,
                                                       const RemotePart& remote,
                                                       std::vector<std::string>* unreachable) {
  const std::string& self = membership_->options().node_id;
  std::vector<std::future<absl::Status>> calls;
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (nodes[i].id == self) {
      calls.push_back(std::async(std::launch::deferred, [&local, i] { return local(i); }));
      continue;
    }
    calls.push_back(std::async(std::launch::async, [&, i] {
      auto stub = v1::Cluster::NewStub(channels_->Get(nodes[i].address));
      grpc::ClientContext client;
      client.set_deadline(absl::ToChronoTime(absl::Now() + timeout_));
      channels_->Authorize(&client);
      return FromGrpcStatus(remote(stub.get(), &client, i));
    }));
  }
  std::vector<absl::Status> statuses;
  for (auto& c : calls) statuses.push_back(c.get());
  std::vector<size_t> answered;
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (!statuses[i].ok()) {
      // The request itself is wrong: every node would say so.
      if (absl::IsInvalidArgument(statuses[i])) return statuses[i];
      unreachable->push_back(absl::StrCat(NodeName(nodes[i]), ": ", statuses[i].message()));
      continue;
    }
    answered.push_back(i);
  }
  return answered;
}

void ScatterGather::NoteDeparted(std::vector<std::string>* unreachable) const {
  // Down nodes hold history; with fewer of them than replicas, each host has one up.
  const std::vector<RingMember> departed = membership_->departed();
  if (!departed.empty() && departed.size() + unreachable->size() >= replication_factor_) {
    for (const RingMember& m : departed) {
      unreachable->push_back(absl::StrCat(NodeName(m), ": down (lease expired)"));
    }
  }
}

absl::StatusOr<NodeAnswers<v1::HostTotalsResponse>> ScatterGather::AskHostTotals(
    const std::vector<RingMember>& nodes, const v1::LocalProfileRequest& request,
    std::vector<std::string>* unreachable) {
  return AskEach(
      nodes, &ClusterService::RunHostTotals, &v1::Cluster::Stub::HostTotals,
      [&](size_t) -> const v1::LocalProfileRequest& { return request; }, unreachable);
}

absl::StatusOr<HostPick> ScatterGather::PickHosts(const v1::LocalProfileRequest& request,
                                                  std::vector<std::string>* unreachable) {
  const std::shared_ptr<const Ring> ring = membership_->ring();
  auto totals = AskHostTotals(ring->members(), request, unreachable);
  if (!totals.ok()) return totals.status();
  return ChooseHosts(ring->members(), *totals, request);
}

HostPick ChooseHosts(const std::vector<RingMember>& nodes,
                     const NodeAnswers<v1::HostTotalsResponse>& totals,
                     const v1::LocalProfileRequest& request,
                     const std::set<std::string>& excluded, const std::set<std::string>* only) {
  std::map<std::string, size_t> index_of;  // node ID -> index in `nodes`
  for (size_t i = 0; i < nodes.size(); ++i) index_of[nodes[i].id] = i;
  std::map<std::string, std::pair<uint64_t, size_t>> best;  // host -> (samples, node index)
  for (const auto& [node, answer] : totals) {
    auto at = index_of.find(node);
    if (at == index_of.end() || excluded.contains(node)) continue;
    for (const auto& [host, samples] : answer.hosts()) {
      if (only != nullptr && !only->contains(host)) continue;
      auto [it, inserted] = best.try_emplace(host, samples, at->second);
      // Ties go to the node first in ring order: any replica would do.
      if (!inserted && (samples > it->second.first ||
                        (samples == it->second.first && at->second < it->second.second))) {
        it->second = {samples, at->second};
      }
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

}  // namespace strata::server::cluster
