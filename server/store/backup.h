// Online backup and restore of a store directory, with RocksDB's BackupEngine: incremental
// (files already in the backup directory are not copied again), checksummed, and taken from
// a read-only view of the directory, so a running strata-server keeps serving meanwhile.
#ifndef STRATA_SERVER_STORE_BACKUP_H_
#define STRATA_SERVER_STORE_BACKUP_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace strata::server::store {

struct BackupInfo {
  uint32_t backup_id = 0;
  uint64_t bytes = 0;      // of this backup (files shared with earlier ones included)
  uint32_t backups = 0;    // kept in the backup directory
};

// Backs up the store in `data_dir` (running server or not) into `backup_dir`, keeping the
// last `keep` backups there. Retries when the server's compactions delete a file mid-copy.
absl::Status BackupStore(const std::string& data_dir, const std::string& backup_dir,
                         uint32_t keep, BackupInfo* info);

// Restores the latest backup in `backup_dir` into `data_dir`, which must not hold a store
// (nothing is overwritten); the server must not run on it.
absl::Status RestoreStore(const std::string& backup_dir, const std::string& data_dir);

}  // namespace strata::server::store

#endif  // STRATA_SERVER_STORE_BACKUP_H_
