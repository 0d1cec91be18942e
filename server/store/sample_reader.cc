#include "server/store/sample_reader.h"

#include <algorithm>
#include <atomic>
#include <climits>
#include <optional>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/base/saturating.h"
#include "server/store/block_cache.h"
#include "server/store/cell_cursor.h"
#include "server/store/codec.h"
#include "server/store/db.h"
#include "server/store/rollup_plan.h"
#include "server/store/rollups.h"
#include "server/store/stack_counts.h"

namespace strata::server::store {
namespace {

// Per-stack sums and contributing hosts while reducing a query's cells.
struct Totals {
  absl::flat_hash_map<uint64_t, uint64_t> counts;
  absl::flat_hash_map<std::string, uint64_t> hosts;  // samples per host
};

// The scope (service or capture ID) `query` reads, once its strings are valid key parts.
absl::StatusOr<std::string> QueryScope(const SampleQuery& query) {
  const std::string& scope = query.capture_id ? *query.capture_id : query.service;
  if (scope.empty() || !ValidKeyPart(scope)) {
    return absl::InvalidArgumentError("service or capture id must be non-empty, without NUL");
  }
  if (query.host && !ValidKeyPart(*query.host)) {
    return absl::InvalidArgumentError("host must not contain NUL");
  }
  if (query.hosts) {
    for (const std::string& h : *query.hosts) {
      if (!ValidKeyPart(h)) return absl::InvalidArgumentError("host must not contain NUL");
    }
  }
  return scope;
}

// Pieces of fewer whole windows are merged from their blocks every time: spans pay for
// pieces of many blocks that share most of their stacks (a week's hours, an hour's minutes).
constexpr int64_t kMinSpanHours = 8;
constexpr int64_t kMinSpanMinutes = 30;

// The hosts and label sets `query` selects, as part of a span's key: empty for all. Host
// names hold no NUL (QueryScope), which ends each.
std::string SelectionKey(const SampleQuery& query) {
  std::string key;
  if (query.host) {
    key += "host:";
    key += *query.host;
    key.push_back('\0');
  }
  if (query.hosts) {
    std::vector<std::string_view> hosts(query.hosts->begin(), query.hosts->end());
    std::sort(hosts.begin(), hosts.end());
    key += "hosts:";
    for (std::string_view h : hosts) {
      key += h;
      key.push_back('\0');
    }
  }
  if (query.label_sets) {
    std::vector<uint64_t> ids(query.label_sets->begin(), query.label_sets->end());
    std::sort(ids.begin(), ids.end());
    key += "sets:";
    for (uint64_t id : ids) absl::StrAppend(&key, id, ",");
  }
  return key;
}

}  // namespace

struct SampleReader::Impl {
  const Database* database;
  RollupBlocks* blocks;
  const Rollups* rollups;
  Retention retention;
  std::function<int64_t()> now_ms;
  std::atomic<uint64_t> cells_scanned{0};

  // Calls visit(const CellKey&, uint64_t count) for the cells of `scope` in column
  // `column` with window in [from, to) (0 <= from < to), of `host` only when given. The
  // key's views are valid during the call only.
  template <typename Visit>
  absl::Status VisitCells(Column column, const std::string& scope, int64_t from, int64_t to,
                          const std::optional<std::string>& host,
                          const std::optional<absl::flat_hash_set<std::string>>& hosts,
                          Visit&& visit) {
    CellCursor it(*database, column, scope, from, to);
    uint64_t cells = 0;
    while (it->Valid()) {
      absl::StatusOr<CellKey> cell = DecodeCellKey(View(it->key()));
      if (!cell.ok()) return cell.status();
      if (cell->scope != scope) return absl::DataLossError("sample key outside its prefix");
      if (host && cell->host != *host) {
        // Skip to the wanted host in this window, or to the next window once past it.
        if (cell->host < *host) {
          std::string target = CellPrefix(scope, cell->window_start_ms);
          target.append(*host);
          target.push_back('\0');
          it->Seek(target);
        } else {
          it->Seek(CellPrefix(scope, cell->window_start_ms + 1));
        }
        continue;
      }
      if (hosts && !hosts->contains(absl::string_view(cell->host.data(), cell->host.size()))) {
        it->Next();
        continue;
      }
      absl::StatusOr<uint64_t> count = DecodeCount(View(it->value()));
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
    return VisitCells(column, scope, from, to, query.host, query.hosts,
                      [&](const CellKey& cell, uint64_t count) {
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
    uint64_t* host_samples = nullptr;
    return VisitCells(column, scope, from, to, query.host, query.hosts,
                      [&](const CellKey& cell, uint64_t count) {
                        if (query.label_sets && !query.label_sets->contains(cell.label_set)) {
                          return;
                        }
                        if (!query.hosts_only) {
                          base::SaturatingAddTo(totals->counts[cell.stack_id], count);
                        }
                        if (host_samples == nullptr || cell.host != last_host) {
                          last_host.assign(cell.host);
                          host_samples = &totals->hosts[last_host];
                        }
                        base::SaturatingAddTo(*host_samples, count);
                      });
  }

  // Window of the first cell of `scope` in `column` with window in [from, to), or `to`.
  absl::StatusOr<int64_t> NextWindow(Column column, const std::string& scope, int64_t from,
                                     int64_t to) {
    CellCursor it(*database, column, scope, from, to);
    if (!it->Valid()) {
      absl::Status s = FromRocks(it->status());
      if (!s.ok()) return s;
      return to;
    }
    absl::StatusOr<CellKey> cell = DecodeCellKey(View(it->key()));
    if (!cell.ok()) return cell.status();
    if (cell->scope != scope) return absl::DataLossError("sample key outside its prefix");
    if (cell->window_start_ms >= static_cast<uint64_t>(to)) return to;
    return std::max(from, static_cast<int64_t>(cell->window_start_ms));
  }

  // Reads rollup `column` of `scope` with window in [start, end) (all hosts) into a block.
  absl::StatusOr<std::shared_ptr<const RollupBlock>> ReadBlock(Column column,
                                                               const std::string& scope,
                                                               int64_t start, int64_t end) {
    auto block = std::make_shared<RollupBlock>();
    bool labelled = false;  // a cell with a label set was seen: label_sets is kept
    absl::Status s = VisitCells(
        column, scope, start, end, std::nullopt, std::nullopt,
        [&](const CellKey& cell, uint64_t count) {
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

  // Adds the windows in [from, to) of rollup `column` (kRollupHour or kRollupMinute) to
  // `totals`, through its block cache.
  absl::Status SumBlocks(Column column, const std::string& scope, int64_t from, int64_t to,
                         const SampleQuery& query, Totals* totals) {
    const std::optional<std::string>& host = query.host;
    const bool hours = column == Column::kRollupHour;
    const int64_t unit = hours ? kHourMs : kMinuteMs;
    BlockCache& cache = blocks->Of(column);
    std::vector<std::shared_ptr<const RollupBlock>> in_range;
    size_t entries = 0;
    // Windows past their rollup's retention may be dropped by any compaction: read, never
    // cached, so a block does not keep them visible longer than the rollup itself.
    const int64_t retention_ms = hours ? retention.hour_ms : retention.minute_ms;
    const int64_t cutoff = retention_ms > 0 ? now_ms() - retention_ms : INT64_MIN;
    // Windows are visited one by one while in memory; on a miss, the rollup is sought, which
    // also skips every empty window up to the next row, so a range costs its rows and gaps,
    // not its length (ranges may reach to the end of time). A range starting inside a
    // window holds none of it (rollup windows start at its multiples).
    int64_t window = from;
    if (const int64_t into = from % unit; into != 0) {
      if (to - from <= unit - into) return absl::OkStatus();  // no window starts in the range
      window = from + (unit - into);
    }
    while (window < to) {
      // `window` is a multiple of the unit below `to`: the end never overflows.
      const int64_t end = to - window <= unit ? to : window + unit;
      const std::string key = CellPrefix(scope, static_cast<uint64_t>(window));
      const bool cacheable = window >= cutoff;
      uint64_t generation = 0;
      std::shared_ptr<const RollupBlock> block =
          cacheable ? cache.Lookup(key, &generation) : nullptr;
      if (!block) {
        absl::StatusOr<int64_t> next = NextWindow(column, scope, window, to);
        if (!next.ok()) return next.status();
        if (*next >= to) break;
        if (*next >= end) {
          window = *next - *next % unit;  // empty windows in between
          continue;
        }
        absl::StatusOr<std::shared_ptr<const RollupBlock>> read =
            ReadBlock(column, scope, window, end);
        if (!read.ok()) return read.status();
        block = *std::move(read);
        if (cacheable) cache.Insert(key, generation, block);
      }
      entries = std::max(entries, block->entries.size());
      in_range.push_back(std::move(block));
      window = end;
    }
    // Windows share most of their stacks: the largest is a fair lower bound of the result.
    totals->counts.reserve(totals->counts.size() + entries * 2);
    for (const auto& block : in_range) {
      for (size_t h = 0; h < block->hosts.size(); ++h) {
        if (host && block->hosts[h] != *host) continue;
        if (query.hosts && !query.hosts->contains(block->hosts[h])) continue;
        const size_t begin = h == 0 ? 0 : block->host_end[h - 1];
        const size_t end = block->host_end[h];
        if (begin == end) continue;
        if (query.label_sets) {
          // Labelled queries are selective: no prefetching, a membership test per entry.
          uint64_t sum = 0;
          bool any = false;
          for (size_t i = begin; i < end; ++i) {
            if (!query.label_sets->contains(block->LabelSetOf(i))) continue;
            any = true;
            if (!query.hosts_only) {
              totals->counts[block->entries[i].stack_id] += block->entries[i].count;
            }
            sum += block->entries[i].count;
          }
          if (any) base::SaturatingAddTo(totals->hosts[block->hosts[h]], sum);
          continue;
        }
        uint64_t sum = 0;
        if (query.hosts_only) {
          for (size_t i = begin; i < end; ++i) sum += block->entries[i].count;
          base::SaturatingAddTo(totals->hosts[block->hosts[h]], sum);
          continue;
        }
        constexpr size_t kAhead = 8;  // overlap the cache misses of the hash probes
        for (size_t i = begin; i < end; ++i) {
          if (i + kAhead < end) totals->counts.prefetch(block->entries[i + kAhead].stack_id);
          totals->counts[block->entries[i].stack_id] += block->entries[i].count;
          sum += block->entries[i].count;
        }
        base::SaturatingAddTo(totals->hosts[block->hosts[h]], sum);
      }
    }
    return absl::OkStatus();
  }

  // Whether a query's piece of rollup `column`, whole windows [from, to), is read through a
  // span.
  bool SpanWorthy(Column column, int64_t from, int64_t to) {
    const bool hours = column == Column::kRollupHour;
    if (!blocks->SpansOf(column).enabled() || !blocks->Of(column).enabled()) return false;
    const int64_t unit = hours ? kHourMs : kMinuteMs;
    if (from % unit != 0 || to % unit != 0) return false;  // a fixed resolution's own range
    if (to - from < (hours ? kMinSpanHours : kMinSpanMinutes) * unit) return false;
    // As for blocks: windows past retention may go with any compaction.
    const int64_t retention_ms = hours ? retention.hour_ms : retention.minute_ms;
    return retention_ms <= 0 || from >= now_ms() - retention_ms;
  }

  // The windows [from, to) of rollup `column` of `scope` for the hosts and label sets `query`
  // selects.
  absl::StatusOr<std::shared_ptr<const RollupSpan>> Span(Column column, const std::string& scope,
                                                         int64_t from, int64_t to,
                                                         const SampleQuery& query) {
    const std::string selection = SelectionKey(query);
    uint64_t generation = 0;
    SpanCache& cache = blocks->SpansOf(column);
    if (auto span = cache.Lookup(scope, from, to, selection, &generation)) return span;
    SampleQuery selected;  // what SumBlocks reads of the query: its selection
    selected.host = query.host;
    selected.hosts = query.hosts;
    selected.label_sets = query.label_sets;
    Totals sums;
    absl::Status s = SumBlocks(column, scope, from, to, selected, &sums);
    if (!s.ok()) return s;
    auto span = std::make_shared<RollupSpan>();
    span->stacks.reserve(sums.counts.size());
    for (const auto& [stack_id, count] : sums.counts) span->stacks.push_back({stack_id, count});
    SortHeavierFirst(&span->stacks);
    std::vector<std::pair<std::string, uint64_t>> hosts(sums.hosts.begin(), sums.hosts.end());
    std::sort(hosts.begin(), hosts.end());
    for (auto& [host, samples] : hosts) {
      span->hosts.push_back(std::move(host));
      span->host_samples.push_back(samples);
    }
    cache.Insert(scope, from, to, selection, generation, span);
    return span;
  }
};

SampleReader::SampleReader(const Database* db, RollupBlocks* blocks, const Rollups* rollups,
                           Retention retention, std::function<int64_t()> now_ms)
    : impl_(new Impl{db, blocks, rollups, retention, std::move(now_ms)}) {}

SampleReader::~SampleReader() = default;

absl::Status SampleReader::ScanSamples(const SampleQuery& query,
                                       const std::function<void(const SampleKey&, uint64_t)>& fn) {
  absl::StatusOr<std::string> scope = QueryScope(query);
  if (!scope.ok()) return scope.status();
  const int64_t from = std::max<int64_t>(query.from_ms, 0);
  const RollupSeal seal = impl_->rollups->Seal(query.service);
  for (const Piece& piece :
       PlanPieces(query, from, query.to_ms, /*whole_hours=*/false, seal)) {
    if (piece.from >= piece.to) continue;
    absl::Status s = impl_->ScanCells(piece.column, *scope, piece.from, piece.to, query, fn);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<SampleTotals> SampleReader::SumSamples(const SampleQuery& query) {
  return SumSamples(query, [](auto*, auto*) { return true; });
}

absl::StatusOr<SampleTotals> SampleReader::SumSamples(const SampleQuery& query,
                                                      ExtraCounts extra) {
  absl::StatusOr<std::string> scope = QueryScope(query);
  if (!scope.ok()) return scope.status();
  const int64_t from = std::max<int64_t>(query.from_ms, 0);
  Totals totals;
  // The range's spans (its whole hours, its minutes at either side); the largest is copied,
  // the others are added to `totals` with the range's other pieces.
  std::vector<std::shared_ptr<const RollupSpan>> spans;
  const RollupSeal seal = impl_->rollups->Seal(query.service);
  for (const Piece& piece : PlanPieces(query, from, query.to_ms, /*whole_hours=*/true, seal)) {
    if (piece.from >= piece.to) continue;
    const bool rollup =
        piece.column == Column::kRollupHour || piece.column == Column::kRollupMinute;
    if (rollup && impl_->SpanWorthy(piece.column, piece.from, piece.to)) {
      absl::StatusOr<std::shared_ptr<const RollupSpan>> read =
          impl_->Span(piece.column, *scope, piece.from, piece.to, query);
      if (!read.ok()) return read.status();
      spans.push_back(*std::move(read));
      continue;
    }
    absl::Status s =
        rollup && impl_->blocks->Of(piece.column).enabled()
            ? impl_->SumBlocks(piece.column, *scope, piece.from, piece.to, query, &totals)
            : impl_->SumCells(piece.column, *scope, piece.from, piece.to, query, &totals);
    if (!s.ok()) return s;
  }
  std::sort(spans.begin(), spans.end(), [](const auto& a, const auto& b) {
    return a->stacks.size() > b->stacks.size();
  });
  for (const std::shared_ptr<const RollupSpan>& span : spans) {
    if (span != spans.front() && !query.hosts_only) {
      for (const StackCount& c : span->stacks) totals.counts[c.stack_id] += c.count;
    }
    for (size_t i = 0; i < span->hosts.size(); ++i) {
      base::SaturatingAddTo(totals.hosts[span->hosts[i]], span->host_samples[i]);
    }
  }
  if (!extra(&totals.counts, &totals.hosts)) {
    return absl::AbortedError("the counts to add moved into the store during the read");
  }
  SampleTotals out;
  if (!spans.empty()) {
    // The rest of the range (a few thousand stacks) goes into the largest span's sorted list.
    if (!query.hosts_only) out.stacks = AddToSorted(spans.front()->stacks, totals.counts);
  } else {
    out.stacks.reserve(totals.counts.size());
    for (const auto& [stack_id, count] : totals.counts) out.stacks.push_back({stack_id, count});
    SortHeavierFirst(&out.stacks);
  }
  std::vector<std::pair<std::string, uint64_t>> hosts(totals.hosts.begin(), totals.hosts.end());
  std::sort(hosts.begin(), hosts.end());
  for (auto& [host, samples] : hosts) {
    out.hosts.push_back(std::move(host));
    out.host_samples.push_back(samples);
  }
  return out;
}

absl::StatusOr<std::vector<ServiceSummary>> SampleReader::ListServices() {
  std::vector<ServiceSummary> out;
  absl::Status s = impl_->database->Scan(
      Column::kServices, "", "", [&](std::string_view key, std::string_view value) {
        absl::StatusOr<ServiceSummary> summary = DecodeServiceSummary(value);
        if (!summary.ok()) return summary.status();
        summary->service.assign(key);
        out.push_back(std::move(*summary));
        return absl::OkStatus();
      });
  if (!s.ok()) return s;
  return out;
}

uint64_t SampleReader::cells_scanned() const {
  return impl_->cells_scanned.load(std::memory_order_relaxed);
}

}  // namespace strata::server::store
