// Store: the server's persistence, an embedded RocksDB directory.
//
// Who owns what: Store owns the RocksDB instance, its column families and the components
// that read it, and applies WriteBatches (Commit). Its components, handed out by reference
// and valid while the Store lives:
//   interner()  content-addressed IDs of functions, stacks and label sets (interner.h)
//   samples()   sample cells, rollups and service summaries (sample_reader.h)
//   meta()      agents, applied sequences, call graphs, phase events, captures, the
//               aggregation journal (meta_records.h)
// Callers (ingest, aggregation, query, capture) own their WriteBatch objects (write_batch.h)
// and the records (records.h) they pass in; everything returned is a copy owned by the
// caller. Encodings (codec.h), merge operators (merge.h) and the other internals are private
// to this folder.
//
// Column families:
//   stacks     stack ID (content hash of the frame list, probed on collision) -> frames
//   functions  function ID (content hash of (build ID or module path, start offset, name))
//              -> name, module, build ID, start offset
//   samples    service '\0' BE(window_start_ms) host '\0' BE(stack_id) [BE(label_set)]
//              -> u64 count (uint64-add merge operator); the label set ID (see meta) only
//              when the samples' target had labels
//   captures   capture_id '\0' BE(window_start_ms) host '\0' BE(stack_id) -> u64 count
//              (same layout and operator; ad hoc captures stay out of continuous queries)
//   services   service -> first/last window and total samples (min/max/sum merge operator),
//              so ListServices reads one small record per service
//   rollup_1m, rollup_1h
//              same layout as samples, windows truncated to 1 minute / 1 hour, summed from
//              the raw cells by RollUp() once a minute or hour is over; long-range queries
//              read them (Resolution::kAuto) up to each service's seal (meta), the raw cells
//              after it
//              SumSamples keeps each (service, hour) of rollup_1h and each (service,
//              minute) of rollup_1m summed per (host, stack) in memory
//              (StoreOptions::hour_block_cache_bytes), and the whole hours of a few long
//              ranges summed (spans); a commit adding samples to an hour or minute drops
//              its aggregate and the spans holding it
//   meta       agents, per-agent applied batch sequence, per-agent call graph records,
//              phase-change events, capture metadata, label sets (content-addressed IDs,
//              like stacks) and the label sets each service uses, agents' unwinding
//              counters per (service, window, batch)
//   journal    BE(sequence) -> opaque record: acknowledged samples that the server's
//              aggregation tables hold in memory and have not written to the cell column
//              families yet (server/aggregate); deleted by the commit that writes them
//
// Durability: every Commit goes through the write-ahead log, so an acknowledged commit
// survives a process kill. StoreOptions::sync additionally fsyncs the WAL on every commit
// (survives power loss; much slower). Default: off.
//
// Thread safety: Store is thread-safe. Any number of threads may intern, commit and read
// concurrently. A WriteBatch belongs to one thread at a time.
#ifndef STRATA_SERVER_STORE_STORE_H_
#define STRATA_SERVER_STORE_STORE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/store/column.h"
#include "server/store/interner.h"
#include "server/store/meta_records.h"
#include "server/store/records.h"
#include "server/store/sample_reader.h"
#include "server/store/write_batch.h"

namespace strata::server::store {

struct StoreOptions {
  // fsync the WAL on every commit. Off: a commit survives a process kill but not power loss.
  bool sync = false;
  bool create_if_missing = true;
  // Shared block cache for all column families.
  size_t block_cache_bytes = 64 << 20;
  // Memory for per-(service, hour) aggregates of the hour rollup (SumSamples); 0 disables
  // them. One hour of a service costs about 16 bytes per distinct (host, stack).
  size_t hour_block_cache_bytes = 256 << 20;
  // Upper bound on committed entries kept in each intern cache (stacks, functions).
  // Entries of batches not yet committed are never evicted, so the bound can be exceeded
  // by the in-flight working set.
  size_t intern_cache_entries = 1 << 20;
  // Retention of continuous-profile cells by window start, enforced by compaction (data may
  // remain readable until compacted; every file is compacted again within a quarter of the
  // retention, an hour to a day); 0 keeps forever. The per-batch meta records (unwind
  // counters, leaf addresses) follow the raw cells; captures and other metadata are kept.
  int64_t raw_retention_ms = 0;
  int64_t minute_retention_ms = 0;
  int64_t hour_retention_ms = 0;
  // The minute and hour rollups are summed from the raw cells by a background roller every
  // this many milliseconds (0: only when RollUp() is called), for the whole minutes and hours
  // that ended rollup_delay_ms ago; until then queries read the raw cells of those ranges.
  int64_t rollup_interval_ms = 0;
  int64_t rollup_delay_ms = 30'000;
  // Test hook: clock used by retention, Unix milliseconds (default: base::NowMs()).
  std::function<int64_t()> now_ms_for_testing;
  // Test hook: replaces the content hash used for stack and function IDs so that tests
  // can force collisions. `probe` is 0 for the first candidate, 1, 2, ... after collisions.
  std::function<uint64_t(std::string_view identity, uint32_t probe)> id_hash_for_testing;
};

struct StoreStats {
  uint64_t malformed_merge_operands = 0;  // skipped by the merge operators
  uint64_t id_collisions = 0;             // intern probes past an occupied ID
  uint64_t stack_cache_entries = 0;
  uint64_t function_cache_entries = 0;
  // Cells read from RocksDB by ScanSamples and SumSamples (including hour-block fills).
  uint64_t cells_scanned = 0;
  // SumSamples' whole hours served from memory / read from the hour rollup.
  uint64_t hour_block_hits = 0;
  uint64_t hour_block_misses = 0;
  uint64_t hour_block_bytes = 0;
  // The same for whole minutes and the minute rollup.
  uint64_t minute_block_hits = 0;
  uint64_t minute_block_misses = 0;
  uint64_t minute_block_bytes = 0;
  // Runs of whole hours (of long ranges) or whole minutes (of ranges of an hour or more)
  // served from one span / merged from their blocks.
  uint64_t span_hits = 0;
  uint64_t span_misses = 0;
  uint64_t span_bytes = 0;
  // RocksDB memory: memtables of all column families, the shared block cache in use, and
  // index and filter blocks of open files.
  uint64_t memtable_bytes = 0;
  uint64_t block_cache_bytes = 0;
  uint64_t table_reader_bytes = 0;
  // Writes RocksDB refused (disk full, I/O errors), and recoveries from them.
  uint64_t write_errors = 0;
  uint64_t write_resumes = 0;
  // Cells written to the minute and hour rollups by RollUp().
  uint64_t rollup_minute_cells = 0;
  uint64_t rollup_hour_cells = 0;
};

class Store {
 public:
  static absl::StatusOr<std::unique_ptr<Store>> Open(const std::string& dir,
                                                     const StoreOptions& options);
  // Flushes memtables and closes the database (Close() if not called yet).
  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  // Flushes all memtables and closes the database. Later calls return the first result;
  // other methods (and the components) must not be used afterwards.
  absl::Status Close();

  // Applies the batch atomically (counts, interned records, applied sequences, metadata)
  // and clears it on success. AlreadyExists (nothing written) when the batch sets an agent's
  // applied sequence that is not above the stored one.
  absl::Status Commit(WriteBatch* batch);

  // Sums the raw cells of every whole minute before `up_to_ms` into the minute rollup, and
  // the minutes of every whole hour into the hour rollup, where not done yet (the roller of
  // StoreOptions::rollup_interval_ms calls it; tests and tools may too).
  absl::Status RollUp(int64_t up_to_ms);

  Interner& interner();
  SampleReader& samples();
  MetaRecords& meta();
  // As given to Open().
  const StoreOptions& options() const;

  // Whether the last write failed (disk full or failing) and none has succeeded since: the
  // server is not ready for agents (/readyz).
  bool WritesFailing();
  // Live SST bytes of all column families plus WAL bytes.
  uint64_t ApproximateBytesOnDisk();
  StoreStats Stats();

  // Forces a full compaction of every column family (tests, tools).
  absl::Status CompactAll();
  // Writes raw bytes under a key, bypassing all encoding (tests: corrupt records).
  absl::Status PutRawForTesting(Column column, std::string_view key, std::string_view value);

 private:
  struct Impl;
  explicit Store(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata::server::store

#endif  // STRATA_SERVER_STORE_STORE_H_
