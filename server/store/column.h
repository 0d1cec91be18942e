// The store's column families, named for tests and tools that write raw bytes
// (Store::PutRawForTesting). The layout of each is described in store.h.
#ifndef STRATA_SERVER_STORE_COLUMN_H_
#define STRATA_SERVER_STORE_COLUMN_H_

#include <cstdint>

namespace strata::server::store {

enum class Column {
  kStacks,
  kFunctions,
  kSamples,
  kCaptures,
  kServices,
  kMeta,
  kRollupMinute,
  kRollupHour,
  kJournal
};

// Windows of the minute and hour rollups.
inline constexpr int64_t kMinuteMs = 60'000;
inline constexpr int64_t kHourMs = 3'600'000;

}  // namespace strata::server::store

#endif  // STRATA_SERVER_STORE_COLUMN_H_
