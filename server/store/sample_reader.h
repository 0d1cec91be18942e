// SampleReader: reads of the sample cells (continuous profile, its rollups, captures) and of
// the per-service summaries. Chooses the column families a query's resolution needs
// (rollup_plan.h) and keeps whole hours of the hour rollup in memory for SumSamples. Owned
// by Store (Store::samples()); thread-safe.
#ifndef STRATA_SERVER_STORE_SAMPLE_READER_H_
#define STRATA_SERVER_STORE_SAMPLE_READER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/store/records.h"

namespace strata::server::store {

struct Database;
struct RollupBlocks;
class Rollups;

class SampleReader {
 public:
  // Of the minute and hour rollups (0: kept for ever).
  struct Retention {
    int64_t minute_ms = 0;
    int64_t hour_ms = 0;
  };
  // Minutes (hours) older than now_ms() - retention.minute_ms (hour_ms) are never cached.
  // `rollups` says how far each service's rollups are complete (rollups.h).
  SampleReader(const Database* db, RollupBlocks* blocks, const Rollups* rollups,
               Retention retention, std::function<int64_t()> now_ms);
  ~SampleReader();
  SampleReader(const SampleReader&) = delete;
  SampleReader& operator=(const SampleReader&) = delete;

  // Calls `fn` for every cell matching `query`, in key order (window, host, stack).
  // With Resolution::kAuto, windows still ascend but a stack repeats once per piece.
  absl::Status ScanSamples(const SampleQuery& query,
                           const std::function<void(const SampleKey&, uint64_t count)>& fn);

  // The cells ScanSamples would return for `query`, summed per stack (counts of zero
  // included, so the stacks and hosts listed are exactly those of the cells). With kAuto
  // and kHour, whole hours come from an in-memory aggregate per (service, hour) of the hour
  // rollup, and whole minutes likewise from the minute rollup: filled on first read, dropped
  // by any commit that adds samples to that hour or minute, so results always equal a fresh
  // scan. Long ranges then cost one merge per hour instead of one RocksDB cell per (hour,
  // host, stack), and short ones one merge per minute. A query over many whole hours reads
  // them as one span (block_cache.h), kept until one of its hours changes.
  absl::StatusOr<SampleTotals> SumSamples(const SampleQuery& query);

  // Counts from outside the store (a server's open windows) added to a sum before its stacks
  // are put in order: per stack ID and per host. False: what it would add is no longer valid
  // beside what was read (it moved into the store meanwhile).
  using ExtraCounts = absl::FunctionRef<bool(absl::flat_hash_map<uint64_t, uint64_t>* stacks,
                                             absl::flat_hash_map<std::string, uint64_t>* hosts)>;
  // SumSamples(query) with `extra`'s counts in, ordered once; Aborted when `extra` says false.
  absl::StatusOr<SampleTotals> SumSamples(const SampleQuery& query, ExtraCounts extra);

  absl::StatusOr<std::vector<ServiceSummary>> ListServices();

  // Cells read from RocksDB by ScanSamples and SumSamples (including hour-block fills).
  uint64_t cells_scanned() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata::server::store

#endif  // STRATA_SERVER_STORE_SAMPLE_READER_H_
