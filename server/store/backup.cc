#include "server/store/backup.h"

#include <filesystem>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "rocksdb/db.h"
#include "rocksdb/env.h"
#include "rocksdb/utilities/backup_engine.h"
#include "server/store/data_dir.h"

namespace strata::server::store {
namespace {

absl::Status Error(const std::string& what, const rocksdb::Status& s) {
  const std::string message = absl::StrCat(what, ": ", s.ToString());
  if (s.IsNotFound()) return absl::NotFoundError(message);
  if (s.IsCorruption()) return absl::DataLossError(message);
  if (s.IsInvalidArgument()) return absl::InvalidArgumentError(message);
  if (s.IsIOError() || s.IsBusy()) return absl::UnavailableError(message);
  return absl::InternalError(message);
}

}  // namespace

absl::Status BackupStore(const std::string& data_dir, const std::string& backup_dir,
                         uint32_t keep, BackupInfo* info) {
  std::vector<std::string> families;
  rocksdb::Status s = rocksdb::DB::ListColumnFamilies(rocksdb::DBOptions(), data_dir, &families);
  if (!s.ok()) return Error(absl::StrCat("cannot read the store in ", data_dir), s);
  std::vector<rocksdb::ColumnFamilyDescriptor> descriptors;
  for (const std::string& name : families) descriptors.emplace_back(name, rocksdb::ColumnFamilyOptions());

  if (absl::Status created = CreateDirectories(backup_dir, "backup directory"); !created.ok()) {
    return created;
  }
  std::unique_ptr<rocksdb::BackupEngine> engine;
  {
    rocksdb::BackupEngine* raw = nullptr;
    s = rocksdb::BackupEngine::Open(rocksdb::Env::Default(), rocksdb::BackupEngineOptions(backup_dir),
                                    &raw);
    if (!s.ok()) return Error(absl::StrCat("cannot open the backup directory ", backup_dir), s);
    engine.reset(raw);
  }
  // A running server compacts meanwhile: a file listed and then deleted fails the copy, and
  // the next attempt lists the files anew.
  constexpr int kAttempts = 5;
  for (int attempt = 1;; ++attempt) {
    // Read-only: takes no lock, so the server keeps running; nothing is flushed or written.
    rocksdb::DBOptions db_options;
    std::vector<rocksdb::ColumnFamilyHandle*> handles;
    rocksdb::DB* raw_db = nullptr;
    s = rocksdb::DB::OpenForReadOnly(db_options, data_dir, descriptors, &handles, &raw_db);
    if (!s.ok()) return Error(absl::StrCat("cannot open the store in ", data_dir), s);
    std::unique_ptr<rocksdb::DB> db(raw_db);
    rocksdb::CreateBackupOptions options;
    options.flush_before_backup = false;
    rocksdb::BackupID id = 0;
    s = engine->CreateNewBackup(options, db.get(), &id);
    for (auto* h : handles) db->DestroyColumnFamilyHandle(h).PermitUncheckedError();
    db.reset();
    if (s.ok()) {
      rocksdb::BackupInfo backup;
      if (engine->GetBackupInfo(id, &backup).ok()) info->bytes = backup.size;
      info->backup_id = id;
      break;
    }
    engine->GarbageCollect().PermitUncheckedError();
    if (attempt == kAttempts || !(s.IsIOError() || s.IsNotFound())) {
      return Error(absl::StrCat("backing up ", data_dir, " to ", backup_dir), s);
    }
  }
  if (keep > 0) engine->PurgeOldBackups(keep).PermitUncheckedError();
  std::vector<rocksdb::BackupInfo> backups;
  engine->GetBackupInfo(&backups);
  info->backups = static_cast<uint32_t>(backups.size());
  return absl::OkStatus();
}

absl::Status RestoreStore(const std::string& backup_dir, const std::string& data_dir) {
  std::error_code ec;
  if (std::filesystem::exists(data_dir, ec) && !std::filesystem::is_empty(data_dir, ec)) {
    return absl::FailedPreconditionError(absl::StrCat(
        data_dir, " is not empty: restore into a new directory, then point --data at it"));
  }
  rocksdb::BackupEngineReadOnly* raw = nullptr;
  rocksdb::Status s = rocksdb::BackupEngineReadOnly::Open(
      rocksdb::Env::Default(), rocksdb::BackupEngineOptions(backup_dir), &raw);
  if (!s.ok()) return Error(absl::StrCat("cannot open the backup directory ", backup_dir), s);
  std::unique_ptr<rocksdb::BackupEngineReadOnly> engine(raw);
  std::vector<rocksdb::BackupInfo> backups;
  engine->GetBackupInfo(&backups);
  if (backups.empty()) return absl::NotFoundError(absl::StrCat("no backup in ", backup_dir));
  s = engine->VerifyBackup(backups.back().backup_id, /*verify_with_checksum=*/true);
  if (!s.ok()) return Error(absl::StrCat("backup ", backups.back().backup_id, " in ", backup_dir), s);
  if (absl::Status created = CreateDirectories(data_dir, "data directory"); !created.ok()) {
    return created;
  }
  s = engine->RestoreDBFromLatestBackup(data_dir, data_dir);
  if (!s.ok()) return Error(absl::StrCat("restoring ", backup_dir, " into ", data_dir), s);
  return absl::OkStatus();
}

}  // namespace strata::server::store
