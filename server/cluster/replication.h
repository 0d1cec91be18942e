// Placement and replication of agent streams in a cluster (ingest's StreamPlacement). The
// ring (membership.h) names each host's replica set; the node an agent reaches takes the
// stream if it is one of the owners and otherwise redirects the agent to them. The node that
// took a stream mirrors it to the other owners over the Ingest API itself (a replica stream:
// Hello, the graph the owner lacks, then every batch), and a batch is acknowledged to the
// agent only once every owner on the ring has committed it.
//
// There are no hints to hand off: an owner that goes away leaves the ring when its lease
// expires, the next node on the ring becomes an owner, and the stream's node brings it up to
// date (the agent's graph from this node's store, then every new batch). Until the lease
// expires, a batch its owner cannot confirm is not acknowledged: the agent keeps it and sends
// it again. History stays where it was written; queries (scatter_gather.h) read each host
// from the replica with the most of its samples.
//
// ClusterPlacement borrows the membership and the store; it owns the channels to other nodes.
#ifndef STRATA_SERVER_CLUSTER_REPLICATION_H_
#define STRATA_SERVER_CLUSTER_REPLICATION_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/rpc/client_security.h"
#include "server/cluster/agent_id_claims.h"
#include "server/cluster/membership.h"
#include "server/ingest/placement.h"
#include "server/store/store.h"

namespace strata::server::cluster {

struct ReplicationMetrics {
  std::atomic<uint64_t> batches_replicated{0};  // batch copies confirmed by another owner
  std::atomic<uint64_t> bytes_replicated{0};    // of those batches, serialized
  std::atomic<uint64_t> graph_catch_ups{0};     // graphs sent to an owner that lacked them
  std::atomic<uint64_t> replica_failures{0};    // owners that did not confirm a batch
  // Batches not sent to an owner that failed to confirm one within the replica timeout
  // (until that timeout has passed again): refused at once instead of each waiting for it.
  std::atomic<uint64_t> replica_skipped{0};
  std::atomic<int64_t> replicated_streams{0};   // accepted streams with another owner
  AgentIdClaimStats agent_ids;
};

// Channels to other nodes by address, shared by replication, fan-out queries and routed
// captures, with this node's credentials for them (TLS and a client certificate, a bearer
// token of role node: server/app's --cluster-tls-* and --cluster-token-file).
class NodeChannels {
 public:
  // rpc::ClientSecurity() for plaintext without a token.
  explicit NodeChannels(rpc::ClientSecurity security) : security_(std::move(security)) {}

  std::shared_ptr<grpc::Channel> Get(const std::string& address);
  // Adds this node's token (if any) to a call to another node.
  void Authorize(grpc::ClientContext* context) const { security_.Authorize(context); }

 private:
  const rpc::ClientSecurity security_;
  absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<grpc::Channel>> channels_ ABSL_GUARDED_BY(mu_);
};

// Cancels gRPC calls that outlive their deadline: a replica stream to a partitioned node
// would otherwise wait for TCP to give up.
class CallDeadlines {
 public:
  CallDeadlines();
  ~CallDeadlines();
  // Cancels `context` at `deadline` unless Disarm()ed first.
  uint64_t Arm(grpc::ClientContext* context, absl::Time deadline);
  void Disarm(uint64_t token);

 private:
  void Run();
  absl::Mutex mu_;
  std::map<uint64_t, std::pair<absl::Time, grpc::ClientContext*>> armed_ ABSL_GUARDED_BY(mu_);
  uint64_t next_ ABSL_GUARDED_BY(mu_) = 1;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

struct ReplicationOptions {
  uint32_t replication_factor = 2;
  // How long an owner may take to confirm a batch before it counts as failed.
  absl::Duration replica_timeout = absl::Seconds(5);
};

class ClusterPlacement final : public ingest::StreamPlacement {
 public:
  ClusterPlacement(Membership* membership, store::Store* store, NodeChannels* channels,
                   ReplicationOptions options, ReplicationMetrics* metrics);

  absl::StatusOr<std::optional<v1::Redirect>> Place(const ingest::AgentIdentity& agent) override;
  std::unique_ptr<ingest::StreamReplica> Replicate(const v1::Hello& hello,
                                                   const std::string& owner) override;
  absl::Status ClaimAgentId(const ingest::AgentIdentity& agent, bool recorded_here) override;

 private:
  friend class AgentReplica;
  // A node that did not confirm a batch (a hung or cut-off host answers nothing until the
  // replica timeout) is skipped for one more timeout: every stream's batches for it fail at
  // once, instead of each holding an ingest worker for the timeout and stalling every other
  // agent's acknowledgements behind them, until its lease expires and the ring moves on.
  bool Unresponsive(const std::string& node_id) ABSL_LOCKS_EXCLUDED(unresponsive_mu_);
  void MarkUnresponsive(const std::string& node_id) ABSL_LOCKS_EXCLUDED(unresponsive_mu_);
  Membership* const membership_;
  store::Store* const store_;
  NodeChannels* const channels_;
  const ReplicationOptions options_;
  ReplicationMetrics* const metrics_;
  CallDeadlines deadlines_;
  AgentIdClaims agent_ids_;
  absl::Mutex unresponsive_mu_;
  std::map<std::string, absl::Time> unresponsive_until_ ABSL_GUARDED_BY(unresponsive_mu_);
};

// The redirect for a host's owners on `ring` (their addresses, best first).
v1::Redirect RedirectTo(const Ring& ring, const std::string& host, uint32_t replication_factor,
                        std::string reason);

}  // namespace strata::server::cluster

#endif  // STRATA_SERVER_CLUSTER_REPLICATION_H_
