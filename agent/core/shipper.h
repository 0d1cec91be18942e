// Ships the agent's batches to strata-server over one bidirectional gRPC stream
// (proto/strata/v1/ingest.proto), with reconnection, from the agent's spool.
//
// Every batch goes to the spool (agent/spool: on disk, with the graph it needs, before it is
// sent) and stays there until the server acknowledges its sequence number, so batches survive
// server restarts, network loss and agent restarts. Batches go out in sequence order; after a
// refusal the server can recover from (FAILED_PRECONDITION, RESOURCE_EXHAUSTED) they are
// resent in order. Reconnects back off exponentially with jitter, at least as long as the
// server asks. Before a batch goes out, the graph nodes and edges it is encoded against are
// sent; after a reconnect the server's Welcome says which part of the graph it already has
// and which batches it applied. Server control messages (captures, rates) are passed to the
// control handler on the shipper's thread.
//
// Servers: a list of addresses (the nodes of a cluster, or one server). The first connection
// goes to the first address; after a failed connection or a stream that ended, the next one
// goes to the next address, round robin. A cluster node that does not own the agent's host
// answers with a Redirect naming the owners, followed as rpc::Reconnector says
// (common/rpc/reconnector.h: at once, a few times in a row at most). Unacknowledged batches
// are resent after every reconnect; the server applies each (agent, sequence) once.
//
// Thread model: Enqueue/Flush/Stop from any thread; one internal thread writes to the stream
// and reads from it (gRPC's asynchronous API on one completion queue, woken by an alarm when
// there is work), so a batch and its acknowledgement cross no other thread of the agent's.
// Where batches come at most 2.5 s apart, that thread sleeps on the shipper's lock between
// them instead of on the stream, and reads what the server sent when the next batch goes:
// one wake-up per batch rather than one for the batch and one for its acknowledgement. The
// server's messages then wait up to that long; while Flush() waits, they are read at once.
// The read after a message is posted with the next batch's write, so the flow-control window
// it announces goes in that write: one socket write per batch.
// The shipper owns the spool's use; the caller keeps it alive.
#ifndef STRATA_AGENT_CORE_SHIPPER_H_
#define STRATA_AGENT_CORE_SHIPPER_H_

#include <grpcpp/alarm.h>
#include <grpcpp/completion_queue.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/core/context_graph.h"
#include "agent/spool/spool.h"
#include "common/rpc/client_security.h"
#include "common/rpc/reconnector.h"
#include "strata/v1/ingest.grpc.pb.h"

namespace strata::agent {

// The addresses of a comma-separated list ("n1:7070,n2:7070"; spaces around them are
// ignored), in order. InvalidArgument for an empty list or an empty address.
absl::StatusOr<std::vector<std::string>> ParseServerList(std::string_view list);

struct ShipperOptions {
  // strata-server addresses (host:port), tried in turn: at least one.
  std::vector<std::string> servers;
  std::string agent_id;
  std::string host;
  std::string arch;
  std::string version;
  // TLS, client certificate and bearer token of the connection.
  rpc::ClientSecurity security;
  uint32_t frequency_hz = 99;
  std::map<std::string, std::string> labels;
  // What the spool found at start-up, reported in the agent's health.
  uint64_t spool_corrupt_records = 0;
  uint64_t spool_orphaned_batches = 0;
  absl::Duration heartbeat = absl::Seconds(10);
  absl::Duration max_backoff = absl::Seconds(30);
};

struct ShipperStats {
  uint64_t connects = 0;
  uint64_t redirects = 0;  // Redirects received (the server named other nodes)
  uint64_t batches_acked = 0;
  uint64_t batches_rejected = 0;
  uint64_t bytes_sent = 0;
  uint64_t spool_errors = 0;  // batches or graph the spool could not write (kept in memory)
  bool connected = false;
  // The server's graph limits, from its Welcome (0: not told).
  uint32_t server_max_graph_nodes = 0;
  uint64_t server_max_graph_edges = 0;
  spool::SpoolStats spool;
};

class Shipper {
 public:
  using ControlHandler = std::function<void(const v1::ServerMessage&)>;

  Shipper(ShipperOptions options, ContextGraph* graph, spool::Spool* spool);
  ~Shipper();

  void SetControlHandler(ControlHandler handler);
  void Start();
  // Spools a batch (its sequence number must be above every earlier one) after the graph it
  // is encoded against, then queues it for sending.
  void Enqueue(v1::SampleBatch batch);
  // Sends a capture status update (not spooled: progress is only useful live).
  void SendStatus(v1::CaptureStatus status);
  // The agent's current targets: announced in a Heartbeat after every (re)connect and
  // whenever they change.
  void SetTargets(std::vector<v1::Target> targets);
  // Waits until every queued batch is acknowledged; false on timeout, or at once when the
  // server is ahead (ServerAhead()). A reconnect waiting out its backoff is tried at once.
  bool Flush(absl::Duration timeout);
  void Stop();
  ShipperStats stats() const;
  // Whether the agent should start a new call graph now: the connected server named its
  // graph limits, the graph is past half of either (at a limit its deltas are refused and
  // nothing more is delivered), and the server is caught up with the batches (a flush will
  // leave no batch that needs the graph left behind); or the graph is past a limit itself; or
  // the server is ahead (ServerAhead()).
  bool NewGraphDue() const;
  // Whether a server's Welcome showed more of this incarnation than the agent has: more nodes
  // or edges of its graph, or a batch sequence past those the spool reserved. The agent's
  // state came from an older copy of its spool (a VM snapshot or a backup restored), and the
  // server would decode its new nodes, edges or batches as others: nothing more is sent under
  // this incarnation, and the batches left can never be delivered.
  bool ServerAhead() const;
  // Whether the graph is past a limit the server named (at its last Welcome): the server
  // refuses it, and batches left in the spool can never be delivered.
  bool GraphPastServerLimits() const;

 private:
  void Run();
  bool PastServerLimitsLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One connection's lifetime; returns when the stream breaks, the server redirects the agent
  // or Stop() is called.
  void Session(v1::Ingest::Stub* stub, const std::string& address);
  void HandleServerMessage(const v1::ServerMessage& m) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A heartbeat with the agent's health.
  v1::AgentMessage Heartbeat() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The messages that go next: the targets when they changed, capture statuses, and batches
  // from the spool (at most kMaxBytesPerRound) after the graph they need.
  void TakeRound(std::deque<v1::AgentMessage>* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Batches, statuses or targets to send, or the session is to end.
  bool HasWorkForSession() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // When batches come at most kMaxPassiveWait apart: until when the session may sleep without
  // waiting on the stream (the next batch is due before then). Not while Flush() waits.
  std::optional<absl::Time> PassiveWaitEnd() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Wakes the session's thread (there is work for it).
  void WakeSessionLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Syncs the spool's unacknowledged writes once they are due (Spool::SyncIfDue).
  void SyncSpoolIfDue() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The spool could not record or sync the graph (`error`): it goes on from memory.
  void AbandonSpoolGraph(const absl::Status& error) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // mu_.AwaitWithDeadline that syncs the spool when that falls due while it waits.
  bool AwaitSyncingSpool(const absl::Condition& condition, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const ShipperOptions options_;
  ContextGraph* const graph_;
  std::thread thread_;

  mutable absl::Mutex mu_;
  spool::Spool* const spool_ ABSL_GUARDED_BY(mu_);
  // Batches from this sequence number on have not been written to the current stream.
  uint64_t next_send_ ABSL_GUARDED_BY(mu_) = 0;
  // The last batches enqueued (ascending sequence numbers, at most kMaxUnsentInMemory)
  // until a round takes them: sent from here rather than read back from the spool's disk.
  static constexpr size_t kMaxUnsentInMemory = 4;
  std::deque<v1::SampleBatch> unsent_ ABSL_GUARDED_BY(mu_);
  // How much of the graph the spool holds.
  uint32_t spooled_nodes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t spooled_edges_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<v1::CaptureStatus> statuses_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::Target> targets_ ABSL_GUARDED_BY(mu_);
  bool targets_sent_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool server_ahead_ ABSL_GUARDED_BY(mu_) = false;  // ServerAhead()
  bool flushing_ ABSL_GUARDED_BY(mu_) = false;  // a Flush() came: skip one reconnect backoff
  int flush_waiters_ ABSL_GUARDED_BY(mu_) = 0;  // Flush() calls waiting
  // The connected session's queue and its wake-up (null between sessions).
  grpc::CompletionQueue* session_cq_ ABSL_GUARDED_BY(mu_) = nullptr;
  grpc::Alarm* session_alarm_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool wake_pending_ ABSL_GUARDED_BY(mu_) = false;  // the alarm is set
  bool session_asleep_ ABSL_GUARDED_BY(mu_) = false;  // waiting on mu_, not on the queue
  uint32_t sent_nodes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t sent_edges_ ABSL_GUARDED_BY(mu_) = 0;
  // When the last batch was enqueued, and how long after the one before.
  absl::Time last_enqueue_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::Duration enqueue_gap_ ABSL_GUARDED_BY(mu_) = absl::InfiniteDuration();
  // Set when the server ends the stream for lack of resources: the least wait before the
  // next connection.
  absl::Duration retry_after_ ABSL_GUARDED_BY(mu_);
  // Set when the server sent the agent elsewhere (the stream ends with it).
  std::optional<v1::Redirect> redirect_ ABSL_GUARDED_BY(mu_);
  ShipperStats stats_ ABSL_GUARDED_BY(mu_);
  ControlHandler control_handler_ ABSL_GUARDED_BY(mu_);
};

}  // namespace strata::agent

#endif  // STRATA_AGENT_CORE_SHIPPER_H_
