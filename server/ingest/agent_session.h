// Server-side state of one agent's ingest stream: its call graph (replayed from GraphDelta
// messages or reloaded from the store), the mapping from graph nodes to stored function IDs,
// the numberings of recent epochs, and the decode cache from (leaf, ID stack) to stack ID.
//
// AgentSession is transport-free (the gRPC stream handler owns one and feeds it messages), so
// the decoding and validation rules are unit-tested without a network. It is used by one
// thread at a time. Every accepted message is written to the Store before the caller
// acknowledges it; rejected input changes nothing.
#ifndef STRATA_SERVER_INGEST_AGENT_SESSION_H_
#define STRATA_SERVER_INGEST_AGENT_SESSION_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/encoding/graph.h"
#include "common/encoding/numbering.h"
#include "common/labels/labels.h"
#include "server/commit/batch_committer.h"
#include "server/ingest/limits.h"
#include "server/store/store.h"
#include "strata/v1/ingest.pb.h"

namespace strata::server::ingest {

struct AgentIdentity {
  std::string agent_id;
  std::string host;
  std::string arch;
  std::string version;
  uint64_t graph_id = 0;
  // The principal that writes as this agent ("certificate host-1", "token fleet"); empty when
  // the server runs without authentication. An agent ID belongs to the first principal that
  // used it.
  std::string owner;
  // Hello.labels (the agent's --label), normalized; each target's own labels win over them.
  labels::LabelSet labels;
};

// Samples whose label set was refused for the per-service bound (--max-label-sets) and
// stored under the overflow set {strata_overflow=label_sets} instead, since the start.
uint64_t LabelSetsRefused();

// Observes every batch an AgentSession applies, after it is committed (aggregation tables,
// capture progress). Called on the ingest thread.
struct AppliedContext {
  const std::string* service;
  uint64_t stack_id;
  uint64_t count;
};
struct AppliedBatch {
  const AgentIdentity* agent;
  const v1::SampleBatch* batch;
  int64_t window_start_ms;
  bool duplicate = false;  // already applied earlier: acknowledged, not stored again
  std::vector<AppliedContext> contexts;
};

class AgentSession {
 public:
  // Loads the persisted graph of (agent, graph_id) if any, and the last applied sequence.
  // Every batch commits through `committer` (its records, captured samples and
  // continuous-profile cells in one commit); null: a StoreCommitter of `store`.
  static absl::StatusOr<std::unique_ptr<AgentSession>> Open(
      store::Store* store, AgentIdentity identity, commit::BatchCommitter* committer = nullptr,
      const IngestLimits& limits = {});

  const AgentIdentity& identity() const { return identity_; }

  // Drops the call graph and the decode caches (an idle agent under a memory budget); the
  // next delta or batch loads the graph from the store again.
  void Unload();
  // Approximate bytes of this session's graph and caches.
  size_t MemoryBytes() const;
  // The graph's size; valid after Open() and after ApplyGraphDelta/ApplyBatch, until Unload().
  uint32_t num_nodes() const { return static_cast<uint32_t>(graph_.num_nodes()); }
  uint64_t num_edges() const { return graph_.num_edges(); }
  uint64_t last_applied_sequence() const { return last_applied_; }
  // Steps spent classifying the graph's edges since it was loaded (encoding::CallGraph::
  // search_steps): deltas cost them, a reload of a graph stored with its classification not.
  uint64_t graph_search_steps() const { return graph_.search_steps(); }

  // Appends the delta's nodes and edges and persists them. FailedPrecondition when the delta
  // does not start where the graph ends (the caller answers Resync); InvalidArgument for
  // malformed content, ResourceExhausted when the graph would outgrow the limits.
  // All-or-nothing.
  absl::Status ApplyGraphDelta(const v1::GraphDelta& delta);

  // Decodes and stores a batch atomically with its sequence number. The contexts are those
  // of `packed_contexts` (current agents) plus the repeated `contexts` (older agents).
  // Returns the applied contexts (empty with OK for an already-applied sequence of this
  // incarnation: the caller just acknowledges). Batches apply in sequence order: gaps are
  // allowed (an agent drops what it cannot keep), going back is not, so an acknowledgement
  // always means "stored now or before".
  //   FailedPrecondition: the batch's epoch is beyond the graph (the caller answers Resync),
  //     or an earlier batch failed that way and has not been applied yet (this one must wait
  //     for it, or it would make the earlier one look applied).
  //   InvalidArgument: malformed packed bytes, an undecodable context, a count above the
  //     limit, a sequence that jumps implausibly far, an epoch older than that of the batch
  //     applied before it (nothing is stored).
  //   ResourceExhausted (from the committer): retry later, in order.
  absl::StatusOr<AppliedBatch> ApplyBatch(const v1::SampleBatch& batch);

 private:
  AgentSession(store::Store* store, AgentIdentity identity, const IngestLimits& limits);

  // Loads the persisted graph (a no-op while it is loaded).
  absl::Status Load();
  // The label set ID of every target of a continuous-profile batch (Hello labels under the
  // target's own); new sets are interned into `wb`.
  absl::StatusOr<absl::flat_hash_map<uint32_t, uint64_t>> TargetLabelSets(
      const v1::SampleBatch& batch, store::WriteBatch* wb);
  // Decodes one context to a stored stack ID.
  // The batch's leaf addresses, per service, as function IDs, into `wb` (one record per
  // service). InvalidArgument for an unknown target or node, or offsets that overflow.
  absl::Status PutLeafAddresses(const v1::SampleBatch& batch,
                                const absl::flat_hash_map<uint32_t, const v1::Target*>& targets,
                                int64_t window_start_ms, store::WriteBatch* wb);
  absl::StatusOr<uint64_t> StackIdFor(const encoding::Numbering& numbering,
                                      const encoding::EncodedContext& context,
                                      store::WriteBatch* wb);

  store::Store* store_;
  std::unique_ptr<commit::StoreCommitter> own_committer_;  // when Open() was given none
  commit::BatchCommitter* committer_ = nullptr;
  AgentIdentity identity_;
  encoding::CallGraph graph_;
  std::vector<uint64_t> node_function_ids_;  // by node ID; 0 for the root and the marker
  encoding::NumberingCache numberings_;
  const IngestLimits limits_;
  bool loaded_ = false;
  uint64_t last_applied_ = 0;
  // Epoch of the last batch applied since the session was opened (0: none yet). An agent's
  // graph only grows and its batches are built in sequence order, so their epochs never go
  // back; a client that alternates them would cost a numbering of the whole graph per batch.
  uint64_t last_applied_epoch_ = 0;
  // When this session last marked its graph as used (WriteBatch::MarkGraphUsed).
  static constexpr int64_t kGraphMarkIntervalMs = 3'600'000;
  int64_t graph_marked_ms_ = 0;
  // Sequence of a batch refused for a missing graph part; later ones wait for it (0: none).
  uint64_t waiting_for_ = 0;
  uint64_t batches_ = 0;

  // (leaf, ids) -> stack ID, valid for `decode_cache_epoch_` only.
  uint64_t decode_cache_epoch_ = UINT64_MAX;
  absl::flat_hash_map<std::string, uint64_t> decode_cache_;
  // Decoded in the batch being applied, not committed yet.
  absl::flat_hash_map<std::string, uint64_t> pending_cache_;
  // Frames decoded for the batch being applied (against max_batch_decoded_frames).
  uint64_t batch_decoded_frames_ = 0;
  // Scratch of StackIdFor: functions seen from the leaf up.
  absl::flat_hash_set<uint64_t> recursive_;
  // (service '\0' encoded target labels) -> label set ID, once committed; and those of the
  // batch being applied.
  absl::flat_hash_map<std::string, uint64_t> label_set_cache_;
  absl::flat_hash_map<std::string, uint64_t> pending_label_sets_;
};

}  // namespace strata::server::ingest

#endif  // STRATA_SERVER_INGEST_AGENT_SESSION_H_
