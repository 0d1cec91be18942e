#include "server/aggregate/window_aggregator.h"

#include <algorithm>
#include <bit>
#include <limits>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/clock.h"
#include "common/base/log.h"
#include "common/base/saturating.h"
#include "common/encoding/packed_contexts.h"  // AppendVarint, ReadVarint
#include "server/aggregate/phase_event.h"

namespace strata::server::aggregate {
namespace {

using commit::kWindowMs;
using encoding::AppendVarint;
using encoding::ReadVarint;

// Journal record: version, host, window, then cells (service, stack, count[, label set]).
// Version 2 adds each cell's label set ID; version 1 records (no labels) still decode.
constexpr uint8_t kJournalVersion = 2;

void AppendString(std::string* out, std::string_view s) {
  AppendVarint(out, s.size());
  out->append(s);
}

bool ReadString(std::string_view in, size_t* pos, std::string* s) {
  uint64_t n = 0;
  if (!ReadVarint(in, pos, &n) || n > in.size() - *pos) return false;
  s->assign(in.substr(*pos, n));
  *pos += n;
  return true;
}

struct JournalCell {
  std::string service;
  int64_t window_start_ms;
  uint64_t stack_id;
  uint64_t count;
  uint64_t label_set = 0;
};

// Cells of one batch, grouped by service (one window per batch).
std::string EncodeJournalRecord(const std::string& host, int64_t window_start_ms,
                                const std::vector<const commit::BatchCommitter::Cell*>& cells) {
  std::string out;
  out.push_back(static_cast<char>(kJournalVersion));
  AppendString(&out, host);
  AppendVarint(&out, static_cast<uint64_t>(window_start_ms));
  AppendVarint(&out, cells.size());
  const std::string* service = nullptr;
  for (const commit::BatchCommitter::Cell* c : cells) {
    // A service name is written when it changes; 0 length repeats the previous one (service
    // names are never empty).
    if (service != nullptr && *c->service == *service) {
      AppendVarint(&out, 0);
    } else {
      AppendString(&out, *c->service);
      service = c->service;
    }
    AppendVarint(&out, c->stack_id);
    AppendVarint(&out, c->count);
    AppendVarint(&out, c->label_set);
  }
  return out;
}

absl::Status DecodeJournalRecord(std::string_view in, std::string* host,
                                 std::vector<JournalCell>* cells) {
  auto corrupt = [](const char* what) {
    return absl::DataLossError(absl::StrCat("corrupt journal record: ", what));
  };
  if (in.empty() || (static_cast<uint8_t>(in[0]) != kJournalVersion &&
                     static_cast<uint8_t>(in[0]) != 1)) {
    return corrupt("version");
  }
  const bool has_labels = static_cast<uint8_t>(in[0]) >= 2;
  size_t pos = 1;
  uint64_t window = 0, n = 0;
  if (!ReadString(in, &pos, host)) return corrupt("host");
  if (!ReadVarint(in, &pos, &window) ||
      window > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return corrupt("window");
  }
  if (!ReadVarint(in, &pos, &n) || n > in.size() - pos) return corrupt("cell count");
  std::string service;
  for (uint64_t i = 0; i < n; ++i) {
    uint64_t len = 0;
    const size_t at = pos;
    if (!ReadVarint(in, &pos, &len)) return corrupt("service");
    if (len != 0) {
      pos = at;
      if (!ReadString(in, &pos, &service)) return corrupt("service");
    } else if (service.empty()) {
      return corrupt("first cell without a service");
    }
    JournalCell cell{service, static_cast<int64_t>(window), 0, 0};
    if (!ReadVarint(in, &pos, &cell.stack_id) || !ReadVarint(in, &pos, &cell.count) ||
        (has_labels && !ReadVarint(in, &pos, &cell.label_set))) {
      return corrupt("cell");
    }
    cells->push_back(std::move(cell));
  }
  if (pos != in.size()) return corrupt("trailing bytes");
  return absl::OkStatus();
}

// Counts of pending flushes past which a batch writes them itself instead of leaving them to
// the ticker (back pressure when the store falls behind).
constexpr size_t kMaxPendingCells = size_t{1} << 21;

}  // namespace

absl::StatusOr<std::unique_ptr<WindowAggregator>> WindowAggregator::Create(
    store::Store* store, AggregatorOptions options) {
  if (options.max_entries == 0 || options.max_entries > (1u << 24)) {
    return absl::InvalidArgumentError("table entries must be in [1, 2^24]");
  }
  if (options.close_delay_ms < 0) return absl::InvalidArgumentError("negative close delay");
  options.initial_entries = std::clamp<uint32_t>(options.initial_entries, 1, options.max_entries);
  table::SortedTableOptions t;
  t.max_entries = options.max_entries;
  t.bucket_count = options.bucket_count;
  t.period = 0;  // one period per window, ended at the window's close
  t.depth_threshold = options.depth_threshold;
  t.frequency_threshold = options.hot_threshold;
  t.phase_change_factor = options.phase_change_factor;
  t.phase_rank_limit = options.phase_rank_limit;
  // Validate once, so that creating or growing a service's table later cannot fail.
  if (auto probe = Table::Create({.max_entries = 1, .period = 0,
                                  .frequency_threshold = t.frequency_threshold,
                                  .phase_change_factor = t.phase_change_factor});
      !probe.ok()) {
    return probe.status();
  }
  std::unique_ptr<WindowAggregator> aggregator(new WindowAggregator(store, options, t));
  const size_t smallest = Table::MemoryBytesFor(aggregator->TableOptions(options.initial_entries));
  if (options.memory_budget_bytes < smallest) {
    return absl::InvalidArgumentError(absl::StrCat("table memory budget of ",
                                                   options.memory_budget_bytes,
                                                   " bytes is below one table (", smallest, ")"));
  }
  if (absl::Status s = aggregator->Recover(); !s.ok()) return s;
  return aggregator;
}

WindowAggregator::WindowAggregator(store::Store* store, AggregatorOptions options,
                                   table::SortedTableOptions table_options)
    : store_(store), options_(options), table_options_(table_options) {}

WindowAggregator::~WindowAggregator() { Stop(); }

absl::Status WindowAggregator::Recover() {
  // Services whose cells of the older records were written before the process ended.
  absl::StatusOr<std::map<std::string, uint64_t>> written = store_->meta().JournalWritten();
  if (!written.ok()) return written.status();
  store::WriteBatch wb;
  uint64_t last = 0, records = 0, corrupt = 0, skipped = 0;
  std::vector<JournalCell> cells;
  std::string host;
  absl::Status s = store_->meta().ScanJournal([&](uint64_t seq, std::string_view record) {
    last = seq;
    cells.clear();
    if (absl::Status d = DecodeJournalRecord(record, &host, &cells); !d.ok()) {
      // Nothing else can recover these samples; the rest of the journal still is.
      LogError("journal record {}: {}; its samples are skipped", seq, d.ToString());
      ++corrupt;
      return absl::OkStatus();
    }
    for (const JournalCell& c : cells) {
      if (auto w = written->find(c.service); w != written->end() && seq < w->second) {
        ++skipped;
        continue;
      }
      wb.AddSamples(c.service, c.window_start_ms, host, c.stack_id, c.count, c.label_set);
    }
    ++records;
    return absl::OkStatus();
  });
  if (!s.ok()) return s;
  if (!written->empty()) wb.DeleteJournalWritten();
  if (last == 0) return written->empty() ? absl::OkStatus() : store_->Commit(&wb);
  wb.DeleteJournalBefore(last + 1);
  if (absl::Status c = store_->Commit(&wb); !c.ok()) return c;
  absl::MutexLock lock(&mu_);
  next_journal_ = last + 1;
  stats_.recovered_records = records;
  LogInfo("wrote {} journal records of an earlier run to the store ({} corrupt, {} cells "
          "written before)", records, corrupt, skipped);
  return absl::OkStatus();
}

table::SortedTableOptions WindowAggregator::TableOptions(uint32_t entries) const {
  table::SortedTableOptions t = table_options_;
  t.max_entries = entries;
  // Chains scale with the entries (a quarter of them by default); phase changes buffered per
  // window with the table, from 64 (a small table has few hot entries to reorder) to 1024.
  const uint64_t buckets_at_max = table_options_.bucket_count != 0
                                      ? table_options_.bucket_count
                                      : std::max<uint32_t>(2, options_.max_entries / 4);
  t.bucket_count = static_cast<uint32_t>(
      std::max<uint64_t>(2, buckets_at_max * entries / options_.max_entries));
  t.max_phase_changes = std::clamp<uint32_t>(entries / 4, 64, 1024);
  return t;
}

bool WindowAggregator::Reserve(size_t bytes, const ServiceTable* keep) {
  if (table_bytes_ + bytes <= options_.memory_budget_bytes) return true;
  std::vector<std::pair<uint64_t, std::string>> idle;  // (last used, service)
  for (const auto& [service, t] : tables_) {
    if (t.get() != keep && !t->open && t->live_total == 0 && t->pending_flushes == 0) {
      idle.push_back({t->last_used, service});
    }
  }
  std::sort(idle.begin(), idle.end());
  for (const auto& [last_used, service] : idle) {
    if (table_bytes_ + bytes <= options_.memory_budget_bytes) break;
    auto it = tables_.find(service);
    table_bytes_ -= it->second->table.memory_bytes();
    tables_.erase(it);
    ++generation_;
    ++stats_.tables_released;
  }
  return table_bytes_ + bytes <= options_.memory_budget_bytes;
}

bool WindowAggregator::GrowTable(ServiceTable& t, size_t wanted) {
  const size_t capacity = t.table.capacity();
  if (capacity >= options_.max_entries) return false;
  const uint32_t entries = static_cast<uint32_t>(std::min<uint64_t>(
      options_.max_entries, std::bit_ceil(std::max<uint64_t>(2 * capacity, wanted))));
  const table::SortedTableOptions grown = TableOptions(entries);
  const size_t before = t.table.memory_bytes();
  const size_t after = Table::MemoryBytesFor(grown);
  if (!Reserve(after - before, &t)) {
    ++stats_.growth_refused;
    return false;
  }
  if (absl::Status s = t.table.Grow(grown); !s.ok()) {
    // Only options Create() validated reach here.
    LogError("growing an aggregation table: {}", s.ToString());
    return false;
  }
  table_bytes_ = table_bytes_ - before + t.table.memory_bytes();
  ++stats_.tables_grown;
  return true;
}

void WindowAggregator::ReleaseIdle(int64_t now_ms) {
  const int64_t idle_ms = int64_t{options_.idle_windows} * kWindowMs + options_.close_delay_ms;
  for (auto it = tables_.begin(); it != tables_.end();) {
    const ServiceTable& t = *it->second;
    if (!t.open && t.live_total == 0 && t.pending_flushes == 0 &&
        t.last_closed_ms + kWindowMs + idle_ms <= now_ms) {
      table_bytes_ -= t.table.memory_bytes();
      it = tables_.erase(it);
      ++generation_;
      ++stats_.tables_released;
    } else {
      ++it;
    }
  }
}

uint32_t WindowAggregator::InternHost(const std::string& host) {
  auto [it, inserted] = host_index_.try_emplace(host, static_cast<uint32_t>(hosts_.size()));
  if (inserted) hosts_.push_back(host);
  return it->second;
}

uint32_t WindowAggregator::InternLabelSet(uint64_t label_set) {
  auto [it, inserted] =
      label_index_.try_emplace(label_set, static_cast<uint32_t>(label_sets_.size()));
  if (inserted) label_sets_.push_back(label_set);
  return it->second;
}

uint64_t WindowAggregator::JournalWatermark(const PendingFlush* except) const {
  uint64_t watermark = next_journal_;
  for (const auto& [service, t] : tables_) watermark = std::min(watermark, t->first_journal);
  for (const PendingFlush& p : pending_) {
    if (&p != except) watermark = std::min(watermark, p.first_journal);
  }
  return watermark;
}

absl::Status WindowAggregator::CommitBatch(store::WriteBatch* wb, const std::string& host,
                                           int64_t window_start_ms,
                                           const std::vector<Cell>& cells) {
  // Nothing for the tables (capture batches, empty intervals): the records go straight to the
  // store, without holding the tables' lock across the write.
  if (cells.empty()) return store_->Commit(wb);
  absl::Status status = CommitBatchLocked(wb, host, window_start_ms, cells);
  bool drain_here = false;
  {
    absl::MutexLock lock(&mu_);
    if (!pending_.empty()) {
      // The ticker writes pending flushes in the background; without one (tests, tools), or
      // when they pile up, the batch that made them writes them.
      drain_here = !ticker_.joinable() || pending_cells_ > kMaxPendingCells;
      if (!drain_here) wake_.Signal();
    }
  }
  if (drain_here) {
    if (absl::Status d = DrainPending(); !d.ok()) {
      LogError("writing aggregation windows: {}", d.ToString());
    }
  }
  return status;
}

absl::Status WindowAggregator::CommitBatchLocked(store::WriteBatch* wb, const std::string& host,
                                                 int64_t window_start_ms,
                                                 const std::vector<Cell>& cells) {
  // A batch from a clock far ahead must not close the windows everybody else still fills:
  // its cells are written directly.
  const bool from_future = window_start_ms > base::NowMs() + 2 * kWindowMs;
  absl::MutexLock lock(&mu_);
  // Where each service's cells go: its table (open window) or the store (closed window).
  std::map<std::string_view, size_t> per_service;  // service -> cells (new entries at most)
  for (const Cell& c : cells) ++per_service[*c.service];
  // Services without a table get one, all or none: a batch the budget cannot hold even
  // after releasing idle tables is refused before anything is written.
  if (!from_future) {
    size_t missing = 0;
    for (const auto& [service_name, incoming] : per_service) {
      if (!tables_.contains(service_name)) ++missing;
    }
    const table::SortedTableOptions initial = TableOptions(options_.initial_entries);
    const size_t bytes = Table::MemoryBytesFor(initial);
    if (missing != 0 && !Reserve(missing * bytes, nullptr)) {
      ++stats_.budget_refusals;
      return absl::ResourceExhaustedError(absl::StrCat(
          "aggregation tables are at their memory budget (", table_bytes_, " of ",
          options_.memory_budget_bytes, " bytes in ", tables_.size(),
          " tables; strata-server --table-memory): ", missing,
          " new services refused, retry later"));
    }
    for (const auto& [service_name, incoming] : per_service) {
      if (tables_.contains(service_name)) continue;
      absl::StatusOr<Table> table = Table::Create(initial);
      if (!table.ok()) return table.status();
      auto t = std::make_unique<ServiceTable>(*std::move(table));
      t->generation = ++generation_;
      table_bytes_ += t->table.memory_bytes();
      tables_.emplace(std::string(service_name), std::move(t));
    }
  }
  const uint32_t host_id = InternHost(host);
  ++use_clock_;
  std::map<std::string_view, ServiceTable*> tabled;
  for (const auto& [service_name, incoming] : per_service) {
    if (from_future) break;
    const std::string service(service_name);
    ServiceTable& table = *tables_.find(service_name)->second;
    table.last_used = use_clock_;
    if (table.open && window_start_ms > table.window_start_ms) {
      Flush(service, table, /*close_window=*/true);
    }
    if (!table.open && window_start_ms > table.last_closed_ms) {
      table.open = true;
      table.window_start_ms = window_start_ms;
    }
    if (!table.open || table.window_start_ms != window_start_ms) continue;  // late
    if (incoming > options_.max_entries) continue;  // cannot fit even when empty
    if (table.table.size() + incoming > table.table.capacity() &&
        !GrowTable(table, table.table.size() + incoming)) {
      Flush(service, table, /*close_window=*/false);
      MakeRoom(table, incoming);
    }
    if (table.table.size() + incoming > table.table.capacity()) continue;  // still too small
    tabled.emplace(service_name, &table);
  }

  std::vector<const Cell*> journaled;
  for (const Cell& c : cells) {
    if (c.count == 0) continue;
    if (tabled.contains(*c.service)) {
      journaled.push_back(&c);
    } else {
      wb->AddSamples(*c.service, window_start_ms, host, c.stack_id, c.count, c.label_set);
      ++stats_.direct_cells;
    }
  }
  const uint64_t seq = next_journal_;
  if (!journaled.empty()) {
    wb->PutJournal(seq, EncodeJournalRecord(host, window_start_ms, journaled));
  }
  if (absl::Status s = store_->Commit(wb); !s.ok()) return s;
  if (journaled.empty()) return absl::OkStatus();
  ++next_journal_;
  ++stats_.journal_records;
  for (const Cell* c : journaled) {
    ServiceTable& t = *tabled.at(*c->service);
    // Never kFull: each cell adds at most one entry, and room for all of them was made above.
    t.table.Add(CellKey{host_id, InternLabelSet(c->label_set), c->stack_id}, c->count);
    base::SaturatingAddTo(t.live_total, c->count);
    t.first_journal = std::min(t.first_journal, seq);
  }
  return absl::OkStatus();
}

void WindowAggregator::MakeRoom(ServiceTable& t, size_t incoming) {
  // Entries not seen in the open window go first: their counts are already written.
  t.table.RemoveIf([](const CellKey&, uint64_t, uint32_t period_count) {
    return period_count == 0;
  });
  if (t.table.size() + incoming > t.table.capacity()) t.table.Clear();
  ++stats_.capacity_flushes;
}

void WindowAggregator::Flush(const std::string& service, ServiceTable& t, bool close_window) {
  PendingFlush p;
  p.service = service;
  p.window_start_ms = t.window_start_ms;
  p.wb = std::make_unique<store::WriteBatch>();
  if (close_window) {
    t.table.EndPeriod();
    std::vector<table::PhaseChange<CellKey>> changes = t.table.TakePhaseChanges();
    // Only a reordering within one host (and one label set: one kind of process) is a change
    // of the program's behaviour; across hosts it may just be one host's batch arriving late.
    std::erase_if(changes, [](const auto& c) {
      return c.rose_key.host != c.fell_key.host || c.rose_key.labels != c.fell_key.labels;
    });
    if (!changes.empty()) AddPhaseEvent(service, t.window_start_ms, changes, p.wb.get());
  }
  t.table.ForEach([&](const CellKey& key, uint64_t count) {
    if (count == 0) return;
    p.cells.push_back({key, count});
    p.hosts.try_emplace(key.host, hosts_[key.host]);
    p.label_sets.try_emplace(key.labels, label_sets_[key.labels]);
    base::SaturatingAddTo(p.total, count);
  });
  p.first_journal = t.first_journal;
  // The table holds every cell of the service journaled so far that is not written yet.
  p.wb->PutJournalWritten(service, next_journal_);
  t.first_journal = kNoJournal;
  t.live_total = 0;
  ++t.pending_flushes;
  pending_cells_ += p.cells.size();
  pending_.push_back(std::move(p));
  if (close_window) {
    // Entries not seen since the last flush are dropped; the others keep their place (and
    // their period history) for the next window, with zero counts.
    t.table.RemoveIf([](const CellKey&, uint64_t count, uint32_t) { return count == 0; });
    t.open = false;
    t.last_closed_ms = t.window_start_ms;
    ++stats_.windows_closed;
  }
  t.table.TakeCounts([](const CellKey&, uint64_t) {});
}

absl::Status WindowAggregator::DrainPending() {
  absl::MutexLock drain(&drain_mu_);
  for (;;) {
    PendingFlush* p = nullptr;
    {
      absl::MutexLock lock(&mu_);
      if (pending_.empty()) return absl::OkStatus();
      // Only this drainer pops, and deque::push_back keeps references: p stays valid.
      p = &pending_.front();
      p->wb->DeleteJournalBefore(JournalWatermark(p));
      // Until the generation changes below, a query cannot tell whether its store read saw
      // this commit: AddLiveCounts and LiveServices wait for it.
      committing_ = true;
    }
    if (!p->cells_in_wb) {
      // Cells in key order (the window is fixed; then host, then stack), so that RocksDB's
      // memtables insert each one next to the previous instead of searching from the top: a
      // thousand services closing their windows together are a million such inserts. The
      // cells themselves stay as they are: queries read them meanwhile.
      // Hosts ranked by name once, so that the sort compares integers, not hash lookups.
      std::vector<std::pair<std::string_view, uint32_t>> host_names;
      host_names.reserve(p->hosts.size());
      for (const auto& [id, name] : p->hosts) host_names.emplace_back(name, id);
      std::sort(host_names.begin(), host_names.end());
      absl::flat_hash_map<uint32_t, uint32_t> host_rank;
      for (uint32_t i = 0; i < host_names.size(); ++i) host_rank[host_names[i].second] = i;
      struct SortedCell {
        uint32_t host_rank;
        uint64_t stack, label_set, count;
      };
      std::vector<SortedCell> sorted;
      sorted.reserve(p->cells.size());
      for (const auto& [key, count] : p->cells) {
        sorted.push_back({host_rank.at(key.host), key.stack, p->label_sets.at(key.labels), count});
      }
      std::sort(sorted.begin(), sorted.end(), [](const SortedCell& a, const SortedCell& b) {
        return std::tie(a.host_rank, a.stack, a.label_set) <
               std::tie(b.host_rank, b.stack, b.label_set);
      });
      for (const SortedCell& c : sorted) {
        p->wb->AddSamples(p->service, p->window_start_ms, host_names[c.host_rank].first, c.stack,
                          c.count, c.label_set);
      }
      p->cells_in_wb = true;
    }
    absl::Status committed = store_->Commit(p->wb.get());
    absl::MutexLock lock(&mu_);
    committing_ = false;
    if (!committed.ok()) {
      // The counts stay pending (queries still see them) and in the journal.
      return absl::Status(committed.code(),
                          absl::StrCat("writing window ", p->window_start_ms, " of ", p->service,
                                       ": ", committed.message()));
    }
    auto it = tables_.find(p->service);
    if (it != tables_.end()) {
      it->second->generation = ++generation_;
      --it->second->pending_flushes;
    }
    pending_cells_ -= p->cells.size();
    pending_.pop_front();
  }
}

void WindowAggregator::AddPhaseEvent(const std::string& service, int64_t window_start_ms,
                                     const std::vector<table::PhaseChange<CellKey>>& changes,
                                     store::WriteBatch* wb) {
  aggregate::PhaseEventPayload event;
  event.detected_ms = base::NowMs();
  // Per stack, summed over the hosts whose entries reordered.
  std::map<uint64_t, aggregate::PhaseShift> rose, fell;
  std::set<std::tuple<uint32_t, uint32_t, uint64_t>> rose_seen, fell_seen;
  for (const auto& c : changes) {
    if (rose_seen.insert({c.rose_key.host, c.rose_key.labels, c.rose_key.stack}).second) {
      rose[c.rose_key.stack].count_before += c.rose_prev_count;
      rose[c.rose_key.stack].count_after += c.rose_count;
    }
    if (fell_seen.insert({c.fell_key.host, c.fell_key.labels, c.fell_key.stack}).second) {
      fell[c.fell_key.stack].count_before += c.fell_prev_count;
      fell[c.fell_key.stack].count_after += c.fell_count;
    }
  }
  for (auto& [stack, shift] : rose) {
    shift.stack_id = stack;
    event.rose.push_back(shift);
  }
  for (auto& [stack, shift] : fell) {
    shift.stack_id = stack;
    event.fell.push_back(shift);
  }
  wb->PutPhaseEvent({service, window_start_ms, aggregate::EncodePhaseEvent(event)});
  ++stats_.phase_events;
  LogInfo("phase change in {} (window {}): {} contexts rose, {} fell", service,
               window_start_ms, event.rose.size(), event.fell.size());
}

absl::Status WindowAggregator::CloseDueWindows(int64_t now_ms) {
  {
    absl::MutexLock lock(&mu_);
    for (auto& [service, t] : tables_) {
      if (t->open && t->window_start_ms + kWindowMs + options_.close_delay_ms <= now_ms) {
        Flush(service, *t, /*close_window=*/true);
      }
    }
  }
  absl::Status result = DrainPending();
  absl::MutexLock lock(&mu_);
  ReleaseIdle(now_ms);
  return result;
}

absl::Status WindowAggregator::FlushAll() {
  {
    absl::MutexLock lock(&mu_);
    for (auto& [service, t] : tables_) {
      if (t->open) Flush(service, *t, /*close_window=*/true);
    }
  }
  return DrainPending();
}

void WindowAggregator::Start(absl::Duration tick) {
  if (ticker_.joinable()) return;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = false;
  }
  ticker_ = std::thread([this, tick] {
    // A failing store fails every tick: the first failure is logged, then one a minute.
    uint64_t failures = 0;
    absl::Time logged = absl::InfinitePast();
    for (;;) {
      {
        absl::MutexLock lock(&mu_);
        if (!stopping_ && pending_.empty()) wake_.WaitWithTimeout(&mu_, tick);
        if (stopping_) return;
      }
      if (absl::Status s = CloseDueWindows(base::NowMs()); !s.ok()) {
        ++failures;
        if (absl::Now() - logged >= absl::Minutes(1)) {
          LogError("closing aggregation windows ({} attempts failed so far): {}", failures,
                   s.ToString());
          logged = absl::Now();
        }
        absl::SleepFor(absl::Milliseconds(100));  // a failing store: do not spin
      } else if (failures > 0) {
        LogInfo("closing aggregation windows again, after {} failed attempts", failures);
        failures = 0;
        logged = absl::InfinitePast();
      }
    }
  });
}

void WindowAggregator::Stop() {
  if (!ticker_.joinable()) return;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    wake_.Signal();
  }
  ticker_.join();
}

uint64_t WindowAggregator::FlushGeneration(std::string_view service) const {
  absl::MutexLock lock(&mu_);
  if (service.empty()) return generation_;  // any service: any flush, creation or release
  auto it = tables_.find(service);
  return it == tables_.end() ? 0 : it->second->generation;
}

// Calls add(key, window, count) for each live cell of `query` under mu_, unless the flush
// generation moved (false).
template <typename AddCell>
bool WindowAggregator::VisitLive(const store::SampleQuery& query, uint64_t generation,
                                 AddCell add) const {
  if (query.capture_id) return true;  // captures are written directly
  AwaitNoCommit();
  auto it = tables_.find(query.service);
  if (it == tables_.end()) return generation == 0;  // no table, so no pending flush either
  const ServiceTable& t = *it->second;
  if (generation != t.generation) return false;
  std::optional<uint32_t> host;
  if (query.host) {
    auto h = host_index_.find(*query.host);
    if (h == host_index_.end()) return true;
    host = h->second;
  }
  auto in_range = [&](int64_t window) { return window >= query.from_ms && window < query.to_ms; };
  auto visit = [&](int64_t window, const CellKey& key, uint64_t count) {
    if (count == 0 || (host && key.host != *host)) return;
    if (query.hosts && !query.hosts->contains(hosts_[key.host])) return;
    if (query.label_sets && !query.label_sets->contains(label_sets_[key.labels])) return;
    add(key, window, count);
  };
  if (t.live_total != 0 && in_range(t.window_start_ms)) {
    t.table.ForEach([&](const CellKey& key, uint64_t count) {
      visit(t.window_start_ms, key, count);
    });
  }
  if (t.pending_flushes != 0) {
    for (const PendingFlush& p : pending_) {
      if (p.service != query.service || !in_range(p.window_start_ms)) continue;
      for (const auto& [key, count] : p.cells) visit(p.window_start_ms, key, count);
    }
  }
  return true;
}

bool WindowAggregator::AddLiveCounts(const store::SampleQuery& query, uint64_t generation,
                                     absl::flat_hash_map<uint64_t, uint64_t>* stacks,
                                     absl::flat_hash_map<std::string, uint64_t>* hosts) const {
  absl::MutexLock lock(&mu_);
  std::map<uint32_t, uint64_t> seen_hosts;
  if (!VisitLive(query, generation, [&](const CellKey& key, int64_t, uint64_t count) {
        base::SaturatingAddTo((*stacks)[key.stack], count);
        base::SaturatingAddTo(seen_hosts[key.host], count);
      })) {
    return false;
  }
  for (const auto& [h, count] : seen_hosts) base::SaturatingAddTo((*hosts)[hosts_[h]], count);
  return true;
}

bool WindowAggregator::ForEachLiveCell(const store::SampleQuery& query, uint64_t generation,
                                       LiveCellFn fn) const {
  absl::MutexLock lock(&mu_);
  return VisitLive(query, generation, [&](const CellKey& key, int64_t window, uint64_t count) {
    fn(window, hosts_[key.host], key.stack, label_sets_[key.labels], count);
  });
}

void WindowAggregator::AwaitNoCommit() const {
  mu_.Await(absl::Condition(+[](const bool* committing) { return !*committing; }, &committing_));
}

std::vector<store::ServiceSummary> WindowAggregator::LiveServices() const {
  absl::MutexLock lock(&mu_);
  AwaitNoCommit();
  std::map<std::string, store::ServiceSummary, std::less<>> by_service;
  auto add = [&](const std::string& service, int64_t window, uint64_t total) {
    auto [it, inserted] = by_service.try_emplace(service, store::ServiceSummary{service, window,
                                                                               window, 0});
    it->second.first_window_ms = std::min(it->second.first_window_ms, window);
    it->second.last_window_ms = std::max(it->second.last_window_ms, window);
    base::SaturatingAddTo(it->second.total_samples, total);
  };
  for (const auto& [service, t] : tables_) {
    if (t->live_total != 0) add(service, t->window_start_ms, t->live_total);
  }
  for (const PendingFlush& p : pending_) {
    if (p.total != 0) add(p.service, p.window_start_ms, p.total);
  }
  std::vector<store::ServiceSummary> out;
  for (auto& [service, summary] : by_service) out.push_back(std::move(summary));
  return out;
}

AggregatorStats WindowAggregator::stats() const {
  absl::MutexLock lock(&mu_);
  AggregatorStats s = stats_;
  s.live_entries = 0;
  for (const auto& [service, t] : tables_) s.live_entries += t->table.size();
  s.tables = tables_.size();
  s.table_bytes = table_bytes_;
  return s;
}

}  // namespace strata::server::aggregate
