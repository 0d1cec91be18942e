// Program phase-change detection per service (the AMD method's "reordering of hot entries by
// an order of magnitude"): every applied batch's (stack, count) pairs are counted per period;
// a period ends at a batch boundary once `period` samples have arrived, and its ranking of hot
// contexts is compared with the ranking two periods back. A context that is now hot and ahead
// of one that was hot then, with an order of magnitude between them on either side, is a phase
// change. Events are resolved to call paths and stored (Store::PutPhaseEvent) as
// v1::PhaseChange messages, which the Phases query and `strata phases` read back.
//
// Why not the sorted table's own swap test (common/table): its periods end inside a batch,
// and a batch adds each context's whole agent interval at once, so such a period compares
// lumps in arrival order, not program behaviour. And a switch rarely falls on a period
// boundary: in the period that straddles it, the new hot context overtakes the old one by less
// than 10x, and afterwards it is already ahead; comparing two periods apart sees across it.
//
// Thread-safe: OnBatch may be called from every ingest stream.
#ifndef STRATA_SERVER_AGGREGATE_PHASE_DETECTOR_H_
#define STRATA_SERVER_AGGREGATE_PHASE_DETECTOR_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/synchronization/mutex.h"
#include "common/table/sorted_table.h"  // table::PhaseChange
#include "server/ingest/agent_session.h"
#include "server/store/store.h"
#include "strata/v1/query.pb.h"

namespace strata::server {

struct PhaseDetectorOptions {
  // Contexts ranked per service and period; more are counted but not ranked.
  uint32_t max_contexts = 1024;
  // Samples per comparison period. At 99 Hz on two busy threads this is ~1.5 s; short
  // periods let a switch be confirmed soon after it happens.
  uint32_t period = 300;
  // A context is hot in a period when it has more than this share of the period's samples.
  double hot_share = 0.1;
  uint32_t factor = 10;
};

class PhaseDetector {
 public:
  PhaseDetector(store::Store* store, PhaseDetectorOptions options = {});

  void OnBatch(const AppliedBatch& batch);
  uint64_t events() const;

 private:

  // Resolves the events of one sort and stores them as one v1::PhaseChange.
  void Publish(const std::string& service, int64_t window_start_ms,
               const std::vector<table::PhaseChange<uint64_t>>& changes);
  void Resolve(uint64_t stack_id, v1::HotPath* path);

  struct ServiceState {
    // Per-period counts of the current period and the two before it, at most max_contexts
    // contexts each.
    std::map<uint64_t, uint64_t> current;
    std::map<uint64_t, uint64_t> previous[2];
    uint64_t current_total = 0;
    uint64_t previous_total[2] = {0, 0};
  };
  // Ends a period of `state`: compares it with the period two back; appends events.
  void EndPeriod(ServiceState& state, std::vector<table::PhaseChange<uint64_t>>* out);

  store::Store* store_;
  PhaseDetectorOptions options_;
  mutable absl::Mutex mu_;
  std::map<std::string, ServiceState> services_ ABSL_GUARDED_BY(mu_);
  uint64_t events_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace strata::server

#endif  // STRATA_SERVER_AGGREGATE_PHASE_DETECTOR_H_
