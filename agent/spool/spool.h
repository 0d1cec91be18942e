// agent/spool (strata::agent::spool): the durable spool. Opened by the agent's main, which
// owns it; the Shipper (agent/core) appends to it, reads it and acknowledges from it.
//
// The agent's spool: every batch it has built and the server has not acknowledged yet, in
// sequence order, with the call graph the batches are encoded against.
//
// On disk (a directory per agent identity under the spool directory) it survives agent
// restarts, kill -9, OOM kills and reboots: a restarted agent resumes the same identity
// (agent ID and graph ID), restores its call graph and resends what the server had not
// acknowledged; the server applies each batch once (it keeps the last sequence number
// applied per agent incarnation). Without a directory the spool lives in memory, bounded by
// a number of batches.
//
// An agent's directory is <spool dir>/given/<agent ID> when its ID was given, else
// <spool dir>/generated/<agent ID>; only the latter are adopted by an agent started without
// an ID (a given identity is resumed only by the agent it was given to). Its files:
//   LOCK                   flock()ed for the life of the agent: one agent per identity
//   graph.log              the identity (a Hello record), then every graph delta, in order,
//                          and the blocks of batch sequence numbers reserved
//   batches-<seq>.log      segments of batch records, the first sequence in the name; an
//                          acknowledgement goes in ahead of the next batch, in its write
//   acked                  the highest sequence number acknowledged when the spool closed
// Every file is a header and records of [u32 length][u32 crc32c][u8 type][payload]; a record is
// written whole before the batch can go out, so a torn or corrupt tail (a crash mid-write, a bad
// disk) is detected by its length or checksum, skipped and counted, never fatal; a graph log cut
// short that way is not resumed (see Open()). A written record survives the agent's own death at
// once (it is in the kernel); it is synced to the disk (fdatasync, the graph first) once it has
// waited `sync_delay` for the server's acknowledgement: an acknowledged batch is the server's to
// keep, so an agent whose server answers within the delay writes its batches and never waits for
// the disk. A power loss can take the batches of the last `sync_delay`, but never what a restart
// numbers on from: graph deltas are synced before the server is sent them (SyncGraph), and batch
// sequence numbers are reserved in synced blocks, so a resumed incarnation numbers no node, edge
// or batch as the server already knows another. Only the batch bytes are on
// disk: memory holds an index entry per batch, so the agent stays flat however long the server is
// away. Past `max_bytes` the oldest segment is dropped (counted). A batch that cannot be written
// (disk full) is kept in memory and counted, so shipping goes on.
//
// Not thread-safe: the shipper calls it under its own lock.
#ifndef STRATA_AGENT_SPOOL_SPOOL_H_
#define STRATA_AGENT_SPOOL_SPOOL_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "strata/v1/ingest.pb.h"

namespace strata::agent::spool {

struct SpoolOptions {
  std::string dir;                        // empty: in memory only
  uint64_t max_bytes = 256ull << 20;      // on disk, graph included
  uint64_t segment_bytes = 4ull << 20;    // a new segment past this size
  size_t max_memory_batches = 360;        // in memory: one hour of 10 s batches
  // Unacknowledged writes are synced to the disk after this long (see above).
  absl::Duration sync_delay = absl::Seconds(1);
  // No agent ID was given: adopt the directory of an earlier agent that left batches behind
  // (and is not running) instead of making a new one.
  bool adopt = false;
};

// Who the agent is: kept in the spool so that a restarted agent resumes as the same
// incarnation while it has batches to deliver.
struct SpoolIdentity {
  std::string agent_id;
  std::string host;
  uint64_t graph_id = 0;
};

// What Open() found of an earlier run.
struct SpoolRecovery {
  bool resumed = false;          // unacknowledged batches of an earlier run: same identity
  SpoolIdentity identity;        // the identity to run as (the earlier one when resumed)
  uint64_t last_sequence = 0;    // the earlier run numbered its batches up to here at most
  uint64_t batches = 0;          // batches recovered
  uint64_t samples = 0;          // their samples
  uint64_t graph_records = 0;    // graph deltas restored
  uint64_t corrupt_records = 0;  // torn or failing their checksum: skipped
  uint64_t orphaned_batches = 0; // encoded against graph that was not recovered: dropped
  std::string path;              // the agent's spool directory (empty in memory)
};

struct SpoolStats {
  uint64_t batches = 0;          // unacknowledged, in the spool now
  uint64_t bytes = 0;            // on disk now
  uint64_t batches_dropped = 0;  // past the bound, oldest first
  uint64_t samples_dropped = 0;
  uint64_t write_errors = 0;     // batches kept in memory because the disk refused them
  uint64_t graph_syncs = 0;      // times the graph log was synced
};

class Spool {
 public:
  // Applies one recovered graph delta to the call graph of the resumed identity; an error
  // stops the graph's recovery there.
  using GraphRestorer =
      std::function<absl::Status(const SpoolIdentity& resumed, const v1::GraphDelta&)>;

  // Opens (creating) the spool. The agent's directory is `fresh.agent_id`'s; with
  // `options.adopt`, the directory of an earlier agent that left batches behind and is no
  // longer running is adopted first. An identity with no batches left, or whose graph log
  // is cut short (the server may know more of its graph than is left), starts over as `fresh`
  // (new graph; the batches dropped, counted as orphaned). Errors: the directory cannot
  // be created or written, or another running agent holds the identity.
  static absl::StatusOr<std::unique_ptr<Spool>> Open(const SpoolOptions& options,
                                                     const SpoolIdentity& fresh,
                                                     const GraphRestorer& restore,
                                                     SpoolRecovery* recovery);
  ~Spool();
  Spool(const Spool&) = delete;
  Spool& operator=(const Spool&) = delete;

  // Records graph nodes and edges (in order, contiguous with the previous ones) before the
  // batches that need them.
  absl::Status AppendGraph(const v1::GraphDelta& delta);
  // For a graph that could not be recorded while the caller sends it on from memory: the
  // graph log is emptied, so that a restart starts a new incarnation rather than resume a
  // graph behind the server's, and takes no more deltas. Batches go on being spooled (for
  // this run's reconnects); a restart drops them, counted as orphaned.
  void AbandonGraph();
  // Drops every batch, counted as dropped: they need graph the server refuses (past its
  // limits), and a restart that found them would resume that graph for good.
  void DropAll();
  // Whether every delta the caller sent was recorded (no AbandonGraph()).
  bool graph_durable() const { return !graph_abandoned_; }
  // Batches are numbered up to here at most (0 in memory, where nothing is reserved).
  uint64_t sequences_reserved() const { return sequences_reserved_; }
  // Syncs the graph deltas recorded so far, before the caller sends them to the server. On an
  // error the caller sends from memory and abandons the graph (AbandonGraph()).
  absl::Status SyncGraph();
  // Adds a batch (sequence above every earlier one). Written when it returns OK (synced by
  // SyncIfDue); on a write error the batch is kept in memory and the error returned for the
  // caller to report. A sequence past the block reserved reserves the next (synced first; if
  // that fails, the graph is abandoned and the error returned, the batch written all the same).
  absl::Status Append(const v1::SampleBatch& batch);
  // Batch sequence numbers reserved a block at a time: a restart numbers on above the block,
  // whatever batch records the disk lost (the server may have applied them).
  static constexpr uint64_t kSequenceBlock = 256;
  // When the oldest write that unacknowledged batches depend on must be synced (infinite
  // future: none waits).
  absl::Time sync_due() const { return sync_due_; }
  // Syncs the graph and the batches written so far when `now` is past sync_due(); the
  // error of a failed sync (the batches stay, and are synced again at the next write).
  absl::Status SyncIfDue(absl::Time now);

  struct Entry {
    uint64_t sequence = 0;
    uint64_t epoch = 0;
    // The batch's samples, for the operator's accounting. Counting decodes the whole batch,
    // so they are counted when the batch is recovered from disk or dropped, not as it is
    // appended: 0 until then.
    uint64_t samples = 0;
  };
  bool empty() const { return entries_.empty(); }
  size_t size() const { return entries_.size(); }
  // The batches a restart would find: those on disk while the graph is durable (none in
  // memory, none after AbandonGraph()).
  size_t ResumableBatches() const;
  const Entry& entry(size_t i) const { return entries_[i].entry; }
  // The samples of entry `i`'s batch, counted now if they were not yet (Entry::samples).
  uint64_t CountSamples(size_t i) { return CountSlotSamples(entries_[i]); }
  // The batch of entry `i`, read back from disk (or memory).
  absl::StatusOr<v1::SampleBatch> Read(size_t i) const;
  // The server has everything up to `sequence`: drops those entries and their segments.
  // Written with the next Append (or when the spool closes), not on its own: an agent
  // killed before that resends batches the server has, and the server applies each once.
  void AckThrough(uint64_t sequence);
  // The server refused batch `sequence` for good.
  void Remove(uint64_t sequence);

  SpoolStats stats() const;
  const std::string& path() const { return path_; }

 private:
  struct Segment;
  struct Slot {
    Entry entry;
    Segment* segment = nullptr;  // null: the batch is in `memory`
    uint64_t offset = 0;
    uint32_t length = 0;
    std::shared_ptr<const std::string> memory;  // serialized batch
    bool counted = false;  // entry.samples holds the batch's samples
    // When the batch was written to its segment, while that write is not synced.
    absl::Time unsynced_since = absl::InfiniteFuture();
  };
  static bool SyncedOnDisk(const Slot& slot) {
    return slot.segment != nullptr && slot.unsynced_since == absl::InfiniteFuture();
  }

  Spool(SpoolOptions options, std::string path, int lock_fd);
  absl::Status Recover(const SpoolIdentity& fresh, const GraphRestorer& restore,
                       SpoolRecovery* recovery);
  absl::Status StartOver(const SpoolIdentity& fresh);
  absl::Status OpenSegment(uint64_t first_sequence);
  // Writes a record to the graph log (cut back to the last whole record on an error).
  absl::Status AppendGraphRecord(const std::string& record);
  // Records (synced) that batches may be numbered up to `through`.
  absl::Status ReserveSequences(uint64_t through);
  absl::Status RewriteSegment(Segment* segment);
  void DropSegment(Segment* segment, bool count_as_dropped);
  // The batch of `slot`, read back from disk (or memory).
  absl::StatusOr<v1::SampleBatch> ReadSlot(const Slot& slot) const;
  // The samples of `slot`'s batch (counted now if they were not yet; 0 if it is unreadable).
  uint64_t CountSlotSamples(Slot& slot);
  // Drops the entries up to `sequence` and the segments left without live batches.
  void DropThrough(uint64_t sequence);
  // Drops `segment` once it holds no live batch, unless it is the one taking appends (kept,
  // so that a spool the server keeps up with writes one file, not a file per batch).
  void DropIfAcknowledged(Segment* segment);
  // A write that unacknowledged batches depend on was made now.
  void Written(absl::Time when = absl::Now());
  // Nothing unacknowledged depends on the writes not synced yet.
  void NothingToSync();
  absl::Status SyncAll();
  void EnforceBounds();
  // acked_through_ into the acked file.
  void WriteAckedFile();

  const SpoolOptions options_;
  const std::string path_;  // empty: in memory
  const int lock_fd_;
  int graph_fd_ = -1;
  int acked_fd_ = -1;
  bool acked_file_cut_ = false;  // the acked file holds one record's bytes, no more
  uint64_t acked_through_ = 0;  // the server has every batch up to here
  uint64_t acked_recorded_ = 0;  // on disk: in the acked file or a segment's ack record
  uint64_t graph_bytes_ = 0;
  bool graph_abandoned_ = false;  // AbandonGraph()
  uint64_t sequences_reserved_ = 0;  // batches may be numbered up to here (graph log)
  std::deque<std::unique_ptr<Segment>> segments_;  // oldest first; the last takes appends
  bool append_to_last_ = false;                    // false: the next Append opens a segment
  std::deque<Slot> entries_;
  SpoolStats stats_;
  absl::Time sync_due_ = absl::InfiniteFuture();
  bool graph_unsynced_ = false;
  Segment* unsynced_segment_ = nullptr;  // the segment written since the last sync
};

}  // namespace strata::agent::spool

#endif  // STRATA_AGENT_SPOOL_SPOOL_H_
