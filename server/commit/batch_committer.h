// The commit contract between ingest and aggregation. Ingest decodes an agent's batch into
// store records (stacks, functions, label sets, the applied sequence, captured samples) and
// the batch's continuous-profile counts (cells); a BatchCommitter writes both atomically.
// server/aggregate's WindowAggregator is the server's committer (it keeps the cells in its
// tables and journal); StoreCommitter merges them into the store directly (tools, tests).
//
// Ingest and aggregation both depend on this module and not on each other, so data flows one
// way: ingest -> committer -> store. This module owns the aggregation window grid.
#ifndef STRATA_SERVER_COMMIT_BATCH_COMMITTER_H_
#define STRATA_SERVER_COMMIT_BATCH_COMMITTER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "server/store/store.h"

namespace strata::server::commit {

// Width of the server's aggregation windows.
inline constexpr int64_t kWindowMs = 10'000;
inline int64_t WindowStart(int64_t time_ms) {
  return time_ms - (time_ms % kWindowMs + kWindowMs) % kWindowMs;
}

// Commits a decoded batch: its records and applied sequence (`wb`) together with its sample
// counts.
class BatchCommitter {
 public:
  struct Cell {
    const std::string* service;
    uint64_t stack_id;
    uint64_t count;
    uint64_t label_set = 0;  // Store::InternLabelSet ID of the target's labels (0: none)
  };
  virtual ~BatchCommitter() = default;
  // Same contract as Store::Commit (AlreadyExists for a sequence already applied); nothing
  // of the batch is kept when it fails.
  virtual absl::Status CommitBatch(store::WriteBatch* wb, const std::string& host,
                                   int64_t window_start_ms, const std::vector<Cell>& cells) = 0;
};

// Merges the cells into the store's cell column families in the batch's own commit: no
// aggregation tables, no journal. Thread-safe; borrows the store.
class StoreCommitter final : public BatchCommitter {
 public:
  explicit StoreCommitter(store::Store* store) : store_(store) {}
  absl::Status CommitBatch(store::WriteBatch* wb, const std::string& host,
                           int64_t window_start_ms, const std::vector<Cell>& cells) override;

 private:
  store::Store* const store_;
};

}  // namespace strata::server::commit

#endif  // STRATA_SERVER_COMMIT_BATCH_COMMITTER_H_
