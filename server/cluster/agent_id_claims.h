// Which principal owns each agent ID across a cluster. A node records the owner of the agents
// whose streams it takes (its hosts' agents) in its store; an agent ID taken by another
// principal for another host, at a node that does not own the first host, would not be found
// there. So the first principal to write as an agent ID on any node claims it in etcd, under
// PREFIX/agent-ids/ID, and every node checks the claim before it takes an agent's stream.
//
// Confirmed claims are cached. While etcd does not answer, a node takes the agents its store
// already records with the same owner (they were checked when they first came) and refuses
// the others as unavailable (they retry); after a failed call it does not ask etcd again for
// a few seconds, so reconnecting agents do not each wait out a call's deadline.
//
// AgentIdClaims borrows the etcd client and the stats. Thread-safe.
#ifndef STRATA_SERVER_CLUSTER_AGENT_ID_CLAIMS_H_
#define STRATA_SERVER_CLUSTER_AGENT_ID_CLAIMS_H_

#include <atomic>
#include <cstdint>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/cluster/etcd/etcd_client.h"

namespace strata::server::cluster {

struct AgentIdClaimStats {
  std::atomic<uint64_t> refused{0};  // streams refused: another principal owns the ID
  // Streams taken on the store's record alone, etcd not answering.
  std::atomic<uint64_t> unconfirmed{0};
};

class AgentIdClaims {
 public:
  // `back_off`: how long after a failed call etcd is not asked.
  AgentIdClaims(EtcdClient* etcd, std::string prefix, AgentIdClaimStats* stats,
                absl::Duration back_off = absl::Seconds(5))
      : etcd_(etcd), prefix_(std::move(prefix)), stats_(stats), back_off_(back_off) {}

  // OK when `owner` owns `agent_id` cluster-wide (claiming it if no one does);
  // PermissionDenied naming the owner when another principal does; Unavailable when etcd
  // does not answer and `recorded_here` (this node's store records `owner` for the ID) is
  // false.
  absl::Status Claim(const std::string& agent_id, const std::string& owner, bool recorded_here);

 private:
  // Confirmed claims kept at most; the cache is dropped when full (each agent then asks again
  // once).
  static constexpr size_t kMaxCached = 1 << 17;

  EtcdClient* const etcd_;
  const std::string prefix_;
  AgentIdClaimStats* const stats_;
  const absl::Duration back_off_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::string> owners_ ABSL_GUARDED_BY(mu_);
  absl::Time etcd_failed_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace strata::server::cluster

#endif  // STRATA_SERVER_CLUSTER_AGENT_ID_CLAIMS_H_
