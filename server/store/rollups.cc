#include "server/store/rollups.h"

#include <algorithm>
#include <climits>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "server/store/cell_cursor.h"
#include "server/store/codec.h"
#include "server/store/rollup_plan.h"

namespace strata::server::store {
namespace {

constexpr int64_t kWindowMs = 10'000;  // the finest window a cell may have starts below it

int64_t Floor(int64_t v, int64_t unit) { return v - v % unit; }
int64_t Ceil(int64_t v, int64_t unit) { return Floor(v + unit - 1, unit); }

// The window of a cell key (scope '\0' BE(window) ...), and where its 8 bytes start.
bool CellWindow(std::string_view key, size_t* at, int64_t* window) {
  const size_t scope_end = key.find('\0');
  if (scope_end == std::string_view::npos || key.size() < scope_end + 9) return false;
  *at = scope_end + 1;
  *window = static_cast<int64_t>(GetFixed64BE(key.data() + *at));
  return *window >= 0;
}

// Abseil's string_view (Debian's Abseil has its own), for heterogeneous map lookups.
absl::string_view Key(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// `key` with its window replaced by the start of its `unit` window.
std::string RollupKey(std::string_view key, size_t at, int64_t window, int64_t unit) {
  std::string out(key);
  std::string be;
  PutFixed64BE(&be, static_cast<uint64_t>(Floor(window, unit)));
  out.replace(at, 8, be);
  return out;
}

}  // namespace

std::string RollupSealKey(std::string_view service) {
  std::string key(1, kRollupStateTag);
  key.append("seal");
  key.push_back('\0');
  key.append(service);
  return key;
}

std::string EncodeRollupSeal(const RollupSeal& seal) {
  std::string out;
  PutFixed64BE(&out, static_cast<uint64_t>(seal.minute_ms));
  PutFixed64BE(&out, static_cast<uint64_t>(seal.hour_ms));
  return out;
}

absl::StatusOr<RollupSeal> DecodeRollupSeal(std::string_view value) {
  if (value.size() != 16) return absl::DataLossError("corrupt rollup seal record");
  RollupSeal seal{static_cast<int64_t>(GetFixed64BE(value.data())),
                  static_cast<int64_t>(GetFixed64BE(value.data() + 8))};
  if (seal.minute_ms < 0 || seal.hour_ms < 0) {
    return absl::DataLossError("corrupt rollup seal record");
  }
  return seal;
}

absl::Status Rollups::Load(int64_t now_ms) {
  absl::MutexLock lock(&mu_);
  const std::string prefix = RollupSealKey("");
  absl::Status s = db_->Scan(Column::kMeta, prefix, PrefixSuccessor(prefix),
                             [&](std::string_view key, std::string_view value) {
                               absl::StatusOr<RollupSeal> seal = DecodeRollupSeal(value);
                               if (!seal.ok()) return seal.status();
                               services_[Key(key.substr(prefix.size()))].seal = *seal;
                               return absl::OkStatus();
                             });
  if (!s.ok()) return s;
  return db_->Scan(Column::kServices, "", "", [&](std::string_view key, std::string_view value) {
    absl::StatusOr<ServiceSummary> summary = DecodeServiceSummary(value);
    // A corrupt summary (ListServices reports it) says nothing of the service's windows:
    // everything written before now counts as rolled up, as an earlier version did.
    const int64_t last_window = summary.ok() ? summary->last_window_ms : now_ms;
    auto [it, inserted] = services_.try_emplace(Key(key));
    it->second.last_window_ms = last_window;
    if (inserted) {
      // Rolled up at commit by an earlier version: sealed past its last window.
      const int64_t after = last_window + kWindowMs;
      it->second.seal = {Ceil(after, kMinuteMs), Ceil(after, kHourMs)};
    }
    return absl::OkStatus();
  });
}

absl::Status Rollups::AddRollupMerges(const WriteBatch::Rep& rep, rocksdb::WriteBatch* wb,
                                      Updates* updates) {
  // The state each service of the batch has after it: sealed ones as they are, new ones
  // sealed at the batch's earliest window (nothing before it exists to roll up).
  for (size_t i : rep.cell_ops) {
    const std::string& key = rep.ops[i].key;
    size_t at = 0;
    int64_t window = 0;
    if (!CellWindow(key, &at, &window)) return absl::InternalError("malformed cell key");
    const std::string_view service(key.data(), at - 1);
    auto [it, inserted] = updates->try_emplace(Key(service));
    ServiceState& state = it->second;
    if (inserted) {
      auto known = services_.find(Key(service));
      if (known != services_.end()) {
        state = known->second;
      } else {
        state.seal = {INT64_MAX, INT64_MAX};  // new: lowered to the earliest window below
      }
    }
    if (!services_.contains(Key(service))) {
      state.seal.minute_ms = std::min(state.seal.minute_ms, Floor(window, kMinuteMs));
      state.seal.hour_ms = std::min(state.seal.hour_ms, Floor(window, kHourMs));
    }
    state.last_window_ms = std::max(state.last_window_ms, window);
  }
  for (const auto& [service, state] : *updates) {
    if (services_.contains(service)) continue;
    rocksdb::Status s = wb->Put(db_->cf(Column::kMeta), RollupSealKey(service),
                                EncodeRollupSeal(state.seal));
    if (!s.ok()) return FromRocks(s);
  }
  // Cells of sealed windows: their rollups were written already, so they add to them here.
  for (size_t i : rep.cell_ops) {
    const WriteBatch::Rep::Op& op = rep.ops[i];
    size_t at = 0;
    int64_t window = 0;
    CellWindow(op.key, &at, &window);
    const RollupSeal& seal = updates->find(Key(std::string_view(op.key.data(), at - 1)))->second.seal;
    if (window < seal.minute_ms) {
      rocksdb::Status s = wb->Merge(db_->cf(Column::kRollupMinute),
                                    RollupKey(op.key, at, window, kMinuteMs), op.value);
      if (!s.ok()) return FromRocks(s);
    }
    if (window < seal.hour_ms) {
      rocksdb::Status s = wb->Merge(db_->cf(Column::kRollupHour),
                                    RollupKey(op.key, at, window, kHourMs), op.value);
      if (!s.ok()) return FromRocks(s);
    }
  }
  return absl::OkStatus();
}

void Rollups::Committed(Updates& updates) {
  for (auto& [service, state] : updates) services_[service] = std::move(state);
}

RollupSeal Rollups::Seal(std::string_view service) const {
  absl::MutexLock lock(&mu_);
  auto it = services_.find(Key(service));
  if (it == services_.end()) return {INT64_MAX, INT64_MAX};
  return it->second.seal;
}

absl::StatusOr<RollupStats> Rollups::RollUp(int64_t up_to_ms) {
  std::vector<std::string> names;
  {
    absl::MutexLock lock(&mu_);
    names.reserve(services_.size());
    for (const auto& [service, state] : services_) names.push_back(service);
  }
  RollupStats stats;
  for (const std::string& service : names) {
    absl::MutexLock lock(&mu_);
    auto it = services_.find(service);
    if (it == services_.end()) continue;
    if (absl::Status s = RollService(service, it->second, up_to_ms, &stats); !s.ok()) return s;
  }
  return stats;
}

absl::Status Rollups::RollService(const std::string& service, ServiceState& state,
                                  int64_t up_to_ms, RollupStats* stats) {
  RollupSeal seal = state.seal;
  // Minutes: up to the last whole minute, once raw cells lie past the seal.
  const int64_t minute_to = Floor(up_to_ms, kMinuteMs);
  const bool minutes = state.last_window_ms >= seal.minute_ms && minute_to > seal.minute_ms;
  // Hours: every whole hour of minutes already rolled up.
  const int64_t hour_to = Floor(minutes ? minute_to : seal.minute_ms, kHourMs);
  const bool hours = hour_to > seal.hour_ms;
  if (!minutes && !hours) return absl::OkStatus();
  if (minutes) {
    seal.minute_ms = minute_to;
    auto rolled = Roll(Column::kSamples, Column::kRollupMinute, service, state.seal.minute_ms,
                       kMinuteMs, seal);
    if (!rolled.ok()) return rolled.status();
    // Only the minutes that got cells changed: a seal years behind (a host whose clock
    // started at 1970) spans millions of empty ones.
    if (blocks_->minutes.enabled()) {
      for (int64_t m : rolled->units) {
        blocks_->minutes.Invalidate(CellPrefix(service, static_cast<uint64_t>(m)));
      }
    }
    state.seal = seal;
    stats->minute_cells += rolled->cells;
  }
  if (hours) {
    seal.hour_ms = hour_to;
    auto rolled = Roll(Column::kRollupMinute, Column::kRollupHour, service, state.seal.hour_ms,
                       kHourMs, seal);
    if (!rolled.ok()) return rolled.status();
    for (int64_t h : rolled->units) blocks_->InvalidateHour(service, h);
    state.seal = seal;
    stats->hour_cells += rolled->cells;
  }
  ++stats->services;
  return absl::OkStatus();
}

absl::StatusOr<Rollups::Rolled> Rollups::Roll(Column from, Column to,
                                              const std::string& service, int64_t begin,
                                              int64_t unit, const RollupSeal& seal) {
  const int64_t end = unit == kMinuteMs ? seal.minute_ms : seal.hour_ms;
  rocksdb::WriteBatch batch;
  rocksdb::WriteBatch* wb = &batch;
  absl::flat_hash_map<std::string, uint64_t> sums;
  Rolled rolled;
  CellCursor it(*db_, from, service, begin, end);
  for (; it->Valid(); it->Next()) {
    const std::string_view key = View(it->key());
    size_t at = 0;
    int64_t window = 0;
    if (!CellWindow(key, &at, &window) || key.substr(0, at - 1) != service) {
      return absl::DataLossError("sample key outside its prefix");
    }
    // Cells come in window order.
    if (rolled.units.empty() || rolled.units.back() != Floor(window, unit)) {
      rolled.units.push_back(Floor(window, unit));
    }
    absl::StatusOr<uint64_t> count = DecodeCount(View(it->value()));
    if (!count.ok()) return count.status();
    uint64_t& sum = sums[RollupKey(key, at, window, unit)];
    sum = *count > UINT64_MAX - sum ? UINT64_MAX : sum + *count;
  }
  if (absl::Status s = FromRocks(it->status()); !s.ok()) return s;
  // In key order, so that the memtable inserts each next to the previous.
  std::vector<std::pair<std::string, uint64_t>> sorted(sums.begin(), sums.end());
  std::sort(sorted.begin(), sorted.end());
  for (const auto& [key, count] : sorted) {
    if (absl::Status s = FromRocks(wb->Merge(db_->cf(to), key, EncodeCount(count))); !s.ok()) {
      return s;
    }
  }
  if (absl::Status s = FromRocks(
          wb->Put(db_->cf(Column::kMeta), RollupSealKey(service), EncodeRollupSeal(seal)));
      !s.ok()) {
    return s;
  }
  if (absl::Status s = Write(wb); !s.ok()) return s;
  rolled.cells = sorted.size();
  return rolled;
}

absl::Status Rollups::Write(rocksdb::WriteBatch* wb) {
  return FromRocks(db_->db->Write(rocksdb::WriteOptions(), wb));
}

}  // namespace strata::server::store
