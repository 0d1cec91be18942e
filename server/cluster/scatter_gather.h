// Scatter/gather for a cluster's queries: asks nodes at once and gathers their answers. A
// query view names the call it makes (this node's ClusterService form of it and the Cluster
// stub's method) and merges the answers; ScatterGather owns the rest, the same for every
// view:
//  - the calls: each other node in a thread of its own, with the fan-out deadline and this
//    node's credentials; this node answers its part in the caller's thread;
//  - errors: InvalidArgument means the request is wrong (every node would say so) and ends
//    the query; any other error names the node in `unreachable` and the answer is partial;
//  - down nodes: named in `unreachable` too once, with the nodes that did not answer, as
//    many are away as there are replicas (below that, every host has a replica up);
//  - two-phase views (samples): phase 1 asks every live node its samples per host and takes
//    each host from the node holding the most of them (replicas of a host hold the same
//    batches, so the largest is the complete one when another missed some, and summing
//    replicas would count them twice); phase 2 asks each node for the hosts it was given.
//    A node that answered phase 1 but not phase 2 (it stopped or timed out in between) is
//    named, and its hosts are asked once more of their other replicas, so the answer stays
//    whole where every host has one.
//
// ScatterGather borrows the membership, the channels and this node's ClusterService.
#ifndef STRATA_SERVER_CLUSTER_SCATTER_GATHER_H_
#define STRATA_SERVER_CLUSTER_SCATTER_GATHER_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/cluster/cluster_service.h"
#include "server/cluster/membership.h"
#include "server/cluster/replication.h"
#include "strata/v1/cluster.grpc.pb.h"

namespace strata::server::cluster {

// One call of the Cluster service: how this node answers it (ClusterService::Run*), and how
// another node is asked (the Cluster stub's method).
template <typename Request, typename Response>
using LocalForm = absl::StatusOr<Response> (ClusterService::*)(const Request&);
template <typename Request, typename Response>
using RemoteForm =
    grpc::Status (v1::Cluster::Stub::*)(grpc::ClientContext*, const Request&, Response*);

// Answers of nodes, each with the node's ID, in ring (ID) order.
template <typename Response>
using NodeAnswers = std::vector<std::pair<std::string, Response>>;

// Phase 1's choice: the nodes given hosts, each with its request (the query's, narrowed to
// its hosts), and each host's samples on the node it is read from.
struct HostPick {
  std::vector<RingMember> nodes;
  std::vector<v1::LocalProfileRequest> requests;
  std::map<std::string, uint64_t> host_samples;
};

// Phase 1's choice from the nodes' samples per host (`totals`, by node ID; `nodes`: the ring
// they were asked from, whose order breaks ties): each host goes to the node holding the most
// of its samples, passing over the nodes in `excluded`; with `only`, hosts outside it are
// left out. Each node given hosts is asked `request` narrowed to them.
HostPick ChooseHosts(const std::vector<RingMember>& nodes,
                     const NodeAnswers<v1::HostTotalsResponse>& totals,
                     const v1::LocalProfileRequest& request,
                     const std::set<std::string>& excluded = {},
                     const std::set<std::string>* only = nullptr);

// A two-phase answer: each picked node's part, and phase 1's samples per host.
template <typename Response>
struct HostParts {
  NodeAnswers<Response> parts;
  std::map<std::string, uint64_t> host_samples;
  bool capture_known = false;  // a node answering holds the request's capture's record
};

class ScatterGather {
 public:
  ScatterGather(Membership* membership, NodeChannels* channels, ClusterService* local,
                uint32_t replication_factor, absl::Duration timeout);

  // One phase: every live node's answer to `request`; then the down nodes, as said above.
  template <typename Request, typename Response>
  absl::StatusOr<NodeAnswers<Response>> AskEveryNode(LocalForm<Request, Response> local,
                                                     RemoteForm<Request, Response> remote,
                                                     const Request& request,
                                                     std::vector<std::string>* unreachable);

  // Both phases for `request`: phase 1 (PickHosts), then the call on each node given hosts,
  // for them, and once more on other replicas for the hosts of nodes that did not answer;
  // then the down nodes.
  template <typename Response>
  absl::StatusOr<HostParts<Response>> AskByHost(
      LocalForm<v1::LocalProfileRequest, Response> local,
      RemoteForm<v1::LocalProfileRequest, Response> remote,
      const v1::LocalProfileRequest& request, std::vector<std::string>* unreachable);

  // Phase 1 alone (the down nodes are not named).
  absl::StatusOr<HostPick> PickHosts(const v1::LocalProfileRequest& request,
                                     std::vector<std::string>* unreachable);

 private:
  // This node's part (node i), storing its answer; another node's call, into `client`.
  using LocalPart = std::function<absl::Status(size_t i)>;
  using RemotePart =
      std::function<grpc::Status(v1::Cluster::Stub*, grpc::ClientContext* client, size_t i)>;
  // Asks `nodes` at once; the indices of the nodes that answered. The others go to
  // `unreachable`; InvalidArgument ends the call.
  absl::StatusOr<std::vector<size_t>> Ask(const std::vector<RingMember>& nodes,
                                          const LocalPart& local, const RemotePart& remote,
                                          std::vector<std::string>* unreachable);
  // Ask, typed: node i is asked `request_of(i)`.
  template <typename Request, typename Response, typename RequestOf>
  absl::StatusOr<NodeAnswers<Response>> AskEach(const std::vector<RingMember>& nodes,
                                                LocalForm<Request, Response> local,
                                                RemoteForm<Request, Response> remote,
                                                RequestOf request_of,
                                                std::vector<std::string>* unreachable);
  // Phase 1: each of `nodes`' samples per host for `request`.
  absl::StatusOr<NodeAnswers<v1::HostTotalsResponse>> AskHostTotals(
      const std::vector<RingMember>& nodes, const v1::LocalProfileRequest& request,
      std::vector<std::string>* unreachable);
  // Names the down nodes in `unreachable` when, with the nodes already there, as many are
  // away as there are replicas.
  void NoteDeparted(std::vector<std::string>* unreachable) const;

  Membership* const membership_;
  NodeChannels* const channels_;
  ClusterService* const local_;
  const uint32_t replication_factor_;
  const absl::Duration timeout_;
};

template <typename Request, typename Response, typename RequestOf>
absl::StatusOr<NodeAnswers<Response>> ScatterGather::AskEach(
    const std::vector<RingMember>& nodes, LocalForm<Request, Response> local,
    RemoteForm<Request, Response> remote, RequestOf request_of,
    std::vector<std::string>* unreachable) {
  std::vector<Response> answers(nodes.size());
  auto answered = Ask(
      nodes,
      [&](size_t i) {
        absl::StatusOr<Response> answer = (local_->*local)(request_of(i));
        if (answer.ok()) answers[i] = *std::move(answer);
        return answer.status();
      },
      [&](v1::Cluster::Stub* stub, grpc::ClientContext* client, size_t i) {
        return (stub->*remote)(client, request_of(i), &answers[i]);
      },
      unreachable);
  if (!answered.ok()) return answered.status();
  NodeAnswers<Response> out;
  for (size_t i : *answered) out.emplace_back(nodes[i].id, std::move(answers[i]));
  return out;
}

template <typename Request, typename Response>
absl::StatusOr<NodeAnswers<Response>> ScatterGather::AskEveryNode(
    LocalForm<Request, Response> local, RemoteForm<Request, Response> remote,
    const Request& request, std::vector<std::string>* unreachable) {
  const std::shared_ptr<const Ring> ring = membership_->ring();
  auto answers = AskEach(
      ring->members(), local, remote, [&](size_t) -> const Request& { return request; },
      unreachable);
  NoteDeparted(unreachable);
  return answers;
}

template <typename Response>
absl::StatusOr<HostParts<Response>> ScatterGather::AskByHost(
    LocalForm<v1::LocalProfileRequest, Response> local,
    RemoteForm<v1::LocalProfileRequest, Response> remote, const v1::LocalProfileRequest& request,
    std::vector<std::string>* unreachable) {
  const std::shared_ptr<const Ring> ring = membership_->ring();
  auto totals = AskHostTotals(ring->members(), request, unreachable);
  if (!totals.ok()) return totals.status();
  HostPick pick = ChooseHosts(ring->members(), *totals, request);
  auto ask = [&](const HostPick& p) {
    return AskEach(
        p.nodes, local, remote,
        [&](size_t i) -> const v1::LocalProfileRequest& { return p.requests[i]; }, unreachable);
  };
  auto parts = ask(pick);
  if (!parts.ok()) return parts.status();
  // Nodes given hosts that did not answer: their hosts from the other replicas.
  std::set<std::string> failed, orphaned;
  for (size_t i = 0, answered = 0; i < pick.nodes.size(); ++i) {
    if (answered < parts->size() && (*parts)[answered].first == pick.nodes[i].id) {
      ++answered;
      continue;
    }
    failed.insert(pick.nodes[i].id);
    for (const std::string& host : pick.requests[i].hosts()) {
      orphaned.insert(host);
      pick.host_samples.erase(host);
    }
  }
  if (!orphaned.empty()) {
    const HostPick again = ChooseHosts(ring->members(), *totals, request, failed, &orphaned);
    auto more = ask(again);
    if (!more.ok()) return more.status();
    for (auto& part : *more) parts->push_back(std::move(part));
    pick.host_samples.insert(again.host_samples.begin(), again.host_samples.end());
  }
  NoteDeparted(unreachable);
  bool capture_known = false;
  for (const auto& [node, answer] : *totals) capture_known |= answer.capture_known();
  return HostParts<Response>{*std::move(parts), std::move(pick.host_samples), capture_known};
}

}  // namespace strata::server::cluster

#endif  // STRATA_SERVER_CLUSTER_SCATTER_GATHER_H_
