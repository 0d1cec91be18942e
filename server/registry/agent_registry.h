// The server's agents: which are connected (and which were seen recently), what they profile,
// their health, and the way to push a control message down an agent's ingest stream.
//
// Ingest owns the entries' lifecycle (Attach when a stream's Hello is accepted, Detach when it
// ends, batches and heartbeats in between); the query and capture services only read them
// (List, FindAgents) and send control messages (Send). Results are plain structs: converting
// them to an API's messages is the reader's business.
//
// Thread-safe. Disconnected agents are remembered up to a bound (the oldest are forgotten
// first), so agent IDs that come and go cost bounded memory.
#ifndef STRATA_SERVER_REGISTRY_AGENT_REGISTRY_H_
#define STRATA_SERVER_REGISTRY_AGENT_REGISTRY_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "strata/v1/common.pb.h"
#include "strata/v1/ingest.pb.h"

namespace strata::server::registry {

// Who a connecting agent is (from its Hello and the stream's principal).
struct AgentDescriptor {
  std::string agent_id;
  std::string host;
  std::string arch;
  std::string version;
  // The principal that writes as this agent; empty without authentication. An agent ID
  // belongs to the first principal that used it.
  std::string owner;
};

// A process an agent profiles.
struct TargetRef {
  std::string service;
  uint32_t pid = 0;
};

struct AgentStatus {
  std::string agent_id;
  std::string host;
  std::string arch;
  std::string version;
  bool connected = false;
  int64_t last_batch_ms = 0;
  uint64_t batches = 0;
  std::vector<TargetRef> targets;  // by pid, latest seen
  v1::AgentHealth health;          // from the agent's latest heartbeat
  uint32_t frequency_hz = 0;       // Hello.frequency_hz; 0: not said
};

// Sampling rate assumed for a service none of whose agents said theirs (the agent's default).
inline constexpr uint32_t kDefaultFrequencyHz = 99;

class AgentRegistry {
 public:
  using Sender = std::function<bool(const v1::ServerMessage&)>;

  explicit AgentRegistry(size_t max_disconnected = 10'000) : max_disconnected_(max_disconnected) {}

  // Registers a connected agent; returns the attachment, which Detach names. PERMISSION_DENIED
  // if the agent ID belongs to another principal (AgentDescriptor::owner) that the registry
  // knows of. When the agent ID is connected from another host already (two agents given one
  // ID, or one moved before its old stream ended), `other_host` (if not null) is set to it;
  // the new attachment replaces the other in List() and FindAgents().
  absl::StatusOr<uint64_t> Attach(const AgentDescriptor& agent, uint32_t frequency_hz,
                                  Sender sender, std::string* other_host = nullptr);
  // Ends `attachment` of the agent. An agent that reconnected before the server saw its old
  // stream end is attached again already: the old stream's Detach leaves it connected.
  void Detach(const std::string& agent_id, uint64_t attachment);
  // Counts the batch; its targets are the agent's list only until a heartbeat lists them
  // (a batch also names targets that exited with samples still to ship).
  void RecordBatch(const std::string& agent_id, const v1::SampleBatch& batch);
  // Replaces the agent's target list (from a Heartbeat), from then on the only source of it.
  void SetTargets(const std::string& agent_id,
                  const google::protobuf::RepeatedPtrField<v1::Target>& targets);
  // The agent's health from its latest heartbeat.
  void SetHealth(const std::string& agent_id, const v1::AgentHealth& health);
  // Every known agent, by agent ID.
  std::vector<AgentStatus> List() const;
  // Agents (connected) that currently profile a target of `service` (empty: any) on `host`
  // (empty: any) with `pid` (0: any).
  std::vector<std::string> FindAgents(const std::string& service, const std::string& host,
                                      uint32_t pid) const;
  // The sampling rate of `service`'s profile: the most common Hello.frequency_hz of the
  // known agents that profile one of its targets (the lower one on a tie), or
  // kDefaultFrequencyHz when none is known.
  uint32_t SamplingRate(const std::string& service) const;
  // Sends a control message to a connected agent; false if it is gone.
  bool Send(const std::string& agent_id, const v1::ServerMessage& message);

 private:
  struct Entry {
    AgentDescriptor agent;
    uint32_t frequency_hz = 0;
    bool connected = false;
    int64_t last_batch_ms = 0;
    uint64_t batches = 0;
    std::map<uint32_t, std::string> targets;  // pid -> service, latest seen
    bool targets_from_heartbeats = false;
    v1::AgentHealth health;
    std::shared_ptr<Sender> sender;
    uint64_t attachment = 0;  // the stream attached last
    uint64_t detached_at = 0;  // Detach() order, for forgetting the oldest
  };
  const size_t max_disconnected_;
  mutable absl::Mutex mu_;
  std::map<std::string, Entry> agents_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, std::string> disconnected_ ABSL_GUARDED_BY(mu_);  // by detached_at
  uint64_t detaches_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t attachments_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace strata::server::registry

#endif  // STRATA_SERVER_REGISTRY_AGENT_REGISTRY_H_
