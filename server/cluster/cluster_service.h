// A cluster node's side of fan-out queries (scatter_gather.h). Every node serves the Cluster
// gRPC service: its own samples per host for a filter, its own profile over a set of hosts,
// its services, agents, label sets, phase changes, unwinding counters, source lines and leaf
// addresses, and the ring as it sees it; and it keeps the checking node's release records
// and hands out its own (KeepReleaseRecords, LocalReleaseRecords). Only other nodes (role
// node) may call it, apart from Status. The Run* forms answer without a transport: the node
// asking answers its own part with them.
//
// ClusterService borrows the membership, store, registry, live samples, symbolizer,
// authorizer and metrics; it owns a ProfileReader.
#ifndef STRATA_SERVER_CLUSTER_CLUSTER_SERVICE_H_
#define STRATA_SERVER_CLUSTER_CLUSTER_SERVICE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "server/auth/authorizer.h"
#include "server/cluster/membership.h"
#include "server/cluster/replication.h"
#include "server/query/profile.h"
#include "server/registry/agent_registry.h"
#include "strata/v1/cluster.grpc.pb.h"

namespace strata::server::cluster {

class ClusterService final : public v1::Cluster::Service {
 public:
  ClusterService(Membership* membership, store::Store* store,
                 registry::AgentRegistry* registry, const aggregate::LiveSamples* live,
                 symbolize::Symbolizer* symbolizer, auth::Authorizer* authorizer,
                 uint32_t replication_factor, const ReplicationMetrics* metrics);

  grpc::Status Status(grpc::ServerContext*, const v1::ClusterStatusRequest*,
                      v1::ClusterStatusResponse*) override;
  grpc::Status HostTotals(grpc::ServerContext*, const v1::LocalProfileRequest*,
                          v1::HostTotalsResponse*) override;
  grpc::Status LocalProfile(grpc::ServerContext*, const v1::LocalProfileRequest*,
                            v1::LocalProfileResponse*) override;
  grpc::Status LocalServices(grpc::ServerContext*, const v1::ListServicesRequest*,
                             v1::ListServicesResponse*) override;
  grpc::Status LocalAgents(grpc::ServerContext*, const v1::ListAgentsRequest*,
                           v1::ListAgentsResponse*) override;
  grpc::Status LocalLabelSets(grpc::ServerContext*, const v1::ListLabelsRequest*,
                              v1::LocalLabelSetsResponse*) override;
  grpc::Status LocalPhases(grpc::ServerContext*, const v1::PhasesRequest*,
                           v1::PhasesResponse*) override;
  grpc::Status LocalUnwindCounts(grpc::ServerContext*, const v1::LocalProfileRequest*,
                                 v1::LocalUnwindCountsResponse*) override;
  grpc::Status LocalTopLines(grpc::ServerContext*, const v1::LocalProfileRequest*,
                             v1::TopResponse*) override;
  grpc::Status LocalSeries(grpc::ServerContext*, const v1::LocalProfileRequest*,
                           v1::SeriesResponse*) override;
  grpc::Status LocalLeafAddresses(grpc::ServerContext*, const v1::LocalProfileRequest*,
                                  v1::LocalLeafAddressesResponse*) override;
  grpc::Status KeepReleaseRecords(grpc::ServerContext*, const v1::ReleaseRecords*,
                                  v1::KeepReleaseRecordsResponse*) override;
  grpc::Status LocalReleaseRecords(grpc::ServerContext*, const v1::LocalReleaseRecordsRequest*,
                                   v1::ReleaseRecords*) override;

  // This node's release records (the Regressions service's): how it keeps another node's
  // (RegressionsService::Keep: how many were newer), and its own (Releases). Set before the
  // service serves; without them both calls fail (FailedPrecondition: the node runs no
  // Regressions service).
  struct ReleaseRecordAccess {
    std::function<absl::StatusOr<size_t>(const std::vector<v1::ReleaseVerdict>&)> keep;
    std::function<std::vector<v1::ReleaseVerdict>()> list;
  };
  void SetReleaseRecords(ReleaseRecordAccess access) { release_records_ = std::move(access); }

  // Transport-free forms (this node's part of a fan-out query; the status for the CLI).
  absl::StatusOr<v1::HostTotalsResponse> RunHostTotals(const v1::LocalProfileRequest& request);
  absl::StatusOr<v1::LocalProfileResponse> RunLocalProfile(const v1::LocalProfileRequest& request);
  absl::StatusOr<v1::ListServicesResponse> RunLocalServices(const v1::ListServicesRequest&);
  absl::StatusOr<v1::ListAgentsResponse> RunLocalAgents(const v1::ListAgentsRequest&);
  absl::StatusOr<v1::LocalLabelSetsResponse> RunLocalLabelSets(const v1::ListLabelsRequest& r);
  absl::StatusOr<v1::PhasesResponse> RunLocalPhases(const v1::PhasesRequest& request);
  absl::StatusOr<v1::LocalUnwindCountsResponse> RunLocalUnwindCounts(
      const v1::LocalProfileRequest& request);
  absl::StatusOr<v1::TopResponse> RunLocalTopLines(const v1::LocalProfileRequest& request);
  absl::StatusOr<v1::SeriesResponse> RunLocalSeries(const v1::LocalProfileRequest& request);
  absl::StatusOr<v1::LocalLeafAddressesResponse> RunLocalLeafAddresses(
      const v1::LocalProfileRequest& request);
  absl::StatusOr<v1::KeepReleaseRecordsResponse> RunKeepReleaseRecords(
      const v1::ReleaseRecords& request);
  absl::StatusOr<v1::ReleaseRecords> RunLocalReleaseRecords(
      const v1::LocalReleaseRecordsRequest& request);
  v1::ClusterStatusResponse RunStatus();
  const Membership& membership() const { return *membership_; }
  const ReplicationMetrics& metrics() const { return *metrics_; }

 private:
  // Answers a call of another node (role node) with `run`'s result for `request`.
  template <typename Request, typename Response>
  grpc::Status AsNode(grpc::ServerContext* context,
                      absl::StatusOr<Response> (ClusterService::*run)(const Request&),
                      const Request* request, Response* response);

  Membership* const membership_;
  store::Store* const store_;
  registry::AgentRegistry* const registry_;
  const aggregate::LiveSamples* const live_;
  symbolize::Symbolizer* const symbolizer_;
  auth::Authorizer* const authorizer_;
  const uint32_t replication_factor_;
  const ReplicationMetrics* const metrics_;
  query::ProfileReader reader_;
  ReleaseRecordAccess release_records_;
};

}  // namespace strata::server::cluster

#endif  // STRATA_SERVER_CLUSTER_CLUSTER_SERVICE_H_
