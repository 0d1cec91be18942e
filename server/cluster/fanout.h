// Queries in a cluster. Every node serves the Cluster gRPC service (ClusterService): its own
// samples per host for a filter, its own profile over a set of hosts, its services, and the
// ring as it sees it. FanoutSource is the query service's ProfileSource on a cluster node: a
// profile query asks every live node for its samples per host, takes each host from the node
// holding the most of them (replicas of a host hold the same batches, so the largest is the
// complete one when another missed some, and summing replicas would count them twice), asks
// each node for the profile of the hosts it was given, and merges. Nodes that did not answer
// are named in the answer; nodes known to be down are named too once as many are down as
// there are replicas (below that, every host's samples have a replica up).
//
// Both borrow the membership, store and channels; ClusterService owns a ProfileReader.
#ifndef STRATA_SERVER_CLUSTER_FANOUT_H_
#define STRATA_SERVER_CLUSTER_FANOUT_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "server/auth/authorizer.h"
#include "server/cluster/membership.h"
#include "server/cluster/replication.h"
#include "server/query/profile.h"
#include "server/query/profile_source.h"
#include "strata/v1/capture.grpc.pb.h"
#include "strata/v1/cluster.grpc.pb.h"

namespace strata::server::cluster {

class ClusterService final : public v1::Cluster::Service {
 public:
  ClusterService(Membership* membership, store::Store* store,
                 const aggregate::LiveSamples* live, symbolize::Symbolizer* symbolizer,
                 auth::Authorizer* authorizer, uint32_t replication_factor,
                 const ReplicationMetrics* metrics);

  grpc::Status Status(grpc::ServerContext*, const v1::ClusterStatusRequest*,
                      v1::ClusterStatusResponse*) override;
  grpc::Status HostTotals(grpc::ServerContext*, const v1::LocalProfileRequest*,
                          v1::HostTotalsResponse*) override;
  grpc::Status LocalProfile(grpc::ServerContext*, const v1::LocalProfileRequest*,
                            v1::LocalProfileResponse*) override;
  grpc::Status LocalServices(grpc::ServerContext*, const v1::ListServicesRequest*,
                             v1::ListServicesResponse*) override;

  // Transport-free forms (this node's part of a fan-out query; the status for the CLI).
  absl::StatusOr<v1::HostTotalsResponse> RunHostTotals(const v1::LocalProfileRequest& request);
  absl::StatusOr<v1::LocalProfileResponse> RunLocalProfile(const v1::LocalProfileRequest& request);
  absl::StatusOr<v1::ListServicesResponse> RunLocalServices();
  v1::ClusterStatusResponse RunStatus();
  const Membership& membership() const { return *membership_; }
  const ReplicationMetrics& metrics() const { return *metrics_; }

 private:
  Membership* const membership_;
  store::Store* const store_;
  const aggregate::LiveSamples* const live_;
  auth::Authorizer* const authorizer_;
  const uint32_t replication_factor_;
  const ReplicationMetrics* const metrics_;
  query::ProfileReader reader_;
};

// Runs a capture on the node whose agent stream serves its target: asks the other live nodes
// in turn (the first that does not answer NotFound runs it) and relays the progress. A call
// that was already routed is not routed again. For CaptureService::Options::run_elsewhere.
grpc::Status RunCaptureElsewhere(Membership* membership, NodeChannels* channels,
                                 grpc::ServerContext* context,
                                 const v1::RunCaptureRequest& request,
                                 grpc::ServerWriter<v1::CaptureProgress>* writer);

// Prometheus text of the node's ring state and replication counters, for /metrics.
std::string RenderClusterMetrics(ClusterService& service);

class FanoutSource final : public query::ProfileSource {
 public:
  FanoutSource(Membership* membership, NodeChannels* channels, ClusterService* local,
               uint32_t replication_factor, absl::Duration timeout);

  absl::StatusOr<query::Profile> Load(const query::ProfileQuery& query) override;
  absl::StatusOr<std::vector<store::ServiceSummary>> Services(
      std::vector<std::string>* unreachable) override;

 private:
  Membership* const membership_;
  NodeChannels* const channels_;
  ClusterService* const local_;
  const uint32_t replication_factor_;
  const absl::Duration timeout_;
};

}  // namespace strata::server::cluster

#endif  // STRATA_SERVER_CLUSTER_FANOUT_H_
