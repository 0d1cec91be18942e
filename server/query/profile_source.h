// Where answers come from when they are not all in this server's store: in a cluster
// (server/cluster) the samples, leaf addresses, agents, label sets, phase changes and
// unwinding counters of a service are spread over the nodes, and the query service reads
// them through a ProfileSource that asks every live node and merges. A single server has
// none and reads its own store (ProfileReader), registry and aggregator.
#ifndef STRATA_SERVER_QUERY_PROFILE_SOURCE_H_
#define STRATA_SERVER_QUERY_PROFILE_SOURCE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/container/flat_hash_map.h"
#include "server/query/lines.h"
#include "server/query/profile.h"
#include "common/labels/labels.h"
#include "server/store/records.h"
#include "strata/v1/query.pb.h"

namespace strata::server::query {

class ProfileSource {
 public:
  virtual ~ProfileSource() = default;
  // As ProfileReader::Load, over every node holding samples for `query`; nodes that did not
  // answer are named in Profile::unreachable_nodes.
  virtual absl::StatusOr<Profile> Load(const ProfileQuery& query) = 0;
  // Every node's services, merged; the nodes that did not answer go to `unreachable`.
  virtual absl::StatusOr<std::vector<store::ServiceSummary>> Services(
      std::vector<std::string>* unreachable) = 0;
  // Every node's agents, each once (connected where its stream is); nodes that did not
  // answer are named in the response.
  virtual v1::ListAgentsResponse Agents() = 0;
  // The distinct label sets of `service` over every node.
  virtual absl::StatusOr<std::vector<labels::LabelSet>> LabelSets(
      const std::string& service, std::vector<std::string>* unreachable) = 0;
  // Every node's phase changes for `query`'s service and range, in window order, each naming
  // its node.
  virtual absl::StatusOr<v1::PhasesResponse> Phases(const ProfileQuery& query) = 0;
  // The leaf addresses of `query`'s range and hosts (lines.h: SumLeafAddressesOf), each host's
  // from one node, with their functions' records added to `functions`.
  virtual absl::StatusOr<LeafAddressCounts> LeafAddresses(
      const ProfileQuery& query, FunctionLookup* functions,
      std::vector<std::string>* unreachable) = 0;
  // Self samples per source line (lines.h: TopLines), each host's from one node.
  virtual absl::StatusOr<v1::TopResponse> TopLines(const ProfileQuery& query,
                                                   uint32_t limit) = 0;
  // The agents' unwinding counters for `query`'s service and range, each agent counted once.
  virtual absl::StatusOr<store::UnwindCounts> UnwindCounts(
      const ProfileQuery& query, std::vector<std::string>* unreachable) = 0;
  // As ProfileReader::Series, each host's samples from one node, the parts added.
  virtual absl::StatusOr<v1::SeriesResponse> Series(const ProfileQuery& query, int64_t step_ms,
                                                    const std::string& group_by) = 0;
};

}  // namespace strata::server::query

#endif  // STRATA_SERVER_QUERY_PROFILE_SOURCE_H_
