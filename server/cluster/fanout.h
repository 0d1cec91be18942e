// Queries in a cluster. FanoutSource is the query service's ProfileSource on a cluster node:
// each view asks the nodes through ScatterGather (scatter_gather.h says how nodes are asked,
// which answers count and which nodes are named unreachable) and merges their answers. A
// profile, its source lines and its leaf addresses are read per host from the node holding
// the most of its samples; services, agents, label sets and phase changes are merged from
// every node; unwinding counters are taken per agent from the node holding the most of them
// (replicas store the same batches).
//
// The node's side of these queries is ClusterService (cluster_service.h); calls routed to
// other nodes on a client's behalf are in routing.h. FanoutSource borrows the membership,
// channels and ClusterService.
#ifndef STRATA_SERVER_CLUSTER_FANOUT_H_
#define STRATA_SERVER_CLUSTER_FANOUT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "server/cluster/cluster_service.h"
#include "server/cluster/membership.h"
#include "server/cluster/replication.h"
#include "server/cluster/routing.h"
#include "server/cluster/scatter_gather.h"
#include "server/query/profile_source.h"

namespace strata::server::cluster {

// Prometheus text of the node's ring state, replication and debug info sync counters, for
// /metrics.
std::string RenderClusterMetrics(ClusterService& service,
                                 const DebugInfoSync* debuginfo_sync = nullptr);

class FanoutSource final : public query::ProfileSource {
 public:
  FanoutSource(Membership* membership, NodeChannels* channels, ClusterService* local,
               uint32_t replication_factor, absl::Duration timeout);

  absl::StatusOr<query::Profile> Load(const query::ProfileQuery& query) override;
  absl::StatusOr<std::vector<store::ServiceSummary>> Services(
      std::vector<std::string>* unreachable) override;
  v1::ListAgentsResponse Agents() override;
  absl::StatusOr<std::vector<labels::LabelSet>> LabelSets(
      const std::string& service, std::vector<std::string>* unreachable) override;
  absl::StatusOr<v1::PhasesResponse> Phases(const query::ProfileQuery& query) override;
  absl::StatusOr<store::UnwindCounts> UnwindCounts(const query::ProfileQuery& query,
                                                   std::vector<std::string>* unreachable) override;
  absl::StatusOr<v1::TopResponse> TopLines(const query::ProfileQuery& query,
                                           uint32_t limit) override;
  absl::StatusOr<v1::SeriesResponse> Series(const query::ProfileQuery& query, int64_t step_ms,
                                            const std::string& group_by) override;
  absl::StatusOr<query::LeafAddressCounts> LeafAddresses(
      const query::ProfileQuery& query, query::FunctionLookup* functions,
      std::vector<std::string>* unreachable) override;

 private:
  ScatterGather nodes_;
};

}  // namespace strata::server::cluster

#endif  // STRATA_SERVER_CLUSTER_FANOUT_H_
