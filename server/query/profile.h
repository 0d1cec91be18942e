// Reading profiles back: the samples of one service (or capture) over a time range, resolved
// to frames, filtered, and reduced to the views the query API serves (top functions, hot
// paths). Shared by the gRPC Query service and the HTTP/JSON mirror.
//
// A Profile owns its resolved data; ProfileReader borrows the Store and keeps the stacks and
// functions it resolved (immutable records) for later loads.
#ifndef STRATA_SERVER_QUERY_PROFILE_H_
#define STRATA_SERVER_QUERY_PROFILE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/container/inlined_vector.h"
#include "absl/status/statusor.h"
#include "server/aggregate/live_samples.h"
#include "server/store/store.h"
#include "server/symbolize/symbolizer.h"
#include "strata/v1/common.pb.h"
#include "strata/v1/query.pb.h"

namespace re2 {
class RE2;
}

namespace strata::server::query {

// The latest time a query takes, in Unix milliseconds (2^62, the year 146 million): sums and
// differences of two of them, and of a step no longer, cannot overflow.
inline constexpr int64_t kMaxQueryMs = int64_t{1} << 62;

struct ProfileQuery {
  std::string service;
  int64_t from_ms = 0;  // inclusive
  int64_t to_ms = 0;    // exclusive
  std::string host;     // empty: all hosts
  std::string capture_id;  // non-empty: the samples of this capture instead
  std::string focus;    // RE2: keep stacks with a matching function
  std::string ignore;   // RE2: drop stacks with a matching function
  // Label selector (common/labels/labels.h): only samples of targets whose labels match.
  // Continuous profiles only.
  std::string selector;
  // kAuto reads whole hours and minutes from the rollups, so long ranges scan few cells.
  store::Resolution resolution = store::Resolution::kAuto;
  // CPU, off-CPU or both (wall): label sets with or without the reserved profile label
  // (commit/profile_type.h). Captures are CPU only.
  v1::ProfileType type = v1::PROFILE_CPU;
  // When set, only samples of these hosts (a cluster node's share of a fan-out query).
  std::optional<absl::flat_hash_set<std::string>> hosts;
  // A cluster's fan-out (ProfileSource) also sends each function's build ID
  // (ResolvedFunction::build_id), which ProfileReader leaves empty.
  bool build_ids = false;
  // Source lines (ExpandLines): a cluster's fan-out has each node expand its part, where its
  // hosts' leaf addresses and call sites are stored.
  bool lines = false;
  // The call sites of each stack (Profile::call_sites), which a cluster's nodes read from
  // their stores for the pprof export's lines.
  bool call_sites = false;
  // Also the requests the hosts served (Profile::requests), for continuous profiles.
  bool requests = false;
};

struct ResolvedFunction {
  uint64_t id = 0;
  std::string name;
  std::string module;
  // In a profile with source lines (lines.h: ExpandLines): the frame's file and line (empty
  // and 0 where not known), and whether its code was inlined into its caller's.
  std::string file;
  uint32_t line = 0;
  bool inlined = false;
  std::string build_id;  // of the module, when the query asked (ProfileQuery::build_ids)
};

// How views label a frame: its name, then " file:line" where known, " [inlined]" if so.
std::string FrameLabel(const ResolvedFunction& f);

// A stack's frames: most stacks fit inline, so loading a week's 100,000 stacks does not
// allocate (and free) each one's frames on its own.
using FrameIndices = absl::InlinedVector<uint32_t, 32>;

struct ResolvedStack {
  uint64_t stack_id = 0;
  uint64_t count = 0;
  bool truncated = false;
  FrameIndices frames;  // indices into Profile::functions, outermost first
};

struct Profile {
  uint64_t total = 0;
  std::vector<ResolvedFunction> functions;
  std::vector<ResolvedStack> stacks;  // by count, descending
  std::vector<std::string> hosts;     // hosts that contributed samples, sorted
  std::vector<uint64_t> host_samples;  // samples of each of `hosts`, before focus and ignore
  // In a cluster: nodes that hold samples for the query and did not answer (profile_source.h).
  std::vector<std::string> unreachable_nodes;
  // From a ProfileSource asked for them (ProfileQuery::call_sites): each stack's call sites
  // (store::StackFrames::call_sites), by index into `stacks`.
  std::vector<std::vector<uint64_t>> call_sites;
  // When asked (ProfileQuery::requests): the requests the query's hosts served over its range
  // as their agents scraped them (store::MetaRecords::SumRequests); 0: not known.
  uint64_t requests = 0;
};

struct FunctionTotals {
  uint32_t function;  // index into Profile::functions
  uint64_t self = 0;
  uint64_t total = 0;
};

// Which frame of a stack its samples are the self samples of.
enum class SelfOf {
  kLeaf,  // the innermost frame
  // The innermost Python or JIT frame, where the stack has one: the interpreter's or JVM's
  // native code it called (_PyObject_Free, a GC barrier) and the kernel's under that are its
  // cost, as py-spy and async-profiler's Java views count them; else the leaf. The question a
  // release of a Python or Java service asks is which of its own functions got slower.
  kLanguageFrame,
};

// Whether `f` is Python, Java or JIT code: a frame SelfOf::kLanguageFrame gives self samples
// to.
bool IsLanguageFrame(const ResolvedFunction& f);

// A function as the API's frame (its kind from the module name; file, line, inlined).
void SetFrame(const ResolvedFunction& f, v1::Frame* out);

// Self and total samples per function; a function appearing several times in one stack
// (recursion) counts once towards that stack's total.
std::vector<FunctionTotals> TopFunctions(const Profile& profile, bool sort_by_total,
                                         SelfOf self_of = SelfOf::kLeaf);

// Makes each function that several builds or processes hold one function: the same name,
// module identity (base::IdentityOf: a release's directory and a perf map's process ID left
// out), file, line and inlined flag. Stacks are renumbered to the first of them, and stacks
// that become alike are summed (the first one's ID kept; stacks stay by count, descending).
// Views keyed by function (top, hot paths, flame graphs) then show a function once over a
// range that spans a deploy, or a fleet with two builds of a library; pprof, FDO and line
// tables keep each build's own, as they need its addresses. A profile with call sites is
// left alone (they are by index into its stacks).
void MergeFunctionsAcrossBuilds(Profile* profile);

// Services of the store, plus those whose only samples are still live (`live` may be null),
// with live totals added.
absl::StatusOr<std::vector<store::ServiceSummary>> ListServices(store::Store* store,
                                                                const aggregate::LiveSamples* live);

class ProfileReader {
 public:
  // `live` (optional) adds the acknowledged samples not yet written to the store.
  // `symbolizer` (optional) names frames the agents could not name, at load time.
  explicit ProfileReader(store::Store* store, const aggregate::LiveSamples* live = nullptr,
                         symbolize::Symbolizer* symbolizer = nullptr);
  ~ProfileReader();
  ProfileReader(const ProfileReader&) = delete;
  ProfileReader& operator=(const ProfileReader&) = delete;

  // InvalidArgument: empty service, from >= to, bad regex, bad selector (or one given with a
  // capture), a capture with a type other than CPU. NotFound: unknown service (with
  // the known ones in the message). Stacks that cannot be resolved are reported as DataLoss.
  // Thread-safe.
  absl::StatusOr<Profile> Load(const ProfileQuery& query);
  // Samples per host for `query` (before focus and ignore), sorted by host; the same errors.
  absl::StatusOr<std::vector<std::pair<std::string, uint64_t>>> HostSamples(
      const ProfileQuery& query);
  // Samples per interval of `step_ms` (series.h: SeriesStep, already checked) from the
  // interval holding query.from_ms to query.to_ms: one series per value of the label
  // `group_by` (kSeriesByHost: per host; empty: one series), every one, in no order; focus
  // and ignore apply; the open windows' samples are counted too. The same errors as Load.
  absl::StatusOr<v1::SeriesResponse> Series(const ProfileQuery& query, int64_t step_ms,
                                            const std::string& group_by);

 private:
  // Checks `query` and turns it into the store's query; compiles its regexes.
  absl::StatusOr<store::SampleQuery> Prepare(const ProfileQuery& query,
                                             std::unique_ptr<re2::RE2>* focus,
                                             std::unique_ptr<re2::RE2>* ignore);
  // Stacks and functions resolved by earlier loads (see profile.cc).
  class Resolved;

  // The store's totals for `query` plus the live counts, read consistently.
  absl::StatusOr<store::SampleTotals> SumSamples(const store::SampleQuery& query);

  store::Store* store_;
  const aggregate::LiveSamples* live_;
  std::unique_ptr<Resolved> resolved_;
};

}  // namespace strata::server::query

#endif  // STRATA_SERVER_QUERY_PROFILE_H_
