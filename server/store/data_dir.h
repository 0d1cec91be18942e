// Internal to server/store: the marker file that tells a Strata data directory (and the
// store version written in it) from anything else at that path, and the making of the
// directories a store, a backup or a restore writes into.
#ifndef STRATA_SERVER_STORE_DATA_DIR_H_
#define STRATA_SERVER_STORE_DATA_DIR_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace strata::server::store {

// Refuses a directory that holds something other than a Strata store, before RocksDB
// creates its files among someone else's: a path given by mistake must not be written to.
absl::Status CheckDataDirectory(const std::string& dir);

// Creates `dir` and its parents where missing; `what` names it in the error ("data
// directory"). RocksDB makes only the last component of a missing path, and for a store only
// after listing it and logging the failure as an error, on every new store.
absl::Status CreateDirectories(const std::string& dir, absl::string_view what);

// Marks an opened directory as a store of the current version.
void MarkDataDirectory(const std::string& dir);

}  // namespace strata::server::store

#endif  // STRATA_SERVER_STORE_DATA_DIR_H_
