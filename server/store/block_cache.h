// Internal to server/store: rollup blocks, the hour (minute) rollup of one (service, hour
// (minute)) summed per (host, stack) in memory, spans, runs of whole hours or whole minutes
// summed, and their caches (StoreOptions::hour_block_cache_bytes). The SampleReader fills and
// reads them; Store::Commit drops the hours, minutes and spans a commit adds samples to. Whole
// hours are most of a long range; whole minutes are the edges of every range and all of a
// short one.
#ifndef STRATA_SERVER_STORE_BLOCK_CACHE_H_
#define STRATA_SERVER_STORE_BLOCK_CACHE_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "server/store/codec.h"
#include "server/store/column.h"
#include "server/store/records.h"

namespace strata::server::store {

// Heap bytes of a vector's buffer, and of its strings' own buffers.
template <typename T>
size_t BufferBytes(const std::vector<T>& v) {
  return v.capacity() * sizeof(T);
}
inline size_t BufferBytes(const std::vector<std::string>& v) {
  size_t bytes = v.capacity() * sizeof(std::string);
  for (const std::string& s : v) bytes += s.capacity();
  return bytes;
}

struct RollupBlock {
  std::vector<std::string> hosts;  // sorted (key order)
  std::vector<uint32_t> host_end;  // entries of hosts[i] end at host_end[i]
  std::vector<StackCount> entries;
  // Label set of each entry; empty when every entry has none (0).
  std::vector<uint64_t> label_sets;

  uint64_t LabelSetOf(size_t i) const { return label_sets.empty() ? 0 : label_sets[i]; }

  size_t Bytes() const {
    return sizeof(RollupBlock) + BufferBytes(hosts) + BufferBytes(host_end) +
           BufferBytes(entries) + BufferBytes(label_sets);
  }
};

// Blocks by CellPrefix(service, window), bounded by bytes (least recently used dropped first).
//
// Consistency with concurrent commits: a block is built from a RocksDB read that may race
// with a commit to the same window. Every key has a generation, bumped when a commit
// touching the window completes; a reader notes the generation before reading and its block
// is kept only if the generation is unchanged when it inserts. A commit bumps after its write
// is visible, so a block that could have missed the write is never kept. Keys evicted (or
// cleared) while a read is in flight lose their generation: such blocks are not kept either.
class BlockCache {
 public:
  explicit BlockCache(size_t capacity_bytes) : capacity_(capacity_bytes) {}

  bool enabled() const { return capacity_ > 0; }

  // The cached block of `key`, or null with *generation set for a later Insert.
  std::shared_ptr<const RollupBlock> Lookup(const std::string& key, uint64_t* generation) {
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

  void Insert(const std::string& key, uint64_t generation,
              std::shared_ptr<const RollupBlock> block) {
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

  struct Counters {
    uint64_t hits = 0;
    uint64_t misses = 0;
    uint64_t bytes = 0;
  };
  Counters counters() {
    absl::MutexLock lock(&mu_);
    return {hits_, misses_, bytes_};
  }

 private:
  struct Entry {
    uint64_t generation = 0;
    uint64_t last_use = 0;
    size_t bytes = 0;
    std::shared_ptr<const RollupBlock> block;
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

// Sums of long runs of whole hours or whole minutes ("spans"): a range's hour (minute) blocks
// merged, stacks in SumSamples' order (stack_counts.h). A week's query then costs a copy of
// its span plus its edges, not the merge of 168 blocks and a sort of 100,000 stacks; the span
// stays valid for the hour a "last 7 days" range keeps its whole hours (the minute a "last
// hour" range keeps its whole minutes). Kept per (scope, window range, hosts and label sets
// selected: a cluster node's share of its hosts is a selection of its own). A span goes with
// any window it covers (a late commit), and a build racing with such a commit is not kept:
// the generation scheme of BlockCache.
struct RollupSpan {
  std::vector<StackCount> stacks;  // HeavierFirst order
  std::vector<std::string> hosts;  // sorted
  std::vector<uint64_t> host_samples;

  size_t Bytes() const {
    return sizeof(RollupSpan) + BufferBytes(stacks) + BufferBytes(hosts) +
           BufferBytes(host_samples);
  }
};

class SpanCache {
 public:
  explicit SpanCache(size_t capacity_bytes) : capacity_(capacity_bytes) {}

  bool enabled() const { return capacity_ > 0; }

  // The span of windows [from, to) of `scope` for the hosts and label sets `selection` names
  // (empty: all), or null with *generation set for a later Insert.
  std::shared_ptr<const RollupSpan> Lookup(const std::string& scope, int64_t from, int64_t to,
                                           const std::string& selection,
                                           uint64_t* generation) {
    absl::MutexLock lock(&mu_);
    std::vector<Entry>& entries = scopes_[scope];
    auto it = std::find_if(entries.begin(), entries.end(), [&](const Entry& e) {
      return e.from == from && e.to == to && e.selection == selection;
    });
    if (it == entries.end()) {
      Entry& e = entries.emplace_back();
      e.from = from;
      e.to = to;
      e.selection = selection;
      e.generation = next_generation_++;
      it = entries.end() - 1;
      ++count_;
    }
    it->last_use = ++tick_;
    if (it->span) {
      ++hits_;
      return it->span;
    }
    ++misses_;
    *generation = it->generation;
    if (count_ > kMaxEntries) EvictLocked();
    return nullptr;
  }

  void Insert(const std::string& scope, int64_t from, int64_t to, const std::string& selection,
              uint64_t generation, std::shared_ptr<const RollupSpan> span) {
    const size_t bytes = span->Bytes() + scope.size() + selection.size() + sizeof(Entry);
    absl::MutexLock lock(&mu_);
    if (bytes > capacity_ / 2) return;  // one span never pushes out most of the others
    auto s = scopes_.find(scope);
    if (s == scopes_.end()) return;
    for (Entry& e : s->second) {
      if (e.generation != generation || e.span) continue;
      e.span = std::move(span);
      e.bytes = bytes;
      bytes_ += bytes;
      if (bytes_ > capacity_) EvictLocked();
      return;
    }
  }

  // Drops the spans of `scope` overlapping [from, to) (and voids their builds).
  void Invalidate(const std::string& scope, int64_t from, int64_t to) {
    absl::MutexLock lock(&mu_);
    auto s = scopes_.find(scope);
    if (s == scopes_.end()) return;
    std::erase_if(s->second, [&](const Entry& e) {
      if (to <= e.from || from >= e.to) return false;
      bytes_ -= e.bytes;
      --count_;
      return true;
    });
    if (s->second.empty()) scopes_.erase(s);
  }

  void Clear() {
    absl::MutexLock lock(&mu_);
    scopes_.clear();
    bytes_ = 0;
    count_ = 0;
  }

  BlockCache::Counters counters() {
    absl::MutexLock lock(&mu_);
    return {hits_, misses_, bytes_};
  }

 private:
  // Spans are few (one per long range being looked at); placeholders of builds that never
  // completed are bounded by this too.
  static constexpr size_t kMaxEntries = 64;

  struct Entry {
    int64_t from = 0, to = 0;
    std::string selection;
    uint64_t generation = 0;
    uint64_t last_use = 0;
    size_t bytes = 0;
    std::shared_ptr<const RollupSpan> span;
  };

  // Drops the least recently used entries until at most three quarters of the capacity and
  // of kMaxEntries are used.
  void EvictLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::vector<std::pair<uint64_t, size_t>> uses;  // last use (unique) and bytes
    for (const auto& [scope, entries] : scopes_) {
      for (const Entry& e : entries) uses.emplace_back(e.last_use, e.bytes);
    }
    std::sort(uses.begin(), uses.end());
    uint64_t last_victim = 0;
    for (const auto& [use, bytes] : uses) {
      if (bytes_ <= capacity_ / 4 * 3 && count_ <= kMaxEntries / 4 * 3) break;
      last_victim = use;
      bytes_ -= bytes;
      --count_;
    }
    for (auto it = scopes_.begin(); it != scopes_.end();) {
      std::erase_if(it->second, [&](const Entry& e) { return e.last_use <= last_victim; });
      if (it->second.empty()) {
        scopes_.erase(it++);
      } else {
        ++it;
      }
    }
  }

  const size_t capacity_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::vector<Entry>> scopes_ ABSL_GUARDED_BY(mu_);
  size_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  size_t count_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t tick_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_generation_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t hits_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t misses_ ABSL_GUARDED_BY(mu_) = 0;
};

// The blocks of both rollups and the spans: a budget shared out between hours (most of it:
// long ranges hold many), minutes (a range's edges, or all of a range under an hour or two)
// and spans (a few ranges being looked at, each as large as its windows' distinct stacks).
// Spans of hours and spans of minutes are kept apart: a week's span costs a second or so to
// build again, one of an hour's minutes a few milliseconds, and "last hour" views, one span
// per service and selection and a new one each minute, would otherwise push the week's out.
struct RollupBlocks {
  explicit RollupBlocks(size_t capacity_bytes)
      : hours(capacity_bytes - capacity_bytes / 8 - capacity_bytes / 8 - capacity_bytes / 32),
        minutes(capacity_bytes / 8),
        hour_spans(capacity_bytes / 8),
        minute_spans(capacity_bytes / 32) {}

  BlockCache& Of(Column rollup) { return rollup == Column::kRollupHour ? hours : minutes; }
  SpanCache& SpansOf(Column rollup) {
    return rollup == Column::kRollupHour ? hour_spans : minute_spans;
  }
  // A commit added samples to the minute starting at `minute` of `service`: its block, its
  // hour's, and the spans holding that minute (spans of the live hour's other minutes stay).
  void InvalidateMinute(const std::string& service, int64_t minute) {
    minutes.Invalidate(CellPrefix(service, static_cast<uint64_t>(minute)));
    hours.Invalidate(CellPrefix(service, static_cast<uint64_t>(minute - minute % kHourMs)));
    hour_spans.Invalidate(service, minute, minute + kMinuteMs);
    minute_spans.Invalidate(service, minute, minute + kMinuteMs);
  }
  // A roll-up rewrote the hour starting at `hour` of `service`.
  void InvalidateHour(const std::string& service, int64_t hour) {
    hours.Invalidate(CellPrefix(service, static_cast<uint64_t>(hour)));
    hour_spans.Invalidate(service, hour, hour + kHourMs);
    minute_spans.Invalidate(service, hour, hour + kHourMs);
  }
  void Clear() {
    hours.Clear();
    minutes.Clear();
    hour_spans.Clear();
    minute_spans.Clear();
  }
  // Both kinds of span together.
  BlockCache::Counters span_counters() {
    const BlockCache::Counters h = hour_spans.counters();
    const BlockCache::Counters m = minute_spans.counters();
    return {h.hits + m.hits, h.misses + m.misses, h.bytes + m.bytes};
  }

  BlockCache hours;
  BlockCache minutes;
  SpanCache hour_spans;
  SpanCache minute_spans;
};

}  // namespace strata::server::store

#endif  // STRATA_SERVER_STORE_BLOCK_CACHE_H_
