// server/aggregate: between ingest and the store (ingest -> aggregate -> store). The
// WindowAggregator is the server's commit::BatchCommitter; readers see its counts through
// LiveSamples (live_samples.h) and its phase events through the store, stored by stack ID
// (phase_event.h). It owns its tables and pending flushes and borrows the store.
//
// Server-side aggregation of acknowledged samples per (service, window) in bounded, sorted
// hash tables (common/table), with phase-change detection and a journal that keeps every
// acknowledged sample durable until its window is written to the store.
//
// Each service has one table keyed by (host, stack ID, label set). A window's counts accumulate in it
// and are written to the store's cell column families (samples and rollups, merge-add) when
// the window closes: when a batch of a later window arrives, or close_delay_ms after the
// window ended. The table then keeps its entries (with zero counts) for the next window, so
// the sort order and the per-period counts carry over: one period per window, and the
// table's ranking of hot entries compares each window with the one before (phase changes).
// Entries not seen for a whole window are dropped. When a batch would not fit, the table's
// counts are written early (a capacity flush) and entries not seen in the current window are
// dropped, or all of them if that is not enough; counts are never lost.
//
// Flushes leave the ingest path at once: a closing window's counts move from its table to a
// pending flush (in memory, under the lock), and the ticker thread commits pending flushes in
// order outside the lock, so a thousand services closing their windows together do not stall
// every batch behind their RocksDB writes. Queries count pending flushes as live until their
// commit, which changes the table's flush generation.
//
// Durability: a batch's cells are written to the journal column family in the same commit as
// the batch's other records and applied sequence, before the caller acknowledges it. A window
// flush deletes, in its commit, the journal records no table and no other pending flush
// still needs, and marks the service's cells of every record so far as written (a record
// holds a batch's cells of all its services, so it outlives the first service's flush).
// Create() writes the cells of journal records left by a killed process to the store, but
// for services marked as written past them. Cells
// of windows already closed (late batches) go to the cell column families directly.
//
// Queries see every acknowledged sample: LiveSamples adds the counts still in the tables to
// what the store returns (hot paths, top, flame graphs, exports).
//
// Thread-safe. The aggregator borrows the store, which must outlive it.
#ifndef STRATA_SERVER_AGGREGATE_WINDOW_AGGREGATOR_H_
#define STRATA_SERVER_AGGREGATE_WINDOW_AGGREGATOR_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/table/sorted_table.h"
#include "server/aggregate/live_samples.h"
#include "server/commit/batch_committer.h"
#include "server/store/store.h"

namespace strata::server::aggregate {

struct AggregatorOptions {
  // Distinct (host, stack) entries per service table at most; 64 bytes each plus the buckets.
  uint32_t max_entries = 1u << 16;
  // Entries of a new table: tables start small and double when full (up to max_entries, as
  // the memory budget allows), so services with few contexts cost little.
  uint32_t initial_entries = 256;
  // All tables together (SortedTable::memory_bytes()). A table that cannot grow within it is
  // written early when full; a batch that needs a new table beyond it, after idle tables
  // were released, is refused with ResourceExhausted (the agent retries later).
  size_t memory_budget_bytes = size_t{512} << 20;
  // A table whose service sent nothing for this many windows after its last closed window
  // is released (its counts are in the store; its sort order and phase history are lost).
  uint32_t idle_windows = 6;
  // Chains per table at max_entries; 0 picks max_entries / 4 (chains of about four when
  // full, so sorting the hot entries to the front pays). Smaller tables scale it down.
  uint32_t bucket_count = 0;
  // Chains longer than this are sorted at each window close.
  uint32_t depth_threshold = 2;
  // An entry with more samples than this in a window is hot: it is sorted to the front of
  // its chain and ranked for phase changes. 50 samples is half a CPU-second at 99 Hz.
  uint32_t hot_threshold = 50;
  // Order of magnitude between two reordered entries that makes a phase change.
  uint32_t phase_change_factor = 10;
  // Hottest entries ranked per window for phase changes.
  uint32_t phase_rank_limit = 64;
  // A window with no batch of a later window is closed this long after it ended.
  int64_t close_delay_ms = commit::kWindowMs;
};

struct AggregatorStats {
  uint64_t windows_closed = 0;
  uint64_t capacity_flushes = 0;
  // Written to the store directly: their window was already closed, or one batch brought
  // more new entries than a table holds.
  uint64_t direct_cells = 0;
  uint64_t journal_records = 0;   // written
  uint64_t recovered_records = 0; // replayed by Create()
  uint64_t phase_events = 0;
  uint64_t live_entries = 0;      // entries in all tables now
  uint64_t tables = 0;            // tables now
  uint64_t table_bytes = 0;       // their memory, against AggregatorOptions::memory_budget_bytes
  uint64_t tables_grown = 0;
  uint64_t tables_released = 0;   // idle, or to make room within the budget
  uint64_t growth_refused = 0;    // a full table not grown for the budget: written early
  uint64_t budget_refusals = 0;   // batches refused: no room for a new table
};

class WindowAggregator : public LiveSamples, public commit::BatchCommitter {
 public:
  // Writes the cells of journal records left by an earlier process to the store, then starts
  // with empty tables. InvalidArgument for bad options.
  static absl::StatusOr<std::unique_ptr<WindowAggregator>> Create(store::Store* store,
                                                                 AggregatorOptions options);
  ~WindowAggregator() override;

  // Commits `wb` (an agent batch's records and applied sequence) together with its cells,
  // all of window `window_start_ms` from `host`. Cells of a service's open window, or of a
  // later one (which closes the open window first), go to the journal in this commit and to
  // the table after it; cells of a closed window are merged into the store directly. If the
  // commit fails its error is returned and nothing was added (AlreadyExists: a duplicate
  // sequence). `wb` is cleared on success.
  absl::Status CommitBatch(store::WriteBatch* wb, const std::string& host,
                           int64_t window_start_ms, const std::vector<Cell>& cells) override;

  // Closes the windows that ended more than close_delay_ms before `now_ms`.
  absl::Status CloseDueWindows(int64_t now_ms);
  // Closes every open window (shutdown, tests).
  absl::Status FlushAll();
  // Calls CloseDueWindows every `tick` with the wall clock until Stop() (or destruction).
  void Start(absl::Duration tick = absl::Seconds(1));
  void Stop();

  uint64_t FlushGeneration(std::string_view service) const override;
  bool AddLiveCounts(const store::SampleQuery& query, uint64_t generation,
                     absl::flat_hash_map<uint64_t, uint64_t>* stacks,
                     absl::flat_hash_map<std::string, uint64_t>* hosts) const override;
  bool ForEachLiveCell(const store::SampleQuery& query, uint64_t generation,
                       LiveCellFn fn) const override;
  std::vector<store::ServiceSummary> LiveServices() const override;

  AggregatorStats stats() const;

 private:
  struct CellKey {
    uint32_t host;
    uint32_t labels = 0;  // index into label_sets_ (0: no labels); no padding either way
    uint64_t stack;
    friend bool operator==(const CellKey&, const CellKey&) = default;
    friend bool operator<(const CellKey& a, const CellKey& b) {
      if (a.stack != b.stack) return a.stack < b.stack;
      return a.host != b.host ? a.host < b.host : a.labels < b.labels;
    }
  };
  struct CellKeyHash {
    uint64_t operator()(const CellKey& k) const {
      return k.stack ^ ((uint64_t{k.host} | uint64_t{k.labels} << 32) * 0x9e3779b97f4a7c15ull);
    }
  };
  using Table = table::SortedTable<CellKey, CellKeyHash>;
  static constexpr uint64_t kNoJournal = ~uint64_t{0};

  struct ServiceTable {
    explicit ServiceTable(Table t) : table(std::move(t)) {}
    Table table;
    bool open = false;
    int64_t window_start_ms = 0;         // of the open window
    int64_t last_closed_ms = -1;         // window start of the last closed window
    uint64_t first_journal = kNoJournal; // oldest journal record with counts still in table
    uint64_t live_total = 0;             // counts in the table
    // Changes with every flush of this table (from the aggregator-wide counter, so a table
    // released and created again never repeats an earlier value).
    uint64_t generation = 0;
    uint64_t last_used = 0;              // use_clock_ at its last batch, for releasing
    uint32_t pending_flushes = 0;        // in pending_: the table is not released meanwhile
  };
  // Counts taken from a table, on their way to the store. Queries see them as live counts
  // until their commit, which bumps the table's generation.
  struct PendingFlush {
    std::string service;
    int64_t window_start_ms = 0;
    std::vector<std::pair<CellKey, uint64_t>> cells;
    absl::flat_hash_map<uint32_t, std::string> hosts;  // of the cells, by host ID
    absl::flat_hash_map<uint32_t, uint64_t> label_sets;  // of the cells, by label index
    uint64_t total = 0;
    uint64_t first_journal = kNoJournal;
    std::unique_ptr<store::WriteBatch> wb;  // phase events; the drainer adds the cells
    bool cells_in_wb = false;                // once (a failed commit keeps the batch)
  };

  WindowAggregator(store::Store* store, AggregatorOptions options,
                   table::SortedTableOptions table_options);
  absl::Status Recover();
  table::SortedTableOptions TableOptions(uint32_t entries) const;
  // Makes room for `bytes` more table memory within the budget, releasing idle tables
  // (closed, nothing live) least recently used first, except `keep`. False if impossible.
  bool Reserve(size_t bytes, const ServiceTable* keep) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Doubles `t` (or more, to hold `wanted` entries) up to max_entries within the budget.
  bool GrowTable(ServiceTable& t, size_t wanted) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Releases tables idle since before `now_ms`.
  void ReleaseIdle(int64_t now_ms) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint32_t InternHost(const std::string& host) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint32_t InternLabelSet(uint64_t label_set) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves the table's counts (and, on a window close, its phase changes) to a pending flush.
  // DrainPending() writes them to the store.
  void Flush(const std::string& service, ServiceTable& t, bool close_window)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Commits the pending flushes in order, each with the deletion of the journal records no
  // table or pending flush needs any more, outside mu_: ingest goes on meanwhile. One drainer
  // at a time. A failed commit stays pending and is retried by the next drain.
  absl::Status DrainPending() ABSL_LOCKS_EXCLUDED(mu_);
  // Waits (releasing mu_) until no pending flush is being committed.
  void AwaitNoCommit() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  template <typename AddCell>
  bool VisitLive(const store::SampleQuery& query, uint64_t generation, AddCell add) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Makes room for `incoming` new entries after a capacity flush.
  void MakeRoom(ServiceTable& t, size_t incoming) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The oldest journal record that a table or a pending flush (but `except`) still needs.
  uint64_t JournalWatermark(const PendingFlush* except = nullptr) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CommitBatchLocked(store::WriteBatch* wb, const std::string& host,
                                 int64_t window_start_ms, const std::vector<Cell>& cells)
      ABSL_LOCKS_EXCLUDED(mu_);
  void AddPhaseEvent(const std::string& service, int64_t window_start_ms,
                     const std::vector<table::PhaseChange<CellKey>>& changes,
                     store::WriteBatch* wb) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  store::Store* const store_;
  const AggregatorOptions options_;
  const table::SortedTableOptions table_options_;

  mutable absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<ServiceTable>, std::less<>> tables_ ABSL_GUARDED_BY(mu_);
  size_t table_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  // A pending flush is being committed (outside mu_). A query whose store read overlaps the
  // commit may or may not have seen it, and the generation changes only after it: reading
  // the pending counts then would count them twice. AddLiveCounts and LiveServices wait.
  bool committing_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t use_clock_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<PendingFlush> pending_ ABSL_GUARDED_BY(mu_);
  size_t pending_cells_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Mutex drain_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  // Wakes the ticker when a batch left pending flushes behind.
  absl::CondVar wake_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::string> hosts_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, uint32_t> host_index_ ABSL_GUARDED_BY(mu_);
  // Store label set IDs by table index (index 0 is ID 0, no labels), and back.
  std::vector<uint64_t> label_sets_ ABSL_GUARDED_BY(mu_) = {0};
  absl::flat_hash_map<uint64_t, uint32_t> label_index_ ABSL_GUARDED_BY(mu_) = {{0, 0}};
  uint64_t next_journal_ ABSL_GUARDED_BY(mu_) = 1;
  AggregatorStats stats_ ABSL_GUARDED_BY(mu_);

  std::thread ticker_;
};

}  // namespace strata::server::aggregate

#endif  // STRATA_SERVER_AGGREGATE_WINDOW_AGGREGATOR_H_
