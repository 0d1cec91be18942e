// Store: the server's persistence, an embedded RocksDB directory.
//
// The store owns the RocksDB instance, its column families and the in-memory intern caches.
// Callers (ingest, aggregation, query, capture) own their WriteBatch objects and the
// records they pass in; everything returned is a copy owned by the caller.
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
//              same layout as samples, windows truncated to 1 minute / 1 hour, written by
//              the same commit; long-range queries read them (Resolution::kAuto).
//              SumSamples keeps each (service, hour) of rollup_1h summed per (host, stack)
//              in memory (StoreOptions::hour_block_cache_bytes); a commit adding samples to
//              an hour drops that hour's aggregate
//   meta       agents, per-agent applied batch sequence, per-agent call graph records,
//              phase-change events, capture metadata, label sets (content-addressed IDs,
//              like stacks) and the label sets each service uses
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

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/labels/labels.h"

namespace strata::store {

struct FunctionInfo {
  std::string name;
  std::string module;    // path of the executable or shared library
  std::string build_id;  // raw GNU build ID bytes; empty when the module has none
  uint64_t start_offset = 0;

  bool operator==(const FunctionInfo&) const = default;
};

struct StackFrames {
  std::vector<uint64_t> function_ids;  // outermost first
  bool truncated = false;              // unwinding stopped before the outermost frame

  bool operator==(const StackFrames&) const = default;
};

struct SampleKey {
  std::string service;
  int64_t window_start_ms = 0;
  std::string host;
  uint64_t stack_id = 0;
  uint64_t label_set = 0;  // 0: no labels

  bool operator==(const SampleKey&) const = default;
};

// Time resolution of sample cells. Raw windows are expected to divide a minute evenly
// (e.g. 10 s), so that every raw window lies inside one rollup window.
enum class Resolution {
  kRaw,
  kMinute,
  kHour,
  // Coarsest resolutions that exactly cover the range: whole hours from rollup_1h, whole
  // minutes at the edges from rollup_1m, the rest raw. Keys carry the window start of the
  // resolution they were read at. Not available for captures (always raw).
  kAuto,
};

struct SampleQuery {
  std::string service;
  int64_t from_ms = 0;  // inclusive
  int64_t to_ms = 0;    // exclusive
  std::optional<std::string> host;
  // When set, scans the samples of this capture instead of the continuous profile; the
  // returned keys carry `service` as given here.
  std::optional<std::string> capture_id;
  Resolution resolution = Resolution::kRaw;
  // When set, only cells of these label set IDs (0 for samples without labels); unset: all.
  std::optional<absl::flat_hash_set<uint64_t>> label_sets;
};

// A distinct label set of a service's samples.
struct LabelSetRecord {
  uint64_t id = 0;  // 0: the empty set
  labels::LabelSet labels;

  bool operator==(const LabelSetRecord&) const = default;
};

// Samples of one stack summed over a query's range.
struct StackCount {
  uint64_t stack_id = 0;
  uint64_t count = 0;

  bool operator==(const StackCount&) const = default;
};

// The cells of a SampleQuery reduced to one count per stack: what a profile needs, without
// the window and host of every cell.
struct SampleTotals {
  std::vector<StackCount> stacks;  // one entry per stack that has a cell; in no fixed order
  std::vector<std::string> hosts;  // hosts that have a cell, sorted
};

struct ServiceSummary {
  std::string service;
  int64_t first_window_ms = 0;
  int64_t last_window_ms = 0;
  uint64_t total_samples = 0;

  bool operator==(const ServiceSummary&) const = default;
};

struct AgentRecord {
  std::string agent_id;
  std::string host;
  std::string arch;
  std::string version;
  int64_t last_batch_ms = 0;
  uint64_t batches = 0;
  std::string owner;  // the principal that writes as this agent; empty: none recorded

  bool operator==(const AgentRecord&) const = default;
};

// One function node of an agent's call graph (dense node ID = record index).
struct GraphNode {
  uint32_t id = 0;
  std::string name;
  std::string module;
  std::string build_id;
  uint64_t start_offset = 0;

  bool operator==(const GraphNode&) const = default;
};

// One call edge of an agent's call graph; its edge ID is its index in AgentGraph::edges.
struct GraphEdge {
  uint32_t caller = 0;
  uint64_t call_site = 0;
  uint32_t callee = 0;

  bool operator==(const GraphEdge&) const = default;
};

// All persisted records of one (agent, graph_id), in index order. Nodes are contiguous by
// id (starting at whatever id was appended first); edges are contiguous from edge 0.
struct AgentGraph {
  std::vector<GraphNode> nodes;
  std::vector<GraphEdge> edges;
};

struct PhaseEvent {
  std::string service;
  int64_t window_start_ms = 0;
  std::string payload;  // opaque to the store

  bool operator==(const PhaseEvent&) const = default;
};

struct CaptureInfo {
  std::string capture_id;
  std::string service;
  std::string host;
  uint32_t pid = 0;
  uint32_t frequency_hz = 0;
  int64_t start_ms = 0;
  int64_t end_ms = 0;  // 0 while running
  bool finished = false;
  std::string error;

  bool operator==(const CaptureInfo&) const = default;
};

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
  // remain readable until compacted); 0 keeps forever. Captures and metadata are kept.
  int64_t raw_retention_ms = 0;
  int64_t minute_retention_ms = 0;
  int64_t hour_retention_ms = 0;
  // Test hook: clock used by retention, Unix milliseconds.
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
  // RocksDB memory: memtables of all column families, the shared block cache in use, and
  // index and filter blocks of open files.
  uint64_t memtable_bytes = 0;
  uint64_t block_cache_bytes = 0;
  uint64_t table_reader_bytes = 0;
  // Writes RocksDB refused (disk full, I/O errors), and recoveries from them.
  uint64_t write_errors = 0;
  uint64_t write_resumes = 0;
};

// Column families, for tests and tools that need raw access.
enum class Column {
  kStacks,
  kFunctions,
  kSamples,
  kCaptures,
  kServices,
  kMeta,
  kRollupMinute,
  kRollupHour,
  kJournal
};

class Store;

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
  // `label_set` is an ID from Store::InternLabelSet (0: no labels).
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
  // Drops every record of (agent, graph_id), e.g. when the agent starts a new graph.
  void DeleteGraph(std::string_view agent_id, uint64_t graph_id);
  // Identical events (same service, window, payload) are stored once.
  void PutPhaseEvent(const PhaseEvent& event);
  void PutCapture(const CaptureInfo& capture);
  // Drops a capture: its sample cells and its metadata record (capture retention).
  void DeleteCapture(std::string_view capture_id);
  // Journal records (see the journal column family): an opaque record under `sequence`, and
  // the deletion of every record below `sequence`.
  void PutJournal(uint64_t sequence, std::string_view record);
  void DeleteJournalBefore(uint64_t sequence);

  bool empty() const;
  // Drops everything added so far.
  void Clear();

 private:
  friend class Store;
  struct Rep;
  std::unique_ptr<Rep> rep_;
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
  // other methods must not be called afterwards.
  absl::Status Close();

  // Returns the ID of the function or stack; if it may not be persisted yet, its record is
  // added to `batch` so it lands atomically with the counts that reference it. The same
  // content always yields the same ID (also across restarts and agents); different content
  // never shares an ID (collisions are resolved by probing). Errors only on I/O failure.
  absl::StatusOr<uint64_t> InternFunction(const FunctionInfo& function, WriteBatch* batch);
  absl::StatusOr<uint64_t> InternStack(const StackFrames& stack, WriteBatch* batch);
  // The ID of a label set (normalized, no empty values) used by `service`'s samples: 0 for
  // the empty set; the same content always yields the same ID. Its records are added to
  // `batch` until a commit of them succeeded. ResourceExhausted when the service already
  // has `max_per_service` distinct label sets (the empty one not counted) and this one is
  // new; InvalidArgument for a set that is not normalized or not valid label syntax.
  absl::StatusOr<uint64_t> InternLabelSet(std::string_view service, const labels::LabelSet& set,
                                          uint32_t max_per_service, WriteBatch* batch);
  // The label sets of `service`'s samples, committed or pending, by ID; the empty set (ID 0)
  // is always listed first (samples written before labels have it).
  absl::StatusOr<std::vector<LabelSetRecord>> ListLabelSets(std::string_view service);

  // Applies the batch atomically (counts, interned records, applied sequences, metadata)
  // and clears it on success.
  absl::Status Commit(WriteBatch* batch);

  // Last applied batch sequence of the agent's incarnation; 0 when none was ever committed.
  // A store written before sequences were kept per incarnation has one per agent: it counts
  // for the incarnation whose graph the store holds.
  absl::StatusOr<uint64_t> AppliedSequence(std::string_view agent_id, uint64_t incarnation);

  // Calls `fn` for every cell matching `query`, in key order (window, host, stack).
  // With Resolution::kAuto, windows still ascend but a stack repeats once per piece.
  absl::Status ScanSamples(const SampleQuery& query,
                           const std::function<void(const SampleKey&, uint64_t count)>& fn);

  // The cells ScanSamples would return for `query`, summed per stack (counts of zero
  // included, so the stacks and hosts listed are exactly those of the cells). With kAuto
  // and kHour, whole hours come from an in-memory aggregate per (service, hour) of the hour
  // rollup: filled on first read, dropped by any commit that adds samples to that hour, so
  // results always equal a fresh scan. Long ranges then cost one merge per hour instead of
  // one RocksDB cell per (hour, host, stack).
  absl::StatusOr<SampleTotals> SumSamples(const SampleQuery& query);

  // NotFound for unknown IDs, DataLoss for corrupt records. Served from the intern caches
  // when possible.
  absl::StatusOr<StackFrames> GetStack(uint64_t stack_id);
  absl::StatusOr<FunctionInfo> GetFunction(uint64_t function_id);

  absl::StatusOr<std::vector<ServiceSummary>> ListServices();
  absl::StatusOr<std::vector<AgentRecord>> ListAgents();
  // One agent's record; NotFound if there is none.
  absl::StatusOr<AgentRecord> GetAgent(const std::string& agent_id);
  absl::StatusOr<AgentGraph> LoadGraph(std::string_view agent_id, uint64_t graph_id);
  // Events of `service` with window in [from_ms, to_ms), by window.
  absl::StatusOr<std::vector<PhaseEvent>> ScanPhaseEvents(std::string_view service,
                                                          int64_t from_ms, int64_t to_ms);
  absl::StatusOr<CaptureInfo> GetCapture(std::string_view capture_id);
  // Every journal record in sequence order; stops at the first error `fn` returns.
  absl::Status ScanJournal(
      const std::function<absl::Status(uint64_t sequence, std::string_view record)>& fn);
  absl::StatusOr<std::vector<CaptureInfo>> ListCaptures();

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

}  // namespace strata::store

#endif  // STRATA_SERVER_STORE_STORE_H_
