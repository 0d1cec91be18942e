// The release watcher's bookkeeping with a scripted service and comparison: releases met with
// the service are not compared, a new one is compared with the one it replaces over the
// right ranges until its window ends, a phase change within a release is compared before
// with after, a restarted watcher continues from what it stored, and a watcher that keeps
// another's states (newest wins) continues from them.
#include "server/regress/release_watcher.h"

#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace strata::server::regress {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::SizeIs;

constexpr int64_t kMinute = 60'000;

// What ListLabels answers for these label sets: each key's distinct values, sorted.
std::map<std::string, std::vector<std::string>> ValuesOf(const std::vector<labels::LabelSet>& sets) {
  std::map<std::string, std::set<std::string>> distinct;
  for (const labels::LabelSet& set : sets) {
    for (const auto& [key, value] : set) distinct[key].insert(value);
  }
  std::map<std::string, std::vector<std::string>> values;
  for (const auto& [key, v] : distinct) values[key].assign(v.begin(), v.end());
  return values;
}

// A scripted server: each service's label sets, a comparison that regresses whenever the
// candidate is "slow", and a store of the persisted records.
struct Fixture {
  std::map<std::string, std::vector<labels::LabelSet>> sets;
  std::vector<ComparisonPlan> plans;
  std::map<std::string, std::string> stored;  // release ID -> payload
  std::map<std::string, std::vector<int64_t>> phase_starts;  // by service
  absl::Status label_error;
  absl::Status compare_error;
  // With `scripted_running`: the values of each service with samples at the next check.
  bool scripted_running = false;
  std::map<std::string, std::vector<std::string>> running;

  ReleaseWatcherInputs Inputs() {
    ReleaseWatcherInputs in;
    in.services = [this]() -> absl::StatusOr<std::vector<std::string>> {
      std::vector<std::string> out;
      for (const auto& [service, unused] : sets) out.push_back(service);
      return out;
    };
    in.label_values = [this](const std::string& service)
        -> absl::StatusOr<std::map<std::string, std::vector<std::string>>> {
      if (!label_error.ok() && service == "broken") return label_error;
      return ValuesOf(sets[service]);
    };
    if (scripted_running) {
      in.running = [this](const std::string& service, const std::string& label, int64_t,
                          int64_t) -> absl::StatusOr<std::vector<std::string>> {
        EXPECT_EQ(label, "version");
        return running[service];
      };
    }
    in.phases = [this](const std::string& service, int64_t from_ms,
                       int64_t to_ms) -> absl::StatusOr<std::vector<int64_t>> {
      std::vector<int64_t> out;
      for (int64_t start : phase_starts[service]) {
        if (start >= from_ms && start < to_ms) out.push_back(start);
      }
      return out;
    };
    in.compare = [this](const ComparisonPlan& plan) -> absl::StatusOr<v1::ReleaseVerdict> {
      plans.push_back(plan);
      if (!compare_error.ok()) return compare_error;
      v1::ReleaseVerdict v;
      const bool slow = plan.candidate_selector.ends_with("slow");
      v.set_state(slow ? v1::ReleaseVerdict::REGRESSED : v1::ReleaseVerdict::UNCHANGED);
      if (slow) {
        v1::ReleaseFunctionChange* f = v.add_functions();
        f->set_name("hot");
        f->set_delta(4.5);
        v.set_unit("ms CPU/request");  // decided per request
      }
      v.set_candidate_units(3);
      if (plan.windows_independent) v.set_window_s(plan.window_s);
      return v;
    };
    in.persist = [this](const std::vector<store::ReleaseRecord>& records) {
      for (const auto& r : records) stored[r.release_id] = r.payload;
      return absl::OkStatus();
    };
    return in;
  }
  std::vector<store::ReleaseRecord> Stored() const {
    std::vector<store::ReleaseRecord> out;
    for (const auto& [id, payload] : stored) out.push_back({id, payload});
    return out;
  }
};

ReleaseWatcherOptions Options() {
  ReleaseWatcherOptions o;
  o.baseline_lookback = absl::Minutes(60);
  o.window = absl::Minutes(10);
  return o;
}

TEST(ReleaseWatcherTest, ANewReleaseIsComparedWithTheOneItReplacesUntilItsWindowEnds) {
  Fixture f;
  f.sets["checkout"] = {{{"version", "1"}, {"zone", "a"}}, {{"version", "1"}, {"zone", "b"}}};
  ReleaseWatcher watcher(Options(), f.Inputs(), {});
  // Met with the service: known, not compared.
  auto changed = watcher.Check(100 * kMinute);
  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_THAT(*changed, IsEmpty());
  EXPECT_THAT(f.plans, IsEmpty());
  EXPECT_THAT(watcher.Verdicts("", 0), IsEmpty());
  EXPECT_THAT(f.stored, SizeIs(1));

  f.sets["checkout"].push_back({{"version", "2-slow"}, {"zone", "a"}});
  changed = watcher.Check(101 * kMinute);
  ASSERT_TRUE(changed.ok());
  ASSERT_THAT(*changed, SizeIs(1));
  EXPECT_EQ((*changed)[0].state(), v1::ReleaseVerdict::REGRESSED);
  EXPECT_EQ((*changed)[0].unit(), "ms CPU/request");  // the figures' unit goes with them
  EXPECT_EQ((*changed)[0].baseline(), "1");
  EXPECT_EQ((*changed)[0].candidate(), "2-slow");
  ASSERT_THAT(f.plans, SizeIs(1));
  const ComparisonPlan& plan = f.plans[0];
  EXPECT_EQ(plan.service, "checkout");
  EXPECT_EQ(plan.baseline_selector, "version=1");
  EXPECT_EQ(plan.candidate_selector, "version=2-slow");
  EXPECT_EQ(plan.baseline_from_ms, 41 * kMinute);  // an hour before the candidate appeared
  EXPECT_EQ(plan.baseline_to_ms, 101 * kMinute);
  // Since the check before, less a minute for batches that came after it: the candidate ran
  // from some time in between.
  EXPECT_EQ(plan.candidate_from_ms, 99 * kMinute);
  EXPECT_EQ(plan.candidate_to_ms, 101 * kMinute);
  // Hosts are the units, unless the service runs on one host: then its minutes.
  EXPECT_FALSE(plan.windows_independent);
  EXPECT_TRUE(plan.one_host_windows);
  EXPECT_EQ(plan.window_s, 60u);
  EXPECT_EQ((*changed)[0].window_s(), 0u);
  // The lines behind it: the comparison's two selections, by line.
  const v1::DiffRequest& lines = (*changed)[0].which_lines();
  EXPECT_TRUE(lines.by_line());
  EXPECT_EQ(lines.base().selector(), "version=1");
  EXPECT_EQ(lines.base().range().from_ms(), 41 * kMinute);
  EXPECT_EQ(lines.filter().selector(), "version=2-slow");
  EXPECT_EQ(lines.filter().range().from_ms(), 99 * kMinute);

  // Compared again as samples accrue; reported again only when the state changes.
  changed = watcher.Check(105 * kMinute);
  ASSERT_TRUE(changed.ok());
  EXPECT_THAT(*changed, IsEmpty());
  EXPECT_THAT(f.plans, SizeIs(2));
  std::vector<v1::ReleaseVerdict> verdicts = watcher.Verdicts("checkout", 0);
  ASSERT_THAT(verdicts, SizeIs(1));
  EXPECT_FALSE(verdicts[0].final());
  EXPECT_EQ(verdicts[0].functions(0).name(), "hot");

  // Final once the candidate was seen for the window; then left alone.
  ASSERT_TRUE(watcher.Check(111 * kMinute).ok());
  EXPECT_TRUE(watcher.Verdicts("checkout", 0)[0].final());
  ASSERT_TRUE(watcher.Check(120 * kMinute).ok());
  EXPECT_THAT(f.plans, SizeIs(3));
  EXPECT_THAT(watcher.Verdicts("other", 0), IsEmpty());
  EXPECT_THAT(watcher.Verdicts("", 102 * kMinute), IsEmpty());
}

// v1, v2, back to v1, then v3: v3 replaced v1, not v2 (first seen more recently).
TEST(ReleaseWatcherTest, TheReleaseAfterARollbackIsComparedWithTheOneRolledBackTo) {
  Fixture f;
  f.scripted_running = true;
  f.sets["checkout"] = {{{"version", "1"}}};
  f.running["checkout"] = {"1"};
  ReleaseWatcher watcher(Options(), f.Inputs(), {});
  ASSERT_TRUE(watcher.Check(100 * kMinute).ok());
  f.sets["checkout"].push_back({{"version", "2-slow"}});
  f.running["checkout"] = {"1", "2-slow"};  // rolling out
  auto changed = watcher.Check(101 * kMinute);
  ASSERT_TRUE(changed.ok());
  ASSERT_THAT(*changed, SizeIs(1));
  EXPECT_EQ((*changed)[0].baseline(), "1");
  f.running["checkout"] = {"2-slow"};
  ASSERT_TRUE(watcher.Check(102 * kMinute).ok());
  f.running["checkout"] = {"1"};  // rolled back
  ASSERT_TRUE(watcher.Check(103 * kMinute).ok());
  ASSERT_TRUE(watcher.Check(104 * kMinute).ok());

  f.sets["checkout"].push_back({{"version", "3"}});
  f.running["checkout"] = {"1", "3"};
  changed = watcher.Check(105 * kMinute);
  ASSERT_TRUE(changed.ok());
  ASSERT_THAT(*changed, SizeIs(1));
  EXPECT_EQ((*changed)[0].candidate(), "3");
  EXPECT_EQ((*changed)[0].baseline(), "1");
  EXPECT_EQ(f.plans.back().baseline_selector, "version=1");

  // Without a rollback, the release before.
  f.running["checkout"] = {"3"};
  ASSERT_TRUE(watcher.Check(106 * kMinute).ok());
  f.sets["checkout"].push_back({{"version", "4"}});
  f.running["checkout"] = {"3", "4"};
  changed = watcher.Check(107 * kMinute);
  ASSERT_TRUE(changed.ok());
  ASSERT_THAT(*changed, SizeIs(1));
  EXPECT_EQ((*changed)[0].baseline(), "3");

  // What ran when is kept: a restarted watcher picks the same baseline.
  f.running["checkout"] = {"1"};  // rolled back again
  ASSERT_TRUE(watcher.Check(108 * kMinute).ok());
  ReleaseWatcher restarted(Options(), f.Inputs(), f.Stored());
  f.sets["checkout"].push_back({{"version", "5"}});
  f.running["checkout"] = {"5"};
  changed = restarted.Check(109 * kMinute);
  ASSERT_TRUE(changed.ok());
  ASSERT_THAT(*changed, SizeIs(1));
  EXPECT_EQ((*changed)[0].baseline(), "1");
}

TEST(ReleaseWatcherTest, ARestartedWatcherContinuesFromWhatItStored) {
  Fixture f;
  f.sets["svc"] = {{{"version", "1"}}};
  {
    ReleaseWatcher watcher(Options(), f.Inputs(), {});
    ASSERT_TRUE(watcher.Check(0).ok());
    f.sets["svc"].push_back({{"version", "2"}});
    ASSERT_TRUE(watcher.Check(kMinute).ok());
  }
  ReleaseWatcher restarted(Options(), f.Inputs(), f.Stored());
  std::vector<v1::ReleaseVerdict> verdicts = restarted.Verdicts("svc", 0);
  ASSERT_THAT(verdicts, SizeIs(1));
  EXPECT_EQ(verdicts[0].state(), v1::ReleaseVerdict::UNCHANGED);
  // Version 2 is still compared (not final); a third release is compared with version 2,
  // the one seen most recently, not with version 1.
  f.sets["svc"].push_back({{"version", "3-slow"}});
  auto changed = restarted.Check(2 * kMinute);
  ASSERT_TRUE(changed.ok());
  ASSERT_THAT(*changed, SizeIs(1));
  EXPECT_EQ((*changed)[0].baseline(), "2");
  EXPECT_EQ((*changed)[0].candidate(), "3-slow");
  verdicts = restarted.Verdicts("svc", 0);
  ASSERT_THAT(verdicts, SizeIs(2));
  EXPECT_EQ(verdicts[0].candidate(), "3-slow");  // newest first
  EXPECT_EQ(verdicts[1].candidate(), "2");
  EXPECT_EQ(verdicts[1].updated_ms(), 2 * kMinute);
  // A record that does not parse is dropped, not fatal.
  std::vector<store::ReleaseRecord> corrupt = f.Stored();
  corrupt.push_back({"junk", "\xff\xff\xff"});
  ReleaseWatcher tolerant(Options(), f.Inputs(), corrupt);
  EXPECT_THAT(tolerant.Verdicts("svc", 0), SizeIs(2));
}

// A verdict stored before verdicts carried their lines, or sent by an older node, gets those
// of its last comparison.
TEST(ReleaseWatcherTest, AVerdictStoredWithoutItsLinesGetsThemFromItsRanges) {
  Fixture f;
  v1::ReleaseVerdict stored;
  stored.set_service("checkout");
  stored.set_label("version");
  stored.set_baseline("1");
  stored.set_candidate("2");
  stored.set_comparisons(3);
  stored.set_final(true);
  stored.set_baseline_from_ms(10);
  stored.set_baseline_to_ms(90);
  stored.set_candidate_from_ms(50);
  stored.set_candidate_to_ms(90);
  store::ReleaseRecord record;
  record.release_id = ReleaseWatcher::ReleaseId(stored);
  stored.SerializeToString(&record.payload);
  ReleaseWatcher watcher(Options(), f.Inputs(), {record});
  std::vector<v1::ReleaseVerdict> verdicts = watcher.Verdicts("checkout", 0);
  ASSERT_THAT(verdicts, SizeIs(1));
  const v1::DiffRequest lines = verdicts[0].which_lines();
  EXPECT_TRUE(lines.by_line());
  EXPECT_TRUE(lines.language_self());
  EXPECT_EQ(lines.base().selector(), "version=1");
  EXPECT_EQ(lines.base().range().from_ms(), 10);
  EXPECT_EQ(lines.filter().selector(), "version=2");
  EXPECT_EQ(lines.filter().range().from_ms(), 50);
  EXPECT_EQ(lines.filter().range().to_ms(), 90);

  ReleaseWatcher copy(Options(), f.Inputs(), {});
  ASSERT_EQ(*copy.Keep({stored}), 1u);
  verdicts = copy.Verdicts("checkout", 0);
  ASSERT_THAT(verdicts, SizeIs(1));
  EXPECT_EQ(verdicts[0].which_lines().ShortDebugString(), lines.ShortDebugString());
}

TEST(ReleaseWatcherTest, BuildIdIsTheReleaseLabelWithoutVersions) {
  Fixture f;
  f.sets["svc"] = {{{"build_id", "aa"}}};
  ReleaseWatcher watcher(Options(), f.Inputs(), {});
  ASSERT_TRUE(watcher.Check(0).ok());
  f.sets["svc"].push_back({{"build_id", "bb"}});
  ASSERT_TRUE(watcher.Check(kMinute).ok());
  ASSERT_THAT(f.plans, SizeIs(1));
  EXPECT_EQ(f.plans[0].baseline_selector, "build_id=aa");
  EXPECT_EQ(f.plans[0].candidate_selector, "build_id=bb");
  // A service without either label has no releases.
  f.sets["unlabelled"] = {{{"zone", "a"}}};
  ASSERT_TRUE(watcher.Check(2 * kMinute).ok());
  EXPECT_THAT(watcher.Verdicts("unlabelled", 0), IsEmpty());
}

TEST(ReleaseWatcherTest, FailuresAreKeptAndRetriedWithoutStoppingOtherServices) {
  Fixture f;
  f.sets["broken"] = {{{"version", "1"}}};
  f.sets["svc"] = {{{"version", "1"}}};
  f.label_error = absl::UnavailableError("node down");
  ReleaseWatcher watcher(Options(), f.Inputs(), {});
  EXPECT_TRUE(absl::IsUnavailable(watcher.Check(0).status()));
  EXPECT_THAT(f.stored, SizeIs(1));  // svc's release, despite the broken service
  f.label_error = absl::OkStatus();
  f.sets["svc"].push_back({{"version", "2"}});
  f.compare_error = absl::DeadlineExceededError("slow node");
  EXPECT_TRUE(absl::IsDeadlineExceeded(watcher.Check(kMinute).status()));
  std::vector<v1::ReleaseVerdict> verdicts = watcher.Verdicts("svc", 0);
  ASSERT_THAT(verdicts, SizeIs(1));
  EXPECT_EQ(verdicts[0].error(), "slow node");
  EXPECT_EQ(verdicts[0].state(), v1::ReleaseVerdict::NOT_ENOUGH_DATA);
  f.compare_error = absl::OkStatus();
  auto changed = watcher.Check(2 * kMinute);
  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_THAT(*changed, SizeIs(1));
  EXPECT_EQ(watcher.Verdicts("svc", 0)[0].error(), "");
  // A value a selector cannot name is recorded as such, never compared.
  f.sets["svc"].push_back({{"version", "3,beta"}});
  const size_t plans = f.plans.size();
  ASSERT_TRUE(watcher.Check(3 * kMinute).ok());
  EXPECT_EQ(f.plans.size(), plans + 1);  // only version 2 again
  verdicts = watcher.Verdicts("svc", 0);
  ASSERT_THAT(verdicts, SizeIs(2));
  EXPECT_TRUE(verdicts[0].final());
  EXPECT_THAT(verdicts[0].error(), ::testing::HasSubstr("selector"));
}

TEST(ReleaseWatcherTest, APhaseChangeIsComparedWithinItsReleaseBeforeWithAfter) {
  Fixture f;
  f.sets["checkout"] = {{{"version", "1"}}};
  ReleaseWatcher watcher(Options(), f.Inputs(), {});
  ASSERT_TRUE(watcher.Check(100 * kMinute).ok());
  f.sets["checkout"].push_back({{"version", "2"}});
  ASSERT_TRUE(watcher.Check(101 * kMinute).ok());  // release 2, first seen at 101
  ASSERT_THAT(f.plans, SizeIs(1));

  // A phase change 5 minutes into release 2 is part of its comparison (window: 10 minutes).
  f.phase_starts["checkout"] = {106 * kMinute};
  ASSERT_TRUE(watcher.Check(107 * kMinute).ok());
  EXPECT_THAT(watcher.Verdicts("checkout", 0), SizeIs(1));

  // One at 130, long after: compared within release 2, from the change on against the hour
  // before it, each (host, window) a unit.
  f.phase_starts["checkout"].push_back(130 * kMinute);
  f.plans.clear();
  auto changed = watcher.Check(131 * kMinute);
  ASSERT_TRUE(changed.ok()) << changed.status();
  // Release 2's last comparison (its window ended), and the phase change's first.
  ASSERT_THAT(f.plans, SizeIs(2));
  EXPECT_NE(f.plans[0].windows_independent, f.plans[1].windows_independent);
  const ComparisonPlan& plan = f.plans[0].windows_independent ? f.plans[0] : f.plans[1];
  EXPECT_EQ(plan.baseline_selector, "version=2");
  EXPECT_EQ(plan.candidate_selector, "version=2");
  EXPECT_EQ(plan.baseline_from_ms, 70 * kMinute);
  EXPECT_EQ(plan.baseline_to_ms, 130 * kMinute - 20'000);  // not the change's onset
  EXPECT_EQ(plan.candidate_from_ms, 130 * kMinute);
  EXPECT_EQ(plan.candidate_to_ms, 131 * kMinute);
  EXPECT_TRUE(plan.windows_independent);
  EXPECT_FALSE(plan.one_host_windows);
  EXPECT_EQ(plan.window_s, 60u);
  ASSERT_THAT(*changed, SizeIs(1));
  EXPECT_EQ((*changed)[0].kind(), v1::ReleaseVerdict::PHASE);
  EXPECT_EQ((*changed)[0].window_s(), 60u);
  EXPECT_EQ((*changed)[0].first_seen_ms(), 130 * kMinute);

  // Further changes within its window are part of it; it is final after the window.
  f.phase_starts["checkout"].push_back(133 * kMinute);
  ASSERT_TRUE(watcher.Check(141 * kMinute).ok());
  std::vector<v1::ReleaseVerdict> verdicts = watcher.Verdicts("checkout", 0);
  ASSERT_THAT(verdicts, SizeIs(2));  // newest first: the phase change, then release 2
  EXPECT_EQ(verdicts[0].kind(), v1::ReleaseVerdict::PHASE);
  EXPECT_TRUE(verdicts[0].final());
  EXPECT_EQ(verdicts[1].kind(), v1::ReleaseVerdict::RELEASE);
  EXPECT_EQ(verdicts[1].candidate(), "2");
  const size_t plans = f.plans.size();
  ASSERT_TRUE(watcher.Check(150 * kMinute).ok());
  EXPECT_EQ(f.plans.size(), plans);

  // Stored and restored like releases.
  ReleaseWatcher restarted(Options(), f.Inputs(), f.Stored());
  EXPECT_THAT(restarted.Verdicts("checkout", 0), SizeIs(2));
  ASSERT_TRUE(restarted.Check(151 * kMinute).ok());
  EXPECT_EQ(f.plans.size(), plans);
}

TEST(ReleaseWatcherTest, APhaseChangeOfAServiceWithoutReleasesComparesAllItsSamples) {
  Fixture f;
  f.sets["batch"] = {{{"zone", "a"}}};
  f.phase_starts["batch"] = {50 * kMinute};
  ReleaseWatcher watcher(Options(), f.Inputs(), {});
  auto changed = watcher.Check(52 * kMinute);
  ASSERT_TRUE(changed.ok()) << changed.status();
  ASSERT_THAT(f.plans, SizeIs(1));
  EXPECT_EQ(f.plans[0].baseline_selector, "");
  EXPECT_EQ(f.plans[0].candidate_selector, "");
  ASSERT_THAT(*changed, SizeIs(1));
  EXPECT_EQ((*changed)[0].kind(), v1::ReleaseVerdict::PHASE);
  EXPECT_EQ((*changed)[0].window_s(), 60u);
  EXPECT_EQ((*changed)[0].label(), "");
  // Changes older than the window when met are history: not compared.
  f.phase_starts["other"] = {kMinute};
  f.sets["other"] = {{{"zone", "a"}}};
  f.plans.clear();
  ASSERT_TRUE(watcher.Check(53 * kMinute).ok());
  for (const ComparisonPlan& plan : f.plans) EXPECT_EQ(plan.service, "batch");
}


// A state of release "svc" version "2" (compared `comparisons` times, computed at `updated_ms`).
v1::ReleaseVerdict StateOf2(uint32_t comparisons, int64_t updated_ms, bool final = false) {
  v1::ReleaseVerdict v;
  v.set_service("svc");
  v.set_label("version");
  v.set_baseline("1");
  v.set_candidate("2");
  v.set_first_seen_ms(kMinute);
  v.set_state(v1::ReleaseVerdict::UNCHANGED);
  v.set_comparisons(comparisons);
  v.set_updated_ms(updated_ms);
  v.set_final(final);
  return v;
}

TEST(ReleaseWatcherTest, ALaterStateHasMoreComparisonsElseIsFinalElseIsNewer) {
  // More comparisons win over a later clock (the node that took over may lag).
  EXPECT_TRUE(ReleaseWatcher::Supersedes(StateOf2(3, kMinute), StateOf2(2, 5 * kMinute)));
  EXPECT_FALSE(ReleaseWatcher::Supersedes(StateOf2(2, 5 * kMinute), StateOf2(3, kMinute)));
  EXPECT_TRUE(ReleaseWatcher::Supersedes(StateOf2(3, kMinute, true), StateOf2(3, 2 * kMinute)));
  EXPECT_FALSE(ReleaseWatcher::Supersedes(StateOf2(3, 2 * kMinute), StateOf2(3, kMinute, true)));
  EXPECT_TRUE(ReleaseWatcher::Supersedes(StateOf2(3, 2 * kMinute), StateOf2(3, kMinute)));
  // The same state supersedes nothing: kept once.
  EXPECT_FALSE(ReleaseWatcher::Supersedes(StateOf2(3, kMinute), StateOf2(3, kMinute)));
}

TEST(ReleaseWatcherTest, KeptStatesAreStoredNewestWinsAndCheckedOnFromThere) {
  Fixture first;  // the node that checked
  first.sets["svc"] = {{{"version", "1"}}};
  ReleaseWatcher checker(Options(), first.Inputs(), {});
  ASSERT_TRUE(checker.Check(0).ok());
  first.sets["svc"].push_back({{"version", "2"}});
  ASSERT_TRUE(checker.Check(kMinute).ok());
  ASSERT_TRUE(checker.Check(2 * kMinute).ok());
  const std::vector<v1::ReleaseVerdict> states = checker.Releases();
  ASSERT_THAT(states, SizeIs(2));  // version 1 (met with the service) and 2

  Fixture next;  // the node that takes over: same services, a store of its own
  next.sets = first.sets;
  ReleaseWatcher copy(Options(), next.Inputs(), {});
  auto kept = copy.Keep(states);
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ(*kept, 2u);
  EXPECT_EQ(next.stored, first.stored);  // the same records, byte for byte
  // Kept again, or an older state of version 2: nothing changes, nothing is written.
  next.stored.clear();
  EXPECT_EQ(*copy.Keep(states), 0u);
  EXPECT_EQ(*copy.Keep({StateOf2(1, 10 * kMinute)}), 0u);
  EXPECT_THAT(next.stored, IsEmpty());
  std::vector<v1::ReleaseVerdict> verdicts = copy.Verdicts("svc", 0);
  ASSERT_THAT(verdicts, SizeIs(1));
  EXPECT_EQ(verdicts[0].comparisons(), 2u);
  EXPECT_EQ(verdicts[0].updated_ms(), 2 * kMinute);
  // Of two states of one release in one call, the later one.
  EXPECT_EQ(*copy.Keep({StateOf2(4, 3 * kMinute), StateOf2(5, 3 * kMinute),
                        StateOf2(3, 4 * kMinute)}),
            1u);
  EXPECT_EQ(copy.Verdicts("svc", 0)[0].comparisons(), 5u);
  ASSERT_THAT(next.stored, SizeIs(1));
  v1::ReleaseVerdict stored;
  ASSERT_TRUE(stored.ParseFromString(next.stored.begin()->second));
  EXPECT_EQ(stored.comparisons(), 5u);
  // A state of no service is not a release.
  EXPECT_EQ(*copy.Keep({v1::ReleaseVerdict()}), 0u);

  // The watcher that kept them checks on: version 2 is compared again (not met anew), and a
  // third release is compared with version 2.
  next.sets["svc"].push_back({{"version", "3"}});
  auto changed = copy.Check(3 * kMinute);
  ASSERT_TRUE(changed.ok()) << changed.status();
  ASSERT_THAT(*changed, SizeIs(1));
  EXPECT_EQ((*changed)[0].baseline(), "2");
  EXPECT_EQ((*changed)[0].candidate(), "3");
  ASSERT_THAT(next.plans, SizeIs(2));
  verdicts = copy.Verdicts("svc", 0);
  ASSERT_THAT(verdicts, SizeIs(2));
  EXPECT_EQ(verdicts[1].candidate(), "2");
  EXPECT_EQ(verdicts[1].comparisons(), 6u);
  EXPECT_EQ(verdicts[1].first_seen_ms(), kMinute);
}

TEST(ReleaseWatcherTest, StatesThatCannotBeStoredAreNotKept) {
  Fixture f;
  ReleaseWatcherInputs inputs = f.Inputs();
  inputs.persist = [](const std::vector<store::ReleaseRecord>&) {
    return absl::UnavailableError("disk full");
  };
  ReleaseWatcher watcher(Options(), std::move(inputs), {});
  EXPECT_TRUE(absl::IsUnavailable(watcher.Keep({StateOf2(1, kMinute)}).status()));
  EXPECT_THAT(watcher.Releases(), IsEmpty());
}

}  // namespace
}  // namespace strata::server::regress
