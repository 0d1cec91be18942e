#include "server/store/backup.h"

#include <atomic>
#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/testing/temp_dir.h"
#include "gtest/gtest.h"
#include "rocksdb/db.h"

namespace strata::server::store {
namespace {

// A store written to as a server writes it: several column families, each flushed on its own,
// so the write-ahead logs roll over and are deleted while a backup reads the directory.
class LiveStore {
 public:
  static constexpr int kFamilies = 3;

  explicit LiveStore(const std::string& dir) {
    rocksdb::Options options;
    options.create_if_missing = true;
    options.create_missing_column_families = true;
    options.write_buffer_size = 64 << 10;
    std::vector<rocksdb::ColumnFamilyDescriptor> descriptors;
    descriptors.emplace_back(rocksdb::kDefaultColumnFamilyName, options);
    for (int i = 1; i < kFamilies; ++i) descriptors.emplace_back(absl::StrCat("cf", i), options);
    rocksdb::DB* db = nullptr;
    status_ = rocksdb::DB::Open(options, dir, descriptors, &handles_, &db);
    db_.reset(db);
  }
  ~LiveStore() {
    Stop();
    for (auto* h : handles_) db_->DestroyColumnFamilyHandle(h).PermitUncheckedError();
  }
  const rocksdb::Status& status() const { return status_; }

  // Writes and flushes one family after another until Stop(); `written` counts the keys.
  void Start() {
    writer_ = std::thread([this] {
      for (uint64_t i = 0; !stop_.load(); ++i) {
        rocksdb::ColumnFamilyHandle* family = handles_[i % kFamilies];
        if (!db_->Put(rocksdb::WriteOptions(), family, absl::StrCat("key", i),
                      std::string(100, 'v')).ok()) {
          break;
        }
        written_.store(i + 1);
        if (i % 50 == 49) db_->Flush(rocksdb::FlushOptions(), family).PermitUncheckedError();
        // Slow enough that a backup's copy does not grow without end; fast enough that logs
        // are deleted during every copy.
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    });
  }
  void Stop() {
    stop_.store(true);
    if (writer_.joinable()) writer_.join();
  }
  uint64_t written() const { return written_.load(); }

 private:
  rocksdb::Status status_;
  std::vector<rocksdb::ColumnFamilyHandle*> handles_;
  std::unique_ptr<rocksdb::DB> db_;
  std::thread writer_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> written_{0};
};

// Keys in every family of the store in `dir`, opened read-only.
uint64_t CountKeys(const std::string& dir) {
  std::vector<std::string> names;
  EXPECT_TRUE(rocksdb::DB::ListColumnFamilies(rocksdb::DBOptions(), dir, &names).ok());
  std::vector<rocksdb::ColumnFamilyDescriptor> descriptors;
  for (const std::string& name : names) {
    descriptors.emplace_back(name, rocksdb::ColumnFamilyOptions());
  }
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::DB* raw = nullptr;
  rocksdb::Status s =
      rocksdb::DB::OpenForReadOnly(rocksdb::DBOptions(), dir, descriptors, &handles, &raw);
  EXPECT_TRUE(s.ok()) << s.ToString();
  if (!s.ok()) return 0;
  std::unique_ptr<rocksdb::DB> db(raw);
  uint64_t keys = 0;
  for (auto* h : handles) {
    std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(rocksdb::ReadOptions(), h));
    for (it->SeekToFirst(); it->Valid(); it->Next()) ++keys;
    db->DestroyColumnFamilyHandle(h).PermitUncheckedError();
  }
  return keys;
}

// A backup taken while the store is flushed and its logs deleted succeeds every time, and
// restores into a store holding every key written before it began. Each backup pins its view
// of the store in the data directory and removes it when done.
TEST(BackupTest, BackupsOfAStoreBeingFlushedSucceedAndRestore) {
  testing::TempDir dir("strata_backup_test");
  LiveStore live(dir.File("data"));
  ASSERT_TRUE(live.status().ok()) << live.status().ToString();
  // A view left by a backup that was killed (no such pid) is removed by the next one.
  std::filesystem::create_directories(dir.File("data/backup-staging.999999999/x"));
  live.Start();
  constexpr int kBackups = 8;
  uint64_t written_before_last = 0;
  for (int i = 0; i < kBackups; ++i) {
    written_before_last = live.written();
    BackupInfo info;
    absl::Status s = BackupStore(dir.File("data"), dir.File("backups"), /*keep=*/2, &info);
    ASSERT_TRUE(s.ok()) << "backup " << i << ": " << s;
  }
  live.Stop();
  for (const auto& entry : std::filesystem::directory_iterator(dir.File("data"))) {
    EXPECT_FALSE(entry.path().filename().string().starts_with("backup-staging."))
        << entry.path();
  }
  ASSERT_TRUE(RestoreStore(dir.File("backups"), dir.File("restored")).ok());
  EXPECT_GE(CountKeys(dir.File("restored")), written_before_last);
}

}  // namespace
}  // namespace strata::server::store
