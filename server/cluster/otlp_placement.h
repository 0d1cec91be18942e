// OTLP exports in a cluster (otlp::OtlpPlacement): a request's hosts are stored by their
// owners on the ring, the same owners (replication factor) as agents' streams of those hosts.
// The node a request reaches stores the hosts it owns and forwards the request to each other
// owner with the hosts that node is to store, over OTLP's own Export call (a replica call,
// authenticated as this node). Unlike a stream there is nothing to redirect: an OTLP sender
// knows one endpoint.
//
// Borrows the membership and the node channels.
#ifndef STRATA_SERVER_CLUSTER_OTLP_PLACEMENT_H_
#define STRATA_SERVER_CLUSTER_OTLP_PLACEMENT_H_

#include <string>
#include <vector>

#include "server/cluster/membership.h"
#include "server/cluster/replication.h"
#include "server/otlp/otlp_service.h"

namespace strata::server::cluster {

class ClusterOtlpPlacement final : public otlp::OtlpPlacement {
 public:
  ClusterOtlpPlacement(Membership* membership, NodeChannels* channels, ReplicationOptions options)
      : membership_(membership), channels_(channels), options_(options) {}

  absl::StatusOr<Plan> PlanHosts(const std::vector<std::string>& hosts) override;
  // Bounded by the replica timeout.
  absl::Status Forward(const std::string& address,
                       const otlp::otlp_v1::ExportProfilesServiceRequest& request,
                       const std::vector<std::string>& hosts) override;

 private:
  Membership* const membership_;
  NodeChannels* const channels_;
  const ReplicationOptions options_;
};

}  // namespace strata::server::cluster

#endif  // STRATA_SERVER_CLUSTER_OTLP_PLACEMENT_H_
