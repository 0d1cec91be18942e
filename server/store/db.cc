#include "server/store/db.h"

#include <memory>

namespace strata::server::store {

absl::Status FromRocks(const rocksdb::Status& s) {
  if (s.ok()) return absl::OkStatus();
  if (s.IsNotFound()) return absl::NotFoundError(s.ToString());
  if (s.IsCorruption()) return absl::DataLossError(s.ToString());
  if (s.IsInvalidArgument()) return absl::InvalidArgumentError(s.ToString());
  if (s.IsBusy() || s.IsTryAgain()) return absl::UnavailableError(s.ToString());
  // Disk full, a failing disk: nothing was written; the writer tries again later.
  if (s.IsIOError() || s.IsNoSpace()) return absl::UnavailableError(s.ToString());
  return absl::InternalError(s.ToString());
}

std::string PrefixSuccessor(std::string prefix) {
  while (!prefix.empty()) {
    unsigned char last = static_cast<unsigned char>(prefix.back());
    if (last != 0xff) {
      prefix.back() = static_cast<char>(last + 1);
      return prefix;
    }
    prefix.pop_back();
  }
  return prefix;
}

absl::Status Database::Scan(
    Column column, const std::string& begin, const std::string& end,
    const std::function<absl::Status(std::string_view key, std::string_view value)>& fn) const {
  rocksdb::ReadOptions ro;
  rocksdb::Slice upper(end);
  if (!end.empty()) ro.iterate_upper_bound = &upper;
  std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(ro, cf(column)));
  for (it->Seek(begin); it->Valid(); it->Next()) {
    absl::Status s = fn(View(it->key()), View(it->value()));
    if (!s.ok()) return s;
  }
  return FromRocks(it->status());
}

absl::StatusOr<bool> Database::HasRecords(Column column, const std::string& prefix) const {
  std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(rocksdb::ReadOptions(), cf(column)));
  it->Seek(prefix);
  if (!it->status().ok()) return FromRocks(it->status());
  return it->Valid() && it->key().starts_with(rocksdb::Slice(prefix));
}

}  // namespace strata::server::store
