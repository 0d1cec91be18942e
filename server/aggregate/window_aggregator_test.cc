#include "server/aggregate/window_aggregator.h"

#include <chrono>
#include <atomic>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/testing/temp_dir.h"
#include "server/aggregate/phase_event.h"
#include "server/query/profile.h"
#include "gtest/gtest.h"

namespace strata::server::aggregate {
namespace {

using commit::BatchCommitter;
using commit::kWindowMs;
using commit::WindowStart;
using Totals = std::map<uint64_t, uint64_t>;  // stack -> count

class WindowAggregatorTest : public ::testing::Test {
 protected:
  void SetUp() override { OpenStore(); }

  void OpenStore() {
    aggregator_.reset();
    store_.reset();
    auto store = store::Store::Open(dir_.path(), {});
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
  }
  void CreateAggregator(AggregatorOptions options) {
    options_ = options;
    auto aggregator = WindowAggregator::Create(store_.get(), options);
    ASSERT_TRUE(aggregator.ok()) << aggregator.status();
    aggregator_ = std::move(*aggregator);
  }

  // Commits one batch of `cells` (stack -> count) of `service` from `host` at `window`.
  absl::Status Commit(const std::string& service, const std::string& host, int64_t window,
                      const Totals& cells, uint64_t sequence = 0) {
    store::WriteBatch wb;
    if (sequence != 0) wb.SetAppliedSequence("agent-" + host, 1, sequence);
    std::vector<BatchCommitter::Cell> batch;
    for (const auto& [stack, count] : cells) batch.push_back({&service, stack, count});
    return aggregator_->CommitBatch(&wb, host, window, batch);
  }

  // What a query of `service` over all time sees: store plus live counts.
  Totals Query(const std::string& service, const std::string& host = "") {
    store::SampleQuery q;
    q.service = service;
    q.from_ms = 0;
    q.to_ms = int64_t{1} << 50;
    if (!host.empty()) q.host = host;
    for (;;) {
      const uint64_t generation = aggregator_ ? aggregator_->FlushGeneration(service) : 0;
      Totals out;
      auto totals = store_->samples().SumSamples(q);
      EXPECT_TRUE(totals.ok()) << totals.status();
      if (!totals.ok()) return out;
      for (const auto& s : totals->stacks) {
        if (s.count != 0) out[s.stack_id] += s.count;
      }
      if (!aggregator_) return out;
      absl::flat_hash_map<uint64_t, uint64_t> live;
      absl::flat_hash_map<std::string, uint64_t> hosts;
      if (!aggregator_->AddLiveCounts(q, generation, &live, &hosts)) continue;
      for (const auto& [stack, count] : live) out[stack] += count;
      return out;
    }
  }
  // Counts written to the store only.
  Totals Stored(const std::string& service) {
    auto saved = std::move(aggregator_);
    Totals t = Query(service);
    aggregator_ = std::move(saved);
    return t;
  }
  size_t JournalRecords() {
    size_t n = 0;
    EXPECT_TRUE(store_->meta().ScanJournal([&](uint64_t, std::string_view) {
                        ++n;
                        return absl::OkStatus();
                      })
                    .ok());
    return n;
  }
  struct Phase {
    int64_t window_start_ms;
    aggregate::PhaseEventPayload event;
  };
  std::vector<Phase> Phases(const std::string& service) {
    auto events = store_->meta().ScanPhaseEvents(service, 0, int64_t{1} << 50);
    EXPECT_TRUE(events.ok()) << events.status();
    std::vector<Phase> out;
    for (const auto& e : *events) {
      auto decoded = aggregate::DecodePhaseEvent(e.payload);
      EXPECT_TRUE(decoded.ok()) << decoded.status();
      if (decoded.ok()) out.push_back({e.window_start_ms, *std::move(decoded)});
    }
    return out;
  }

  strata::testing::TempDir dir_{"window_aggregator_test"};
  std::unique_ptr<store::Store> store_;
  AggregatorOptions options_;
  std::unique_ptr<WindowAggregator> aggregator_;
};

// Random batches into small tables that flush early again and again, windows moving on,
// some late batches: after every batch, store + live equals everything committed, and after
// FlushAll the store alone does and the journal is empty.
TEST_F(WindowAggregatorTest, ConservesCountsUnderCapacityFlushesAndWindowCloses) {
  // Tables start at 4 entries and grow to 24.
  CreateAggregator({.max_entries = 24, .initial_entries = 4, .hot_threshold = 5});
  std::mt19937_64 rng(17);
  const std::vector<std::string> services = {"api", "db"};
  const std::vector<std::string> hosts = {"h1", "h2", "h3"};
  std::map<std::string, Totals> want;
  int64_t window = 1'000'000 * kWindowMs;
  for (int i = 0; i < 600; ++i) {
    if (rng() % 8 == 0) window += kWindowMs;
    const int64_t w = rng() % 10 == 0 ? window - kWindowMs * (1 + rng() % 3) : window;  // late
    const std::string& service = services[rng() % 2];
    Totals cells;
    const int n = 1 + static_cast<int>(rng() % 12);
    for (int k = 0; k < n; ++k) {
      const uint64_t stack = rng() % 3 == 0 ? rng() % 4 + 1 : rng() % 200 + 1;
      cells[stack] += 1 + rng() % 30;
    }
    ASSERT_TRUE(Commit(service, hosts[rng() % 3], w, cells).ok());
    for (const auto& [stack, count] : cells) want[service][stack] += count;
    if (i % 50 == 0) {
      for (const auto& s : services) ASSERT_EQ(Query(s), want[s]) << s << " after batch " << i;
    }
    if (i % 97 == 0) {
      ASSERT_TRUE(aggregator_->CloseDueWindows(window + 5 * kWindowMs).ok());
    }
  }
  const AggregatorStats stats = aggregator_->stats();
  EXPECT_GT(stats.tables_grown, 0u);
  EXPECT_GT(stats.capacity_flushes, 10u);
  EXPECT_GT(stats.windows_closed, 20u);
  EXPECT_GT(stats.direct_cells, 0u);
  for (const auto& s : services) EXPECT_EQ(Query(s), want[s]) << s;
  ASSERT_TRUE(aggregator_->FlushAll().ok());
  for (const auto& s : services) EXPECT_EQ(Stored(s), want[s]) << s;
  EXPECT_EQ(JournalRecords(), 0u);
}

// A process killed with open windows: its acknowledged samples are only in the journal; the
// next aggregator writes them to the store exactly once.
TEST_F(WindowAggregatorTest, RecoversOpenWindowsFromTheJournal) {
  CreateAggregator({});
  const int64_t w = 500 * kWindowMs;
  ASSERT_TRUE(Commit("api", "h1", w, {{1, 10}, {2, 5}}).ok());
  ASSERT_TRUE(Commit("api", "h2", w, {{1, 7}}).ok());
  ASSERT_TRUE(Commit("db", "h1", w + kWindowMs, {{3, 4}}).ok());
  EXPECT_EQ(Stored("api"), Totals{});  // nothing written yet: all in the tables
  EXPECT_EQ(Query("api"), (Totals{{1, 17}, {2, 5}}));
  EXPECT_EQ(Query("api", "h2"), (Totals{{1, 7}}));
  EXPECT_EQ(JournalRecords(), 3u);

  aggregator_.reset();  // no flush: as if killed
  OpenStore();
  CreateAggregator({});
  EXPECT_EQ(aggregator_->stats().recovered_records, 3u);
  EXPECT_EQ(JournalRecords(), 0u);
  EXPECT_EQ(Stored("api"), (Totals{{1, 17}, {2, 5}}));
  EXPECT_EQ(Stored("db"), (Totals{{3, 4}}));
  // Recovering again (another restart) adds nothing.
  aggregator_.reset();
  CreateAggregator({});
  EXPECT_EQ(Stored("api"), (Totals{{1, 17}, {2, 5}}));
}

// One batch of two services is one journal record; when one service's window was written
// and the process was killed before the other's, the record is still there, and recovery
// writes only the other service's cells of it.
TEST_F(WindowAggregatorTest, RecoveryWritesNoServiceTwiceWhoseWindowWasWrittenAlready) {
  CreateAggregator({});
  const int64_t w = 500 * kWindowMs;
  const std::string api = "api", db = "db";
  store::WriteBatch wb;
  std::vector<BatchCommitter::Cell> cells{{&api, 1, 10}, {&db, 2, 6}};
  ASSERT_TRUE(aggregator_->CommitBatch(&wb, "h1", w, cells).ok());
  ASSERT_TRUE(Commit("api", "h1", w + kWindowMs, {{1, 3}}).ok());  // closes api's window w
  EXPECT_EQ(Stored("api"), (Totals{{1, 10}}));
  EXPECT_EQ(Stored("db"), Totals{});
  EXPECT_EQ(JournalRecords(), 2u);  // db still needs the first

  aggregator_.reset();  // no flush: as if killed
  OpenStore();
  CreateAggregator({});
  EXPECT_EQ(JournalRecords(), 0u);
  EXPECT_EQ(Stored("api"), (Totals{{1, 13}}));
  EXPECT_EQ(Stored("db"), (Totals{{2, 6}}));
  // Recovering again (another restart) adds nothing.
  aggregator_.reset();
  CreateAggregator({});
  EXPECT_EQ(Stored("api"), (Totals{{1, 13}}));
  EXPECT_EQ(Stored("db"), (Totals{{2, 6}}));
}

// Cells of one stack under different label sets stay apart in the tables, the journal and
// the store, and queries select them by label set ID.
TEST_F(WindowAggregatorTest, LabelSetsStayApartThroughTablesJournalAndStore) {
  CreateAggregator({});
  const int64_t w = 500 * kWindowMs;
  const std::string api = "api";
  auto commit = [&](const std::string& host, int64_t window,
                    std::vector<BatchCommitter::Cell> cells) {
    store::WriteBatch wb;
    return aggregator_->CommitBatch(&wb, host, window, cells);
  };
  ASSERT_TRUE(commit("h1", w, {{&api, 1, 10, 0}, {&api, 1, 4, 77}, {&api, 2, 3, 88}}).ok());
  ASSERT_TRUE(commit("h2", w, {{&api, 1, 6, 77}}).ok());
  auto query = [&](std::optional<absl::flat_hash_set<uint64_t>> sets) {
    store::SampleQuery q;
    q.service = api;
    q.to_ms = int64_t{1} << 50;
    q.label_sets = std::move(sets);
    for (;;) {
      const uint64_t generation = aggregator_->FlushGeneration(api);
      Totals out;
      auto totals = store_->samples().SumSamples(q);
      EXPECT_TRUE(totals.ok());
      for (const auto& c : totals->stacks) {
        if (c.count != 0) out[c.stack_id] += c.count;
      }
      absl::flat_hash_map<uint64_t, uint64_t> live;
      absl::flat_hash_map<std::string, uint64_t> hosts;
      if (!aggregator_->AddLiveCounts(q, generation, &live, &hosts)) continue;
      for (const auto& [stack, count] : live) out[stack] += count;
      return out;
    }
  };
  using Sets = absl::flat_hash_set<uint64_t>;
  for (int phase = 0; phase < 2; ++phase) {
    // 0: live in the tables; 1: recovered from the journal after a kill, then flushed.
    EXPECT_EQ(query(std::nullopt), (Totals{{1, 20}, {2, 3}})) << phase;
    EXPECT_EQ(query(Sets{77}), (Totals{{1, 10}})) << phase;
    EXPECT_EQ(query(Sets{0, 88}), (Totals{{1, 10}, {2, 3}})) << phase;
    EXPECT_EQ(query(Sets{}), Totals{}) << phase;
    if (phase == 0) {
      aggregator_.reset();  // as if killed: the journal holds everything
      OpenStore();
      CreateAggregator({});
      EXPECT_EQ(aggregator_->stats().recovered_records, 2u);
    } else if (phase == 1) {
      ASSERT_TRUE(commit("h1", w + kWindowMs, {{&api, 2, 5, 88}}).ok());
      ASSERT_TRUE(aggregator_->FlushAll().ok());
      EXPECT_EQ(Stored(api), (Totals{{1, 20}, {2, 8}}));
      EXPECT_EQ(query(Sets{88}), (Totals{{2, 8}}));
      EXPECT_EQ(query(Sets{77}), (Totals{{1, 10}}));
      return;
    }
  }
}

// Journal records written before labels (version 1) are still recovered.
TEST_F(WindowAggregatorTest, RecoversVersionOneJournalRecords) {
  std::string record;
  record.push_back(1);            // version
  record += std::string("\x02h1");  // host
  record.push_back(100);          // window 100 ms (varint)
  record.push_back(1);            // one cell
  record += std::string("\x03" "api");
  record.push_back(9);            // stack
  record.push_back(5);            // count
  std::string key(8, '\0');
  key[7] = 1;
  ASSERT_TRUE(store_->PutRawForTesting(store::Column::kJournal, key, record).ok());
  CreateAggregator({});
  EXPECT_EQ(aggregator_->stats().recovered_records, 1u);
  EXPECT_EQ(Stored("api"), (Totals{{9, 5}}));
}

// A corrupt journal record is reported and skipped; the others are recovered.
TEST_F(WindowAggregatorTest, CorruptJournalRecordIsSkipped) {
  CreateAggregator({});
  ASSERT_TRUE(Commit("api", "h1", 500 * kWindowMs, {{1, 10}}).ok());
  aggregator_.reset();
  std::string key(8, '\0');
  key[7] = 100;  // sequence 100
  ASSERT_TRUE(store_->PutRawForTesting(store::Column::kJournal, key, "\x01garbage").ok());
  CreateAggregator({});
  EXPECT_EQ(aggregator_->stats().recovered_records, 1u);
  EXPECT_EQ(Stored("api"), (Totals{{1, 10}}));
  EXPECT_EQ(JournalRecords(), 0u);
}

// A batch whose sequence was applied already fails to commit and leaves no counts behind.
TEST_F(WindowAggregatorTest, RefusedCommitAddsNothing) {
  CreateAggregator({});
  const int64_t w = 500 * kWindowMs;
  ASSERT_TRUE(Commit("api", "h1", w, {{1, 10}}, /*sequence=*/5).ok());
  absl::Status again = Commit("api", "h1", w, {{1, 10}}, /*sequence=*/5);
  EXPECT_TRUE(absl::IsAlreadyExists(again)) << again;
  EXPECT_EQ(Query("api"), (Totals{{1, 10}}));
  EXPECT_EQ(JournalRecords(), 1u);
}

// Windows close when a later window's batch arrives or on the timer; a closed window's late
// batch goes to the store directly.
TEST_F(WindowAggregatorTest, WindowsCloseOnNewerBatchOrTimer) {
  CreateAggregator({.close_delay_ms = 5000});
  const int64_t w = 500 * kWindowMs;
  ASSERT_TRUE(Commit("api", "h1", w, {{1, 10}}).ok());
  ASSERT_TRUE(Commit("api", "h1", w + kWindowMs, {{1, 3}}).ok());
  EXPECT_EQ(Stored("api"), (Totals{{1, 10}}));  // w closed by the later batch
  ASSERT_TRUE(aggregator_->CloseDueWindows(w + 2 * kWindowMs + 4999).ok());
  EXPECT_EQ(Stored("api"), (Totals{{1, 10}}));  // not yet due
  ASSERT_TRUE(aggregator_->CloseDueWindows(w + 2 * kWindowMs + 5000).ok());
  EXPECT_EQ(Stored("api"), (Totals{{1, 13}}));
  ASSERT_TRUE(Commit("api", "h2", w, {{2, 1}}).ok());  // late
  EXPECT_EQ(Stored("api"), (Totals{{1, 13}, {2, 1}}));
  EXPECT_EQ(aggregator_->stats().direct_cells, 1u);
  EXPECT_EQ(aggregator_->stats().windows_closed, 2u);
  EXPECT_EQ(JournalRecords(), 0u);
}

// One host's hot path switches from stack 1 to stack 2 inside window 3: the table's ranking
// at the window closes records it; a steady service (with the usual jitter) records nothing.
TEST_F(WindowAggregatorTest, RecordsPhaseChangeWhenHotPathSwitches) {
  CreateAggregator({.hot_threshold = 20});
  std::mt19937_64 rng(5);
  const int64_t w0 = 700 * kWindowMs;
  for (int window = 0; window < 8; ++window) {
    for (int batch = 0; batch < 10; ++batch) {  // 1 s batches
      const bool switched = window > 3 || (window == 3 && batch >= 4);
      Totals cells{{switched ? 2u : 1u, 40 + rng() % 10},
                   {switched ? 1u : 2u, rng() % 2 + 1},
                   {3, 10 + rng() % 5},
                   {4, 8 + rng() % 5}};
      ASSERT_TRUE(Commit("shifty", "h1", w0 + window * kWindowMs, cells).ok());
      Totals steady{{1, 40 + rng() % 10}, {2, 20 + rng() % 10}, {3, 10 + rng() % 5}};
      ASSERT_TRUE(Commit("steady", "h1", w0 + window * kWindowMs, steady).ok());
      // A second host of the steady service whose batches stop: that is not a phase change.
      if (window < 4) {
        ASSERT_TRUE(Commit("steady", "h2", w0 + window * kWindowMs, {{5, 60}}).ok());
      }
    }
  }
  ASSERT_TRUE(aggregator_->FlushAll().ok());
  EXPECT_TRUE(Phases("steady").empty());
  const std::vector<Phase> events = Phases("shifty");
  ASSERT_FALSE(events.empty());
  bool two_over_one = false;
  for (const Phase& p : events) {
    EXPECT_TRUE(p.window_start_ms == w0 + 3 * kWindowMs || p.window_start_ms == w0 + 4 * kWindowMs)
        << p.window_start_ms;
    EXPECT_GT(p.event.detected_ms, 0);
    for (const aggregate::PhaseShift& rose : p.event.rose) {
      EXPECT_GT(rose.count_after, rose.count_before);
    }
    bool rose2 = false, fell1 = false;
    for (const aggregate::PhaseShift& fell : p.event.fell) {
      EXPECT_LT(fell.count_after, fell.count_before);
      // Stack 1's window before the switch.
      fell1 |= fell.stack_id == 1 && fell.count_before >= 200;
    }
    for (const aggregate::PhaseShift& rose : p.event.rose) {
      rose2 |= rose.stack_id == 2 && rose.count_after >= 200;
    }
    two_over_one |= rose2 && fell1;
  }
  EXPECT_TRUE(two_over_one);
  EXPECT_EQ(aggregator_->stats().phase_events, events.size());
}

// A batch stamped far in the future (a skewed agent clock) is written directly and leaves
// the open window alone.
TEST_F(WindowAggregatorTest, FutureWindowDoesNotCloseTheOpenOne) {
  CreateAggregator({});
  const int64_t now = std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  const int64_t w = WindowStart(now);
  ASSERT_TRUE(Commit("api", "h1", w, {{1, 10}}).ok());
  ASSERT_TRUE(Commit("api", "h2", w + 3600 * 1000, {{2, 4}}).ok());
  EXPECT_EQ(Stored("api"), (Totals{{2, 4}}));
  EXPECT_EQ(Query("api"), (Totals{{1, 10}, {2, 4}}));
  EXPECT_EQ(aggregator_->stats().windows_closed, 0u);
  EXPECT_EQ(aggregator_->stats().direct_cells, 1u);
}

// Queries read the store and the tables while batches keep closing windows and forcing
// capacity flushes: every profile's total lies between what was committed before the query
// started and after it ended (no window counted twice or missed).
// With the ticker running, closed windows are written by it in the background while batches
// go on: queries see their counts as live until they are committed.
class WindowAggregatorFlushTest : public WindowAggregatorTest,
                                  public ::testing::WithParamInterface<bool> {};

INSTANTIATE_TEST_SUITE_P(Writer, WindowAggregatorFlushTest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "Ticker" : "Inline"; });

TEST_P(WindowAggregatorFlushTest, ProfilesStayConsistentWhileWindowsFlush) {
  CreateAggregator({.max_entries = 8, .initial_entries = 2});
  if (GetParam()) aggregator_->Start(absl::Milliseconds(2));
  store::WriteBatch interned;
  std::vector<uint64_t> stacks;
  for (uint64_t i = 0; i < 12; ++i) {
    auto fn = store_->interner().InternFunction({"f" + std::to_string(i), "/bin/app", "", i}, &interned);
    ASSERT_TRUE(fn.ok());
    auto stack = store_->interner().InternStack({{*fn}, false}, &interned);
    ASSERT_TRUE(stack.ok());
    stacks.push_back(*stack);
  }
  ASSERT_TRUE(store_->Commit(&interned).ok());

  // started counts a batch before its commit, committed after it: a query may see a batch
  // between the two.
  std::atomic<uint64_t> started{0}, committed{0};
  std::atomic<bool> done{false};
  std::thread writer([&] {
    std::mt19937_64 rng(3);
    int64_t window = 900 * kWindowMs;
    for (int i = 0; i < 1500; ++i) {
      if (i % 7 == 0) window += kWindowMs;
      Totals cells;
      for (int k = 0; k < 3; ++k) cells[stacks[rng() % stacks.size()]] += 1;
      started += 3;
      ASSERT_TRUE(Commit("api", "h1", window, cells).ok());
      committed += 3;
      std::this_thread::sleep_for(std::chrono::microseconds(200));  // let queries interleave
    }
    done = true;
  });
  query::ProfileReader reader(store_.get(), aggregator_.get());
  query::ProfileQuery q;
  q.service = "api";
  q.from_ms = 0;
  q.to_ms = int64_t{1} << 50;
  int queries = 0;
  while (!done) {
    const uint64_t before = committed.load();
    auto profile = reader.Load(q);
    const uint64_t after = started.load();
    if (!profile.ok()) {
      ASSERT_TRUE(absl::IsNotFound(profile.status())) << profile.status();  // nothing yet
      continue;
    }
    ASSERT_GE(profile->total, before);
    ASSERT_LE(profile->total, after);
    ++queries;
  }
  writer.join();
  EXPECT_GT(queries, 10);
  EXPECT_GT(aggregator_->stats().windows_closed, 100u);
  auto final_profile = reader.Load(q);
  ASSERT_TRUE(final_profile.ok());
  EXPECT_EQ(final_profile->total, committed.load());
}

int64_t NowWindow() {
  return WindowStart(std::chrono::duration_cast<std::chrono::milliseconds>(
                         std::chrono::system_clock::now().time_since_epoch())
                         .count());
}

// Bytes of one table of `entries` entries, as the aggregator accounts them.
size_t TableBytes(store::Store* store, uint32_t entries) {
  auto a = WindowAggregator::Create(store, {.max_entries = entries, .initial_entries = entries});
  EXPECT_TRUE(a.ok());
  store::WriteBatch wb;
  const std::string service = "probe";
  EXPECT_TRUE((*a)->CommitBatch(&wb, "h", NowWindow(), {{&service, 1, 1}}).ok());
  const size_t bytes = (*a)->stats().table_bytes;
  EXPECT_TRUE((*a)->FlushAll().ok());
  return bytes;
}

// Tables start small and grow with their service's contexts; counts are conserved.
TEST_F(WindowAggregatorTest, TablesStartSmallAndGrowWithUse) {
  CreateAggregator({.max_entries = 1024, .initial_entries = 16});
  const int64_t w = NowWindow();
  ASSERT_TRUE(Commit("small", "h1", w, {{1, 3}}).ok());
  const size_t small_bytes = aggregator_->stats().table_bytes;
  Totals big;
  for (uint64_t stack = 1; stack <= 600; ++stack) big[stack] = stack % 7 + 1;
  ASSERT_TRUE(Commit("big", "h1", w, big).ok());
  const AggregatorStats stats = aggregator_->stats();
  EXPECT_EQ(stats.tables, 2u);
  EXPECT_GT(stats.tables_grown, 0u);
  EXPECT_EQ(stats.capacity_flushes, 0u);
  EXPECT_GT(stats.table_bytes, 4 * small_bytes);
  EXPECT_EQ(Query("big"), big);
  EXPECT_EQ(Stored("big"), Totals{});  // all still in the (grown) table
}

// All tables share one memory budget: a batch that needs a new table beyond it is refused
// whole (ResourceExhausted, nothing written), a full table that cannot grow is written
// early, and tables of closed windows are released to make room.
TEST_F(WindowAggregatorTest, MemoryBudgetRefusesNewTablesAndReleasesIdleOnes) {
  const size_t bytes = TableBytes(store_.get(), 16);
  ASSERT_GT(bytes, 0u);
  CreateAggregator({.max_entries = 1024, .initial_entries = 16,
                    .memory_budget_bytes = 3 * bytes + bytes / 2});
  const int64_t w = NowWindow();
  ASSERT_TRUE(Commit("a", "h1", w, {{1, 1}}).ok());
  ASSERT_TRUE(Commit("b", "h1", w, {{1, 2}}).ok());
  // Two new services in one batch, room for one: refused as a whole.
  {
    store::WriteBatch wb;
    wb.SetAppliedSequence("agent-h1", 1, 1);
    const std::string c = "c", d = "d";
    absl::Status s = aggregator_->CommitBatch(&wb, "h1", w, {{&c, 1, 5}, {&d, 1, 6}});
    EXPECT_TRUE(absl::IsResourceExhausted(s)) << s;
    EXPECT_EQ(*store_->meta().AppliedSequence("agent-h1", 1), 0u);  // nothing committed
  }
  EXPECT_EQ(Query("c"), Totals{});
  EXPECT_EQ(aggregator_->stats().budget_refusals, 1u);
  ASSERT_TRUE(Commit("c", "h1", w, {{1, 5}}).ok());
  // A full table that cannot grow within the budget is written early; nothing is lost.
  Totals many;
  for (uint64_t stack = 1; stack <= 100; ++stack) many[stack] = 1;
  ASSERT_TRUE(Commit("a", "h1", w, many).ok());
  many[1] += 1;
  EXPECT_EQ(Query("a"), many);
  EXPECT_GT(aggregator_->stats().growth_refused, 0u);
  EXPECT_LE(aggregator_->stats().table_bytes, 3 * bytes + bytes / 2);
  EXPECT_TRUE(absl::IsResourceExhausted(Commit("d", "h1", w, {{1, 6}})));
  // Once their windows closed, tables are released for new services (least recently used
  // first), and after idle_windows without a batch on their own.
  ASSERT_TRUE(aggregator_->CloseDueWindows(w + 3 * kWindowMs).ok());
  ASSERT_TRUE(Commit("d", "h1", w + kWindowMs, {{1, 6}}).ok());
  EXPECT_GT(aggregator_->stats().tables_released, 0u)
      << aggregator_->stats().tables << " tables, " << aggregator_->stats().table_bytes << " bytes";
  ASSERT_TRUE(aggregator_->CloseDueWindows(w + 100 * kWindowMs).ok());
  EXPECT_EQ(aggregator_->stats().tables, 0u);
  EXPECT_EQ(aggregator_->stats().table_bytes, 0u);
  EXPECT_EQ(Stored("a"), many);
  EXPECT_EQ(Stored("c"), (Totals{{1, 5}}));
  EXPECT_EQ(Stored("d"), (Totals{{1, 6}}));
  EXPECT_EQ(JournalRecords(), 0u);
}

TEST_F(WindowAggregatorTest, RejectsBadOptions) {
  EXPECT_FALSE(WindowAggregator::Create(store_.get(), {.max_entries = 0}).ok());
  EXPECT_FALSE(WindowAggregator::Create(store_.get(), {.phase_change_factor = 1}).ok());
  EXPECT_FALSE(WindowAggregator::Create(store_.get(), {.close_delay_ms = -1}).ok());
  EXPECT_FALSE(WindowAggregator::Create(store_.get(), {.memory_budget_bytes = 100}).ok());
}

}  // namespace
}  // namespace strata::server::aggregate
