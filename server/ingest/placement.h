// How a cluster places agent streams (server/cluster implements it). Ingest asks it once per
// stream whether this node takes the agent at all (its host's owners on the ring), and has it
// mirror every accepted stream to the host's other owners before acknowledging a batch. A
// single server has no placement (IngestService::Options::placement null): every stream is
// taken and a batch is acknowledged once it is committed here.
//
// Streams from other nodes carry kReplicaMetadata: they are replicas of a stream another
// node accepted, and are applied here without placement or further replication.
#ifndef STRATA_SERVER_INGEST_PLACEMENT_H_
#define STRATA_SERVER_INGEST_PLACEMENT_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/ingest/agent_session.h"
#include "strata/v1/ingest.pb.h"

namespace strata::server::ingest {

// Metadata key of a replica stream; its value is the sending node's ID. Only a principal of
// role node may send one (when the server authenticates).
inline constexpr char kReplicaMetadata[] = "x-strata-replica-of";
// Metadata of a replica stream: the principal that owns the agent (AgentIdentity::owner) on
// the node that accepted its stream, so every owner records the same owner for the agent.
inline constexpr char kReplicaOwnerMetadata[] = "x-strata-agent-owner";

// Mirrors one accepted agent stream to the other owners of its host. Used by one thread at
// a time (the stream's).
class StreamReplica {
 public:
  virtual ~StreamReplica() = default;
  // After `delta` was applied here.
  virtual void OnGraphDelta(const v1::GraphDelta& delta) = 0;
  // After `batch` was committed here (now or before). OK once every live owner has it too:
  // the batch may be acknowledged. FailedPrecondition with `redirect` filled when this node
  // no longer owns the host (the ring moved); Unavailable when an owner that holds its lease
  // did not confirm the batch, or this node lost its own lease (the agent sends it again).
  virtual absl::Status OnBatch(const v1::SampleBatch& batch, const AgentSession& session,
                               v1::Redirect* redirect) = 0;
};

class StreamPlacement {
 public:
  virtual ~StreamPlacement() = default;
  // nullopt: this node takes the stream. A Redirect: it does not own the agent's host.
  // Unavailable: it cannot tell (it lost its membership); the agent retries later.
  virtual absl::StatusOr<std::optional<v1::Redirect>> Place(const AgentIdentity& agent) = 0;
  // The replica of an accepted stream, after its session opened; `owner` is the agent's
  // AgentIdentity::owner here.
  virtual std::unique_ptr<StreamReplica> Replicate(const v1::Hello& hello,
                                                   const std::string& owner) = 0;
  // Before this node takes a stream whose agent.owner is set: a node knows the owners of its
  // own hosts' agents only, so the first principal to write as an agent ID anywhere owns it
  // everywhere. OK, PermissionDenied naming the owner, or Unavailable when the cluster cannot
  // tell and `recorded_here` (this node's store records the same owner) is false.
  virtual absl::Status ClaimAgentId(const AgentIdentity& agent, bool recorded_here) = 0;
};

}  // namespace strata::server::ingest

#endif  // STRATA_SERVER_INGEST_PLACEMENT_H_
