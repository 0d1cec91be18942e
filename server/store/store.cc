#include "server/store/store.h"

#include <algorithm>
#include <thread>
#include <array>
#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <mutex>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/base/clock.h"
#include "common/base/log.h"
#include "rocksdb/cache.h"
#include "rocksdb/convenience.h"
#include "rocksdb/db.h"
#include "rocksdb/filter_policy.h"
#include "rocksdb/options.h"
#include "rocksdb/table.h"
#include "rocksdb/write_batch.h"
#include "server/store/block_cache.h"
#include "server/store/codec.h"
#include "server/store/data_dir.h"
#include "server/store/db.h"
#include "server/store/merge.h"
#include "server/store/rollup_plan.h"
#include "server/store/rollups.h"
#include "server/store/write_batch_rep.h"

namespace strata::server::store {
namespace {

// Retention is applied when RocksDB compacts a file (the compaction filters), which a store
// taking few writes may not do for weeks: every file of a column with a retention is
// compacted again at least this often, so what expired goes within a quarter of the
// retention (at least an hour, at most a day) of expiring.
uint64_t PeriodicCompactionSeconds(int64_t retention_ms) {
  return static_cast<uint64_t>(std::clamp<int64_t>(retention_ms / 4 / 1000, 3600, 86400));
}

constexpr size_t kSequenceStripes = 16;
constexpr size_t kMaxCachedSequencesPerStripe = 4096;

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
    const LogLevel to = level >= rocksdb::InfoLogLevel::ERROR_LEVEL ? LogLevel::kError
                        : level == rocksdb::InfoLogLevel::WARN_LEVEL ? LogLevel::kWarn
                                                                     : LogLevel::kDebug;
    if (!LogEnabled(to)) return;
    char buf[1024];
    const int n = vsnprintf(buf, sizeof buf, format, ap);
    if (n < 0) return;
    Log(to, "rocksdb: {}", std::string_view(buf, std::min<size_t>(n, sizeof buf - 1)));
  }
};

}  // namespace

struct Store::Impl {
  StoreOptions options;
  Database database;
  std::shared_ptr<std::atomic<uint64_t>> malformed = std::make_shared<std::atomic<uint64_t>>(0);
  std::unique_ptr<RollupBlocks> blocks;
  std::unique_ptr<Interner> interner;
  std::unique_ptr<SampleReader> samples;
  std::unique_ptr<MetaRecords> meta;
  std::unique_ptr<Rollups> rollups;
  std::shared_ptr<rocksdb::Cache> block_cache;
  std::array<absl::Mutex, kSequenceStripes> sequence_mu;
  // The applied sequence of each (agent, incarnation) by SequenceKey, per stripe and
  // guarded by its mutex: Commit writes every sequence, so after the first read of an agent
  // its batches cost no read. A failed write drops the entry (it may have been applied).
  std::array<absl::flat_hash_map<std::string, uint64_t>, kSequenceStripes> applied_sequences;
  // Referenced by the column family options; must outlive the DB.
  std::vector<std::unique_ptr<rocksdb::CompactionFilter>> retention_filters;
  // After a failed write RocksDB refuses every write until Resume(): tried on the next write
  // at most once a second, so the server recovers by itself when space returns.
  std::atomic<uint64_t> write_errors{0};
  std::atomic<uint64_t> resumes{0};
  absl::Mutex resume_mu;
  absl::Time last_resume ABSL_GUARDED_BY(resume_mu) = absl::InfinitePast();
  bool write_failed ABSL_GUARDED_BY(resume_mu) = false;
  // write_failed for readers that must not wait behind a resume (/readyz).
  std::atomic<bool> writes_failing{false};
  std::function<int64_t()> now_ms;
  // The roller: rolls every service up every StoreOptions::rollup_interval_ms.
  absl::Mutex roller_mu;
  absl::CondVar roller_wake;
  bool roller_stop ABSL_GUARDED_BY(roller_mu) = false;
  std::thread roller;
  std::atomic<uint64_t> rollup_minute_cells{0};
  std::atomic<uint64_t> rollup_hour_cells{0};
  std::mutex close_mu;
  bool closed = false;
  absl::Status close_status;

  // Applies a validated batch in one RocksDB write; with its raw cells' rollup merges
  // (`updates` then holds the rollup state to apply once it is written; the caller holds
  // the rollups' lock).
  absl::Status Write(WriteBatch::Rep& rep, Rollups::Updates* updates) {
    rocksdb::WriteBatch wb;
    rocksdb::Status s;
    for (const auto& op : rep.ops) {
      switch (op.type) {
        case WriteBatch::Rep::OpType::kPut:
          s = wb.Put(database.cf(op.column), op.key, op.value);
          break;
        case WriteBatch::Rep::OpType::kMerge:
          s = wb.Merge(database.cf(op.column), op.key, op.value);
          break;
        case WriteBatch::Rep::OpType::kDeleteRange:
          s = wb.DeleteRange(database.cf(op.column), op.key, op.value);
          break;
      }
      if (!s.ok()) return FromRocks(s);
    }
    for (const auto& [service, summary] : rep.services) {
      s = wb.Merge(database.cf(Column::kServices), service,
                   EncodeServiceSummary(summary.first_window_ms, summary.last_window_ms,
                                               summary.total_samples));
      if (!s.ok()) return FromRocks(s);
    }
    for (const WriteBatch::Rep::Sequence& q : rep.sequences) {
      s = wb.Put(database.cf(Column::kMeta), SequenceKey(q.agent_id, q.incarnation),
                 EncodeCount(q.sequence));
      if (!s.ok()) return FromRocks(s);
    }
    if (updates != nullptr) {
      absl::Status merged = rollups->AddRollupMerges(rep, &wb, updates);
      if (!merged.ok()) return merged;
    }
    rocksdb::WriteOptions wo;
    wo.sync = options.sync;
    if (absl::Status resumed = ResumeAfterWriteError(); !resumed.ok()) return resumed;
    s = database.db->Write(wo, &wb);
    if (!s.ok()) {
      write_errors.fetch_add(1, std::memory_order_relaxed);
      absl::MutexLock lock(&resume_mu);
      if (!write_failed) LogError("store: writes fail: {}", s.ToString());
      write_failed = true;
      writes_failing = true;
    }
    return FromRocks(s);
  }

  absl::Status RollUp(int64_t up_to_ms) {
    absl::StatusOr<RollupStats> rolled = rollups->RollUp(up_to_ms);
    if (!rolled.ok()) return rolled.status();
    rollup_minute_cells.fetch_add(rolled->minute_cells, std::memory_order_relaxed);
    rollup_hour_cells.fetch_add(rolled->hour_cells, std::memory_order_relaxed);
    return absl::OkStatus();
  }

  void RunRoller() {
    absl::MutexLock lock(&roller_mu);
    while (!roller_stop) {
      roller_wake.WaitWithTimeout(&roller_mu, absl::Milliseconds(options.rollup_interval_ms));
      if (roller_stop) break;
      roller_mu.Unlock();
      absl::Status rolled = RollUp(now_ms() - options.rollup_delay_ms);
      if (!rolled.ok()) LogError("store: rolling up samples: {}", rolled.ToString());
      roller_mu.Lock();
    }
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
    rocksdb::Status r = database.db->Resume();
    if (r.IsBusy()) {
      // RocksDB's own recovery runs (its Busy says nothing more): it resumes writes itself
      // once the disk has room again.
      return absl::UnavailableError(
          "the store cannot write (disk full or failing); RocksDB is recovering and resumes "
          "writes once the disk has room");
    }
    if (!r.ok()) {
      return absl::UnavailableError(absl::StrCat(
          "the store cannot write (disk full or failing); resuming failed: ", r.ToString()));
    }
    write_failed = false;
    writes_failing = false;
    resumes.fetch_add(1, std::memory_order_relaxed);
    LogInfo("store: writes resumed");
    return absl::OkStatus();
  }
};

Store::Store(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Store::~Store() { Close().IgnoreError(); }

absl::StatusOr<std::unique_ptr<Store>> Store::Open(const std::string& dir,
                                                   const StoreOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->blocks = std::make_unique<RollupBlocks>(options.hour_block_cache_bytes);
  // The clock retention uses, Unix milliseconds.
  std::function<int64_t()> now_ms = options.now_ms_for_testing;
  if (!now_ms) now_ms = base::NowMs;

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
      impl->retention_filters.push_back(NewRetentionFilter(retention_ms, now_ms));
      cf_options.compaction_filter = impl->retention_filters.back().get();
      cf_options.periodic_compaction_seconds = PeriodicCompactionSeconds(retention_ms);
    } else if (column == Column::kMeta) {
      cf_options.merge_operator = NewLeafAddressSumOperator(impl->malformed);
      if (options.raw_retention_ms > 0 || options.hour_retention_ms > 0) {
        impl->retention_filters.push_back(NewMetaRetentionFilter(
            options.raw_retention_ms, options.hour_retention_ms, now_ms));
        cf_options.compaction_filter = impl->retention_filters.back().get();
        cf_options.periodic_compaction_seconds = PeriodicCompactionSeconds(
            options.raw_retention_ms > 0 ? options.raw_retention_ms : options.hour_retention_ms);
      }
    } else if (column == Column::kServices) {
      cf_options.merge_operator = NewServiceSummaryOperator(impl->malformed);
    }
    cf_options.table_factory = table_factory(cells);
    descriptors.emplace_back(kColumnNames[i], cf_options);
  }
  // RocksDB always has a default column family; the store keeps nothing in it.
  descriptors.emplace_back(rocksdb::kDefaultColumnFamilyName, rocksdb::ColumnFamilyOptions());

  if (absl::Status checked = CheckDataDirectory(dir); !checked.ok()) return checked;
  if (options.create_if_missing) {
    if (absl::Status created = CreateDirectories(dir, "data directory"); !created.ok()) {
      return created;
    }
  }
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::Status s = rocksdb::DB::Open(db_options, dir, descriptors, &handles, &impl->database.db);
  if (s.IsIOError() && s.ToString().find("lock file") != std::string::npos &&
      s.ToString().find("temporarily unavailable") != std::string::npos) {
    return absl::FailedPreconditionError(
        "another process has it open (a strata-server running on it?): " + s.ToString());
  }
  if (!s.ok()) return FromRocks(s);
  MarkDataDirectory(dir);
  for (size_t i = 0; i < kNumColumns; ++i) impl->database.columns[i] = handles[i];
  impl->database.db->DestroyColumnFamilyHandle(handles.back()).PermitUncheckedError();
  impl->interner = std::make_unique<Interner>(&impl->database, options.intern_cache_entries,
                                              options.id_hash_for_testing);
  // Hourly leaf-address records are complete from the first full hour after this store began
  // writing them; a store that has no leaf addresses yet has them complete from the start.
  {
    std::string since;
    rocksdb::Status got = impl->database.db->Get(rocksdb::ReadOptions(),
                                                 impl->database.cf(Column::kMeta),
                                                 LeafAddressHoursSinceKey(), &since);
    if (got.IsNotFound()) {
      absl::StatusOr<bool> has_batches =
          impl->database.HasRecords(Column::kMeta, std::string(1, kLeafAddressTag));
      if (!has_batches.ok()) return has_batches.status();
      const int64_t first = *has_batches ? (now_ms() / kHourMs + 1) * kHourMs : 0;
      got = impl->database.db->Put(rocksdb::WriteOptions(), impl->database.cf(Column::kMeta),
                                   LeafAddressHoursSinceKey(),
                                   EncodeCount(static_cast<uint64_t>(first)));
    }
    if (!got.ok()) return FromRocks(got);
  }
  impl->rollups = std::make_unique<Rollups>(&impl->database, impl->blocks.get());
  if (absl::Status loaded = impl->rollups->Load(now_ms()); !loaded.ok()) return loaded;
  impl->samples = std::make_unique<SampleReader>(
      &impl->database, impl->blocks.get(), impl->rollups.get(),
      SampleReader::Retention{options.minute_retention_ms, options.hour_retention_ms}, now_ms);
  impl->now_ms = std::move(now_ms);
  if (options.rollup_interval_ms > 0) {
    Impl* roller = impl.get();
    impl->roller = std::thread([roller] { roller->RunRoller(); });
  }
  impl->meta = std::make_unique<MetaRecords>(&impl->database);
  return std::unique_ptr<Store>(new Store(std::move(impl)));
}

absl::Status Store::Close() {
  std::lock_guard<std::mutex> lock(impl_->close_mu);
  if (impl_->closed) return impl_->close_status;
  impl_->closed = true;
  if (impl_->roller.joinable()) {
    {
      absl::MutexLock lock(&impl_->roller_mu);
      impl_->roller_stop = true;
      impl_->roller_wake.Signal();
    }
    impl_->roller.join();
  }
  rocksdb::FlushOptions fo;
  fo.wait = true;
  std::vector<rocksdb::ColumnFamilyHandle*> handles(impl_->database.columns.begin(), impl_->database.columns.end());
  absl::Status status = FromRocks(impl_->database.db->Flush(fo, handles));
  for (rocksdb::ColumnFamilyHandle* h : handles) {
    impl_->database.db->DestroyColumnFamilyHandle(h).PermitUncheckedError();
  }
  absl::Status close = FromRocks(impl_->database.db->Close());
  if (status.ok()) status = close;
  delete impl_->database.db;
  impl_->database.db = nullptr;
  impl_->close_status = status;
  return status;
}

absl::Status Store::Commit(WriteBatch* batch) {
  WriteBatch::Rep& rep = BatchAccess::Of(batch);
  if (!rep.status.ok()) return rep.status;

  // Lock the stripes of every agent whose sequence this batch advances, in stripe order,
  // so that checking and advancing a sequence is atomic against other commits.
  std::vector<size_t> stripes;
  for (const WriteBatch::Rep::Sequence& q : rep.sequences) {
    stripes.push_back(Hash64(q.agent_id, q.incarnation) % kSequenceStripes);
  }
  std::sort(stripes.begin(), stripes.end());
  stripes.erase(std::unique(stripes.begin(), stripes.end()), stripes.end());
  for (size_t stripe : stripes) impl_->sequence_mu[stripe].Lock();
  absl::Status status;
  for (const WriteBatch::Rep::Sequence& q : rep.sequences) {
    auto& cached = impl_->applied_sequences[Hash64(q.agent_id, q.incarnation) % kSequenceStripes];
    const std::string key = SequenceKey(q.agent_id, q.incarnation);
    absl::StatusOr<uint64_t> applied;
    if (auto it = cached.find(key); it != cached.end()) {
      applied = it->second;
    } else {
      applied = impl_->meta->AppliedSequence(q.agent_id, q.incarnation);
    }
    if (!applied.ok()) {
      status = applied.status();
    } else if (q.sequence <= *applied) {
      status = absl::AlreadyExistsError(absl::StrCat("agent ", q.agent_id, " batch ",
                                                     q.sequence, " already applied (last ",
                                                     *applied, ")"));
    }
    if (!status.ok()) break;
  }
  if (status.ok()) {
    if (rep.cell_ops.empty()) {
      status = impl_->Write(rep, nullptr);
    } else {
      absl::MutexLock rollup_lock(&impl_->rollups->CommitLock());
      Rollups::Updates updates;
      status = impl_->Write(rep, &updates);
      if (status.ok()) impl_->rollups->Committed(updates);
    }
    for (const WriteBatch::Rep::Sequence& q : rep.sequences) {
      auto& cached =
          impl_->applied_sequences[Hash64(q.agent_id, q.incarnation) % kSequenceStripes];
      if (!status.ok()) {
        cached.erase(SequenceKey(q.agent_id, q.incarnation));
        continue;
      }
      // Bounded: agents come and go; a cleared stripe reads each agent's sequence once more.
      if (cached.size() >= kMaxCachedSequencesPerStripe) cached.clear();
      cached[SequenceKey(q.agent_id, q.incarnation)] = q.sequence;
    }
  }
  for (auto it = stripes.rbegin(); it != stripes.rend(); ++it) impl_->sequence_mu[*it].Unlock();
  // After the write is visible (see BlockCache); also after a failed write, which may
  // have been applied before failing to report.
  for (const auto& [service, minute] : rep.touched_minutes) {
    impl_->blocks->InvalidateMinute(service, minute);
  }
  if (!status.ok()) return status;

  impl_->interner->MarkCommitted(batch);
  batch->Clear();
  return absl::OkStatus();
}

absl::Status Store::RollUp(int64_t up_to_ms) { return impl_->RollUp(up_to_ms); }

Interner& Store::interner() { return *impl_->interner; }
SampleReader& Store::samples() { return *impl_->samples; }
MetaRecords& Store::meta() { return *impl_->meta; }
const StoreOptions& Store::options() const { return impl_->options; }

uint64_t Store::ApproximateBytesOnDisk() {
  uint64_t total = 0;
  for (rocksdb::ColumnFamilyHandle* h : impl_->database.columns) {
    uint64_t bytes = 0;
    if (impl_->database.db->GetIntProperty(h, rocksdb::DB::Properties::kLiveSstFilesSize, &bytes)) {
      total += bytes;
    }
  }
  rocksdb::VectorLogPtr wal_files;
  if (impl_->database.db->GetSortedWalFiles(wal_files).ok()) {
    for (const auto& f : wal_files) total += f->SizeFileBytes();
  }
  return total;
}

bool Store::WritesFailing() { return impl_->writes_failing; }

StoreStats Store::Stats() {
  StoreStats stats;
  stats.malformed_merge_operands = impl_->malformed->load(std::memory_order_relaxed);
  stats.id_collisions = impl_->interner->collisions();
  stats.stack_cache_entries = impl_->interner->stack_cache_entries();
  stats.function_cache_entries = impl_->interner->function_cache_entries();
  stats.cells_scanned = impl_->samples->cells_scanned();
  stats.write_errors = impl_->write_errors.load(std::memory_order_relaxed);
  stats.write_resumes = impl_->resumes.load(std::memory_order_relaxed);
  stats.rollup_minute_cells = impl_->rollup_minute_cells.load(std::memory_order_relaxed);
  stats.rollup_hour_cells = impl_->rollup_hour_cells.load(std::memory_order_relaxed);
  const BlockCache::Counters hour_blocks = impl_->blocks->hours.counters();
  stats.hour_block_hits = hour_blocks.hits;
  stats.hour_block_misses = hour_blocks.misses;
  stats.hour_block_bytes = hour_blocks.bytes;
  const BlockCache::Counters minute_blocks = impl_->blocks->minutes.counters();
  stats.minute_block_hits = minute_blocks.hits;
  stats.minute_block_misses = minute_blocks.misses;
  stats.minute_block_bytes = minute_blocks.bytes;
  const BlockCache::Counters spans = impl_->blocks->span_counters();
  stats.span_hits = spans.hits;
  stats.span_misses = spans.misses;
  stats.span_bytes = spans.bytes;
  for (rocksdb::ColumnFamilyHandle* h : impl_->database.columns) {
    uint64_t v = 0;
    if (impl_->database.db->GetIntProperty(h, rocksdb::DB::Properties::kSizeAllMemTables, &v)) {
      stats.memtable_bytes += v;
    }
    if (impl_->database.db->GetIntProperty(h, rocksdb::DB::Properties::kEstimateTableReadersMem, &v)) {
      stats.table_reader_bytes += v;
    }
  }
  if (impl_->block_cache) stats.block_cache_bytes = impl_->block_cache->GetUsage();
  return stats;
}

absl::Status Store::CompactAll() {
  rocksdb::CompactRangeOptions options;
  options.bottommost_level_compaction = rocksdb::BottommostLevelCompaction::kForce;
  for (rocksdb::ColumnFamilyHandle* h : impl_->database.columns) {
    absl::Status s = FromRocks(impl_->database.db->CompactRange(options, h, nullptr, nullptr));
    if (!s.ok()) return s;
  }
  // Retention may have dropped rollup rows that cached blocks still hold.
  impl_->blocks->Clear();
  return absl::OkStatus();
}

absl::Status Store::PutRawForTesting(Column column, std::string_view key, std::string_view value) {
  absl::Status s = FromRocks(
      impl_->database.db->Put(rocksdb::WriteOptions(), impl_->database.cf(column), ToSlice(key), ToSlice(value)));
  impl_->blocks->Clear();  // bypasses the commit path that invalidates blocks
  return s;
}

}  // namespace strata::server::store
