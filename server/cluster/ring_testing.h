// Ring members for the cluster's unit tests.
#ifndef STRATA_SERVER_CLUSTER_RING_TESTING_H_
#define STRATA_SERVER_CLUSTER_RING_TESTING_H_

#include <vector>

#include "absl/strings/str_cat.h"
#include "server/cluster/ring.h"

namespace strata::server::cluster {

// Members n1 .. nN at 127.0.0.1:7001 .., with the default tokens, in ID order.
inline std::vector<RingMember> TestMembers(int n) {
  std::vector<RingMember> out;
  for (int i = 1; i <= n; ++i) {
    out.push_back({absl::StrCat("n", i), absl::StrCat("127.0.0.1:", 7000 + i), kDefaultTokens});
  }
  return out;
}

}  // namespace strata::server::cluster

#endif  // STRATA_SERVER_CLUSTER_RING_TESTING_H_
