// Internal to server/store: the open RocksDB database and its column families, shared by the
// store's components (Store owns it and outlives them), and conversions at the RocksDB
// boundary. No header outside server/store includes this.
#ifndef STRATA_SERVER_STORE_DB_H_
#define STRATA_SERVER_STORE_DB_H_

#include <array>
#include <cstddef>
#include <functional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "rocksdb/db.h"
#include "rocksdb/slice.h"
#include "server/store/column.h"

namespace strata::server::store {

// Column family names on disk, indexed by Column.
inline constexpr std::array<const char*, 9> kColumnNames = {
    "stacks",  "functions", "samples",   "captures", "services",
    "meta",    "rollup_1m", "rollup_1h", "journal"};
inline constexpr size_t kNumColumns = kColumnNames.size();

absl::Status FromRocks(const rocksdb::Status& s);

inline std::string_view View(const rocksdb::Slice& s) {
  return std::string_view(s.data(), s.size());
}
inline rocksdb::Slice ToSlice(std::string_view s) { return rocksdb::Slice(s.data(), s.size()); }

// Service, host, agent and capture IDs become key components ending in '\0'.
inline bool ValidKeyPart(std::string_view s) { return s.find('\0') == std::string_view::npos; }

// Smallest key greater than every key starting with `prefix`, or "" if none exists.
std::string PrefixSuccessor(std::string prefix);

struct Database {
  rocksdb::DB* db = nullptr;
  std::array<rocksdb::ColumnFamilyHandle*, kNumColumns> columns{};

  rocksdb::ColumnFamilyHandle* cf(Column c) const { return columns[static_cast<size_t>(c)]; }

  // Iterates [begin, end) of a column family (end "" : to the last key); stops at the first
  // error `fn` returns.
  absl::Status Scan(
      Column column, const std::string& begin, const std::string& end,
      const std::function<absl::Status(std::string_view key, std::string_view value)>& fn) const;
  // Whether some key of `column` starts with `prefix`.
  absl::StatusOr<bool> HasRecords(Column column, const std::string& prefix) const;
};

}  // namespace strata::server::store

#endif  // STRATA_SERVER_STORE_DB_H_
