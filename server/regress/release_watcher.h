// Releases found by themselves: the server notices a new release of a service and compares it
// with the one it replaced, without being asked.
//
// Every Check(), for every service: the values of its release label (the first of
// `labels` its label sets carry: "version", else "build_id"). A value not seen before is a
// new release. Its baseline is the known release of the same label that ran most recently
// (the values with samples since the last check are noted at every check: after a rollback,
// the release rolled back to), else the one first seen most recently. The comparison takes
// the baseline's samples over [first seen - lookback, now) and the candidate's from the check
// before the one that found it (less kLateSamplesMs: a window's samples are listed only once
// its batch arrives) to now, since the candidate ran from some time between the two, and runs
// again at every check until the candidate has been seen for `window`: then its verdict is
// final. The values a service shows when the watcher first meets it are recorded without a
// comparison (their order is unknown).
//
// Phase changes (the aggregator saw a service's hottest contexts reorder within one window)
// are compared the same way: the release running at the change, its samples from the change
// on against its samples over the lookback before its onset, per (host, span) unit (a release of
// a service on one host is compared per span of that host too). A phase change
// within `window` after a compared release or another phase change is part of that one.
//
// The comparison itself (CompareFn: two label selections over two ranges, with confidence
// intervals and a false discovery rate) and the storage of the state are the caller's; the
// watcher owns the bookkeeping. Every release's state goes through PersistFn after each
// change, and a watcher built with those records continues where the last one stopped.
// Keep() takes another watcher's states (a cluster's checking node sends them to the other
// nodes), the newer state of each release winning, so that the watcher of whichever node
// checks next continues from them too.
//
// Thread-safe: Check() from one thread (the server's), Verdicts(), Releases() and Keep() from
// any.
#ifndef STRATA_SERVER_REGRESS_RELEASE_WATCHER_H_
#define STRATA_SERVER_REGRESS_RELEASE_WATCHER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/labels/labels.h"
#include "server/store/records.h"
#include "strata/v1/regress.pb.h"

namespace strata::server::regress {

// How long before a check samples of a value it does not list yet may be: their batch came
// after it (agents send a window's samples once it ends, every 10 s by default).
inline constexpr int64_t kLateSamplesMs = 60'000;

struct ReleaseWatcherOptions {
  std::vector<std::string> labels = {"version", "build_id"};
  absl::Duration baseline_lookback = absl::Hours(1);
  absl::Duration window = absl::Minutes(30);
  // A phase change's comparison unit: each host's samples over a span this long; a
  // release's too when the service runs on one host, the same before and after.
  absl::Duration phase_unit = absl::Minutes(1);
  // How long before the window a phase change is reported in it may have begun (the
  // aggregator ranks each window against the ones before): left out of the baseline.
  absl::Duration phase_onset = absl::Seconds(20);
};

// What one comparison reads: the baseline's and the candidate's samples of `service`.
struct ComparisonPlan {
  std::string service;
  std::string baseline_selector;   // e.g. version=1.4.2
  std::string candidate_selector;
  int64_t baseline_from_ms = 0, baseline_to_ms = 0;
  int64_t candidate_from_ms = 0, candidate_to_ms = 0;
  // Each (host, span of window_s seconds) a unit of its own (a phase change: the same hosts
  // before and after), else each host.
  bool windows_independent = false;
  // Each host a unit, but its spans where both groups are the same one host (a release of a
  // service that runs on one host).
  bool one_host_windows = false;
  uint32_t window_s = 0;
};

// A comparison's outcome: ReleaseVerdict's state, functions, min_detectable, units, samples.
using CompareFn = std::function<absl::StatusOr<v1::ReleaseVerdict>(const ComparisonPlan&)>;

struct ReleaseWatcherInputs {
  std::function<absl::StatusOr<std::vector<std::string>>()> services;
  // The values each label key of the service's targets takes.
  std::function<absl::StatusOr<std::map<std::string, std::vector<std::string>>>(
      const std::string& service)>
      label_values;
  // The values of the service's label `label` that have samples in [from_ms, to_ms).
  // Optional (without it, the baseline is the release first seen most recently).
  std::function<absl::StatusOr<std::vector<std::string>>(
      const std::string& service, const std::string& label, int64_t from_ms, int64_t to_ms)>
      running;
  // The window starts of the service's phase changes in [from_ms, to_ms). Optional.
  std::function<absl::StatusOr<std::vector<int64_t>>(const std::string& service,
                                                      int64_t from_ms, int64_t to_ms)>
      phases;
  CompareFn compare;
  std::function<absl::Status(const std::vector<store::ReleaseRecord>&)> persist;
};

class ReleaseWatcher {
 public:
  // `stored`: the records PersistFn was given before (a restart), in any order.
  ReleaseWatcher(ReleaseWatcherOptions options, ReleaseWatcherInputs inputs,
                 const std::vector<store::ReleaseRecord>& stored);
  ReleaseWatcher(const ReleaseWatcher&) = delete;
  ReleaseWatcher& operator=(const ReleaseWatcher&) = delete;

  // One pass at `now_ms`: new releases, and the comparisons not final yet. Returns the
  // verdicts whose state changed in this pass (a release newly found REGRESSED, ...). A
  // service whose label sets cannot be read, or a comparison that fails, is left for the next
  // pass (the failure is kept in the verdict's `error`); the error returned is the first one.
  absl::StatusOr<std::vector<v1::ReleaseVerdict>> Check(int64_t now_ms);

  // The verdicts of releases compared with a baseline and of phase changes, of `service`
  // (every one when empty) whose candidate was first seen (or phase change began) at or after
  // `since_ms`, newest first.
  std::vector<v1::ReleaseVerdict> Verdicts(const std::string& service, int64_t since_ms) const;

  // Every release's and phase change's state as last persisted, the releases met without a
  // comparison too (what another watcher needs to continue from), in ReleaseId order.
  std::vector<v1::ReleaseVerdict> Releases() const;

  // Another watcher's states (Releases() there): each one of a release not known here, or
  // superseding the state held here, goes through PersistFn and is then held, so that Check
  // continues from it. Returns how many were taken; when PersistFn fails, none is.
  absl::StatusOr<size_t> Keep(const std::vector<v1::ReleaseVerdict>& states);

  // Whether `a` is a later state of its release than `b`: more comparisons run (they only
  // grow along a release's history, whichever node ran them, so a clock behind on the node
  // that took over does not hide its states), else final where `b` is not, else computed
  // later.
  static bool Supersedes(const v1::ReleaseVerdict& a, const v1::ReleaseVerdict& b);

  // Whether release `a` ran more recently than `b` (its last check with samples, else its
  // first sighting; the one first seen later on a tie): what a new release replaced, and
  // whether a service was rolled back.
  static bool RanLater(const v1::ReleaseVerdict& a, const v1::ReleaseVerdict& b);

  // A release's unique ID: service '\0' label '\0' value (the store's record ID); a phase
  // change's: service '\0' '\1' its window start (20 digits).
  static std::string ReleaseId(const v1::ReleaseVerdict& release);

 private:
  // The service's release label and its values now, or an empty label when it has none.
  absl::StatusOr<std::pair<std::string, std::vector<std::string>>> ReleaseValues(
      const std::string& service);
  // New phase verdicts of `service` for the changes that began at `phase_starts`, compared
  // within the release of `label` running at each.
  void AddPhases(const std::string& service, const std::string& label,
                 const std::vector<int64_t>& phase_starts, int64_t now_ms,
                 std::set<std::string>& dirty) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Compare(v1::ReleaseVerdict& release, int64_t now_ms);

  const ReleaseWatcherOptions options_;
  const ReleaseWatcherInputs inputs_;
  // Held across a state's copy and its PersistFn call, so that the store is written in the
  // order releases_ changed (Check and Keep).
  absl::Mutex persist_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  mutable absl::Mutex mu_;
  // By ReleaseId.
  std::map<std::string, v1::ReleaseVerdict> releases_ ABSL_GUARDED_BY(mu_);
  // Per service, when its release values were last listed (at start-up: its latest stored
  // state's time). A value new at a check may have run since then.
  std::map<std::string, int64_t> listed_ms_ ABSL_GUARDED_BY(mu_);
};

}  // namespace strata::server::regress

#endif  // STRATA_SERVER_REGRESS_RELEASE_WATCHER_H_
