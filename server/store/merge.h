// RocksDB merge operators and prefix extractor of the store. Internal to server/store.
//
// Both operators combine fixed-size records and are associative and commutative, so
// RocksDB may apply them in any grouping (reads, flushes, compactions). Malformed operands
// or base values never crash: they are skipped and counted in `malformed`, which the
// owner (Store) shares with the operator.
#ifndef STRATA_SERVER_STORE_MERGE_H_
#define STRATA_SERVER_STORE_MERGE_H_

#include <atomic>
#include <cstdint>
#include <memory>

#include <functional>

#include "rocksdb/compaction_filter.h"
#include "rocksdb/merge_operator.h"
#include "rocksdb/slice_transform.h"

namespace strata::server::store {

// Sums u64 counts (fixed64 little-endian), wrapping on overflow.
std::shared_ptr<rocksdb::MergeOperator> NewCountAddOperator(
    std::shared_ptr<std::atomic<uint64_t>> malformed);

// Combines service summaries: min first window, max last window, sum of samples.
std::shared_ptr<rocksdb::MergeOperator> NewServiceSummaryOperator(
    std::shared_ptr<std::atomic<uint64_t>> malformed);

// Prefix = key up to and including its first '\0' (the service or capture ID of a cell).
std::shared_ptr<const rocksdb::SliceTransform> NewScopePrefixExtractor();

// Drops cells (values and merge operands) whose window start is older than
// now_ms() - retention_ms. Keys that do not parse as cells are kept.
std::unique_ptr<rocksdb::CompactionFilter> NewRetentionFilter(int64_t retention_ms,
                                                              std::function<int64_t()> now_ms);

// Meta column: drops the per-batch records (unwind counters, leaf addresses:
// BatchMetaWindowStart) of windows older than now_ms() - raw_retention_ms, the raw samples'
// retention (one record per batch and agent would otherwise grow without bound), and the
// hourly leaf-address records (HourlyMetaWindowStart) older than hour_retention_ms. A
// retention of 0 keeps them; other meta records are kept.
std::unique_ptr<rocksdb::CompactionFilter> NewMetaRetentionFilter(
    int64_t raw_retention_ms, int64_t hour_retention_ms, std::function<int64_t()> now_ms);

// Sums hourly leaf-address records (EncodeLeafAddresses lists) address by address.
std::shared_ptr<rocksdb::MergeOperator> NewLeafAddressSumOperator(
    std::shared_ptr<std::atomic<uint64_t>> malformed);

}  // namespace strata::server::store

#endif  // STRATA_SERVER_STORE_MERGE_H_
