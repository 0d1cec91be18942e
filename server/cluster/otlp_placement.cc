#include "server/cluster/otlp_placement.h"

#include <chrono>
#include <memory>

#include "absl/strings/str_join.h"
#include "common/rpc/grpc_status.h"
#include "server/ingest/placement.h"

namespace strata::server::cluster {

absl::StatusOr<otlp::OtlpPlacement::Plan> ClusterOtlpPlacement::PlanHosts(
    const std::vector<std::string>& hosts) {
  if (!membership_->lease_held()) {
    return absl::UnavailableError(
        "this cluster node lost its membership (etcd unreachable); try another node");
  }
  const std::shared_ptr<const Ring> ring = membership_->ring();
  if (ring == nullptr || ring->empty()) return absl::UnavailableError("the ring is empty");
  const std::string& self = membership_->options().node_id;
  Plan plan;
  for (const std::string& host : hosts) {
    for (const RingMember* owner : ring->Owners(host, options_.replication_factor)) {
      if (owner->id == self) {
        plan.here.push_back(host);
      } else {
        plan.elsewhere[owner->address].push_back(host);
      }
    }
  }
  return plan;
}

absl::Status ClusterOtlpPlacement::Forward(
    const std::string& address, const otlp::otlp_v1::ExportProfilesServiceRequest& request,
    const std::vector<std::string>& hosts) {
  grpc::ClientContext context;
  context.AddMetadata(ingest::kReplicaMetadata, membership_->options().node_id);
  context.AddMetadata(otlp::kReplicaHostsMetadata, absl::StrJoin(hosts, std::string(1, '\0')));
  context.set_deadline(std::chrono::system_clock::now() +
                       absl::ToChronoMilliseconds(options_.replica_timeout));
  channels_->Authorize(&context);
  auto stub = otlp::otlp_v1::ProfilesService::NewStub(channels_->Get(address));
  otlp::otlp_v1::ExportProfilesServiceResponse response;
  return rpc::FromGrpcStatus(stub->Export(&context, request, &response));
}

}  // namespace strata::server::cluster
