#include "server/store/store.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <mutex>
#include <fstream>
#include <filesystem>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "rocksdb/cache.h"
#include "rocksdb/convenience.h"
#include "rocksdb/db.h"
#include "rocksdb/filter_policy.h"
#include "rocksdb/options.h"
#include "rocksdb/table.h"
#include "rocksdb/write_batch.h"
#include "common/base/escape.h"
#include "common/base/saturating.h"
#include "spdlog/spdlog.h"
#include "server/store/codec.h"
#include "server/store/merge.h"

namespace strata::store {
namespace {

constexpr std::array<const char*, 9> kColumnNames = {
    "stacks",  "functions", "samples",   "captures", "services",
    "meta",    "rollup_1m", "rollup_1h", "journal"};
constexpr int64_t kMinuteMs = 60'000;
constexpr int64_t kHourMs = 3'600'000;
constexpr size_t kNumColumns = kColumnNames.size();
constexpr uint32_t kMaxProbes = 64;
constexpr size_t kInternShards = 16;
constexpr size_t kSequenceStripes = 16;

size_t ColumnIndex(Column c) { return static_cast<size_t>(c); }

absl::Status FromRocks(const rocksdb::Status& s) {
  if (s.ok()) return absl::OkStatus();
  if (s.IsNotFound()) return absl::NotFoundError(s.ToString());
  if (s.IsCorruption()) return absl::DataLossError(s.ToString());
  if (s.IsInvalidArgument()) return absl::InvalidArgumentError(s.ToString());
  if (s.IsBusy() || s.IsTryAgain()) return absl::UnavailableError(s.ToString());
  // Disk full, a failing disk: nothing was written; the writer tries again later.
  if (s.IsIOError() || s.IsNoSpace()) return absl::UnavailableError(s.ToString());
  return absl::InternalError(s.ToString());
}

// RocksDB's own log goes to the server's log, not to a LOG file in the data directory: on a
// full disk RocksDB's file logger fails its writes, and Debian's build asserts on that
// (WritableFileWriter, "sync_without_flush_called_") and aborts the server. Info and
// below are debug messages here; warnings and errors stay visible.
class RocksLogger final : public rocksdb::Logger {
 public:
  RocksLogger() : rocksdb::Logger(rocksdb::InfoLogLevel::INFO_LEVEL) {}
  using rocksdb::Logger::Logv;
  void Logv(const char* format, va_list ap) override {
    Logv(rocksdb::InfoLogLevel::INFO_LEVEL, format, ap);
  }
  void Logv(const rocksdb::InfoLogLevel level, const char* format, va_list ap) override {
    if (level < GetInfoLogLevel()) return;
    const spdlog::level::level_enum to = level >= rocksdb::InfoLogLevel::ERROR_LEVEL ? spdlog::level::err
                                         : level == rocksdb::InfoLogLevel::WARN_LEVEL ? spdlog::level::warn
                                                                                     : spdlog::level::debug;
    if (!spdlog::should_log(to)) return;
    char buf[1024];
    const int n = vsnprintf(buf, sizeof buf, format, ap);
    if (n < 0) return;
    spdlog::log(to, "rocksdb: {}", std::string_view(buf, std::min<size_t>(n, sizeof buf - 1)));
  }
};

std::string_view View(const rocksdb::Slice& s) { return std::string_view(s.data(), s.size()); }
rocksdb::Slice ToSlice(std::string_view s) { return rocksdb::Slice(s.data(), s.size()); }

bool ValidKeyPart(std::string_view s) { return s.find('\0') == std::string_view::npos; }

// Smallest key greater than every key starting with `prefix`, or "" if none exists.
std::string PrefixSuccessor(std::string prefix) {
  while (!prefix.empty()) {
    unsigned char last = static_cast<unsigned char>(prefix.back());
    if (last != 0xff) {
      prefix.back() = static_cast<char>(last + 1);
      return prefix;
    }
    prefix.pop_back();
  }
  return prefix;
}

// A part of a query's range read from one column family.
struct Piece {
  Column column;
  int64_t from, to;
};

// kAuto's pieces of [from, to), in ascending time order: raw head, minute head, whole hours,
// minute tail, raw tail (empty pieces included).
std::vector<Piece> AutoPieces(int64_t from, int64_t to) {
  auto round_up = [](int64_t v, int64_t unit) { return (v + unit - 1) / unit * unit; };
  auto round_down = [](int64_t v, int64_t unit) { return v / unit * unit; };
  std::vector<Piece> pieces;
  // Splits [a, b) into raw edges around whole minutes.
  auto add_minutes = [&](int64_t a, int64_t b) {
    int64_t ms = round_up(a, kMinuteMs), me = round_down(b, kMinuteMs);
    if (ms >= me) {
      pieces.push_back({Column::kSamples, a, b});
      return;
    }
    pieces.push_back({Column::kSamples, a, ms});
    pieces.push_back({Column::kRollupMinute, ms, me});
    pieces.push_back({Column::kSamples, me, b});
  };
  int64_t hs = round_up(from, kHourMs), he = round_down(to, kHourMs);
  if (hs < he) {
    add_minutes(from, hs);
    pieces.push_back({Column::kRollupHour, hs, he});
    add_minutes(he, to);
  } else {
    add_minutes(from, to);
  }
  return pieces;
}

// Kinds of content-addressed records.
enum class InternKind { kStack, kFunction };

}  // namespace

// ---------------------------------------------------------------------------------------
// WriteBatch

struct WriteBatch::Rep {
  enum class OpType { kPut, kMerge, kDeleteRange };
  struct Op {
    Column column;
    OpType type;
    std::string key;
    std::string value;  // end key for kDeleteRange
  };
  std::vector<Op> ops;
  absl::flat_hash_map<std::string, ServiceSummary> services;
  struct Sequence {
    std::string agent_id;
    uint64_t incarnation;
    uint64_t sequence;
  };
  std::vector<Sequence> sequences;
  std::vector<std::pair<InternKind, uint64_t>> interned;
  // (service, label set ID) records this batch writes: durable once it is committed.
  std::vector<std::pair<std::string, uint64_t>> label_sets;
  // CellPrefix(service, hour) of every hour this batch adds samples to: their cached hour
  // aggregates are dropped once the batch is committed.
  absl::flat_hash_set<std::string> touched_hours;
  // The last (service, hour) added to touched_hours: consecutive samples mostly repeat it.
  std::string last_touched_service;
  int64_t last_touched_hour = -1;
  absl::Status status;

  void Fail(absl::Status s) {
    if (status.ok()) status = std::move(s);
  }
  bool CheckKeyPart(const char* what, std::string_view s, bool allow_empty) {
    if (ValidKeyPart(s) && (allow_empty || !s.empty())) return true;
    Fail(absl::InvalidArgumentError(
        absl::StrCat(what, " must be non-empty and contain no NUL byte")));
    return false;
  }
  bool CheckWindow(int64_t window_start_ms) {
    if (window_start_ms >= 0) return true;
    Fail(absl::InvalidArgumentError(absl::StrCat("negative window ", window_start_ms)));
    return false;
  }
  void Add(Column c, OpType t, std::string key, std::string value) {
    ops.push_back(Op{c, t, std::move(key), std::move(value)});
  }
};

WriteBatch::WriteBatch() : rep_(std::make_unique<Rep>()) {}
WriteBatch::~WriteBatch() = default;

void WriteBatch::AddSamples(std::string_view service, int64_t window_start_ms,
                            std::string_view host, uint64_t stack_id, uint64_t count,
                            uint64_t label_set) {
  if (!rep_->CheckKeyPart("service", service, false) || !rep_->CheckKeyPart("host", host, true) ||
      !rep_->CheckWindow(window_start_ms)) {
    return;
  }
  rep_->Add(Column::kSamples, Rep::OpType::kMerge,
            codec::EncodeCellKey(service, window_start_ms, host, stack_id, label_set),
            codec::EncodeCount(count));
  rep_->Add(Column::kRollupMinute, Rep::OpType::kMerge,
            codec::EncodeCellKey(service, window_start_ms - window_start_ms % kMinuteMs, host,
                                 stack_id, label_set),
            codec::EncodeCount(count));
  const int64_t hour = window_start_ms - window_start_ms % kHourMs;
  rep_->Add(Column::kRollupHour, Rep::OpType::kMerge,
            codec::EncodeCellKey(service, hour, host, stack_id, label_set),
            codec::EncodeCount(count));
  if (hour != rep_->last_touched_hour || service != rep_->last_touched_service) {
    rep_->touched_hours.insert(codec::CellPrefix(service, static_cast<uint64_t>(hour)));
    rep_->last_touched_hour = hour;
    rep_->last_touched_service.assign(service);
  }
  auto [it, inserted] = rep_->services.try_emplace(std::string(service));
  ServiceSummary& s = it->second;
  if (inserted) {
    s.first_window_ms = s.last_window_ms = window_start_ms;
  } else {
    s.first_window_ms = std::min(s.first_window_ms, window_start_ms);
    s.last_window_ms = std::max(s.last_window_ms, window_start_ms);
  }
  SaturatingAddTo(s.total_samples, count);
}

void WriteBatch::AddCaptureSamples(std::string_view capture_id, int64_t window_start_ms,
                                   std::string_view host, uint64_t stack_id, uint64_t count,
                                   uint64_t label_set) {
  if (!rep_->CheckKeyPart("capture id", capture_id, false) ||
      !rep_->CheckKeyPart("host", host, true) || !rep_->CheckWindow(window_start_ms)) {
    return;
  }
  rep_->Add(Column::kCaptures, Rep::OpType::kMerge,
            codec::EncodeCellKey(capture_id, window_start_ms, host, stack_id, label_set),
            codec::EncodeCount(count));
}

void WriteBatch::SetAppliedSequence(std::string_view agent_id, uint64_t incarnation,
                                    uint64_t sequence) {
  if (!rep_->CheckKeyPart("agent id", agent_id, false)) return;
  for (Rep::Sequence& s : rep_->sequences) {
    if (s.agent_id == agent_id && s.incarnation == incarnation) {
      s.sequence = std::max(s.sequence, sequence);
      return;
    }
  }
  rep_->sequences.push_back({std::string(agent_id), incarnation, sequence});
}

void WriteBatch::PutAgent(const AgentRecord& agent) {
  if (!rep_->CheckKeyPart("agent id", agent.agent_id, false)) return;
  rep_->Add(Column::kMeta, Rep::OpType::kPut, codec::AgentKey(agent.agent_id),
            codec::EncodeAgent(agent));
}

void WriteBatch::AppendGraphNodes(std::string_view agent_id, uint64_t graph_id,
                                  const std::vector<GraphNode>& nodes) {
  if (!rep_->CheckKeyPart("agent id", agent_id, false)) return;
  for (const GraphNode& node : nodes) {
    rep_->Add(Column::kMeta, Rep::OpType::kPut, codec::GraphNodeKey(agent_id, graph_id, node.id),
              codec::EncodeGraphNode(node));
  }
}

void WriteBatch::AppendGraphEdges(std::string_view agent_id, uint64_t graph_id,
                                  uint64_t first_edge, const std::vector<GraphEdge>& edges) {
  if (!rep_->CheckKeyPart("agent id", agent_id, false)) return;
  for (size_t i = 0; i < edges.size(); ++i) {
    rep_->Add(Column::kMeta, Rep::OpType::kPut,
              codec::GraphEdgeKey(agent_id, graph_id, first_edge + i),
              codec::EncodeGraphEdge(edges[i]));
  }
}

void WriteBatch::DeleteGraph(std::string_view agent_id, uint64_t graph_id) {
  if (!rep_->CheckKeyPart("agent id", agent_id, false)) return;
  std::string begin = codec::GraphPrefix(agent_id, graph_id);
  std::string end = PrefixSuccessor(begin);
  rep_->Add(Column::kMeta, Rep::OpType::kDeleteRange, std::move(begin), std::move(end));
}

void WriteBatch::DeleteCapture(std::string_view capture_id) {
  if (!rep_->CheckKeyPart("capture id", capture_id, false)) return;
  // Every cell key of the capture starts with its ID and the separator.
  std::string cells = codec::CellPrefix(capture_id, 0);
  cells.resize(cells.size() - 8);
  std::string cells_end = PrefixSuccessor(cells);
  rep_->Add(Column::kCaptures, Rep::OpType::kDeleteRange, std::move(cells), std::move(cells_end));
  // The metadata record is the only key with exactly this value: a one-key range.
  std::string meta = codec::CaptureKey(capture_id);
  std::string meta_end = meta;
  meta_end.push_back('\0');
  rep_->Add(Column::kMeta, Rep::OpType::kDeleteRange, std::move(meta), std::move(meta_end));
}

namespace {
std::string JournalKey(uint64_t sequence) {
  std::string key;
  codec::PutFixed64BE(&key, sequence);
  return key;
}
}  // namespace

void WriteBatch::PutJournal(uint64_t sequence, std::string_view record) {
  rep_->Add(Column::kJournal, Rep::OpType::kPut, JournalKey(sequence), std::string(record));
}

void WriteBatch::DeleteJournalBefore(uint64_t sequence) {
  if (sequence == 0) return;
  rep_->Add(Column::kJournal, Rep::OpType::kDeleteRange, JournalKey(0), JournalKey(sequence));
}

void WriteBatch::PutPhaseEvent(const PhaseEvent& event) {
  if (!rep_->CheckKeyPart("service", event.service, false) ||
      !rep_->CheckWindow(event.window_start_ms)) {
    return;
  }
  rep_->Add(Column::kMeta, Rep::OpType::kPut, codec::PhaseKey(event), event.payload);
}

void WriteBatch::PutCapture(const CaptureInfo& capture) {
  if (!rep_->CheckKeyPart("capture id", capture.capture_id, false)) return;
  rep_->Add(Column::kMeta, Rep::OpType::kPut, codec::CaptureKey(capture.capture_id),
            codec::EncodeCapture(capture));
}

bool WriteBatch::empty() const {
  return rep_->ops.empty() && rep_->sequences.empty() && rep_->status.ok();
}

void WriteBatch::Clear() { *rep_ = Rep(); }

// ---------------------------------------------------------------------------------------
// Intern tables: content-addressed IDs with collision probing.

namespace {

// Cache of stored (or about to be stored) records by ID. An entry is `durable` once a
// commit containing its record succeeded; only durable entries are evicted, since pending
// ones reserve their ID against colliding content interned concurrently.
class InternTable {
 public:
  struct Entry {
    std::string value;
    bool durable = false;
  };

  explicit InternTable(size_t capacity)
      : shard_capacity_(std::max<size_t>(capacity / kInternShards, 16)) {}

  struct Shard {
    absl::Mutex mu;
    absl::flat_hash_map<uint64_t, Entry> entries ABSL_GUARDED_BY(mu);
  };

  Shard& ShardFor(uint64_t id) { return shards_[(id * 0x9e3779b97f4a7c15ULL) >> 60]; }

  // Inserts into a shard whose lock is held, evicting durable entries when full.
  Entry& Insert(Shard& shard, uint64_t id, Entry entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(shard.mu) {
    if (shard.entries.size() >= shard_capacity_) {
      for (auto it = shard.entries.begin();
           it != shard.entries.end() && shard.entries.size() > shard_capacity_ / 2;) {
        if (it->second.durable) {
          shard.entries.erase(it++);
        } else {
          ++it;
        }
      }
    }
    return shard.entries.insert_or_assign(id, std::move(entry)).first->second;
  }

  void MarkDurable(uint64_t id) {
    Shard& shard = ShardFor(id);
    absl::MutexLock lock(&shard.mu);
    auto it = shard.entries.find(id);
    if (it != shard.entries.end()) it->second.durable = true;
  }

  size_t Size() {
    size_t n = 0;
    for (Shard& shard : shards_) {
      absl::MutexLock lock(&shard.mu);
      n += shard.entries.size();
    }
    return n;
  }

 private:
  const size_t shard_capacity_;
  std::array<Shard, kInternShards> shards_;
};

}  // namespace

// ---------------------------------------------------------------------------------------
// Hour blocks: the hour rollup of one (service, hour), summed per (host, stack), in memory.

namespace {

struct HourBlock {
  std::vector<std::string> hosts;  // sorted (key order)
  std::vector<uint32_t> host_end;  // entries of hosts[i] end at host_end[i]
  std::vector<StackCount> entries;
  // Label set of each entry; empty when every entry has none (0).
  std::vector<uint64_t> label_sets;

  uint64_t LabelSetOf(size_t i) const { return label_sets.empty() ? 0 : label_sets[i]; }

  size_t Bytes() const {
    size_t bytes = sizeof(HourBlock) + entries.capacity() * sizeof(StackCount) +
                   host_end.capacity() * sizeof(uint32_t) +
                   label_sets.capacity() * sizeof(uint64_t);
    for (const std::string& h : hosts) bytes += sizeof(std::string) + h.capacity();
    return bytes;
  }
};

// Blocks by CellPrefix(service, hour), bounded by bytes (least recently used dropped first).
//
// Consistency with concurrent commits: a block is built from a RocksDB read that may race
// with a commit to the same hour. Every key has a generation, bumped when a commit touching
// the hour completes; a reader notes the generation before reading and its block is kept
// only if the generation is unchanged when it inserts. A commit bumps after its write is
// visible, so a block that could have missed the write is never kept. Keys evicted (or
// cleared) while a read is in flight lose their generation: such blocks are not kept either.
class HourBlockCache {
 public:
  explicit HourBlockCache(size_t capacity_bytes) : capacity_(capacity_bytes) {}

  bool enabled() const { return capacity_ > 0; }

  // The cached block of `key`, or null with *generation set for a later Insert.
  std::shared_ptr<const HourBlock> Lookup(const std::string& key, uint64_t* generation) {
    absl::MutexLock lock(&mu_);
    auto [it, inserted] = entries_.try_emplace(key);
    Entry& e = it->second;
    if (inserted) e.generation = next_generation_++;
    e.last_use = ++tick_;
    if (e.block) {
      ++hits_;
      return e.block;
    }
    ++misses_;
    *generation = e.generation;
    return nullptr;
  }

  void Insert(const std::string& key, uint64_t generation, std::shared_ptr<const HourBlock> block) {
    const size_t bytes = block->Bytes() + key.size() + sizeof(Entry);
    absl::MutexLock lock(&mu_);
    auto it = entries_.find(key);
    if (it == entries_.end() || it->second.generation != generation || it->second.block) return;
    if (bytes > capacity_ / 2) return;  // one block never pushes out most of the others
    it->second.block = std::move(block);
    it->second.bytes = bytes;
    bytes_ += bytes;
    if (bytes_ > capacity_) EvictLocked();
  }

  void Invalidate(const std::string& key) {
    absl::MutexLock lock(&mu_);
    auto it = entries_.find(key);
    if (it == entries_.end()) return;
    bytes_ -= it->second.bytes;
    // Erasing also voids in-flight reads of this key (Insert finds no entry).
    entries_.erase(it);
  }

  void Clear() {
    absl::MutexLock lock(&mu_);
    entries_.clear();
    bytes_ = 0;
  }

  void Stats(StoreStats* stats) {
    absl::MutexLock lock(&mu_);
    stats->hour_block_hits = hits_;
    stats->hour_block_misses = misses_;
    stats->hour_block_bytes = bytes_;
  }

 private:
  struct Entry {
    uint64_t generation = 0;
    uint64_t last_use = 0;
    size_t bytes = 0;
    std::shared_ptr<const HourBlock> block;
  };

  // Drops the least recently used entries (placeholders of in-flight reads included) until
  // three quarters of the capacity is used, so eviction runs rarely.
  void EvictLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::vector<std::pair<uint64_t, const std::string*>> order;
    order.reserve(entries_.size());
    for (const auto& [key, e] : entries_) order.emplace_back(e.last_use, &key);
    std::sort(order.begin(), order.end());
    std::vector<std::string> victims;
    size_t bytes = bytes_;
    for (const auto& [use, key] : order) {
      if (bytes <= capacity_ / 4 * 3) break;
      bytes -= entries_.find(*key)->second.bytes;
      victims.push_back(*key);
    }
    for (const std::string& key : victims) entries_.erase(key);
    bytes_ = bytes;
  }

  const size_t capacity_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, Entry> entries_ ABSL_GUARDED_BY(mu_);
  size_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t tick_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_generation_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t hits_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t misses_ ABSL_GUARDED_BY(mu_) = 0;
};

// Per-stack sums and contributing hosts while reducing a query's cells.
struct Totals {
  absl::flat_hash_map<uint64_t, uint64_t> counts;
  absl::flat_hash_set<std::string> hosts;
};

}  // namespace

// ---------------------------------------------------------------------------------------
// Store

struct Store::Impl {
  StoreOptions options;
  rocksdb::DB* db = nullptr;
  std::array<rocksdb::ColumnFamilyHandle*, kNumColumns> columns{};
  std::shared_ptr<std::atomic<uint64_t>> malformed = std::make_shared<std::atomic<uint64_t>>(0);
  std::atomic<uint64_t> collisions{0};
  std::unique_ptr<InternTable> stacks;
  std::unique_ptr<InternTable> functions;
  std::unique_ptr<HourBlockCache> hour_blocks;
  std::shared_ptr<rocksdb::Cache> block_cache;
  std::atomic<uint64_t> cells_scanned{0};
  std::array<absl::Mutex, kSequenceStripes> sequence_mu;
  // Referenced by the column family options; must outlive the DB.
  std::vector<std::unique_ptr<rocksdb::CompactionFilter>> retention_filters;
  // After a failed write RocksDB refuses every write until Resume(): tried on the next write
  // at most once a second, so the server recovers by itself when space returns.
  std::atomic<uint64_t> write_errors{0};
  std::atomic<uint64_t> resumes{0};
  absl::Mutex resume_mu;
  absl::Time last_resume ABSL_GUARDED_BY(resume_mu) = absl::InfinitePast();
  bool write_failed ABSL_GUARDED_BY(resume_mu) = false;
  std::mutex close_mu;
  bool closed = false;
  absl::Status close_status;
  // Label sets read or interned so far, and per service the sets its samples use (loaded
  // from the meta index on first use; `true` once committed). Few and small: one lock.
  struct ServiceLabelSets {
    bool loaded = false;
    absl::flat_hash_map<uint64_t, bool> ids;
  };
  absl::Mutex label_mu;
  absl::flat_hash_map<uint64_t, std::string> label_sets ABSL_GUARDED_BY(label_mu);
  absl::flat_hash_map<std::string, ServiceLabelSets> service_label_sets ABSL_GUARDED_BY(label_mu);

  rocksdb::ColumnFamilyHandle* cf(Column c) const { return columns[ColumnIndex(c)]; }

  // The clock retention uses, Unix milliseconds.
  int64_t NowMs() const {
    if (options.now_ms_for_testing) return options.now_ms_for_testing();
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  }

  InternTable& Table(InternKind kind) {
    return kind == InternKind::kStack ? *stacks : *functions;
  }
  Column ColumnOf(InternKind kind) {
    return kind == InternKind::kStack ? Column::kStacks : Column::kFunctions;
  }

  uint64_t Candidate(std::string_view identity, uint32_t probe) {
    if (options.id_hash_for_testing) return options.id_hash_for_testing(identity, probe);
    return codec::ContentId(identity, probe);
  }

  // Identity of a stored record, or an error if the record is corrupt.
  static absl::StatusOr<std::string> IdentityOf(InternKind kind, std::string_view value) {
    if (kind == InternKind::kStack) {
      absl::StatusOr<StackFrames> stack = codec::DecodeStack(value);
      if (!stack.ok()) return stack.status();
      return std::string(value);
    }
    absl::StatusOr<FunctionInfo> function = codec::DecodeFunction(value);
    if (!function.ok()) return function.status();
    return codec::FunctionIdentity(*function);
  }

  absl::StatusOr<uint64_t> Intern(InternKind kind, std::string_view identity,
                                  std::string value, WriteBatch* batch) {
    InternTable& table = Table(kind);
    Column column = ColumnOf(kind);
    for (uint32_t probe = 0; probe < kMaxProbes; ++probe) {
      uint64_t id = Candidate(identity, probe);
      InternTable::Shard& shard = table.ShardFor(id);
      // The shard lock covers lookup, store read and reservation of this one ID, so two
      // threads never reserve the same ID for different content.
      absl::MutexLock lock(&shard.mu);
      const InternTable::Entry* entry = nullptr;
      auto it = shard.entries.find(id);
      if (it != shard.entries.end()) {
        entry = &it->second;
      } else {
        std::string stored;
        rocksdb::Status s = db->Get(rocksdb::ReadOptions(), cf(column), codec::IdKey(id), &stored);
        if (s.IsNotFound()) {
          entry = &table.Insert(shard, id, InternTable::Entry{std::move(value), false});
        } else if (!s.ok()) {
          return FromRocks(s);
        } else if (!IdentityOf(kind, stored).ok()) {
          // A corrupt record occupies this ID: keep probing rather than reuse it, since
          // samples may reference whatever it held.
          collisions.fetch_add(1, std::memory_order_relaxed);
          continue;
        } else {
          entry = &table.Insert(shard, id, InternTable::Entry{std::move(stored), true});
        }
      }
      absl::StatusOr<std::string> occupant = IdentityOf(kind, entry->value);
      if (!occupant.ok() || *occupant != identity) {
        collisions.fetch_add(1, std::memory_order_relaxed);
        continue;
      }
      if (!entry->durable) {
        // Not known to be committed (possibly pending in another batch): write it with this
        // batch too so this batch never references a missing record.
        batch->rep_->Add(column, WriteBatch::Rep::OpType::kPut, codec::IdKey(id), entry->value);
        batch->rep_->interned.emplace_back(kind, id);
      }
      return id;
    }
    return absl::InternalError(absl::StrCat("no free ID after ", kMaxProbes, " probes"));
  }

  absl::StatusOr<std::string> Lookup(InternKind kind, uint64_t id) {
    InternTable& table = Table(kind);
    InternTable::Shard& shard = table.ShardFor(id);
    {
      absl::MutexLock lock(&shard.mu);
      auto it = shard.entries.find(id);
      if (it != shard.entries.end()) return it->second.value;
    }
    std::string stored;
    rocksdb::Status s =
        db->Get(rocksdb::ReadOptions(), cf(ColumnOf(kind)), codec::IdKey(id), &stored);
    if (!s.ok()) return FromRocks(s);
    absl::StatusOr<std::string> identity = IdentityOf(kind, stored);
    if (!identity.ok()) return identity.status();
    absl::MutexLock lock(&shard.mu);
    if (!shard.entries.contains(id)) table.Insert(shard, id, InternTable::Entry{stored, true});
    return stored;
  }

  absl::StatusOr<ServiceLabelSets*> LoadServiceLabelSets(std::string_view service)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(label_mu) {
    ServiceLabelSets& sets = service_label_sets[std::string(service)];
    if (sets.loaded) return &sets;
    const std::string prefix = codec::ServiceLabelSetPrefix(service);
    std::unique_ptr<rocksdb::Iterator> it(
        db->NewIterator(rocksdb::ReadOptions(), cf(Column::kMeta)));
    for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next()) {
      if (it->key().size() != prefix.size() + 8) return absl::DataLossError("corrupt label set index key");
      sets.ids[codec::GetFixed64BE(it->key().data() + prefix.size())] = true;
    }
    if (!it->status().ok()) return FromRocks(it->status());
    sets.loaded = true;
    return &sets;
  }

  // The encoded label set `id`, from memory or the store (NotFound when absent).
  absl::StatusOr<std::string> LabelSetBytes(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(label_mu) {
    if (auto it = label_sets.find(id); it != label_sets.end()) return it->second;
    std::string stored;
    rocksdb::Status s =
        db->Get(rocksdb::ReadOptions(), cf(Column::kMeta), codec::LabelSetKey(id), &stored);
    if (!s.ok()) return FromRocks(s);
    if (!labels::Decode(stored).ok()) return absl::DataLossError("corrupt label set record");
    label_sets.emplace(id, stored);
    return stored;
  }

  absl::StatusOr<uint64_t> ReadSequence(std::string_view agent_id, uint64_t incarnation) {
    std::string value;
    rocksdb::Status s = db->Get(rocksdb::ReadOptions(), cf(Column::kMeta),
                                codec::SequenceKey(agent_id, incarnation), &value);
    if (s.IsNotFound()) {
      // A store from before incarnations: its one sequence per agent belongs to the graph it
      // holds (the agent's latest), so a batch of that graph resent after the upgrade is
      // still recognised as applied.
      s = db->Get(rocksdb::ReadOptions(), cf(Column::kMeta), codec::LegacySequenceKey(agent_id),
                  &value);
      if (s.IsNotFound()) return 0;
      if (s.ok()) {
        absl::StatusOr<bool> has_graph = HasRecords(codec::GraphPrefix(agent_id, incarnation));
        if (!has_graph.ok()) return has_graph.status();
        if (!*has_graph) return 0;
      }
    }
    if (!s.ok()) return FromRocks(s);
    if (value.size() != 8) return absl::DataLossError("corrupt applied sequence record");
    return codec::GetFixed64LE(value.data());
  }

  absl::StatusOr<bool> HasRecords(const std::string& prefix) {
    std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(rocksdb::ReadOptions(), cf(Column::kMeta)));
    it->Seek(prefix);
    if (!it->status().ok()) return FromRocks(it->status());
    return it->Valid() && it->key().starts_with(rocksdb::Slice(prefix));
  }

  absl::Status Write(WriteBatch::Rep& rep) {
    rocksdb::WriteBatch wb;
    rocksdb::Status s;
    for (const auto& op : rep.ops) {
      switch (op.type) {
        case WriteBatch::Rep::OpType::kPut:
          s = wb.Put(cf(op.column), op.key, op.value);
          break;
        case WriteBatch::Rep::OpType::kMerge:
          s = wb.Merge(cf(op.column), op.key, op.value);
          break;
        case WriteBatch::Rep::OpType::kDeleteRange:
          s = wb.DeleteRange(cf(op.column), op.key, op.value);
          break;
      }
      if (!s.ok()) return FromRocks(s);
    }
    for (const auto& [service, summary] : rep.services) {
      s = wb.Merge(cf(Column::kServices), service,
                   codec::EncodeServiceSummary(summary.first_window_ms, summary.last_window_ms,
                                               summary.total_samples));
      if (!s.ok()) return FromRocks(s);
    }
    for (const WriteBatch::Rep::Sequence& q : rep.sequences) {
      s = wb.Put(cf(Column::kMeta), codec::SequenceKey(q.agent_id, q.incarnation),
                 codec::EncodeCount(q.sequence));
      if (!s.ok()) return FromRocks(s);
    }
    rocksdb::WriteOptions wo;
    wo.sync = options.sync;
    if (absl::Status resumed = ResumeAfterWriteError(); !resumed.ok()) return resumed;
    s = db->Write(wo, &wb);
    if (!s.ok()) {
      write_errors.fetch_add(1, std::memory_order_relaxed);
      absl::MutexLock lock(&resume_mu);
      if (!write_failed) spdlog::error("store: writes fail: {}", s.ToString());
      write_failed = true;
    }
    return FromRocks(s);
  }

  // OK when writes may be tried; Unavailable while RocksDB stays stopped by an earlier error.
  absl::Status ResumeAfterWriteError() {
    absl::MutexLock lock(&resume_mu);
    if (!write_failed) return absl::OkStatus();
    const absl::Time now = absl::Now();
    if (now - last_resume < absl::Seconds(1)) {
      return absl::UnavailableError("the store cannot write (disk full or failing); retrying");
    }
    last_resume = now;
    rocksdb::Status r = db->Resume();
    if (!r.ok()) return FromRocks(r);
    write_failed = false;
    resumes.fetch_add(1, std::memory_order_relaxed);
    spdlog::info("store: writes resumed");
    return absl::OkStatus();
  }

  // Cells of `scope` in column `column` with window in [from, to) (0 <= from < to),
  // filtered by query.host.
  // Calls visit(const codec::CellKey&, uint64_t count) for the cells of `scope` in column
  // `column` with window in [from, to) (0 <= from < to), of `host` only when given. The
  // key's views are valid during the call only.
  template <typename Visit>
  absl::Status VisitCells(Column column, const std::string& scope, int64_t from, int64_t to,
                          const std::optional<std::string>& host, Visit&& visit) {
    std::string upper_key = codec::CellPrefix(scope, static_cast<uint64_t>(to));
    rocksdb::Slice upper(upper_key);
    rocksdb::ReadOptions ro;
    ro.iterate_upper_bound = &upper;
    ro.prefix_same_as_start = true;
    std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(ro, cf(column)));

    uint64_t cells = 0;
    it->Seek(codec::CellPrefix(scope, static_cast<uint64_t>(from)));
    while (it->Valid()) {
      absl::StatusOr<codec::CellKey> cell = codec::DecodeCellKey(View(it->key()));
      if (!cell.ok()) return cell.status();
      if (cell->scope != scope) return absl::DataLossError("sample key outside its prefix");
      if (host && cell->host != *host) {
        // Skip to the wanted host in this window, or to the next window once past it.
        if (cell->host < *host) {
          std::string target = codec::CellPrefix(scope, cell->window_start_ms);
          target.append(*host);
          target.push_back('\0');
          it->Seek(target);
        } else {
          it->Seek(codec::CellPrefix(scope, cell->window_start_ms + 1));
        }
        continue;
      }
      absl::StatusOr<uint64_t> count = codec::DecodeCount(View(it->value()));
      if (!count.ok()) return count.status();
      ++cells;
      visit(*cell, *count);
      it->Next();
    }
    cells_scanned.fetch_add(cells, std::memory_order_relaxed);
    return FromRocks(it->status());
  }

  absl::Status ScanCells(Column column, const std::string& scope, int64_t from, int64_t to,
                         const SampleQuery& query,
                         const std::function<void(const SampleKey&, uint64_t)>& fn) {
    SampleKey key;
    key.service = query.service;
    return VisitCells(column, scope, from, to, query.host,
                      [&](const codec::CellKey& cell, uint64_t count) {
                        if (query.label_sets && !query.label_sets->contains(cell.label_set)) {
                          return;
                        }
                        key.window_start_ms = static_cast<int64_t>(cell.window_start_ms);
                        key.host.assign(cell.host);
                        key.stack_id = cell.stack_id;
                        key.label_set = cell.label_set;
                        fn(key, count);
                      });
  }

  // Adds the cells of a piece read from RocksDB to `totals`.
  absl::Status SumCells(Column column, const std::string& scope, int64_t from, int64_t to,
                        const SampleQuery& query, Totals* totals) {
    // Cells arrive grouped by host within each window: hash the host only when it changes.
    std::string last_host;
    bool any = false;
    return VisitCells(column, scope, from, to, query.host,
                      [&](const codec::CellKey& cell, uint64_t count) {
                        if (query.label_sets && !query.label_sets->contains(cell.label_set)) {
                          return;
                        }
                        SaturatingAddTo(totals->counts[cell.stack_id], count);
                        if (!any || cell.host != last_host) {
                          any = true;
                          last_host.assign(cell.host);
                          totals->hosts.insert(last_host);
                        }
                      });
  }

  // Window of the first cell of `scope` in `column` with window in [from, to), or `to`.
  absl::StatusOr<int64_t> NextWindow(Column column, const std::string& scope, int64_t from,
                                     int64_t to) {
    std::string upper_key = codec::CellPrefix(scope, static_cast<uint64_t>(to));
    rocksdb::Slice upper(upper_key);
    rocksdb::ReadOptions ro;
    ro.iterate_upper_bound = &upper;
    ro.prefix_same_as_start = true;
    std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(ro, cf(column)));
    it->Seek(codec::CellPrefix(scope, static_cast<uint64_t>(from)));
    if (!it->Valid()) {
      absl::Status s = FromRocks(it->status());
      if (!s.ok()) return s;
      return to;
    }
    absl::StatusOr<codec::CellKey> cell = codec::DecodeCellKey(View(it->key()));
    if (!cell.ok()) return cell.status();
    if (cell->scope != scope) return absl::DataLossError("sample key outside its prefix");
    if (cell->window_start_ms >= static_cast<uint64_t>(to)) return to;
    return std::max(from, static_cast<int64_t>(cell->window_start_ms));
  }

  // Reads the hour rollup of `scope` with window in [hour, end) (all hosts) into a block.
  absl::StatusOr<std::shared_ptr<const HourBlock>> ReadHourBlock(const std::string& scope,
                                                                 int64_t hour, int64_t end) {
    auto block = std::make_shared<HourBlock>();
    bool labelled = false;  // a cell with a label set was seen: label_sets is kept
    absl::Status s = VisitCells(
        Column::kRollupHour, scope, hour, end, std::nullopt,
        [&](const codec::CellKey& cell, uint64_t count) {
          if (block->hosts.empty() || cell.host != block->hosts.back()) {
            if (!block->hosts.empty()) block->host_end.push_back(block->entries.size());
            block->hosts.emplace_back(cell.host);
          }
          if (cell.label_set != 0 && !labelled) {
            labelled = true;
            block->label_sets.assign(block->entries.size(), 0);
          }
          if (labelled) block->label_sets.push_back(cell.label_set);
          block->entries.push_back({cell.stack_id, count});
        });
    if (!s.ok()) return s;
    if (!block->hosts.empty()) block->host_end.push_back(block->entries.size());
    block->entries.shrink_to_fit();
    block->label_sets.shrink_to_fit();
    return block;
  }

  // Adds whole hours [from, to) of the hour rollup to `totals`, through the block cache.
  absl::Status SumHours(const std::string& scope, int64_t from, int64_t to,
                        const SampleQuery& query, Totals* totals) {
    const std::optional<std::string>& host = query.host;
    std::vector<std::shared_ptr<const HourBlock>> blocks;
    size_t entries = 0;
    // Hours past the hour retention may be dropped by any compaction: read, never cached, so
    // a block does not keep them visible longer than the rollup itself.
    const int64_t cutoff =
        options.hour_retention_ms > 0 ? NowMs() - options.hour_retention_ms : INT64_MIN;
    // Hours are visited one by one while in memory; on a miss, the rollup is sought, which
    // also skips every empty hour up to the next row, so a range costs its rows and gaps,
    // not its length (ranges may reach to the end of time).
    for (int64_t hour = from; hour < to;) {
      // `hour` is a multiple of the hour below `to`: the end never overflows.
      const int64_t end = to - hour <= kHourMs ? to : hour + kHourMs;
      const std::string key = codec::CellPrefix(scope, static_cast<uint64_t>(hour));
      const bool cacheable = hour >= cutoff;
      uint64_t generation = 0;
      std::shared_ptr<const HourBlock> block =
          cacheable ? hour_blocks->Lookup(key, &generation) : nullptr;
      if (!block) {
        absl::StatusOr<int64_t> next = NextWindow(Column::kRollupHour, scope, hour, to);
        if (!next.ok()) return next.status();
        if (*next >= to) break;
        if (*next >= end) {
          hour = *next - *next % kHourMs;  // empty hours in between
          continue;
        }
        absl::StatusOr<std::shared_ptr<const HourBlock>> read = ReadHourBlock(scope, hour, end);
        if (!read.ok()) return read.status();
        block = *std::move(read);
        if (cacheable) hour_blocks->Insert(key, generation, block);
      }
      entries = std::max(entries, block->entries.size());
      blocks.push_back(std::move(block));
      hour = end;
    }
    // Hours share most of their stacks: the largest hour is a fair lower bound of the result.
    totals->counts.reserve(totals->counts.size() + entries * 2);
    for (const auto& block : blocks) {
      for (size_t h = 0; h < block->hosts.size(); ++h) {
        if (host && block->hosts[h] != *host) continue;
        const size_t begin = h == 0 ? 0 : block->host_end[h - 1];
        const size_t end = block->host_end[h];
        if (begin == end) continue;
        if (query.label_sets) {
          // Labelled queries are selective: no prefetching, a membership test per entry.
          bool any = false;
          for (size_t i = begin; i < end; ++i) {
            if (!query.label_sets->contains(block->LabelSetOf(i))) continue;
            any = true;
            totals->counts[block->entries[i].stack_id] += block->entries[i].count;
          }
          if (any && !totals->hosts.contains(block->hosts[h])) totals->hosts.insert(block->hosts[h]);
          continue;
        }
        if (!totals->hosts.contains(block->hosts[h])) totals->hosts.insert(block->hosts[h]);
        constexpr size_t kAhead = 8;  // overlap the cache misses of the hash probes
        for (size_t i = begin; i < end; ++i) {
          if (i + kAhead < end) totals->counts.prefetch(block->entries[i + kAhead].stack_id);
          totals->counts[block->entries[i].stack_id] += block->entries[i].count;
        }
      }
    }
    return absl::OkStatus();
  }

  // Iterates [begin, end) of a column family; `fn` returns false to stop early.
  absl::Status Scan(Column column, const std::string& begin, const std::string& end,
                    const std::function<absl::Status(std::string_view key, std::string_view value)>& fn) {
    rocksdb::ReadOptions ro;
    rocksdb::Slice upper(end);
    if (!end.empty()) ro.iterate_upper_bound = &upper;
    std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(ro, cf(column)));
    for (it->Seek(begin); it->Valid(); it->Next()) {
      absl::Status s = fn(View(it->key()), View(it->value()));
      if (!s.ok()) return s;
    }
    return FromRocks(it->status());
  }
};

namespace {

constexpr char kMarkerFile[] = "STRATA";
// Version 2 adds label set IDs to cell keys (codec.h): a version 1 store reads unchanged and
// is marked version 2 when opened, so an older server refuses it instead of misreading it.
constexpr char kMarker[] = "strata-store 2\n";
constexpr char kMarkerV1[] = "strata-store 1\n";

// Refuses a directory that holds something other than a Strata store, before RocksDB
// creates its files among someone else's: a path given by mistake must not be written to.
absl::Status CheckDataDirectory(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(dir, ec)) return absl::OkStatus();
  if (!fs::is_directory(dir, ec)) {
    return absl::FailedPreconditionError(absl::StrCat(dir, " is not a directory"));
  }
  const std::string marker = dir + "/" + kMarkerFile;
  if (fs::exists(marker, ec)) {
    std::ifstream in(marker);
    std::string contents((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (contents != kMarker && contents != kMarkerV1) {
      return absl::FailedPreconditionError(absl::StrCat(
          marker, " says '", absl::CHexEscape(contents.substr(0, 64)),
          "', not '", absl::CHexEscape(kMarker), "': a store of another version or a damaged file"));
    }
    return absl::OkStatus();
  }
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir, ec)) names.push_back(e.path().filename());
  if (names.empty()) return absl::OkStatus();
  if (fs::exists(dir + "/CURRENT", ec)) {
    // A RocksDB database: a Strata store from before the marker has Strata's column families.
    std::vector<std::string> families;
    rocksdb::Status st = rocksdb::DB::ListColumnFamilies(rocksdb::DBOptions(), dir, &families);
    if (!st.ok()) return FromRocks(st);
    for (const char* name : kColumnNames) {
      if (std::find(families.begin(), families.end(), name) == families.end()) {
        return absl::FailedPreconditionError(absl::StrCat(
            dir, " holds a RocksDB database that is not a Strata store (column families: ",
            absl::StrJoin(families, ", "), ")"));
      }
    }
    return absl::OkStatus();
  }
  std::sort(names.begin(), names.end());
  names.resize(std::min<size_t>(names.size(), 3));
  return absl::FailedPreconditionError(absl::StrCat(
      dir, " is not empty and is not a Strata data directory (it holds ",
      absl::StrJoin(names, ", "), "...): give an empty or new directory"));
}

}  // namespace

Store::Store(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Store::~Store() { Close().IgnoreError(); }

absl::StatusOr<std::unique_ptr<Store>> Store::Open(const std::string& dir,
                                                   const StoreOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->stacks = std::make_unique<InternTable>(options.intern_cache_entries);
  impl->functions = std::make_unique<InternTable>(options.intern_cache_entries);
  impl->hour_blocks = std::make_unique<HourBlockCache>(options.hour_block_cache_bytes);

  rocksdb::DBOptions db_options;
  db_options.create_if_missing = options.create_if_missing;
  db_options.create_missing_column_families = true;
  db_options.info_log = std::make_shared<RocksLogger>();
  // No preallocation: a full disk fails the write that meets it (the batch is then not
  // acknowledged) instead of tens of MiB later in a background flush.
  db_options.allow_fallocate = false;
  db_options.max_background_jobs = 2;
  db_options.bytes_per_sync = 1 << 20;

  // Prefer LZ4 for hot levels and ZSTD for the bottommost level, as built into librocksdb.
  std::vector<rocksdb::CompressionType> supported = rocksdb::GetSupportedCompressions();
  auto has = [&](rocksdb::CompressionType t) {
    return std::find(supported.begin(), supported.end(), t) != supported.end();
  };
  rocksdb::CompressionType hot = has(rocksdb::kLZ4Compression)      ? rocksdb::kLZ4Compression
                                 : has(rocksdb::kSnappyCompression) ? rocksdb::kSnappyCompression
                                                                    : rocksdb::kNoCompression;
  rocksdb::CompressionType cold = has(rocksdb::kZSTD) ? rocksdb::kZSTD : hot;

  std::shared_ptr<rocksdb::Cache> cache = rocksdb::NewLRUCache(options.block_cache_bytes);
  impl->block_cache = cache;
  auto table_factory = [&](bool prefix_bloom) {
    rocksdb::BlockBasedTableOptions t;
    t.block_cache = cache;
    t.filter_policy.reset(rocksdb::NewBloomFilterPolicy(10));
    // Cell tables are read by range per service; point lookups go to stacks/functions/meta.
    t.whole_key_filtering = !prefix_bloom;
    t.format_version = 5;
    return std::shared_ptr<rocksdb::TableFactory>(rocksdb::NewBlockBasedTableFactory(t));
  };

  std::vector<rocksdb::ColumnFamilyDescriptor> descriptors;
  for (size_t i = 0; i < kNumColumns; ++i) {
    rocksdb::ColumnFamilyOptions cf_options;
    cf_options.compression = hot;
    cf_options.bottommost_compression = cold;
    Column column = static_cast<Column>(i);
    int64_t retention_ms = column == Column::kSamples        ? options.raw_retention_ms
                           : column == Column::kRollupMinute ? options.minute_retention_ms
                           : column == Column::kRollupHour   ? options.hour_retention_ms
                                                             : 0;
    bool cells = column == Column::kSamples || column == Column::kCaptures ||
                 column == Column::kRollupMinute || column == Column::kRollupHour;
    if (cells) {
      cf_options.merge_operator = NewCountAddOperator(impl->malformed);
      cf_options.prefix_extractor = NewScopePrefixExtractor();
    }
    if (retention_ms > 0) {
      std::function<int64_t()> now = options.now_ms_for_testing;
      if (!now) {
        now = [] {
          return std::chrono::duration_cast<std::chrono::milliseconds>(
                     std::chrono::system_clock::now().time_since_epoch())
              .count();
        };
      }
      impl->retention_filters.push_back(NewRetentionFilter(retention_ms, std::move(now)));
      cf_options.compaction_filter = impl->retention_filters.back().get();
    } else if (column == Column::kServices) {
      cf_options.merge_operator = NewServiceSummaryOperator(impl->malformed);
    }
    cf_options.table_factory = table_factory(cells);
    descriptors.emplace_back(kColumnNames[i], cf_options);
  }
  // RocksDB always has a default column family; the store keeps nothing in it.
  descriptors.emplace_back(rocksdb::kDefaultColumnFamilyName, rocksdb::ColumnFamilyOptions());

  if (absl::Status checked = CheckDataDirectory(dir); !checked.ok()) return checked;
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::Status s = rocksdb::DB::Open(db_options, dir, descriptors, &handles, &impl->db);
  if (!s.ok()) return FromRocks(s);
  {
    std::ifstream in(dir + "/" + kMarkerFile);
    std::string contents((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (contents != kMarker) {
      std::ofstream out(dir + "/" + kMarkerFile, std::ios::trunc);
      out << kMarker;
    }
  }
  for (size_t i = 0; i < kNumColumns; ++i) impl->columns[i] = handles[i];
  impl->db->DestroyColumnFamilyHandle(handles.back()).PermitUncheckedError();
  return std::unique_ptr<Store>(new Store(std::move(impl)));
}

absl::Status Store::Close() {
  std::lock_guard<std::mutex> lock(impl_->close_mu);
  if (impl_->closed) return impl_->close_status;
  impl_->closed = true;
  rocksdb::FlushOptions fo;
  fo.wait = true;
  std::vector<rocksdb::ColumnFamilyHandle*> handles(impl_->columns.begin(), impl_->columns.end());
  absl::Status status = FromRocks(impl_->db->Flush(fo, handles));
  for (rocksdb::ColumnFamilyHandle* h : handles) {
    impl_->db->DestroyColumnFamilyHandle(h).PermitUncheckedError();
  }
  absl::Status close = FromRocks(impl_->db->Close());
  if (status.ok()) status = close;
  delete impl_->db;
  impl_->db = nullptr;
  impl_->close_status = status;
  return status;
}

absl::StatusOr<uint64_t> Store::InternFunction(const FunctionInfo& function, WriteBatch* batch) {
  return impl_->Intern(InternKind::kFunction, codec::FunctionIdentity(function),
                       codec::EncodeFunction(function), batch);
}

absl::StatusOr<uint64_t> Store::InternStack(const StackFrames& stack, WriteBatch* batch) {
  std::string value = codec::EncodeStack(stack);
  std::string identity = value;
  return impl_->Intern(InternKind::kStack, identity, std::move(value), batch);
}

absl::StatusOr<uint64_t> Store::InternLabelSet(std::string_view service,
                                               const labels::LabelSet& set,
                                               uint32_t max_per_service, WriteBatch* batch) {
  if (set.empty()) return 0;
  if (service.empty() || !ValidKeyPart(service)) {
    return absl::InvalidArgumentError("service must be non-empty, without NUL");
  }
  for (size_t i = 0; i < set.size(); ++i) {
    if (absl::Status s = labels::ValidateLabel(set[i].first, set[i].second); !s.ok()) return s;
    if (set[i].second.empty() || (i > 0 && set[i - 1].first >= set[i].first)) {
      return absl::InvalidArgumentError("label set is not normalized");
    }
  }
  const std::string encoded = labels::Encode(set);
  absl::MutexLock lock(&impl_->label_mu);
  uint64_t id = 0;
  for (uint32_t probe = 0; probe < kMaxProbes && id == 0; ++probe) {
    const uint64_t candidate = impl_->Candidate(encoded, probe);
    absl::StatusOr<std::string> occupant = impl_->LabelSetBytes(candidate);
    if (absl::IsNotFound(occupant.status())) {
      impl_->label_sets.emplace(candidate, encoded);
      id = candidate;
    } else if (!occupant.ok() && !absl::IsDataLoss(occupant.status())) {
      return occupant.status();
    } else if (occupant.ok() && *occupant == encoded) {
      id = candidate;
    } else {
      impl_->collisions.fetch_add(1, std::memory_order_relaxed);
    }
  }
  if (id == 0) return absl::InternalError(absl::StrCat("no free ID after ", kMaxProbes, " probes"));
  absl::StatusOr<Impl::ServiceLabelSets*> sets = impl_->LoadServiceLabelSets(service);
  if (!sets.ok()) return sets.status();
  auto [it, inserted] = (*sets)->ids.try_emplace(id, false);
  if (inserted && (*sets)->ids.size() > max_per_service) {
    (*sets)->ids.erase(it);
    return absl::ResourceExhaustedError(absl::StrCat(
        "service '", std::string(service), "' already has ", max_per_service,
        " distinct label sets (strata-server --max-label-sets); refused {",
        EscapeForLog(labels::ToString(set), 200), "}"));  // NOLINT
  }
  if (!it->second) {
    batch->rep_->Add(Column::kMeta, WriteBatch::Rep::OpType::kPut, codec::LabelSetKey(id), encoded);
    batch->rep_->Add(Column::kMeta, WriteBatch::Rep::OpType::kPut,
                     codec::ServiceLabelSetKey(service, id), std::string());
    batch->rep_->label_sets.emplace_back(std::string(service), id);
  }
  return id;
}

absl::StatusOr<std::vector<LabelSetRecord>> Store::ListLabelSets(std::string_view service) {
  if (service.empty() || !ValidKeyPart(service)) {
    return absl::InvalidArgumentError("service must be non-empty, without NUL");
  }
  std::vector<LabelSetRecord> out;
  out.push_back({0, {}});
  absl::MutexLock lock(&impl_->label_mu);
  absl::StatusOr<Impl::ServiceLabelSets*> sets = impl_->LoadServiceLabelSets(service);
  if (!sets.ok()) return sets.status();
  std::vector<uint64_t> ids;
  for (const auto& [id, durable] : (*sets)->ids) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  for (uint64_t id : ids) {
    absl::StatusOr<std::string> bytes = impl_->LabelSetBytes(id);
    if (!bytes.ok()) {
      return absl::DataLossError(absl::StrCat("label set ", id, " of service '", std::string(service),
                                              "' cannot be read: ", bytes.status().message()));
    }
    absl::StatusOr<labels::LabelSet> set = labels::Decode(*bytes);
    if (!set.ok()) return absl::DataLossError(absl::StrCat("corrupt label set ", id));
    out.push_back({id, *std::move(set)});
  }
  return out;
}

absl::Status Store::Commit(WriteBatch* batch) {
  WriteBatch::Rep& rep = *batch->rep_;
  if (!rep.status.ok()) return rep.status;

  // Lock the stripes of every agent whose sequence this batch advances, in stripe order,
  // so that checking and advancing a sequence is atomic against other commits.
  std::vector<size_t> stripes;
  for (const WriteBatch::Rep::Sequence& q : rep.sequences) {
    stripes.push_back(codec::Hash64(q.agent_id, q.incarnation) % kSequenceStripes);
  }
  std::sort(stripes.begin(), stripes.end());
  stripes.erase(std::unique(stripes.begin(), stripes.end()), stripes.end());
  for (size_t stripe : stripes) impl_->sequence_mu[stripe].Lock();
  absl::Status status;
  for (const WriteBatch::Rep::Sequence& q : rep.sequences) {
    absl::StatusOr<uint64_t> applied = impl_->ReadSequence(q.agent_id, q.incarnation);
    if (!applied.ok()) {
      status = applied.status();
    } else if (q.sequence <= *applied) {
      status = absl::AlreadyExistsError(absl::StrCat("agent ", q.agent_id, " batch ",
                                                     q.sequence, " already applied (last ",
                                                     *applied, ")"));
    }
    if (!status.ok()) break;
  }
  if (status.ok()) status = impl_->Write(rep);
  for (auto it = stripes.rbegin(); it != stripes.rend(); ++it) impl_->sequence_mu[*it].Unlock();
  // After the write is visible (see HourBlockCache); also after a failed write, which may
  // have been applied before failing to report.
  for (const std::string& hour : rep.touched_hours) impl_->hour_blocks->Invalidate(hour);
  if (!status.ok()) return status;

  for (const auto& [kind, id] : rep.interned) impl_->Table(kind).MarkDurable(id);
  if (!rep.label_sets.empty()) {
    absl::MutexLock lock(&impl_->label_mu);
    for (const auto& [service, id] : rep.label_sets) {
      auto it = impl_->service_label_sets.find(service);
      if (it == impl_->service_label_sets.end()) continue;
      if (auto s = it->second.ids.find(id); s != it->second.ids.end()) s->second = true;
    }
  }
  batch->Clear();
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> Store::AppliedSequence(std::string_view agent_id,
                                                uint64_t incarnation) {
  if (!ValidKeyPart(agent_id)) return absl::InvalidArgumentError("agent id contains NUL");
  return impl_->ReadSequence(agent_id, incarnation);
}

absl::Status Store::ScanSamples(const SampleQuery& query,
                                const std::function<void(const SampleKey&, uint64_t)>& fn) {
  const std::string& scope = query.capture_id ? *query.capture_id : query.service;
  if (scope.empty() || !ValidKeyPart(scope)) {
    return absl::InvalidArgumentError("service or capture id must be non-empty, without NUL");
  }
  if (query.host && !ValidKeyPart(*query.host)) {
    return absl::InvalidArgumentError("host must not contain NUL");
  }
  int64_t from = std::max<int64_t>(query.from_ms, 0);
  int64_t to = query.to_ms;
  if (to <= from) return absl::OkStatus();
  if (query.capture_id) return impl_->ScanCells(Column::kCaptures, scope, from, to, query, fn);
  switch (query.resolution) {
    case Resolution::kRaw:
      return impl_->ScanCells(Column::kSamples, scope, from, to, query, fn);
    case Resolution::kMinute:
      return impl_->ScanCells(Column::kRollupMinute, scope, from, to, query, fn);
    case Resolution::kHour:
      return impl_->ScanCells(Column::kRollupHour, scope, from, to, query, fn);
    case Resolution::kAuto:
      break;
  }
  for (const Piece& piece : AutoPieces(from, to)) {
    if (piece.from >= piece.to) continue;
    absl::Status s = impl_->ScanCells(piece.column, scope, piece.from, piece.to, query, fn);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<SampleTotals> Store::SumSamples(const SampleQuery& query) {
  const std::string& scope = query.capture_id ? *query.capture_id : query.service;
  if (scope.empty() || !ValidKeyPart(scope)) {
    return absl::InvalidArgumentError("service or capture id must be non-empty, without NUL");
  }
  if (query.host && !ValidKeyPart(*query.host)) {
    return absl::InvalidArgumentError("host must not contain NUL");
  }
  int64_t from = std::max<int64_t>(query.from_ms, 0);
  int64_t to = query.to_ms;
  Totals totals;
  std::vector<Piece> pieces;
  if (to <= from) {
    // Nothing to read.
  } else if (query.capture_id) {
    pieces.push_back({Column::kCaptures, from, to});
  } else if (query.resolution == Resolution::kRaw) {
    pieces.push_back({Column::kSamples, from, to});
  } else if (query.resolution == Resolution::kMinute) {
    pieces.push_back({Column::kRollupMinute, from, to});
  } else if (query.resolution == Resolution::kHour) {
    // Hour windows starting in [from, to), as a scan of the hour rollup returns them.
    const int64_t first = from % kHourMs == 0 ? from : from - from % kHourMs + kHourMs;
    if (first < to) pieces.push_back({Column::kRollupHour, first, to});
  } else {
    pieces = AutoPieces(from, to);
  }
  for (const Piece& piece : pieces) {
    if (piece.from >= piece.to) continue;
    absl::Status s =
        piece.column == Column::kRollupHour && impl_->hour_blocks->enabled()
            ? impl_->SumHours(scope, piece.from, piece.to, query, &totals)
            : impl_->SumCells(piece.column, scope, piece.from, piece.to, query, &totals);
    if (!s.ok()) return s;
  }
  SampleTotals out;
  out.stacks.reserve(totals.counts.size());
  for (const auto& [stack_id, count] : totals.counts) out.stacks.push_back({stack_id, count});
  out.hosts.assign(totals.hosts.begin(), totals.hosts.end());
  std::sort(out.hosts.begin(), out.hosts.end());
  return out;
}

absl::StatusOr<StackFrames> Store::GetStack(uint64_t stack_id) {
  absl::StatusOr<std::string> value = impl_->Lookup(InternKind::kStack, stack_id);
  if (!value.ok()) return value.status();
  return codec::DecodeStack(*value);
}

absl::StatusOr<FunctionInfo> Store::GetFunction(uint64_t function_id) {
  absl::StatusOr<std::string> value = impl_->Lookup(InternKind::kFunction, function_id);
  if (!value.ok()) return value.status();
  return codec::DecodeFunction(*value);
}

absl::StatusOr<std::vector<ServiceSummary>> Store::ListServices() {
  std::vector<ServiceSummary> out;
  absl::Status s = impl_->Scan(Column::kServices, "", "",
                               [&](std::string_view key, std::string_view value) {
                                 absl::StatusOr<ServiceSummary> summary =
                                     codec::DecodeServiceSummary(value);
                                 if (!summary.ok()) return summary.status();
                                 summary->service.assign(key);
                                 out.push_back(std::move(*summary));
                                 return absl::OkStatus();
                               });
  if (!s.ok()) return s;
  return out;
}

namespace {

// Every meta record under a one-byte tag, decoded; the key after the tag is the record's ID.
template <typename Record>
absl::StatusOr<std::vector<Record>> ScanTaggedRecords(
    const std::function<absl::Status(Column, const std::string&, const std::string&,
                                     const std::function<absl::Status(std::string_view,
                                                                      std::string_view)>&)>& scan,
    char tag, absl::StatusOr<Record> (*decode)(std::string_view), std::string Record::*id) {
  std::vector<Record> out;
  const std::string begin(1, tag);
  absl::Status s = scan(Column::kMeta, begin, PrefixSuccessor(begin),
                        [&](std::string_view key, std::string_view value) {
                          absl::StatusOr<Record> record = decode(value);
                          if (!record.ok()) return record.status();
                          ((*record).*id).assign(key.substr(1));
                          out.push_back(std::move(*record));
                          return absl::OkStatus();
                        });
  if (!s.ok()) return s;
  return out;
}

}  // namespace

absl::StatusOr<std::vector<AgentRecord>> Store::ListAgents() {
  return ScanTaggedRecords<AgentRecord>(
      [this](auto... args) { return impl_->Scan(args...); }, codec::kAgentTag,
      &codec::DecodeAgent, &AgentRecord::agent_id);
}

absl::StatusOr<AgentGraph> Store::LoadGraph(std::string_view agent_id, uint64_t graph_id) {
  if (!ValidKeyPart(agent_id)) return absl::InvalidArgumentError("agent id contains NUL");
  AgentGraph graph;
  std::string prefix = codec::GraphPrefix(agent_id, graph_id);
  absl::Status s = impl_->Scan(
      Column::kMeta, prefix, PrefixSuccessor(prefix),
      [&](std::string_view key, std::string_view value) -> absl::Status {
        if (key.size() != prefix.size() + 9) return absl::DataLossError("corrupt graph key");
        char kind = key[prefix.size()];
        uint64_t index = codec::GetFixed64BE(key.data() + prefix.size() + 1);
        if (kind == 'n') {
          absl::StatusOr<GraphNode> node = codec::DecodeGraphNode(value);
          if (!node.ok()) return node.status();
          if (index > UINT32_MAX ||
              (!graph.nodes.empty() && index != uint64_t{graph.nodes.back().id} + 1)) {
            return absl::DataLossError(absl::StrCat("graph node ", index, " out of sequence"));
          }
          node->id = static_cast<uint32_t>(index);
          graph.nodes.push_back(std::move(*node));
        } else if (kind == 'e') {
          absl::StatusOr<GraphEdge> edge = codec::DecodeGraphEdge(value);
          if (!edge.ok()) return edge.status();
          if (index != graph.edges.size()) {
            return absl::DataLossError(absl::StrCat("graph edge ", index, " out of sequence"));
          }
          graph.edges.push_back(*edge);
        } else {
          return absl::DataLossError("corrupt graph key");
        }
        return absl::OkStatus();
      });
  if (!s.ok()) return s;
  return graph;
}

absl::StatusOr<std::vector<PhaseEvent>> Store::ScanPhaseEvents(std::string_view service,
                                                               int64_t from_ms, int64_t to_ms) {
  if (!ValidKeyPart(service)) return absl::InvalidArgumentError("service contains NUL");
  std::vector<PhaseEvent> out;
  uint64_t from = static_cast<uint64_t>(std::max<int64_t>(from_ms, 0));
  if (to_ms <= 0 || static_cast<uint64_t>(to_ms) <= from) return out;
  std::string begin = codec::PhasePrefix(service, from);
  size_t window_at = begin.size() - 8;
  absl::Status s = impl_->Scan(
      Column::kMeta, begin, codec::PhasePrefix(service, static_cast<uint64_t>(to_ms)),
      [&](std::string_view key, std::string_view value) -> absl::Status {
        if (key.size() != window_at + 16) return absl::DataLossError("corrupt phase event key");
        PhaseEvent event;
        event.service.assign(service);
        event.window_start_ms = static_cast<int64_t>(codec::GetFixed64BE(key.data() + window_at));
        event.payload.assign(value);
        out.push_back(std::move(event));
        return absl::OkStatus();
      });
  if (!s.ok()) return s;
  return out;
}

absl::StatusOr<AgentRecord> Store::GetAgent(const std::string& agent_id) {
  if (!ValidKeyPart(agent_id)) return absl::InvalidArgumentError("agent id contains NUL");
  std::string value;
  rocksdb::Status s = impl_->db->Get(rocksdb::ReadOptions(), impl_->cf(Column::kMeta),
                                     codec::AgentKey(agent_id), &value);
  if (!s.ok()) return FromRocks(s);
  absl::StatusOr<AgentRecord> agent = codec::DecodeAgent(value);
  if (agent.ok()) agent->agent_id = agent_id;
  return agent;
}

absl::StatusOr<CaptureInfo> Store::GetCapture(std::string_view capture_id) {
  std::string value;
  rocksdb::Status s = impl_->db->Get(rocksdb::ReadOptions(), impl_->cf(Column::kMeta),
                                     codec::CaptureKey(capture_id), &value);
  if (!s.ok()) return FromRocks(s);
  absl::StatusOr<CaptureInfo> capture = codec::DecodeCapture(value);
  if (capture.ok()) capture->capture_id.assign(capture_id);
  return capture;
}

absl::Status Store::ScanJournal(
    const std::function<absl::Status(uint64_t sequence, std::string_view record)>& fn) {
  return impl_->Scan(Column::kJournal, std::string(), std::string(),
                     [&](std::string_view key, std::string_view value) -> absl::Status {
                       if (key.size() != 8) return absl::DataLossError("corrupt journal key");
                       return fn(codec::GetFixed64BE(key.data()), value);
                     });
}

absl::StatusOr<std::vector<CaptureInfo>> Store::ListCaptures() {
  return ScanTaggedRecords<CaptureInfo>(
      [this](auto... args) { return impl_->Scan(args...); }, codec::kCaptureTag,
      &codec::DecodeCapture, &CaptureInfo::capture_id);
}

uint64_t Store::ApproximateBytesOnDisk() {
  uint64_t total = 0;
  for (rocksdb::ColumnFamilyHandle* h : impl_->columns) {
    uint64_t bytes = 0;
    if (impl_->db->GetIntProperty(h, rocksdb::DB::Properties::kLiveSstFilesSize, &bytes)) {
      total += bytes;
    }
  }
  rocksdb::VectorLogPtr wal_files;
  if (impl_->db->GetSortedWalFiles(wal_files).ok()) {
    for (const auto& f : wal_files) total += f->SizeFileBytes();
  }
  return total;
}

StoreStats Store::Stats() {
  StoreStats stats;
  stats.malformed_merge_operands = impl_->malformed->load(std::memory_order_relaxed);
  stats.id_collisions = impl_->collisions.load(std::memory_order_relaxed);
  stats.stack_cache_entries = impl_->stacks->Size();
  stats.function_cache_entries = impl_->functions->Size();
  stats.cells_scanned = impl_->cells_scanned.load(std::memory_order_relaxed);
  stats.write_errors = impl_->write_errors.load(std::memory_order_relaxed);
  stats.write_resumes = impl_->resumes.load(std::memory_order_relaxed);
  impl_->hour_blocks->Stats(&stats);
  for (rocksdb::ColumnFamilyHandle* h : impl_->columns) {
    uint64_t v = 0;
    if (impl_->db->GetIntProperty(h, rocksdb::DB::Properties::kSizeAllMemTables, &v)) {
      stats.memtable_bytes += v;
    }
    if (impl_->db->GetIntProperty(h, rocksdb::DB::Properties::kEstimateTableReadersMem, &v)) {
      stats.table_reader_bytes += v;
    }
  }
  if (impl_->block_cache) stats.block_cache_bytes = impl_->block_cache->GetUsage();
  return stats;
}

absl::Status Store::CompactAll() {
  rocksdb::CompactRangeOptions options;
  options.bottommost_level_compaction = rocksdb::BottommostLevelCompaction::kForce;
  for (rocksdb::ColumnFamilyHandle* h : impl_->columns) {
    absl::Status s = FromRocks(impl_->db->CompactRange(options, h, nullptr, nullptr));
    if (!s.ok()) return s;
  }
  // Retention may have dropped hour rows that cached blocks still hold.
  impl_->hour_blocks->Clear();
  return absl::OkStatus();
}

absl::Status Store::PutRawForTesting(Column column, std::string_view key, std::string_view value) {
  absl::Status s = FromRocks(
      impl_->db->Put(rocksdb::WriteOptions(), impl_->cf(column), ToSlice(key), ToSlice(value)));
  impl_->hour_blocks->Clear();  // bypasses the commit path that invalidates blocks
  return s;
}

}  // namespace strata::store
