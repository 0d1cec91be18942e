// Interner: content-addressed IDs of functions, stacks and label sets, and reads of them.
//
// The same content always yields the same ID (also across restarts and agents); different
// content never shares an ID (collisions are resolved by probing). A new ID's record is added
// to the caller's WriteBatch, so it lands atomically with the counts that reference it; the
// interner keeps recent records in memory (StoreOptions::intern_cache_entries). Owned by
// Store (Store::interner()); thread-safe.
#ifndef STRATA_SERVER_STORE_INTERNER_H_
#define STRATA_SERVER_STORE_INTERNER_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/labels/labels.h"
#include "server/store/records.h"
#include "server/store/write_batch.h"

namespace strata::server::store {

struct Database;

class Interner {
 public:
  using IdHash = std::function<uint64_t(std::string_view identity, uint32_t probe)>;
  // `id_hash` replaces the content hash when set (StoreOptions::id_hash_for_testing).
  Interner(const Database* db, size_t cache_entries, IdHash id_hash);
  ~Interner();
  Interner(const Interner&) = delete;
  Interner& operator=(const Interner&) = delete;

  // The ID of the function or stack; if it may not be persisted yet, its record is added to
  // `batch`. Errors only on I/O failure.
  absl::StatusOr<uint64_t> InternFunction(const FunctionInfo& function, WriteBatch* batch);
  absl::StatusOr<uint64_t> InternStack(const StackFrames& stack, WriteBatch* batch);
  // The ID of a label set (normalized, no empty values) used by `service`'s samples: 0 for
  // the empty set; the same content always yields the same ID. Its records are added to
  // `batch` until a commit of them succeeded. ResourceExhausted when the service already
  // has `max_per_service` distinct label sets (the empty one not counted) and this one is
  // new; InvalidArgument for a set that is not normalized or not valid label syntax.
  absl::StatusOr<uint64_t> InternLabelSet(std::string_view service, const labels::LabelSet& set,
                                          uint32_t max_per_service, WriteBatch* batch);
  // The label sets of `service`'s samples, committed or pending, by ID; the empty set (ID 0)
  // is always listed first (samples written before labels have it).
  absl::StatusOr<std::vector<LabelSetRecord>> ListLabelSets(std::string_view service);

  // NotFound for unknown IDs, DataLoss for corrupt records. Served from memory when possible.
  absl::StatusOr<StackFrames> GetStack(uint64_t stack_id);
  absl::StatusOr<FunctionInfo> GetFunction(uint64_t function_id);

  // Store::Commit, after `batch` was written: its interned records are durable.
  void MarkCommitted(WriteBatch* batch);

  // Intern probes past an occupied ID.
  uint64_t collisions() const;
  uint64_t stack_cache_entries() const;
  uint64_t function_cache_entries() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata::server::store

#endif  // STRATA_SERVER_STORE_INTERNER_H_
