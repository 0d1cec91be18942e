// Internal to server/store: which column families a sample query reads, over which parts
// of its range (rollup planning for Resolution::kAuto and the fixed resolutions).
#ifndef STRATA_SERVER_STORE_ROLLUP_PLAN_H_
#define STRATA_SERVER_STORE_ROLLUP_PLAN_H_

#include <cstdint>
#include <vector>

#include "server/store/column.h"
#include "server/store/records.h"
#include "server/store/rollups.h"

namespace strata::server::store {

// A part of a query's range read from one column family.
struct Piece {
  Column column;
  int64_t from, to;
};

// kAuto's pieces of [from, to), in ascending time order: raw head, minute head, whole hours,
// minute tail, raw tail (empty pieces included). Rollups are read only before the service's
// seal (rollups.h): later whole hours come from the minute rollup, later minutes raw.
std::vector<Piece> AutoPieces(int64_t from, int64_t to, const RollupSeal& seal);

// The pieces `query` reads of [from, to) (0 <= from; nothing when to <= from): its capture's
// cells, one rollup for a fixed resolution, AutoPieces for kAuto. With `whole_hours`, a
// kHour piece starts at the first hour window in the range (readers of whole hours).
// Past the seal, a fixed resolution's pieces continue in the next finer column. Callers skip
// empty pieces.
std::vector<Piece> PlanPieces(const SampleQuery& query, int64_t from, int64_t to,
                              bool whole_hours, const RollupSeal& seal);

}  // namespace strata::server::store

#endif  // STRATA_SERVER_STORE_ROLLUP_PLAN_H_
