// Self samples per source line: the leaf addresses agents ship with continuous CPU batches
// (store::MetaRecords::SumLeafAddresses) resolved with the modules' DWARF through the
// symbolizer, inlined functions as frames of their own. Addresses of modules the server has
// no DWARF for are counted per function, without a line.
#ifndef STRATA_SERVER_QUERY_LINES_H_
#define STRATA_SERVER_QUERY_LINES_H_

#include <cstdint>
#include <memory>
#include <utility>

#include "absl/container/flat_hash_map.h"

#include "absl/status/statusor.h"
#include "server/query/pprof.h"
#include "server/query/profile.h"
#include "server/store/store.h"
#include "server/symbolize/symbolizer.h"
#include "strata/v1/query.pb.h"

namespace strata::server::query {

// Function records of one query, each read from the store once; or given (Add) when they
// come from other nodes of a cluster, with no store (null) to read the rest from.
class FunctionLookup {
 public:
  explicit FunctionLookup(store::Store* store) : store_(store) {}
  // DataLoss when the record cannot be read (or was not given). The pointer stays valid for
  // the lookup's life.
  absl::StatusOr<const store::FunctionInfo*> Get(uint64_t function_id);
  void Add(uint64_t function_id, store::FunctionInfo info);

 private:
  store::Store* store_;
  absl::flat_hash_map<uint64_t, std::unique_ptr<store::FunctionInfo>> functions_;
};

// (function ID, offset in its module) -> samples.
using LeafAddressCounts = absl::flat_hash_map<std::pair<uint64_t, uint64_t>, uint64_t>;

// OK for a query leaf addresses can answer; InvalidArgument for one with filters they cannot
// honour (focus, ignore, selector, capture, a type other than CPU).
absl::Status CheckLeafAddressQuery(const ProfileQuery& query);
// The leaf addresses of `query`'s range and host (and hosts), after CheckLeafAddressQuery.
absl::StatusOr<LeafAddressCounts> LoadLeafAddresses(store::Store* store,
                                                    const ProfileQuery& query);
// The leaf addresses of `query`'s range and host (and hosts) whatever its other filters (they
// only give the proportions within a function), and the records of their functions.
absl::StatusOr<LeafAddressCounts> SumLeafAddressesOf(store::Store* store,
                                                     const ProfileQuery& query);

// The source lines of `profile`'s leaf functions (by index in Profile::functions) at
// `addresses` (SumLeafAddressesOf), for the pprof export; functions without DWARF are left
// out.
absl::StatusOr<absl::flat_hash_map<uint32_t, std::vector<LeafLine>>> LeafLinesOf(
    FunctionLookup* functions, symbolize::Symbolizer* symbolizer,
    const LeafAddressCounts& addresses, const Profile& profile);

// The call sites of `profile`'s stacks (Profile::call_sites when a ProfileSource gave them,
// else as `store` recorded them) and, where the module's DWARF resolves them, their source
// frames. Stacks stored before call sites were kept have none.
absl::StatusOr<CallSiteLines> CallSiteLinesOf(store::Store* store, FunctionLookup* functions,
                                              symbolize::Symbolizer* symbolizer,
                                              const Profile& profile);

// `profile` at source-line granularity, for the views that only know functions (flame graphs
// in every format): every frame becomes the chain of source frames where its code was
// running, outermost first, inlined functions as frames of their own (ResolvedFunction::file,
// line, inlined). Callers at their stacks' call sites; leaves at their sampled addresses,
// a stack's samples split over its leaf's lines in proportion (as the pprof export does).
// Frames without DWARF on the server, or without a recorded call site, stay one frame
// without a line. Totals are unchanged.
absl::StatusOr<Profile> ExpandLines(store::Store* store, symbolize::Symbolizer* symbolizer,
                                    const ProfileQuery& query, const Profile& profile);

// Self samples per source line of `expanded` (ExpandLines' profile, or a ProfileSource's with
// lines): each stack's samples at its innermost Python or Java frame (IsLanguageFrame), else at
// its leaf, with the frames that one was inlined into. `unresolved_samples` counts those at a
// frame without a line.
v1::TopResponse TopLinesOfStacks(const Profile& expanded, uint32_t limit);

// `symbolizer` may be null (no lines: every address is unresolved). InvalidArgument for a
// query with filters that leaf addresses cannot honour (focus, ignore, selector, capture,
// a profile type other than CPU).
absl::StatusOr<v1::TopResponse> TopLines(store::Store* store, symbolize::Symbolizer* symbolizer,
                                         const ProfileQuery& query, uint32_t limit);

}  // namespace strata::server::query

#endif  // STRATA_SERVER_QUERY_LINES_H_
