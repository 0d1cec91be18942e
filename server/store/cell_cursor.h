// Internal to server/store: a RocksDB iterator over one scope's cells (samples, captures,
// rollups) from one window up to, not including, another.
#ifndef STRATA_SERVER_STORE_CELL_CURSOR_H_
#define STRATA_SERVER_STORE_CELL_CURSOR_H_

#include <cstdint>
#include <memory>
#include <string>

#include "rocksdb/db.h"
#include "server/store/codec.h"
#include "server/store/db.h"

namespace strata::server::store {

// Positioned at window `from` of `scope` in `column`, bounded before window `to`.
class CellCursor {
 public:
  CellCursor(const Database& db, Column column, const std::string& scope, int64_t from,
             int64_t to)
      : upper_key_(CellPrefix(scope, static_cast<uint64_t>(to))), upper_(upper_key_) {
    rocksdb::ReadOptions ro;
    ro.iterate_upper_bound = &upper_;
    ro.prefix_same_as_start = true;
    it_.reset(db.db->NewIterator(ro, db.cf(column)));
    it_->Seek(CellPrefix(scope, static_cast<uint64_t>(from)));
  }
  CellCursor(const CellCursor&) = delete;
  CellCursor& operator=(const CellCursor&) = delete;

  rocksdb::Iterator* operator->() const { return it_.get(); }

 private:
  const std::string upper_key_;
  const rocksdb::Slice upper_;  // the iterator's upper bound: lives as long as it
  std::unique_ptr<rocksdb::Iterator> it_;
};

}  // namespace strata::server::store

#endif  // STRATA_SERVER_STORE_CELL_CURSOR_H_
