// Where profiles come from when they are not all in this server's store: in a cluster
// (server/cluster) the samples of a service are spread over the nodes, and the query service
// loads profiles and lists services through a ProfileSource that asks them. A single server
// has none and reads its own store (ProfileReader).
#ifndef STRATA_SERVER_QUERY_PROFILE_SOURCE_H_
#define STRATA_SERVER_QUERY_PROFILE_SOURCE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/query/profile.h"
#include "server/store/records.h"

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
};

}  // namespace strata::server::query

#endif  // STRATA_SERVER_QUERY_PROFILE_SOURCE_H_
