// WriteBatch: a set of writes that Store::Commit applies atomically. Callers build and own
// their batches; the interner adds the records of new IDs to the batch whose counts use them.
#ifndef STRATA_SERVER_STORE_WRITE_BATCH_H_
#define STRATA_SERVER_STORE_WRITE_BATCH_H_

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "server/store/records.h"

namespace strata::server::store {

// A set of writes applied atomically by Store::Commit. Strings must not contain '\0' where
// they become key components (service, host, agent ID, capture ID); such input, and negative
// windows, make Commit fail with InvalidArgument without writing anything.
class WriteBatch {
 public:
  WriteBatch();
  ~WriteBatch();
  WriteBatch(const WriteBatch&) = delete;
  WriteBatch& operator=(const WriteBatch&) = delete;

  // Adds `count` to the continuous profile cell (service, window, host, stack, label set);
  // `label_set` is an ID from Interner::InternLabelSet (0: no labels).
  void AddSamples(std::string_view service, int64_t window_start_ms, std::string_view host,
                  uint64_t stack_id, uint64_t count, uint64_t label_set = 0);
  // Adds `count` to a cell of an ad hoc capture.
  void AddCaptureSamples(std::string_view capture_id, int64_t window_start_ms,
                         std::string_view host, uint64_t stack_id, uint64_t count,
                         uint64_t label_set = 0);
  // Records that batch `sequence` of the agent's incarnation (its graph ID: a restarted
  // agent numbers its batches from 1 again under a new one) is applied by this commit.
  // Commit refuses (AlreadyExists, nothing written) if `sequence` is not above the stored one.
  void SetAppliedSequence(std::string_view agent_id, uint64_t incarnation, uint64_t sequence);
  void PutAgent(const AgentRecord& agent);
  // Graph records of (agent, graph_id): nodes are keyed by node id, edges by
  // first_edge + position. Re-appending an index overwrites it (resync-safe).
  void AppendGraphNodes(std::string_view agent_id, uint64_t graph_id,
                        const std::vector<GraphNode>& nodes);
  void AppendGraphEdges(std::string_view agent_id, uint64_t graph_id, uint64_t first_edge,
                        const std::vector<GraphEdge>& edges);
  // Drops every record of (agent, graph_id) and its use mark (an incarnation long gone).
  void DeleteGraph(std::string_view agent_id, uint64_t graph_id);
  // Marks (agent, graph_id) as used at `now_ms` (MetaRecords::ListGraphs reads it back).
  void MarkGraphUsed(std::string_view agent_id, uint64_t graph_id, int64_t now_ms);
  // Identical events (same service, window, payload) are stored once.
  void PutPhaseEvent(const PhaseEvent& event);
  void PutCapture(const CaptureInfo& capture);
  void PutRelease(const ReleaseRecord& release);
  // The agents' unwinding counters of batch `sequence` of (agent, incarnation) for `service`:
  // committed with the batch, so exactly once; MetaRecords::SumUnwindCounts reads them.
  void PutUnwindCounts(std::string_view service, int64_t window_start_ms,
                       std::string_view agent_id, uint64_t incarnation, uint64_t sequence,
                       const UnwindCounts& counts);
  // Where batch `sequence`'s samples of `service` stopped in their leaf functions: committed
  // with the batch, so exactly once, and summed into the (service, hour, host) record;
  // MetaRecords::SumLeafAddresses reads them.
  void PutLeafAddresses(std::string_view service, int64_t window_start_ms, std::string_view host,
                        std::string_view agent_id, uint64_t incarnation, uint64_t sequence,
                        const std::vector<LeafAddressCount>& counts);
  // Requests `host` served in batch `sequence`'s window (its agent's scrape of a throughput
  // metric), for `service`: committed with the batch, so exactly once, and summed into the
  // (service, hour, host) record; MetaRecords::SumRequests reads them.
  void PutRequests(std::string_view service, int64_t window_start_ms, std::string_view host,
                   std::string_view agent_id, uint64_t incarnation, uint64_t sequence,
                   uint64_t requests);
  // Drops a capture: its sample cells and its metadata record (capture retention).
  void DeleteCapture(std::string_view capture_id);
  // Journal records (see the journal column family): an opaque record under `sequence`, and
  // the deletion of every record below `sequence`.
  void PutJournal(uint64_t sequence, std::string_view record);
  void DeleteJournalBefore(uint64_t sequence);
  // Every cell of `service` in journal records below `sequence` is in the cell column
  // families (committed with the cells): a journal record holds several services' cells and
  // stays until all of them are written, so replaying it must skip the ones that were.
  void PutJournalWritten(std::string_view service, uint64_t sequence);
  void DeleteJournalWritten();

  bool empty() const;
  // Drops everything added so far.
  void Clear();

 // Its contents, known to the store's components only (write_batch_rep.h).
  struct Rep;

 private:
  friend class BatchAccess;
  std::unique_ptr<Rep> rep_;
};

}  // namespace strata::server::store

#endif  // STRATA_SERVER_STORE_WRITE_BATCH_H_
