// server/ingest: the agents' end of the server. It decodes agent streams into store records
// and sample cells and hands each batch to a commit::BatchCommitter; it knows nothing of
// aggregation or queries. IngestService owns the streams and their sessions; it borrows the
// store, the agent registry (server/registry) and the committer.
//
// gRPC Ingest service: one bidirectional stream per agent (protocol in
// proto/strata/v1/ingest.proto). Streams use gRPC's callback API, so a connected agent costs
// memory, not a thread: each stream owns an AgentSession, and its messages are decoded and
// committed on a bounded worker pool, one at a time per stream (the next message is read
// only after the previous one was handled, which keeps an agent's batches in order and lets
// gRPC's flow control push back on a fast agent). Streams keep server/registry's
// AgentRegistry up to date (connected agents, their targets and health, a way to push
// control messages); batches commit through the BatchCommitter of Options (server/commit).
//
// Bad client input is answered with an IngestError on the stream (or a failed status for a
// stream that does not start with a valid Hello) and never affects other agents or data
// already accepted. Past --max-agents a new stream is refused with RESOURCE_EXHAUSTED and a
// retry delay.
#ifndef STRATA_SERVER_INGEST_INGEST_SERVICE_H_
#define STRATA_SERVER_INGEST_INGEST_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/auth/grpc_auth.h"
#include "server/ingest/agent_session.h"
#include "server/ingest/latency_histogram.h"
#include "server/ingest/limits.h"
#include "server/ingest/placement.h"
#include "server/ingest/worker_pool.h"
#include "server/registry/agent_registry.h"
#include "server/store/store.h"
#include "strata/v1/ingest.grpc.pb.h"

namespace strata::server::ingest {

struct IngestMetrics {
  std::atomic<uint64_t> streams{0};
  std::atomic<uint64_t> batches{0};
  std::atomic<uint64_t> duplicate_batches{0};
  std::atomic<uint64_t> samples{0};
  std::atomic<uint64_t> contexts{0};
  std::atomic<uint64_t> rejected_messages{0};
  // Times a stream's next message was left unread while its replies backed up (its client
  // sends without reading them).
  std::atomic<uint64_t> reads_held{0};
  // Streams ended because the server was out of a resource (table memory).
  std::atomic<uint64_t> resource_exhausted{0};
  // Streams refused at connection: over --max-agents.
  std::atomic<uint64_t> streams_refused{0};
  // Streams refused: over --max-streams-per-principal.
  std::atomic<uint64_t> principal_streams_refused{0};
  // Hellos refused for claiming another principal's agent ID or host.
  std::atomic<uint64_t> identity_refused{0};
  std::atomic<int64_t> connected{0};
  std::atomic<int64_t> queued{0};  // messages waiting for a worker
  std::atomic<int64_t> session_bytes{0};      // estimated, of all sessions
  std::atomic<uint64_t> sessions_unloaded{0};  // graphs dropped for the session budget
  std::atomic<uint64_t> graphs_deleted{0};     // unused past --graph-retention (SweepGraphs)
  // A message's wait for a worker, and a batch's decode and commit.
  LatencyHistogram queue_wait;
  LatencyHistogram batch_apply;
  std::atomic<uint64_t> resyncs{0};
  // Cluster: streams sent to the host's owners, streams taken as another node's replica,
  // and batches not acknowledged because an owner did not confirm them.
  std::atomic<uint64_t> acks{0};  // batches acknowledged to agents (not to replica streams)
  std::atomic<uint64_t> redirects{0};
  std::atomic<uint64_t> replica_streams{0};
  std::atomic<uint64_t> replication_failures{0};
};

// The registry's view of an agent's identity.
registry::AgentDescriptor DescriptorOf(const AgentIdentity& identity);

class IngestService final
    : public v1::Ingest::WithRawCallbackMethod_Connect<v1::Ingest::Service> {
 public:
  struct Options {
    // Who may ingest (role agent); null: anyone. A certificate principal writes only as the
    // host its certificate names, and an agent ID only ever for the principal that first
    // used it.
    auth::Authorizer* authorizer = nullptr;
    // Streams one authenticated principal may hold at once (a stolen or buggy credential
    // cannot take every slot of --max-agents).
    uint32_t max_streams_per_principal = 16;
    // Commits every batch (the aggregation tables); null: each session merges its batches'
    // counts into the store directly (commit::StoreCommitter).
    commit::BatchCommitter* committer = nullptr;
    IngestLimits limits;
    // A stream refused for lack of memory (RESOURCE_EXHAUSTED) is told to come back no
    // sooner than this.
    uint32_t retry_after_ms = 5000;
    // Streams open at once; more are refused with RESOURCE_EXHAUSTED.
    uint32_t max_agents = 20'000;
    // Threads that decode and commit; 0: one per core (four per core for agent streams in a
    // cluster, whose workers wait for the other owners; replica streams get one per core).
    uint32_t worker_threads = 0;
    // Memory of all agent sessions (call graphs, decode caches). Past it, a session drops its
    // graph after each message and loads it from the store for the next one: connected
    // agents then cost RocksDB reads instead of memory.
    size_t session_memory_bytes = size_t{2} << 30;
    // In a cluster: which streams this node takes, and their replication (placement.h).
    // Null: a single server.
    StreamPlacement* placement = nullptr;
    // The call graph of an agent incarnation with no batch applied for longer than this,
    // and no stream open, is deleted (each restart, and each new graph an agent starts near
    // the graph limits, leaves the old one behind). An agent that comes back with it later
    // is told the server knows none of it and sends it again. Zero keeps every graph.
    absl::Duration graph_retention = absl::ZeroDuration();
    // How often the graphs are looked over (SweepGraphs), the first time one interval after
    // start-up.
    absl::Duration graph_sweep_interval = absl::Hours(1);
  };
  using BatchObserver = std::function<void(const AppliedBatch&)>;

  IngestService(store::Store* store, registry::AgentRegistry* registry, IngestMetrics* metrics,
                Options options);
  // Joins the worker pool: the gRPC server must be shut down (every stream done) first.
  ~IngestService() override;
  // Called after every committed batch (aggregation, capture progress).
  void AddBatchObserver(BatchObserver observer) { observers_.push_back(std::move(observer)); }
  using CaptureStatusObserver =
      std::function<void(const std::string& agent_id, const v1::CaptureStatus&)>;
  void AddCaptureStatusObserver(CaptureStatusObserver observer) {
    capture_status_observers_.push_back(std::move(observer));
  }

  // Agent and replica streams, as bytes (see Stream).
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Connect(
      grpc::CallbackServerContext* context) override;

  // Messages waiting for a worker.
  size_t queued() const { return pool_->queued(); }

  // What one look over the stored graphs did.
  struct GraphSweep {
    size_t graphs = 0;   // stored graphs
    size_t marked = 0;   // without a use mark (stored before marks were kept): marked now
    size_t deleted = 0;  // unused past graph_retention, no stream open
  };
  // Deletes the graphs unused past graph_retention at `now_ms` (Unix ms) that no stream
  // holds; a stream opening one meanwhile waits for the delete and then finds no graph.
  // Runs every graph_sweep_interval on a thread of its own; tests call it directly.
  absl::StatusOr<GraphSweep> SweepGraphs(int64_t now_ms);

 private:
  class Stream;

  // A slot of the principal's --max-streams-per-principal; false when it has none left.
  bool TakePrincipalStream(const auth::Principal& principal);
  void ReleasePrincipalStream(const auth::Principal& principal);
  // A stream holds its graph from before it loads it until it ends: SweepGraphs leaves it.
  using GraphRef = std::pair<std::string, uint64_t>;  // (agent ID, graph ID)
  void HoldGraph(const GraphRef& graph);
  void ReleaseGraph(const GraphRef& graph);
  void SweepGraphsPeriodically();

  store::Store* store_;
  registry::AgentRegistry* registry_;
  IngestMetrics* metrics_;
  Options options_;
  std::vector<BatchObserver> observers_;
  std::vector<CaptureStatusObserver> capture_status_observers_;
  std::unique_ptr<WorkerPool> pool_;
  std::unique_ptr<WorkerPool> replica_pool_;  // replica streams' (cluster only)
  absl::Mutex principals_mu_;
  std::map<std::string, uint32_t> principal_streams_ ABSL_GUARDED_BY(principals_mu_);
  absl::Mutex graphs_mu_;
  std::map<GraphRef, uint32_t> held_graphs_ ABSL_GUARDED_BY(graphs_mu_);  // -> streams
  absl::Mutex sweeper_mu_;
  bool sweeper_stopping_ ABSL_GUARDED_BY(sweeper_mu_) = false;
  std::thread graph_sweeper_;
};

}  // namespace strata::server::ingest

#endif  // STRATA_SERVER_INGEST_INGEST_SERVICE_H_
