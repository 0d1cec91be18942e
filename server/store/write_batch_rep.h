// Internal to server/store: what a WriteBatch holds, for the components that add to it
// (Interner) and apply it (Store::Commit).
#ifndef STRATA_SERVER_STORE_WRITE_BATCH_REP_H_
#define STRATA_SERVER_STORE_WRITE_BATCH_REP_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "server/store/column.h"
#include "server/store/db.h"
#include "server/store/write_batch.h"

namespace strata::server::store {

// Kinds of content-addressed records.
enum class InternKind { kStack, kFunction };

struct WriteBatch::Rep {
  enum class OpType { kPut, kMerge, kDeleteRange };
  struct Op {
    Column column;
    OpType type;
    std::string key;
    std::string value;  // end key for kDeleteRange
  };
  std::vector<Op> ops;
  // Indexes in `ops` of the raw sample cells (AddSamples): Store::Commit adds their rollup
  // merges where their windows are sealed (rollups.h).
  std::vector<size_t> cell_ops;
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
  // (service, minute) of every minute this batch adds samples to: the cached rollup blocks of
  // those minutes and of their hours are dropped once it is committed.
  absl::flat_hash_set<std::pair<std::string, int64_t>> touched_minutes;
  // The last pair added to touched_minutes: consecutive samples mostly repeat it.
  std::string last_touched_service;
  int64_t last_touched_minute = -1;
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

class BatchAccess {
 public:
  static WriteBatch::Rep& Of(WriteBatch* batch) { return *batch->rep_; }
};

}  // namespace strata::server::store

#endif  // STRATA_SERVER_STORE_WRITE_BATCH_REP_H_
