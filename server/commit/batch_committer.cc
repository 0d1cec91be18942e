#include "server/commit/batch_committer.h"

namespace strata::server::commit {

absl::Status StoreCommitter::CommitBatch(store::WriteBatch* wb, const std::string& host,
                                         int64_t window_start_ms,
                                         const std::vector<Cell>& cells) {
  for (const Cell& c : cells) {
    wb->AddSamples(*c.service, window_start_ms, host, c.stack_id, c.count, c.label_set);
  }
  return store_->Commit(wb);
}

}  // namespace strata::server::commit
