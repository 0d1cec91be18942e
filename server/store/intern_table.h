// Internal to server/store: the Interner's cache of content-addressed records by ID.
#ifndef STRATA_SERVER_STORE_INTERN_TABLE_H_
#define STRATA_SERVER_STORE_INTERN_TABLE_H_

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"

namespace strata::server::store {

inline constexpr size_t kInternShards = 16;

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

}  // namespace strata::server::store

#endif  // STRATA_SERVER_STORE_INTERN_TABLE_H_
