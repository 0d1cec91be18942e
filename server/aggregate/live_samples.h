// LiveSamples: acknowledged samples that the server holds in memory and has not written to
// the store yet (the aggregation tables of server/aggregate). Readers of the store add them
// so that every query sees every acknowledged sample. The implementation owns the counts;
// results are copied into caller-owned containers.
#ifndef STRATA_SERVER_AGGREGATE_LIVE_SAMPLES_H_
#define STRATA_SERVER_AGGREGATE_LIVE_SAMPLES_H_

#include <cstdint>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "server/store/store.h"

namespace strata::server::aggregate {

// Counts accepted but not yet written to the store, for queries.
class LiveSamples {
 public:
  virtual ~LiveSamples() = default;
  // Changes whenever live counts of `service` (any service if empty) move to the store. A
  // reader takes it, reads the store, then calls AddLiveCounts with it; false means counts
  // moved in between: read again. Per service, so that a long read of one service is not
  // retried for every other service's window flush.
  virtual uint64_t FlushGeneration(std::string_view service) const = 0;
  // Adds the live counts of `query` (continuous profile; windows in [from_ms, to_ms); one
  // host, or the hosts of query.hosts, if set) to `stacks` (stack ID -> count) and to
  // `hosts` (host -> count), if the flush generation of query.service is still `generation`.
  virtual bool AddLiveCounts(const store::SampleQuery& query, uint64_t generation,
                             absl::flat_hash_map<uint64_t, uint64_t>* stacks,
                             absl::flat_hash_map<std::string, uint64_t>* hosts) const = 0;
  // Calls `fn` with each live cell of `query` (the cells AddLiveCounts adds: window, host,
  // stack, label set ID, count) if the flush generation of query.service is still
  // `generation`; false (nothing called) otherwise.
  using LiveCellFn = absl::FunctionRef<void(int64_t window_start_ms, const std::string& host,
                                            uint64_t stack, uint64_t label_set, uint64_t count)>;
  virtual bool ForEachLiveCell(const store::SampleQuery& query, uint64_t generation,
                               LiveCellFn fn) const = 0;
  // Services with live counts, with their open window and live total.
  virtual std::vector<store::ServiceSummary> LiveServices() const = 0;
};

}  // namespace strata::server::aggregate

#endif  // STRATA_SERVER_AGGREGATE_LIVE_SAMPLES_H_
