#include "server/store/backup.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string_view>
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

// The pinned view of a running server's store: a directory of the data directory, so that
// its hard links are on the same file system; its name ends in the pid of the backup that made
// it.
constexpr char kStagingPrefix[] = "backup-staging.";

void RemoveStaging(const std::string& staging) {
  std::error_code ec;
  std::filesystem::remove_all(staging, ec);
}

// Views left by backups that were killed before they removed them.
void RemoveAbandonedStagings(const std::string& data_dir) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(data_dir, ec)) {
    const std::string name = entry.path().filename();
    if (!name.starts_with(kStagingPrefix)) continue;
    const std::string pid = name.substr(sizeof kStagingPrefix - 1);
    if (!std::filesystem::exists("/proc/" + pid, ec)) RemoveStaging(entry.path());
  }
}

// Hard-links the data directory's files whose names end in `suffix` into `staging`, those not
// linked already; a file deleted since it was listed is skipped.
absl::Status LinkFiles(const std::string& data_dir, const std::string& staging,
                       std::string_view suffix) {
  namespace fs = std::filesystem;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(data_dir, ec)) {
    const std::string name = entry.path().filename();
    if (!name.ends_with(suffix) || fs::exists(staging + "/" + name, ec)) continue;
    fs::create_hard_link(entry.path(), staging + "/" + name, ec);
    if (ec && ec != std::errc::no_such_file_or_directory) {
      return absl::UnavailableError(absl::StrCat("linking ", name, ": ", ec.message()));
    }
  }
  if (ec) return absl::UnavailableError(absl::StrCat("listing ", data_dir, ": ", ec.message()));
  return absl::OkStatus();
}

// Pins a view of the store in `data_dir` that its server cannot change: the logs linked first,
// then the manifest copied as it is now (the server appends to it), then the table files and
// the logs begun since. Every file the manifest's copy needs is then either linked or was
// deleted before it was linked; the logs come first so that a log the server deleted after a
// flush is kept if the copy's manifest does not hold the flush.
absl::Status StageStore(const std::string& data_dir, const std::string& staging) {
  namespace fs = std::filesystem;
  RemoveStaging(staging);
  std::error_code ec;
  if (!fs::create_directory(staging, ec) || ec) {
    return absl::UnavailableError(absl::StrCat("cannot create ", staging, ": ", ec.message()));
  }
  fs::permissions(staging, fs::perms::owner_all, ec);
  if (absl::Status linked = LinkFiles(data_dir, staging, ".log"); !linked.ok()) return linked;
  std::string manifest;
  {
    std::ifstream current(data_dir + "/CURRENT");
    std::getline(current, manifest);
  }
  if (!manifest.starts_with("MANIFEST-")) {
    return absl::UnavailableError(absl::StrCat(data_dir, "/CURRENT names no manifest"));
  }
  fs::copy_file(data_dir + "/" + manifest, staging + "/" + manifest, ec);
  if (ec) return absl::UnavailableError(absl::StrCat("copying ", manifest, ": ", ec.message()));
  std::ofstream(staging + "/CURRENT") << manifest << "\n";
  std::string options_file;  // the newest; RocksDB writes one at each open
  for (const auto& entry : fs::directory_iterator(data_dir, ec)) {
    const std::string name = entry.path().filename();
    // Not RocksDB's half-written "OPTIONS-N.dbtmp", which sorts after its finished file.
    if (name.starts_with("OPTIONS-") && !name.ends_with(".dbtmp") && name > options_file) {
      options_file = name;
    }
  }
  for (const std::string& name : {std::string("IDENTITY"), options_file}) {
    if (!name.empty()) fs::copy_file(data_dir + "/" + name, staging + "/" + name, ec);
  }
  if (absl::Status linked = LinkFiles(data_dir, staging, ".sst"); !linked.ok()) return linked;
  return LinkFiles(data_dir, staging, ".log");
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
  RemoveAbandonedStagings(data_dir);
  const std::string staging = absl::StrCat(data_dir, "/", kStagingPrefix, getpid());
  // A running server flushes and compacts meanwhile. The view is pinned first (StageStore), so
  // that nothing it holds can be deleted during the copy, however long that takes; a file
  // deleted while the view was being pinned fails the open (a missing table file, or "SST file
  // is ahead of WALs"), and the next attempt pins the view anew. A store that is really
  // corrupt fails every attempt. Where the data directory cannot take the view (a backup
  // user with read access only), the store is read in place, with the same retries.
  constexpr int kAttempts = 5;
  for (int attempt = 1;; ++attempt) {
    absl::Status staged = StageStore(data_dir, staging);
    const std::string& view = staged.ok() ? staging : data_dir;
    // Read-only: takes no lock, so the server keeps running; nothing is flushed or written.
    rocksdb::DBOptions db_options;
    std::vector<rocksdb::ColumnFamilyHandle*> handles;
    rocksdb::DB* raw_db = nullptr;
    s = rocksdb::DB::OpenForReadOnly(db_options, view, descriptors, &handles, &raw_db);
    if (s.ok()) {
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
    }
    const bool changed_meanwhile = s.IsIOError() || s.IsNotFound() || s.IsCorruption();
    if (attempt == kAttempts || !changed_meanwhile) {
      RemoveStaging(staging);
      return Error(absl::StrCat("backing up ", data_dir, " to ", backup_dir), s);
    }
  }
  RemoveStaging(staging);
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
