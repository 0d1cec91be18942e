// Internal to server/store: the minute and hour rollups, derived from the raw cells.
//
// A window's commit writes its raw cells only. The rollups are written later, per service,
// by RollUp(): it sums the raw cells of every whole minute up to a time into the minute
// rollup, and the minute rollup of every whole hour into the hour rollup, in one commit with
// the service's new seal. Writing each cell three times (raw, minute, hour) made every
// window's commit insert as many merge operands into the rollups' memtables, hundreds per
// hour cell; rolling up writes each (minute, host, stack) and (hour, host, stack) once per
// roll instead.
//
// The seal of a service says how far its rollups are complete: every raw cell with a window
// before `minute_ms` is in the minute rollup, and every one before `hour_ms` in the hour
// rollup (hour_ms <= minute_ms). Readers plan their pieces with it (rollup_plan.h): a range
// past the seal is read from the finer column, which holds the same counts. Cells committed
// for a window already sealed (late batches, journal recovery) get their rollup merges in
// their own commit (AddRollupMerges); the others wait for the roller. Seals are stored in
// the meta column family with the rollups they cover, so a restarted store rolls up exactly
// what it had not. Services written before seals existed have every cell rolled up: their
// seal starts past their last window.
//
// Thread-safe. Store::Commit holds CommitLock() across deciding and writing a batch's rollup
// merges, and RollUp holds it across reading the raw cells and writing their sums, so that
// no cell is counted twice or missed.
#ifndef STRATA_SERVER_STORE_ROLLUPS_H_
#define STRATA_SERVER_STORE_ROLLUPS_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/store/db.h"
#include "server/store/block_cache.h"
#include "server/store/write_batch_rep.h"

namespace strata::server::store {

struct RollupSeal {
  int64_t minute_ms = 0;  // raw cells of windows before it are in the minute rollup
  int64_t hour_ms = 0;    // ... and before this one in the hour rollup
  friend bool operator==(const RollupSeal&, const RollupSeal&) = default;
};

// What one RollUp wrote.
struct RollupStats {
  uint64_t services = 0;      // services whose seal moved
  uint64_t minute_cells = 0;  // cells written to the minute rollup
  uint64_t hour_cells = 0;    // ... and to the hour rollup
};

class Rollups {
 public:
  // A service's seal and its latest raw window (here or before a restart).
  struct ServiceState {
    RollupSeal seal;
    int64_t last_window_ms = -1;
  };
  // What a commit changes, applied by Committed() once its write succeeded.
  using Updates = absl::flat_hash_map<std::string, ServiceState>;

  // Borrows the database and the rollup block caches (the minutes and hours it writes are
  // dropped there).
  Rollups(Database* db, RollupBlocks* blocks) : db_(db), blocks_(blocks) {}

  // Reads the stored seals and the services' summaries; a service without a seal (written
  // before seals existed, every cell rolled up at commit) is sealed after its last window
  // (after `now_ms` if its summary is corrupt).
  absl::Status Load(int64_t now_ms);

  // Held by Store::Commit from AddRollupMerges until its write is done (or failed).
  absl::Mutex& CommitLock() ABSL_LOCK_RETURNED(mu_) { return mu_; }

  // For the raw cells of `rep` (Rep::cell_ops): adds to `wb` the rollup merges of the cells
  // whose windows are sealed, and the seal of each service seen for the first time (at its
  // earliest window in the batch).
  absl::Status AddRollupMerges(const WriteBatch::Rep& rep, rocksdb::WriteBatch* wb,
                               Updates* updates) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Committed(Updates& updates) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Rolls every service up to the whole minutes (and hours) before `up_to_ms`, one service
  // at a time.
  absl::StatusOr<RollupStats> RollUp(int64_t up_to_ms) ABSL_LOCKS_EXCLUDED(mu_);

  // The seal of `service`; {INT64_MAX, INT64_MAX} for a service without cells.
  RollupSeal Seal(std::string_view service) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // Rolls the minutes, then the hours, of one service: each its own commit with its seal.
  absl::Status RollService(const std::string& service, ServiceState& state, int64_t up_to_ms,
                           RollupStats* stats) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What one Roll wrote: its cells, and the unit windows they fall in, ascending.
  struct Rolled {
    uint64_t cells = 0;
    std::vector<int64_t> units;
  };
  // Sums the cells of `from` from window `begin` up to the new seal's end for `unit` (minute
  // or hour) per (unit window, host, stack, label set) into merges of `to`, and commits them
  // with `seal`.
  absl::StatusOr<Rolled> Roll(Column from, Column to, const std::string& service,
                              int64_t begin, int64_t unit, const RollupSeal& seal)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Write(rocksdb::WriteBatch* wb) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Database* const db_;
  RollupBlocks* const blocks_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, ServiceState> services_ ABSL_GUARDED_BY(mu_);
};

// Meta key and value of a service's seal.
std::string RollupSealKey(std::string_view service);
std::string EncodeRollupSeal(const RollupSeal& seal);
absl::StatusOr<RollupSeal> DecodeRollupSeal(std::string_view value);

}  // namespace strata::server::store

#endif  // STRATA_SERVER_STORE_ROLLUPS_H_
