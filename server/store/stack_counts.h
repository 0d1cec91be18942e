// The order SampleTotals::stacks come in (heaviest first, then by stack ID) and how counts
// are added to a list already in that order without sorting all of it again. Profiles keep
// their stacks in this order; a week's list holds 100,000 stacks, while what a query adds to
// a cached one (a range's edges, the open windows) is a few thousand.
#ifndef STRATA_SERVER_STORE_STACK_COUNTS_H_
#define STRATA_SERVER_STORE_STACK_COUNTS_H_

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "server/store/records.h"

namespace strata::server::store {

inline bool HeavierFirst(const StackCount& a, const StackCount& b) {
  return a.count != b.count ? a.count > b.count : a.stack_id < b.stack_id;
}

// Sorts by HeavierFirst (on two threads when long).
void SortHeavierFirst(std::vector<StackCount>* stacks);

// `sorted` (HeavierFirst order, each stack once) with `extra`'s counts added (saturating) and
// its other stacks inserted, in HeavierFirst order: one pass over `sorted`, a sort of the
// entries `extra` touches.
std::vector<StackCount> AddToSorted(const std::vector<StackCount>& sorted,
                                    const absl::flat_hash_map<uint64_t, uint64_t>& extra);

}  // namespace strata::server::store

#endif  // STRATA_SERVER_STORE_STACK_COUNTS_H_
