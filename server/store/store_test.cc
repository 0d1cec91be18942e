#include "server/store/store.h"

#include <signal.h>
#include <stdlib.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <algorithm>
#include <atomic>
#include <limits>
#include <map>
#include <set>
#include <thread>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rocksdb/db.h"
#include "server/store/codec.h"
#include "server/store/stack_counts.h"

namespace strata::server::store {
namespace {

using ::testing::ElementsAre;

class StoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/strata_store_test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    Reopen();
  }
  void TearDown() override {
    store_.reset();
    std::filesystem::remove_all(dir_);
  }
  void Reopen() {
    store_.reset();
    auto store = Store::Open(dir_, options_);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
  }
  void CommitOk(WriteBatch* batch) {
    absl::Status s = store_->Commit(batch);
    ASSERT_TRUE(s.ok()) << s;
  }
  // All cells of a query as (window, host, stack) -> count.
  std::map<std::tuple<int64_t, std::string, uint64_t>, uint64_t> Scan(const SampleQuery& q) {
    std::map<std::tuple<int64_t, std::string, uint64_t>, uint64_t> cells;
    absl::Status s = store_->samples().ScanSamples(q, [&](const SampleKey& k, uint64_t count) {
      EXPECT_EQ(k.service, q.service);
      cells[{k.window_start_ms, k.host, k.stack_id}] += count;
    });
    EXPECT_TRUE(s.ok()) << s;
    return cells;
  }
  uint64_t CellCount(const std::string& service, int64_t window, const std::string& host,
                     uint64_t stack) {
    auto cells = Scan(SampleQuery{service, window, window + 1, host, std::nullopt});
    auto it = cells.find({window, host, stack});
    return it == cells.end() ? 0 : it->second;
  }

  std::string dir_;
  StoreOptions options_;
  std::unique_ptr<Store> store_;
};

TEST_F(StoreTest, FunctionsAndStacksRoundTripAcrossReopen) {
  WriteBatch batch;
  FunctionInfo main_fn{"main", "/usr/bin/app", "\x01\x02\x03", 0x1000};
  FunctionInfo work_fn{"work", "/usr/lib/libw.so", "", 0x20};
  auto main_id = store_->interner().InternFunction(main_fn, &batch);
  auto work_id = store_->interner().InternFunction(work_fn, &batch);
  ASSERT_TRUE(main_id.ok() && work_id.ok());
  EXPECT_NE(*main_id, *work_id);
  StackFrames stack{{*main_id, *work_id}, false};
  StackFrames truncated{{*work_id}, true};
  auto stack_id = store_->interner().InternStack(stack, &batch);
  auto truncated_id = store_->interner().InternStack(truncated, &batch);
  ASSERT_TRUE(stack_id.ok() && truncated_id.ok());
  EXPECT_NE(*stack_id, *truncated_id);
  CommitOk(&batch);

  Reopen();
  EXPECT_EQ(*store_->interner().GetFunction(*main_id), main_fn);
  EXPECT_EQ(*store_->interner().GetFunction(*work_id), work_fn);
  EXPECT_EQ(*store_->interner().GetStack(*stack_id), stack);
  EXPECT_EQ(*store_->interner().GetStack(*truncated_id), truncated);
  EXPECT_EQ(store_->interner().GetStack(12345).status().code(), absl::StatusCode::kNotFound);

  // Same content => same ID after restart, and nothing needs writing again.
  WriteBatch again;
  EXPECT_EQ(*store_->interner().InternStack(stack, &again), *stack_id);
  EXPECT_EQ(*store_->interner().InternFunction(main_fn, &again), *main_id);
  EXPECT_TRUE(again.empty());
}

TEST_F(StoreTest, JournalRecordsSurviveReopenAndDeleteByPrefix) {
  WriteBatch wb;
  for (uint64_t seq : {1u, 2u, 300u, 1u << 20}) wb.PutJournal(seq, "record " + std::to_string(seq));
  CommitOk(&wb);
  Reopen();
  std::vector<std::pair<uint64_t, std::string>> seen;
  auto scan = [&] {
    seen.clear();
    ASSERT_TRUE(store_
                    ->meta().ScanJournal([&](uint64_t seq, std::string_view record) {
                      seen.emplace_back(seq, std::string(record));
                      return absl::OkStatus();
                    })
                    .ok());
  };
  scan();
  EXPECT_THAT(seen, ElementsAre(std::pair<uint64_t, std::string>{1, "record 1"},
                                std::pair<uint64_t, std::string>{2, "record 2"},
                                std::pair<uint64_t, std::string>{300, "record 300"},
                                std::pair<uint64_t, std::string>{1u << 20, "record 1048576"}));
  wb.DeleteJournalBefore(300);
  CommitOk(&wb);
  scan();
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].first, 300u);
  // A callback error stops the scan and is returned.
  absl::Status s = store_->meta().ScanJournal(
      [](uint64_t, std::string_view) { return absl::DataLossError("bad record"); });
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
}

TEST_F(StoreTest, FunctionIdentityIgnoresModulePathWhenBuildIdKnown) {
  WriteBatch batch;
  auto a = store_->interner().InternFunction({"f", "/a/lib.so", "BID", 0x10}, &batch);
  auto b = store_->interner().InternFunction({"f", "/b/lib.so", "BID", 0x10}, &batch);
  auto c = store_->interner().InternFunction({"f", "/a/lib.so", "", 0x10}, &batch);
  auto d = store_->interner().InternFunction({"f", "/b/lib.so", "", 0x10}, &batch);
  EXPECT_EQ(*a, *b);
  EXPECT_NE(*a, *c);
  EXPECT_NE(*c, *d);
}

// A lambda's hidden class is named with its address in each JVM: stored without it, the
// same lambda of two processes (two releases) has one name, in compiled and interpreted
// frames alike. Only Java and JIT frames' names are changed.
TEST_F(StoreTest, JavaHiddenClassAddressesAreNotPartOfFunctionNames) {
  WriteBatch batch;
  const std::pair<const char*, const char*> functions[] = {
      {"void Svc$$Lambda$1+0x00007fbe58000a08.run()", "[jit:/tmp/perf-100.map]"},
      {"void Svc$$Lambda$1+0x00007fac04000a08.run()", "[jit:/tmp/perf-200.map]"},
      {"void Svc$$Lambda$1.0x0000000800c01234.run()", "[java:Svc.java]"},
      {"java.lang.Object java.lang.invoke.LambdaForm$MH/0x0000000800c0c400.invoke("
       "java.lang.Object)",
       "[jit:/tmp/perf-100.map]"},
      {"f+0x10.g", "/usr/bin/app"},
      {"long Svc.parse(int)", "[java:Svc.java]"},
  };
  std::vector<std::string> names;
  for (const auto& [name, module] : functions) {
    auto id = store_->interner().InternFunction({name, module, "", 0}, &batch);
    ASSERT_TRUE(id.ok()) << id.status();
    auto stored = store_->interner().GetFunction(*id);
    ASSERT_TRUE(stored.ok()) << stored.status();
    names.push_back(stored->name);
  }
  EXPECT_THAT(names, ElementsAre("void Svc$$Lambda$1.run()", "void Svc$$Lambda$1.run()",
                                 "void Svc$$Lambda$1.run()",
                                 "java.lang.Object java.lang.invoke.LambdaForm$MH.invoke("
                                 "java.lang.Object)",
                                 "f+0x10.g", "long Svc.parse(int)"));
}

TEST_F(StoreTest, UncommittedInternIsRewrittenByLaterBatch) {
  StackFrames stack{{1, 2, 3}, false};
  uint64_t id;
  {
    WriteBatch abandoned;
    id = *store_->interner().InternStack(stack, &abandoned);
  }  // never committed
  WriteBatch batch;
  EXPECT_EQ(*store_->interner().InternStack(stack, &batch), id);
  EXPECT_FALSE(batch.empty());
  CommitOk(&batch);
  Reopen();
  EXPECT_EQ(*store_->interner().GetStack(id), stack);
}

TEST_F(StoreTest, StackHashCollisionIsProbedNotMerged) {
  // Every identity hashes to 7 on the first probe, 100 + probe afterwards.
  options_.id_hash_for_testing = [](std::string_view, uint32_t probe) -> uint64_t {
    return probe == 0 ? 7 : 100 + probe;
  };
  Reopen();
  StackFrames a{{1, 2}, false}, b{{3}, false}, c{{4}, true};
  WriteBatch batch;
  uint64_t id_a = *store_->interner().InternStack(a, &batch);
  uint64_t id_b = *store_->interner().InternStack(b, &batch);
  CommitOk(&batch);
  EXPECT_EQ(id_a, 7u);
  EXPECT_EQ(id_b, 101u);
  EXPECT_GE(store_->Stats().id_collisions, 1u);

  // After a restart (empty caches) the same probing yields the same IDs.
  Reopen();
  WriteBatch batch2;
  EXPECT_EQ(*store_->interner().InternStack(b, &batch2), 101u);
  EXPECT_EQ(*store_->interner().InternStack(a, &batch2), 7u);
  EXPECT_EQ(*store_->interner().InternStack(c, &batch2), 102u);
  CommitOk(&batch2);
  EXPECT_EQ(*store_->interner().GetStack(7), a);
  EXPECT_EQ(*store_->interner().GetStack(101), b);
  EXPECT_EQ(*store_->interner().GetStack(102), c);
}

TEST_F(StoreTest, CollidingConcurrentInternsGetDistinctIds) {
  options_.id_hash_for_testing = [](std::string_view, uint32_t probe) -> uint64_t {
    return 1000 + probe;
  };
  Reopen();
  constexpr int kThreads = 4;
  std::vector<uint64_t> ids(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      WriteBatch batch;
      ids[t] =
          *store_->interner().InternStack(StackFrames{{static_cast<uint64_t>(t)}, false}, &batch);
      EXPECT_TRUE(store_->Commit(&batch).ok());
    });
  }
  for (auto& th : threads) th.join();
  std::sort(ids.begin(), ids.end());
  EXPECT_EQ(std::unique(ids.begin(), ids.end()), ids.end());
  for (int t = 0; t < kThreads; ++t) {
    // Each stored ID holds exactly one of the stacks.
    auto stack = store_->interner().GetStack(1000 + t);
    ASSERT_TRUE(stack.ok());
    ASSERT_EQ(stack->function_ids.size(), 1u);
  }
}

TEST_F(StoreTest, CommittedDataSurvivesProcessKill) {
  store_.reset();
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // Child: commit, then die without closing (no memtable flush).
    auto store = Store::Open(dir_, options_);
    if (!store.ok()) _exit(1);
    WriteBatch batch;
    auto stack = (*store)->interner().InternStack(StackFrames{{11, 22}, false}, &batch);
    if (!stack.ok() || *stack == 0) _exit(2);
    batch.AddSamples("svc", 5000, "h", *stack, 9);
    batch.SetAppliedSequence("agent", 7, 3);
    if (!(*store)->Commit(&batch).ok()) _exit(3);
    kill(getpid(), SIGKILL);
    _exit(4);
  }
  int wstatus = 0;
  ASSERT_EQ(waitpid(pid, &wstatus, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(wstatus)) << "child exit " << WEXITSTATUS(wstatus);
  Reopen();
  EXPECT_EQ(*store_->meta().AppliedSequence("agent", 7), 3u);
  uint64_t stack_id = 0;
  auto cells = Scan({"svc", 0, 10000, std::nullopt, std::nullopt});
  ASSERT_EQ(cells.size(), 1u);
  stack_id = std::get<2>(cells.begin()->first);
  EXPECT_EQ(cells.begin()->second, 9u);
  EXPECT_EQ(*store_->interner().GetStack(stack_id), (StackFrames{{11, 22}, false}));
}

TEST_F(StoreTest, MergeSumsAcrossBatchesReopenAndCompaction) {
  for (int i = 1; i <= 3; ++i) {
    WriteBatch batch;
    batch.AddSamples("svc", 60000, "h1", 42, i);
    batch.AddSamples("svc", 60000, "h1", 42, 10 * i);  // same cell twice in one batch
    CommitOk(&batch);
  }
  EXPECT_EQ(CellCount("svc", 60000, "h1", 42), 66u);
  Reopen();
  EXPECT_EQ(CellCount("svc", 60000, "h1", 42), 66u);
  WriteBatch more;
  more.AddSamples("svc", 60000, "h1", 42, 4);
  CommitOk(&more);
  ASSERT_TRUE(store_->CompactAll().ok());
  EXPECT_EQ(CellCount("svc", 60000, "h1", 42), 70u);
  Reopen();
  ASSERT_TRUE(store_->CompactAll().ok());
  EXPECT_EQ(CellCount("svc", 60000, "h1", 42), 70u);
  EXPECT_EQ(store_->Stats().malformed_merge_operands, 0u);
}

TEST_F(StoreTest, MalformedMergeOperandsAreSkippedAndCounted) {
  std::string key = EncodeCellKey("svc", 1000, "h", 9);
  WriteBatch batch;
  batch.AddSamples("svc", 1000, "h", 9, 5);
  CommitOk(&batch);
  // A garbage base value under the key, then valid operands on top of it.
  ASSERT_TRUE(store_->PutRawForTesting(Column::kSamples, key, "bad").ok());
  WriteBatch batch2;
  batch2.AddSamples("svc", 1000, "h", 9, 3);
  batch2.AddSamples("svc", 1000, "h", 9, 4);
  CommitOk(&batch2);
  EXPECT_EQ(CellCount("svc", 1000, "h", 9), 7u);
  EXPECT_GE(store_->Stats().malformed_merge_operands, 1u);
  ASSERT_TRUE(store_->CompactAll().ok());
  EXPECT_EQ(CellCount("svc", 1000, "h", 9), 7u);
}

TEST_F(StoreTest, AppliedSequenceIsAtomicWithCountsAndSurvivesReopen) {
  EXPECT_EQ(*store_->meta().AppliedSequence("agent-1", 7), 0u);
  WriteBatch batch;
  batch.AddSamples("svc", 0, "h", 1, 5);
  batch.SetAppliedSequence("agent-1", 7, 1);
  CommitOk(&batch);
  EXPECT_TRUE(batch.empty());

  // A resent batch 1 is refused as a whole: counts unchanged.
  WriteBatch resent;
  resent.AddSamples("svc", 0, "h", 1, 5);
  resent.SetAppliedSequence("agent-1", 7, 1);
  EXPECT_EQ(store_->Commit(&resent).code(), absl::StatusCode::kAlreadyExists);

  Reopen();
  EXPECT_EQ(*store_->meta().AppliedSequence("agent-1", 7), 1u);
  EXPECT_EQ(*store_->meta().AppliedSequence("agent-2", 7), 0u);
  EXPECT_EQ(CellCount("svc", 0, "h", 1), 5u);
  EXPECT_EQ(store_->Commit(&resent).code(), absl::StatusCode::kAlreadyExists);

  WriteBatch next;
  next.AddSamples("svc", 0, "h", 1, 2);
  next.SetAppliedSequence("agent-1", 7, 2);
  CommitOk(&next);
  Reopen();
  EXPECT_EQ(*store_->meta().AppliedSequence("agent-1", 7), 2u);
  EXPECT_EQ(CellCount("svc", 0, "h", 1), 7u);
}

TEST_F(StoreTest, SequencesArePerIncarnation) {
  // A restarted agent (new graph ID) numbers its batches from 1 again: they are new batches,
  // not replays of the earlier incarnation's.
  WriteBatch first;
  first.AddSamples("svc", 0, "h", 1, 5);
  first.SetAppliedSequence("agent-1", 7, 40);
  CommitOk(&first);
  WriteBatch restarted;
  restarted.AddSamples("svc", 0, "h", 1, 2);
  restarted.SetAppliedSequence("agent-1", 8, 1);
  CommitOk(&restarted);
  EXPECT_EQ(*store_->meta().AppliedSequence("agent-1", 7), 40u);
  EXPECT_EQ(*store_->meta().AppliedSequence("agent-1", 8), 1u);
  EXPECT_EQ(CellCount("svc", 0, "h", 1), 7u);
}

TEST_F(StoreTest, LegacySequenceCountsForTheStoredGraphOnly) {
  // A store written before incarnations holds 'q' agent -> sequence. It belongs to the graph
  // the store has for that agent; a new incarnation starts from 0.
  ASSERT_TRUE(store_->PutRawForTesting(Column::kMeta, LegacySequenceKey("old"),
                                       EncodeCount(12))
                  .ok());
  WriteBatch graph;
  graph.AppendGraphNodes("old", 5, {{2, "main", "m", "", 0}});
  CommitOk(&graph);
  EXPECT_EQ(*store_->meta().AppliedSequence("old", 5), 12u);
  EXPECT_EQ(*store_->meta().AppliedSequence("old", 6), 0u);
  WriteBatch resent;
  resent.SetAppliedSequence("old", 5, 12);
  EXPECT_EQ(store_->Commit(&resent).code(), absl::StatusCode::kAlreadyExists);
  WriteBatch next;
  next.SetAppliedSequence("old", 5, 13);
  CommitOk(&next);
  EXPECT_EQ(*store_->meta().AppliedSequence("old", 5), 13u);
}

TEST_F(StoreTest, CountsSaturateInsteadOfWrapping) {
  WriteBatch big;
  big.AddSamples("svc", 0, "h", 1, UINT64_MAX);
  CommitOk(&big);
  WriteBatch more;
  more.AddSamples("svc", 0, "h", 1, 2);
  CommitOk(&more);
  EXPECT_EQ(CellCount("svc", 0, "h", 1), UINT64_MAX);
  ASSERT_TRUE(store_->CompactAll().ok());
  EXPECT_EQ(CellCount("svc", 0, "h", 1), UINT64_MAX);
  auto services = store_->samples().ListServices();
  ASSERT_TRUE(services.ok());
  ASSERT_EQ(services->size(), 1u);
  EXPECT_EQ((*services)[0].total_samples, UINT64_MAX);
}

TEST_F(StoreTest, ConcurrentDuplicateBatchesApplyOnce) {
  constexpr int kThreads = 4;
  std::atomic<int> applied{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      WriteBatch batch;
      batch.AddSamples("svc", 0, "h", 1, 1);
      batch.SetAppliedSequence("agent", 7, 9);
      if (store_->Commit(&batch).ok()) applied++;
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(applied.load(), 1);
  EXPECT_EQ(CellCount("svc", 0, "h", 1), 1u);
}

TEST_F(StoreTest, InvalidInputFailsCommitWithoutWriting) {
  WriteBatch batch;
  batch.AddSamples("svc", 0, "h", 1, 1);
  batch.AddSamples(std::string("bad\0svc", 7), 0, "h", 1, 1);
  EXPECT_EQ(store_->Commit(&batch).code(), absl::StatusCode::kInvalidArgument);
  WriteBatch negative;
  negative.AddSamples("svc", -5, "h", 1, 1);
  EXPECT_EQ(store_->Commit(&negative).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CellCount("svc", 0, "h", 1), 0u);
  EXPECT_TRUE(store_->samples().ListServices()->empty());
}

TEST_F(StoreTest, DeleteCaptureDropsItsCellsAndRecordOnly) {
  WriteBatch batch;
  batch.AddCaptureSamples("cap-1", 10000, "a", 1, 77);
  batch.AddCaptureSamples("cap-1", 20000, "b", 2, 5);
  batch.AddCaptureSamples("cap-10", 10000, "a", 1, 88);  // shares the prefix "cap-1"
  batch.AddSamples("cap-1", 10000, "a", 1, 9);           // a service named like the capture
  CaptureInfo one, ten;
  one.capture_id = "cap-1";
  ten.capture_id = "cap-10";
  batch.PutCapture(one);
  batch.PutCapture(ten);
  CommitOk(&batch);

  batch.DeleteCapture("cap-1");
  CommitOk(&batch);
  EXPECT_TRUE(Scan({"x", 0, 40000, std::nullopt, std::string("cap-1")}).empty());
  EXPECT_EQ(Scan({"x", 0, 40000, std::nullopt, std::string("cap-10")}).size(), 1u);
  EXPECT_EQ(Scan({"cap-1", 0, 40000, std::nullopt, std::nullopt}).size(), 1u);
  EXPECT_TRUE(absl::IsNotFound(store_->meta().GetCapture("cap-1").status()));
  EXPECT_TRUE(store_->meta().GetCapture("cap-10").ok());
  Reopen();
  EXPECT_TRUE(Scan({"x", 0, 40000, std::nullopt, std::string("cap-1")}).empty());
}

TEST_F(StoreTest, ReleasesSurviveReopenAndAreReplacedByID) {
  WriteBatch batch;
  const std::string id_a = std::string("svc") + '\0' + "version" + '\0' + "1";
  const std::string id_b = std::string("svc") + '\0' + "version" + '\0' + "2";
  batch.PutRelease({id_a, "first"});
  batch.PutRelease({id_b, std::string("bytes\0kept", 10)});
  CommitOk(&batch);
  batch.PutRelease({id_a, "second"});
  CommitOk(&batch);
  Reopen();
  EXPECT_THAT(*store_->meta().ListReleases(),
              ElementsAre(ReleaseRecord{id_a, "second"},
                          ReleaseRecord{id_b, std::string("bytes\0kept", 10)}));
  batch.PutRelease({"", "no id"});
  EXPECT_TRUE(absl::IsInvalidArgument(store_->Commit(&batch)));
}

TEST_F(StoreTest, ScanSamplesFiltersRangeHostAndCaptures) {
  WriteBatch batch;
  for (int64_t w : {0, 10000, 20000, 30000}) {
    for (std::string host : {"a", "ab", "b"}) {
      batch.AddSamples("svc", w, host, 1, w / 10000 + 1);
      batch.AddSamples("svc", w, host, 2, 100);
    }
    batch.AddSamples("svc2", w, "a", 1, 1000);  // other service, also a prefix match risk
    batch.AddSamples("sv", w, "a", 1, 5000);
  }
  batch.AddCaptureSamples("cap-1", 10000, "a", 1, 77);
  batch.AddCaptureSamples("cap-2", 10000, "a", 1, 88);
  CommitOk(&batch);

  auto all = Scan({"svc", 0, 40000, std::nullopt, std::nullopt});
  EXPECT_EQ(all.size(), 4u * 3 * 2);
  uint64_t total = 0;
  for (auto& [k, v] : all) total += v;
  EXPECT_EQ(total, 3u * (1 + 2 + 3 + 4) + 4 * 3 * 100);

  auto range = Scan({"svc", 10000, 30000, std::nullopt, std::nullopt});
  for (auto& [k, v] : range) {
    EXPECT_GE(std::get<0>(k), 10000);
    EXPECT_LT(std::get<0>(k), 30000);
  }
  EXPECT_EQ(range.size(), 2u * 3 * 2);

  auto host_a = Scan({"svc", 0, 40000, std::string("a"), std::nullopt});
  EXPECT_EQ(host_a.size(), 4u * 2);
  for (auto& [k, v] : host_a) EXPECT_EQ(std::get<1>(k), "a");
  auto host_ab = Scan({"svc", 10000, 20001, std::string("ab"), std::nullopt});
  EXPECT_EQ(host_ab.size(), 2u * 2);
  EXPECT_EQ((host_ab[{20000, "ab", 1}]), 3u);
  EXPECT_TRUE(Scan({"svc", 0, 40000, std::string("zz"), std::nullopt}).empty());
  EXPECT_TRUE(Scan({"svc", 0, 40000, std::string("0"), std::nullopt}).empty());

  auto cap = Scan({"svc", 0, 40000, std::nullopt, std::string("cap-1")});
  ASSERT_EQ(cap.size(), 1u);
  EXPECT_EQ((cap[{10000, "a", 1}]), 77u);
  EXPECT_TRUE(Scan({"svc", 0, 40000, std::nullopt, std::string("cap-3")}).empty());
  // Captures are invisible to continuous queries.
  EXPECT_EQ((Scan({"svc", 10000, 10001, std::string("a"), std::nullopt})[{10000, "a", 1}]), 2u);

  auto services = store_->samples().ListServices();
  ASSERT_TRUE(services.ok());
  ASSERT_EQ(services->size(), 3u);
  EXPECT_EQ((*services)[1], (ServiceSummary{"svc", 0, 30000, 3u * 10 + 1200}));
}

TEST_F(StoreTest, ServiceSummariesAccumulateAcrossCommitsAndReopen) {
  WriteBatch b1;
  b1.AddSamples("svc", 50000, "h", 1, 3);
  CommitOk(&b1);
  WriteBatch b2;
  b2.AddSamples("svc", 20000, "h", 1, 4);
  b2.AddSamples("svc", 90000, "h", 2, 5);
  CommitOk(&b2);
  Reopen();
  ASSERT_TRUE(store_->CompactAll().ok());
  EXPECT_THAT(*store_->samples().ListServices(),
              ElementsAre(ServiceSummary{"svc", 20000, 90000, 12}));
}

TEST_F(StoreTest, MetaRecordsRoundTrip) {
  WriteBatch batch;
  AgentRecord agent{"agent-1", "host-1", "mips64", "0.1.0", 123456, 7};
  AgentRecord agent2{"agent-2", "host-2", "x86_64", "0.1.0", 99, 1};
  batch.PutAgent(agent2);
  batch.PutAgent(agent);
  CaptureInfo capture{"cap-1", "svc", "host-1", 4242, 499, 1000, 31000, true, ""};
  batch.PutCapture(capture);
  PhaseEvent e1{"svc", 10000, std::string("rose\0a", 6)};
  PhaseEvent e2{"svc", 20000, "rose b"};
  PhaseEvent e3{"svc", 20000, "rose c"};
  PhaseEvent other{"svc2", 20000, "x"};
  for (const auto& e : {e1, e2, e3, other, e2}) batch.PutPhaseEvent(e);
  CommitOk(&batch);
  Reopen();

  EXPECT_THAT(*store_->meta().ListAgents(), ElementsAre(agent, agent2));
  EXPECT_EQ(*store_->meta().GetCapture("cap-1"), capture);
  EXPECT_THAT(*store_->meta().ListCaptures(), ElementsAre(capture));
  EXPECT_EQ(store_->meta().GetCapture("nope").status().code(), absl::StatusCode::kNotFound);

  auto events = store_->meta().ScanPhaseEvents("svc", 0, 100000);
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->size(), 3u);  // the duplicate e2 is stored once
  EXPECT_EQ((*events)[0], e1);
  auto later = store_->meta().ScanPhaseEvents("svc", 15000, 20001);
  ASSERT_EQ(later->size(), 2u);
  EXPECT_TRUE(store_->meta().ScanPhaseEvents("svc", 0, 10000)->empty());
}

TEST_F(StoreTest, GraphRecordsLoadBackInOrder) {
  std::vector<GraphNode> nodes;
  for (uint32_t i = 2; i < 300; ++i) {
    nodes.push_back({i, "fn" + std::to_string(i), "/m.so", "B", 16ull * i});
  }
  std::vector<GraphEdge> edges;
  for (uint32_t i = 0; i < 300; ++i) edges.push_back({i % 7, 0x1000ull + i, i + 2});
  // Appended across several commits, as graph deltas arrive.
  {
    WriteBatch b;
    b.AppendGraphNodes("agent", 5, std::vector<GraphNode>(nodes.begin(), nodes.begin() + 100));
    b.AppendGraphEdges("agent", 5, 0, std::vector<GraphEdge>(edges.begin(), edges.begin() + 256));
    CommitOk(&b);
  }
  {
    WriteBatch b;
    b.AppendGraphNodes("agent", 5, std::vector<GraphNode>(nodes.begin() + 100, nodes.end()));
    b.AppendGraphEdges("agent", 5, 256, std::vector<GraphEdge>(edges.begin() + 256, edges.end()));
    b.AppendGraphNodes("agent", 6, {{2, "other", "", "", 0}});
    b.AppendGraphNodes("agent-x", 5, {{2, "other", "", "", 0}});
    CommitOk(&b);
  }
  Reopen();
  auto graph = store_->meta().LoadGraph("agent", 5);
  ASSERT_TRUE(graph.ok()) << graph.status();
  EXPECT_EQ(graph->nodes, nodes);
  EXPECT_EQ(graph->edges, edges);
  EXPECT_EQ(store_->meta().LoadGraph("agent", 6)->nodes.size(), 1u);

  WriteBatch del;
  del.DeleteGraph("agent", 5);
  CommitOk(&del);
  EXPECT_TRUE(store_->meta().LoadGraph("agent", 5)->nodes.empty());
  EXPECT_EQ(store_->meta().LoadGraph("agent", 6)->nodes.size(), 1u);
}

TEST_F(StoreTest, GraphsAreListedWithTheirUseMarksAndDeletedWithThem) {
  {
    WriteBatch b;
    for (uint32_t i = 0; i < 500; ++i) b.AppendGraphEdges("agent", 5, i, {{0, i, 2}});
    b.AppendGraphNodes("agent", 5, {{2, "f", "", "", 0}});
    b.MarkGraphUsed("agent", 5, 1000);
    b.AppendGraphNodes("agent", 6, {{2, "g", "", "", 0}});  // stored before marks were kept
    b.AppendGraphNodes("agent-x", 5, {{2, "h", "", "", 0}});
    b.MarkGraphUsed("agent-x", 5, 2000);
    b.MarkGraphUsed("agent-y", 1, 3000);  // a mark without a graph lists nothing
    CommitOk(&b);
  }
  auto graphs = store_->meta().ListGraphs();
  ASSERT_TRUE(graphs.ok()) << graphs.status();
  EXPECT_EQ(*graphs, (std::vector<StoredGraph>{
                         {"agent", 5, 1000}, {"agent", 6, 0}, {"agent-x", 5, 2000}}));
  {
    WriteBatch b;
    b.MarkGraphUsed("agent", 5, 5000);
    CommitOk(&b);
  }
  EXPECT_EQ(store_->meta().ListGraphs()->front().last_used_ms, 5000);

  WriteBatch del;
  del.DeleteGraph("agent", 5);
  CommitOk(&del);
  graphs = store_->meta().ListGraphs();
  ASSERT_TRUE(graphs.ok()) << graphs.status();
  EXPECT_EQ(*graphs, (std::vector<StoredGraph>{{"agent", 6, 0}, {"agent-x", 5, 2000}}));
  // The mark went with the graph: a graph stored again under that ID starts unmarked.
  {
    WriteBatch b;
    b.AppendGraphNodes("agent", 5, {{2, "f", "", "", 0}});
    CommitOk(&b);
  }
  EXPECT_EQ(store_->meta().ListGraphs()->front(), (StoredGraph{"agent", 5, 0}));
}

TEST_F(StoreTest, GraphGapIsReportedAsDataLoss) {
  WriteBatch b;
  b.AppendGraphEdges("agent", 1, 0, {{0, 1, 2}});
  b.AppendGraphEdges("agent", 1, 2, {{0, 1, 3}});  // edge 1 missing
  CommitOk(&b);
  EXPECT_EQ(store_->meta().LoadGraph("agent", 1).status().code(), absl::StatusCode::kDataLoss);
}

TEST_F(StoreTest, CorruptRecordsReturnErrors) {
  ASSERT_TRUE(store_->PutRawForTesting(Column::kStacks, IdKey(5), "\x01\x02\x03").ok());
  ASSERT_TRUE(store_->PutRawForTesting(Column::kFunctions, IdKey(6), "\x01\xff").ok());
  ASSERT_TRUE(store_->PutRawForTesting(Column::kMeta, AgentKey("a"), "junk").ok());
  ASSERT_TRUE(store_->PutRawForTesting(Column::kMeta, CaptureKey("c"), "").ok());
  ASSERT_TRUE(store_->PutRawForTesting(Column::kMeta, SequenceKey("a", 7), "xx").ok());
  ASSERT_TRUE(store_->PutRawForTesting(Column::kServices, "svc", "short").ok());
  ASSERT_TRUE(
      store_->PutRawForTesting(Column::kMeta, GraphNodeKey("a", 1, 2), "\x05x").ok());
  // A cell key cut short (window present, host and stack ID missing).
  ASSERT_TRUE(
      store_->PutRawForTesting(Column::kSamples, CellPrefix("svc", 1) + "h", "12345678")
          .ok());
  ASSERT_TRUE(store_->PutRawForTesting(Column::kCaptures,
                                       EncodeCellKey("cap", 0, "h", 1), "x").ok());

  EXPECT_EQ(store_->interner().GetStack(5).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(store_->interner().GetFunction(6).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(store_->meta().ListAgents().status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(store_->meta().GetCapture("c").status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(store_->meta().AppliedSequence("a", 7).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(store_->samples().ListServices().status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(store_->meta().LoadGraph("a", 1).status().code(), absl::StatusCode::kDataLoss);
  auto ignore = [](const SampleKey&, uint64_t) {};
  EXPECT_EQ(store_->samples()
                .ScanSamples({"svc", 0, 1LL << 62, std::nullopt, std::nullopt}, ignore)
                .code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(store_->samples()
                .ScanSamples({"svc", 0, 10, std::nullopt, std::string("cap")}, ignore)
                .code(),
            absl::StatusCode::kDataLoss);

  // A corrupt record squatting on a stack's first candidate ID is probed past, not reused.
  options_.id_hash_for_testing = [](std::string_view, uint32_t probe) -> uint64_t {
    return 5 + probe;
  };
  Reopen();
  WriteBatch batch;
  StackFrames stack{{1}, false};
  EXPECT_EQ(*store_->interner().InternStack(stack, &batch), 6u);
  CommitOk(&batch);
  EXPECT_EQ(*store_->interner().GetStack(6), stack);
}

TEST_F(StoreTest, CodecRejectsTruncatedInput) {
  std::string fn = EncodeFunction({"name", "module", "bid", 77});
  for (size_t n = 0; n < fn.size(); ++n) {
    EXPECT_FALSE(DecodeFunction(std::string_view(fn).substr(0, n)).ok()) << n;
  }
  std::string cap = EncodeCapture({"c", "s", "h", 1, 2, 3, 4, false, "err"});
  for (size_t n = 0; n < cap.size(); ++n) {
    EXPECT_FALSE(DecodeCapture(std::string_view(cap).substr(0, n)).ok()) << n;
  }
  std::string key = EncodeCellKey("svc", 5, "host", 9);
  for (size_t n = 0; n < key.size(); ++n) {
    EXPECT_FALSE(DecodeCellKey(std::string_view(key).substr(0, n)).ok()) << n;
  }
  auto cell = DecodeCellKey(key);
  ASSERT_TRUE(cell.ok());
  EXPECT_EQ(cell->scope, "svc");
  EXPECT_EQ(cell->window_start_ms, 5u);
  EXPECT_EQ(cell->host, "host");
  EXPECT_EQ(cell->stack_id, 9u);
}

TEST_F(StoreTest, ContentIdIsStable) {
  // IDs are persisted: these values must never change between releases.
  EXPECT_EQ(Hash64("strata profiler", 0), 0xf591b6fff5ac1693ull);
  EXPECT_EQ(ContentId("abc", 3), 0x12c8b5ce30a424d8ull);
  EXPECT_NE(ContentId("abc", 0), ContentId("abc", 1));
  EXPECT_NE(ContentId("abc", 0), ContentId("abd", 0));
}

TEST_F(StoreTest, AutoResolutionMatchesRawTotalsAndUsesRollups) {
  constexpr int64_t kMin = 60'000, kHour = 3'600'000;
  WriteBatch batch;
  // 10 s windows across three hours, two hosts, a few stacks.
  for (int64_t w = 0; w < 3 * kHour; w += 10'000) {
    batch.AddSamples("svc", w, (w / 10'000) % 2 ? "a" : "b", 1 + (w / 10'000) % 3, 1 + w % 7);
  }
  CommitOk(&batch);
  ASSERT_TRUE(store_->RollUp(3 * kHour).ok());
  for (auto [from, to] : std::vector<std::pair<int64_t, int64_t>>{
           {0, 3 * kHour}, {25'000, 2 * kHour + 95'000}, {kHour - 10'000, kHour + 130'000},
           {30'000, 50'000}, {kMin, 2 * kMin}}) {
    for (std::optional<std::string> host : {std::optional<std::string>(), std::optional<std::string>("a")}) {
      std::map<uint64_t, uint64_t> raw, auto_totals;
      int64_t last_window = -1;
      ASSERT_TRUE(store_->samples()
                      .ScanSamples({"svc", from, to, host, std::nullopt, Resolution::kRaw},
                                   [&](const SampleKey& k, uint64_t c) { raw[k.stack_id] += c; })
                      .ok());
      size_t auto_cells = 0;
      ASSERT_TRUE(store_->samples()
                      .ScanSamples({"svc", from, to, host, std::nullopt, Resolution::kAuto},
                                   [&](const SampleKey& k, uint64_t c) {
                                     EXPECT_GE(k.window_start_ms, last_window);
                                     last_window = k.window_start_ms;
                                     if (host) {
                                       EXPECT_EQ(k.host, *host);
                                     }
                                     auto_totals[k.stack_id] += c;
                                     ++auto_cells;
                                   })
                      .ok());
      EXPECT_EQ(raw, auto_totals) << from << ".." << to;
      if (from == 0 && to == 3 * kHour) {
        EXPECT_LE(auto_cells, 3u * 2 * 3);  // three hour windows, at most 2 hosts x 3 stacks
      }
    }
  }
  std::map<int64_t, uint64_t> hours;
  ASSERT_TRUE(
      store_->samples()
          .ScanSamples({"svc", 0, 3 * kHour, std::nullopt, std::nullopt, Resolution::kHour},
                       [&](const SampleKey& k, uint64_t c) { hours[k.window_start_ms] += c; })
          .ok());
  EXPECT_EQ(hours.size(), 3u);
  EXPECT_TRUE(hours.contains(kHour) && hours.contains(2 * kHour));
}

// The rollups, summed from the raw cells, hold exactly the raw counts per hour and minute:
// cells of windows rolled up already (late batches) add to them at commit, a restart rolls up
// only what was not, and a store written before seals keeps its rollups as they were.
TEST_F(StoreTest, RollupsHoldTheRawCountsThroughLateCellsRestartsAndUpgrades) {
  constexpr int64_t kMin = 60'000, kHour = 3'600'000;
  // Per (unit window, stack) of one resolution, all hosts.
  auto cells = [&](Resolution r, int64_t unit) {
    std::map<std::pair<int64_t, uint64_t>, uint64_t> out;
    EXPECT_TRUE(store_->samples()
                    .ScanSamples({"svc", 0, 10 * kHour, std::nullopt, std::nullopt, r},
                                 [&](const SampleKey& k, uint64_t c) {
                                   out[{k.window_start_ms - k.window_start_ms % unit,
                                        k.stack_id}] += c;
                                 })
                    .ok());
    return out;
  };
  auto expect_consistent = [&](const std::string& when) {
    EXPECT_EQ(cells(Resolution::kMinute, kMin), cells(Resolution::kRaw, kMin)) << when;
    EXPECT_EQ(cells(Resolution::kHour, kHour), cells(Resolution::kRaw, kHour)) << when;
    EXPECT_EQ(cells(Resolution::kAuto, kHour), cells(Resolution::kRaw, kHour)) << when;
  };
  auto write = [&](int64_t from, int64_t to, uint64_t stack) {
    WriteBatch batch;
    for (int64_t w = from; w < to; w += 10'000) {
      batch.AddSamples("svc", w, w % 20'000 ? "a" : "b", stack + w / kHour, 1 + w % 5);
    }
    CommitOk(&batch);
  };
  write(kHour / 2, 2 * kHour + 7 * kMin, 1);
  expect_consistent("before any roll");
  ASSERT_TRUE(store_->RollUp(kHour + 30 * kMin + 20'000).ok());
  const uint64_t minute_cells = store_->Stats().rollup_minute_cells;
  EXPECT_GT(minute_cells, 0u);
  expect_consistent("rolled up to 01:30");
  write(kHour + 10 * kMin, kHour + 11 * kMin, 7);  // late: a sealed minute and unsealed hour
  write(kHour + 40 * kMin, kHour + 41 * kMin, 7);  // not sealed yet
  expect_consistent("late cells");
  ASSERT_TRUE(store_->RollUp(2 * kHour + 5 * kMin).ok());
  expect_consistent("rolled up to 02:05");
  write(20 * kMin, 21 * kMin, 9);  // late into a sealed hour
  expect_consistent("late cells in a sealed hour");
  Reopen();
  expect_consistent("reopened");
  const uint64_t rolled_before = store_->Stats().rollup_minute_cells;
  ASSERT_TRUE(store_->RollUp(2 * kHour + 5 * kMin).ok());  // nothing left to roll up
  EXPECT_EQ(store_->Stats().rollup_minute_cells, rolled_before);
  ASSERT_TRUE(store_->RollUp(3 * kHour).ok());
  expect_consistent("reopened and rolled up");

  // A store written before seals: rollups merged at commit, no seal record.
  const std::string upgraded = "old";
  for (Column c : {Column::kSamples, Column::kRollupMinute, Column::kRollupHour}) {
    ASSERT_TRUE(
        store_->PutRawForTesting(c, EncodeCellKey(upgraded, 0, "h", 5), EncodeCount(3)).ok());
  }
  ASSERT_TRUE(store_->PutRawForTesting(Column::kServices, upgraded, EncodeServiceSummary(0, 0, 3))
                  .ok());
  Reopen();
  ASSERT_TRUE(store_->RollUp(5 * kHour).ok());
  uint64_t minute_total = 0;
  ASSERT_TRUE(store_->samples()
                  .ScanSamples({upgraded, 0, kHour, std::nullopt, std::nullopt,
                                Resolution::kMinute},
                               [&](const SampleKey&, uint64_t c) { minute_total += c; })
                  .ok());
  EXPECT_EQ(minute_total, 3u);  // not rolled up a second time
}

// A host whose clock started at 1970 (a board without a real-time clock, before NTP) seals
// its service's roll-ups there: the first roll-up spans 29 million minutes, of which only
// those with cells are summed and have cached blocks to drop.
TEST_F(StoreTest, RollingUpFromNineteenSeventyTouchesOnlyTheMinutesWithCells) {
  constexpr int64_t kHour = 3'600'000;
  constexpr int64_t kNow = 1'764'633'600'000;  // 2025-12-02
  WriteBatch batch;
  batch.AddSamples("svc", 10'000, "a", 1, 2);
  batch.AddSamples("svc", kNow - 2 * kHour, "a", 1, 3);
  CommitOk(&batch);
  ASSERT_TRUE(store_->RollUp(kNow).ok());
  std::map<int64_t, uint64_t> minutes, hours;
  auto per_window = [](std::map<int64_t, uint64_t>& into) {
    return [&into](const SampleKey& k, uint64_t c) { into[k.window_start_ms] += c; };
  };
  ASSERT_TRUE(store_->samples()
                  .ScanSamples({"svc", 0, kNow, std::nullopt, std::nullopt,
                                Resolution::kMinute}, per_window(minutes))
                  .ok());
  ASSERT_TRUE(store_->samples()
                  .ScanSamples({"svc", 0, kNow, std::nullopt, std::nullopt, Resolution::kHour},
                               per_window(hours))
                  .ok());
  EXPECT_THAT(minutes, ElementsAre(std::pair<const int64_t, uint64_t>(0, 2),
                                   std::pair<const int64_t, uint64_t>(kNow - 2 * kHour, 3)));
  EXPECT_THAT(hours, ElementsAre(std::pair<const int64_t, uint64_t>(0, 2),
                                 std::pair<const int64_t, uint64_t>(kNow - 2 * kHour, 3)));
}

TEST_F(StoreTest, RetentionDropsOldCellsPerResolution) {
  constexpr int64_t kHour = 3'600'000;
  options_.now_ms_for_testing = [] { return 10 * kHour; };
  options_.raw_retention_ms = 2 * kHour;
  options_.minute_retention_ms = 5 * kHour;
  Reopen();
  WriteBatch batch;
  batch.AddSamples("svc", 1 * kHour, "h", 1, 5);   // beyond raw and minute retention
  batch.AddSamples("svc", 6 * kHour, "h", 1, 7);   // beyond raw retention only
  batch.AddSamples("svc", 9 * kHour, "h", 1, 11);  // kept everywhere
  CommitOk(&batch);
  ASSERT_TRUE(store_->RollUp(10 * kHour).ok());
  ASSERT_TRUE(store_->CompactAll().ok());
  auto windows = [&](Resolution r) {
    std::map<int64_t, uint64_t> out;
    EXPECT_TRUE(store_
                    ->samples().ScanSamples({"svc", 0, 11 * kHour, std::nullopt, std::nullopt, r},
                                  [&](const SampleKey& k, uint64_t c) { out[k.window_start_ms] += c; })
                    .ok());
    return out;
  };
  EXPECT_EQ(windows(Resolution::kRaw), (std::map<int64_t, uint64_t>{{9 * kHour, 11}}));
  EXPECT_EQ(windows(Resolution::kMinute),
            (std::map<int64_t, uint64_t>{{6 * kHour, 7}, {9 * kHour, 11}}));
  EXPECT_EQ(windows(Resolution::kHour),
            (std::map<int64_t, uint64_t>{{1 * kHour, 5}, {6 * kHour, 7}, {9 * kHour, 11}}));
}

// Retention runs when a file is compacted: each column with a retention has every file
// compacted again within a quarter of it (an hour at least, a day at most), so a store that
// takes few writes drops what expired too. Read back from the options RocksDB stored.
TEST_F(StoreTest, ColumnsWithARetentionAreCompactedPeriodically) {
  constexpr int64_t kHour = 3'600'000;
  options_.raw_retention_ms = 8 * kHour;
  options_.minute_retention_ms = 30 * 24 * kHour;
  Reopen();
  std::filesystem::path latest;  // OPTIONS-<n>, the highest n written by the last open
  for (const auto& e : std::filesystem::directory_iterator(dir_)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("OPTIONS-", 0) == 0 &&
        (latest.empty() || name.size() > latest.filename().string().size() ||
         (name.size() == latest.filename().string().size() && name > latest.filename()))) {
      latest = e.path();
    }
  }
  std::ifstream in(latest);
  const std::string stored(std::istreambuf_iterator<char>(in), {});
  auto periodic = [&](const std::string& column) {
    const size_t section = stored.find("[CFOptions \"" + column + "\"]");
    const std::string key = "periodic_compaction_seconds=";
    const size_t at = stored.find(key, section);
    if (section == std::string::npos || at == std::string::npos) return std::string("-");
    return stored.substr(at + key.size(), stored.find('\n', at) - at - key.size());
  };
  EXPECT_EQ(periodic("samples"), "7200");
  EXPECT_EQ(periodic("meta"), "7200");
  EXPECT_EQ(periodic("rollup_1m"), "86400");
}

// A cluster takes each agent's counters from one node: the sums per agent add up to the
// total, and an agent ID that is a prefix of another's stays apart from it.
TEST(UnwindCountsCodecTest, PythonCountersRoundTripAndVersion1RecordsDecode) {
  const UnwindCounts c{.stacks = 5, .lost = 1, .python_frames = 40, .python_stale = 2};
  EXPECT_EQ(*DecodeUnwindCounts(EncodeUnwindCounts(c)), c);
  const std::string v1("\x01\x05\x00\x00\x00\x00\x01", 7);  // before the Python counters
  EXPECT_EQ(*DecodeUnwindCounts(v1), (UnwindCounts{.stacks = 5, .lost = 1}));
  EXPECT_FALSE(DecodeUnwindCounts(v1 + '\x01').ok());
}

TEST_F(StoreTest, UnwindCountsSumPerAgent) {
  WriteBatch batch;
  batch.PutUnwindCounts("svc", 0, "a", 1, 1, {.stacks = 3, .truncated = 1});
  batch.PutUnwindCounts("svc", 10'000, "a", 1, 2, {.stacks = 4, .lost = 2});
  batch.PutUnwindCounts("svc", 10'000, "ab", 1, 1, {.stacks = 5});
  batch.PutUnwindCounts("other", 10'000, "a", 1, 3, {.stacks = 100});
  CommitOk(&batch);
  std::map<std::string, UnwindCounts> by_agent;
  auto sum = store_->meta().SumUnwindCounts("svc", 0, 20'000, &by_agent);
  ASSERT_TRUE(sum.ok()) << sum.status();
  EXPECT_EQ(*sum, (UnwindCounts{.stacks = 12, .truncated = 1, .lost = 2}));
  EXPECT_EQ(by_agent, (std::map<std::string, UnwindCounts>{
                          {"a", {.stacks = 7, .truncated = 1, .lost = 2}},
                          {"ab", {.stacks = 5}}}));
}

TEST_F(StoreTest, PerBatchMetaRecordsFollowTheRawRetentionAndHourlyOnesTheHourRetention) {
  constexpr int64_t kHour = 3'600'000;
  options_.now_ms_for_testing = [] { return 10 * kHour; };
  options_.raw_retention_ms = 2 * kHour;
  options_.hour_retention_ms = 5 * kHour;
  Reopen();
  WriteBatch batch;
  const UnwindCounts counts{.stacks = 3, .truncated = 1};
  const std::vector<LeafAddressCount> leaves = {{.function_id = 4, .offset = 0x40, .count = 3}};
  // Beyond both retentions, beyond the raw one only, within both.
  for (int64_t window : {1 * kHour, 6 * kHour, 9 * kHour}) {
    batch.PutUnwindCounts("svc", window, "agent", 1, window, counts);
    batch.PutLeafAddresses("svc", window, "host", "agent", 1, window, leaves);
  }
  batch.PutPhaseEvent({"svc", 1 * kHour, "payload"});  // other meta records are kept
  CommitOk(&batch);
  ASSERT_TRUE(store_->CompactAll().ok());

  EXPECT_EQ(*store_->meta().SumUnwindCounts("svc", 0, 8 * kHour), UnwindCounts());
  EXPECT_EQ(*store_->meta().SumUnwindCounts("svc", 0, 10 * kHour), counts);
  auto leaf_sum = [&](int64_t from, int64_t to) {
    return store_->meta().SumLeafAddresses("svc", from, to, std::nullopt).value();
  };
  const absl::flat_hash_map<std::pair<uint64_t, uint64_t>, uint64_t> three = {{{4, 0x40}, 3}};
  EXPECT_TRUE(leaf_sum(1 * kHour, 2 * kHour).empty());              // hourly record gone
  EXPECT_EQ(leaf_sum(6 * kHour, 7 * kHour), three);                  // the hour's record
  EXPECT_TRUE(leaf_sum(6 * kHour, 6 * kHour + kHour / 2).empty());  // batch record gone
  EXPECT_EQ(leaf_sum(9 * kHour, 9 * kHour + kHour / 2), three);
  EXPECT_EQ(store_->meta().ScanPhaseEvents("svc", 0, 2 * kHour)->size(), 1u);
}

// Long ranges read one record per host and hour, and give what the batches' records give.
TEST_F(StoreTest, LeafAddressesOfWholeHoursComeFromHourlyRecords) {
  constexpr int64_t kHour = 3'600'000;
  constexpr int64_t kWindow = 10'000;
  std::map<std::tuple<std::string, int64_t>, std::vector<LeafAddressCount>> written;
  uint64_t sequence = 0;
  WriteBatch batch;
  for (int64_t window = 0; window < 4 * kHour; window += 7 * kWindow) {
    for (const std::string host : {"a", "b"}) {
      // Two functions; addresses and counts vary with the window, some repeat.
      std::vector<LeafAddressCount> counts = {
          {.function_id = 1, .offset = static_cast<uint64_t>(window / kWindow % 5) * 4,
           .count = static_cast<uint64_t>(window / kWindow % 3 + 1)},
          {.function_id = host == "a" ? 2u : 3u, .offset = 0x10, .count = 2}};
      batch.PutLeafAddresses("svc", window, host, "agent-" + host, 1, ++sequence, counts);
      written[{host, window}] = counts;
    }
  }
  CommitOk(&batch);
  auto expected = [&](int64_t from, int64_t to, const std::optional<std::string>& host) {
    absl::flat_hash_map<std::pair<uint64_t, uint64_t>, uint64_t> sum;
    for (const auto& [key, counts] : written) {
      const auto& [h, window] = key;
      if (window < from || window >= to || (host && *host != h)) continue;
      for (const LeafAddressCount& c : counts) sum[{c.function_id, c.offset}] += c.count;
    }
    return sum;
  };
  for (bool compacted : {false, true}) {
    if (compacted) {
      ASSERT_TRUE(store_->CompactAll().ok());
    }
    for (auto [from, to] : {std::pair{0 * kHour, 4 * kHour}, std::pair{kHour / 3, 3 * kHour + 77},
                            std::pair{kHour + 5 * kWindow, 2 * kHour - kWindow},
                            std::pair{0 * kHour, 1 * kHour}}) {
      for (const std::optional<std::string>& host :
           {std::optional<std::string>(), std::optional<std::string>("b")}) {
        size_t read = 0;
        auto got = store_->meta().SumLeafAddresses("svc", from, to, host, &read);
        ASSERT_TRUE(got.ok()) << got.status();
        EXPECT_EQ(*got, expected(from, to, host)) << from << ".." << to << " compacted "
                                                  << compacted;
        if (from == 0 && to == 4 * kHour) {
          EXPECT_EQ(read, host ? 4u : 8u) << "not one record per host and hour";
        }
      }
    }
  }
}

// Requests per host: summed over batches and hosts, whole hours from the hourly records.
TEST_F(StoreTest, RequestsSumPerHostAndRange) {
  constexpr int64_t kHour = 3'600'000;
  constexpr int64_t kWindow = 10'000;
  std::map<std::pair<std::string, int64_t>, uint64_t> written;
  uint64_t sequence = 0;
  WriteBatch batch;
  for (int64_t window = 0; window < 3 * kHour; window += 11 * kWindow) {
    for (const std::string host : {"a", "b"}) {
      const uint64_t requests =
          static_cast<uint64_t>(window / kWindow % 7) + (host == "a" ? 1 : 50);
      batch.PutRequests("svc", window, host, "agent-" + host, 1, ++sequence, requests);
      written[{host, window}] = requests;
    }
  }
  batch.PutRequests("other", 0, "a", "agent-a", 1, ++sequence, 1000);
  CommitOk(&batch);
  for (bool compacted : {false, true}) {
    if (compacted) {
      ASSERT_TRUE(store_->CompactAll().ok());
    }
    for (auto [from, to] : {std::pair{0 * kHour, 3 * kHour}, std::pair{kHour / 3, 2 * kHour + 77},
                            std::pair{kHour + 5 * kWindow, 2 * kHour - kWindow}}) {
      for (const std::optional<std::string>& host :
           {std::optional<std::string>(), std::optional<std::string>("b")}) {
        uint64_t expected = 0;
        for (const auto& [key, n] : written) {
          if (key.second >= from && key.second < to && (!host || *host == key.first)) expected += n;
        }
        auto got = store_->meta().SumRequests("svc", from, to, host);
        ASSERT_TRUE(got.ok()) << got.status();
        EXPECT_EQ(*got, expected) << from << ".." << to << " compacted " << compacted;
      }
    }
  }
  EXPECT_EQ(*store_->meta().SumRequests("none", 0, 3 * kHour, std::nullopt), 0u);
}

// A store that held leaf addresses before it wrote hourly records (no marker) reads the hours
// before the next full hour after its start from the batches' records.
TEST_F(StoreTest, HoursBeforeTheHourlyRecordsAreReadFromTheBatches) {
  constexpr int64_t kHour = 3'600'000;
  WriteBatch batch;
  uint64_t sequence = 0;
  for (int64_t window = 0; window < 3 * kHour; window += kHour / 4) {
    batch.PutLeafAddresses("svc", window, "host", "agent", 1, ++sequence,
                           {{.function_id = 1, .offset = 8, .count = 1}});
  }
  CommitOk(&batch);
  store_.reset();
  {  // As a store of the previous version left it: batch records without the marker.
    std::vector<std::string> names;
    ASSERT_TRUE(rocksdb::DB::ListColumnFamilies(rocksdb::DBOptions(), dir_, &names).ok());
    std::vector<rocksdb::ColumnFamilyDescriptor> descriptors;
    for (const std::string& name : names) descriptors.emplace_back(name, rocksdb::ColumnFamilyOptions());
    std::vector<rocksdb::ColumnFamilyHandle*> handles;
    rocksdb::DB* db = nullptr;
    ASSERT_TRUE(rocksdb::DB::Open(rocksdb::DBOptions(), dir_, descriptors, &handles, &db).ok());
    for (size_t i = 0; i < names.size(); ++i) {
      if (names[i] == "meta") {
        ASSERT_TRUE(db->Delete(rocksdb::WriteOptions(), handles[i], LeafAddressHoursSinceKey()).ok());
        ASSERT_TRUE(db->Delete(rocksdb::WriteOptions(), handles[i],
                               LeafAddressHourKey("svc", kHour, "host")).ok());
      }
      ASSERT_TRUE(db->DestroyColumnFamilyHandle(handles[i]).ok());
    }
    delete db;
  }
  options_.now_ms_for_testing = [] { return 1 * kHour + 5; };  // hourly records from 2h on
  Reopen();
  size_t read = 0;
  auto got = store_->meta().SumLeafAddresses("svc", 0, 3 * kHour, std::nullopt, &read);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ((*got)[std::make_pair(uint64_t{1}, uint64_t{8})], 12u);
  EXPECT_EQ(read, 8u + 1u) << "hours 0 and 1 from their 8 batches, hour 2 from its record";
}

TEST_F(StoreTest, BytesOnDiskGrowsWithData) {
  uint64_t before = store_->ApproximateBytesOnDisk();
  WriteBatch batch;
  for (uint64_t s = 0; s < 2000; ++s) batch.AddSamples("svc", 0, "host", s * 7919, s + 1);
  CommitOk(&batch);
  ASSERT_TRUE(store_->CompactAll().ok());
  EXPECT_GT(store_->ApproximateBytesOnDisk(), before + 2000);
}

// SumSamples against the per-stack sums of ScanSamples, for every resolution, with hosts.
class SumSamplesTest : public StoreTest {
 protected:
  static constexpr int64_t kHour = 3'600'000;

  // Per-stack sums and hosts of ScanSamples for `q`.
  SampleTotals Expected(const SampleQuery& q) {
    std::map<uint64_t, uint64_t> counts;
    std::map<std::string, uint64_t> hosts;
    absl::Status s = store_->samples().ScanSamples(q, [&](const SampleKey& k, uint64_t c) {
      counts[k.stack_id] += c;
      hosts[k.host] += c;
    });
    EXPECT_TRUE(s.ok()) << s;
    SampleTotals t;
    for (auto [id, c] : counts) t.stacks.push_back({id, c});
    for (const auto& [host, c] : hosts) {
      t.hosts.push_back(host);
      t.host_samples.push_back(c);
    }
    return t;
  }
  SampleTotals Sum(const SampleQuery& q) {
    absl::StatusOr<SampleTotals> t = store_->samples().SumSamples(q);
    EXPECT_TRUE(t.ok()) << t.status();
    if (!t.ok()) return {};
    std::sort(t->stacks.begin(), t->stacks.end(),
              [](const StackCount& a, const StackCount& b) { return a.stack_id < b.stack_id; });
    return *std::move(t);
  }
  void ExpectSame(const SampleQuery& q) {
    SampleTotals want = Expected(q), got = Sum(q);
    EXPECT_EQ(got.stacks, want.stacks) << q.from_ms << ".." << q.to_ms;
    EXPECT_EQ(got.hosts, want.hosts) << q.from_ms << ".." << q.to_ms;
    EXPECT_EQ(got.host_samples, want.host_samples) << q.from_ms << ".." << q.to_ms;
  }
  // Sums `q` (whole windows of `unit`) over and over while another thread commits late
  // samples to each of its windows in turn; whatever was kept meanwhile, the final answer is
  // fresh.
  void SumWhileWritingLate(const SampleQuery& q, int64_t unit = kHour) {
    const int64_t windows = (q.to_ms - q.from_ms) / unit;
    std::atomic<bool> done{false};
    std::thread writer([&] {
      for (int i = 0; i < 200; ++i) {
        WriteBatch batch;
        batch.AddSamples("svc", q.from_ms + (i % windows) * unit + 10'000, "a", 1, 1);
        ASSERT_TRUE(store_->Commit(&batch).ok());
      }
      done = true;
    });
    while (!done) Sum(q);
    writer.join();
    ExpectSame(q);
  }
  // Four hours of two services; with `roll`, rolled up as the server's roller would have.
  void Fill(bool roll = true) {
    WriteBatch batch;
    for (int64_t w = 0; w < 4 * kHour; w += 10'000) {
      const int64_t i = w / 10'000;
      batch.AddSamples("svc", w, i % 3 == 0 ? "a" : (i % 3 == 1 ? "b" : "c"), 1 + i % 5,
                       i % 11);  // zero counts too
      batch.AddSamples("svc2", w, "a", 1, 1000);
    }
    CommitOk(&batch);
    if (roll) {
      ASSERT_TRUE(store_->RollUp(4 * kHour).ok());
    }
  }
};

// Before the rollups are written, with some of them written, and with all of them.
TEST_F(SumSamplesTest, MatchesScanForEveryResolutionRangeAndHost) {
  Fill(/*roll=*/false);
  for (int64_t rolled_up_to : {int64_t{0}, 2 * kHour + 5 * 60'000, 4 * kHour}) {
  ASSERT_TRUE(store_->RollUp(rolled_up_to).ok());
  for (Resolution r : {Resolution::kAuto, Resolution::kRaw, Resolution::kMinute, Resolution::kHour}) {
    for (auto [from, to] : std::vector<std::pair<int64_t, int64_t>>{
             {0, 4 * kHour}, {25'000, 3 * kHour + 95'000}, {kHour - 10'000, kHour + 130'000},
             {30'000, 50'000}, {kHour, 2 * kHour}, {5 * kHour, 6 * kHour}, {-5, 7}}) {
      for (std::optional<std::string> host :
           {std::optional<std::string>(), std::optional<std::string>("b"),
            std::optional<std::string>("zz")}) {
        // Twice: the second run reads whole hours from the cached blocks.
        ExpectSame({"svc", from, to, host, std::nullopt, r});
        ExpectSame({"svc", from, to, host, std::nullopt, r});
      }
      // A set of hosts (a cluster node's share of a fan-out query).
      SampleQuery some{"svc", from, to, std::nullopt, std::nullopt, r};
      some.hosts.emplace({"a", "c", "zz"});
      ExpectSame(some);
      ExpectSame(some);
      // Per host only: the same host sums, no per-stack work.
      some.hosts_only = true;
      const SampleTotals want = Expected(some), got = Sum(some);
      EXPECT_TRUE(got.stacks.empty());
      EXPECT_EQ(got.hosts, want.hosts);
      EXPECT_EQ(got.host_samples, want.host_samples);
    }
  }
  }
  const StoreStats stats = store_->Stats();
  EXPECT_GT(stats.hour_block_hits, 0u);
  EXPECT_GT(stats.hour_block_misses, 0u);
  EXPECT_GT(stats.hour_block_bytes, 0u);
}

TEST_F(SumSamplesTest, WholeHoursAreReadOnceThenServedFromMemory) {
  Fill();
  const SampleQuery q{"svc", 0, 4 * kHour, std::nullopt, std::nullopt, Resolution::kAuto};
  const uint64_t before = store_->Stats().cells_scanned;
  Sum(q);
  const uint64_t first = store_->Stats().cells_scanned - before;
  EXPECT_GT(first, 0u);
  EXPECT_LE(first, 4u * 3 * 5);  // four hour rows of at most 3 hosts x 5 stacks
  Sum(q);
  EXPECT_EQ(store_->Stats().cells_scanned - before, first);  // nothing read again
  EXPECT_EQ(store_->Stats().hour_block_hits, 4u);
}

TEST_F(SumSamplesTest, LateWritesToAClosedHourInvalidateItsBlock) {
  Fill();
  const SampleQuery q{"svc", 0, 4 * kHour, std::nullopt, std::nullopt, Resolution::kAuto};
  Sum(q);  // caches all four hours
  WriteBatch batch;
  batch.AddSamples("svc", kHour + 20'000, "d", 3, 7);  // a late sample, new host
  batch.AddSamples("svc", 2 * kHour, "a", 99, 1);       // a new stack
  CommitOk(&batch);
  ExpectSame(q);
  SampleTotals t = Sum(q);
  EXPECT_EQ(t.hosts, (std::vector<std::string>{"a", "b", "c", "d"}));
  EXPECT_EQ(t.stacks.back(), (StackCount{99, 1}));
  // Other services' hours stay cached; a failed commit invalidates nothing it did not write.
  ExpectSame({"svc2", 0, 4 * kHour, std::nullopt, std::nullopt, Resolution::kAuto});
  WriteBatch bad;
  bad.AddSamples("svc", kHour, std::string("x\0y", 3), 1, 1);
  EXPECT_FALSE(store_->Commit(&bad).ok());
  ExpectSame(q);
}

TEST_F(SumSamplesTest, WholeMinutesAreReadOnceThenServedFromMemory) {
  Fill();
  // Inside one hour, so no whole hour: a raw head, whole minutes, a raw tail.
  const SampleQuery q{"svc", kHour + 25'000, kHour + 30 * 60'000 + 5'000, std::nullopt,
                      std::nullopt, Resolution::kAuto};
  const uint64_t before = store_->Stats().cells_scanned;
  ExpectSame(q);
  Sum(q);
  EXPECT_EQ(store_->Stats().minute_block_misses, 29u);  // minutes 1 to 29 of the hour
  EXPECT_EQ(store_->Stats().minute_block_hits, 29u);
  const uint64_t scanned = store_->Stats().cells_scanned - before;
  // Once more: only the raw edges are read, the windows at 0:30, 0:40, 0:50 and 30:00.
  Sum(q);
  EXPECT_EQ(store_->Stats().cells_scanned - before - scanned, 4u);
  // A fixed minute resolution starting inside a minute holds none of that minute.
  ExpectSame({"svc", kHour + 25'000, 2 * kHour, std::nullopt, std::nullopt,
              Resolution::kMinute});
  ExpectSame({"svc", kHour + 25'000, 2 * kHour, std::string("b"), std::nullopt,
              Resolution::kMinute});
}

TEST_F(SumSamplesTest, LateWritesToAClosedMinuteInvalidateItsBlock) {
  Fill();
  const SampleQuery q{"svc", kHour + 60'000, kHour + 10 * 60'000, std::nullopt, std::nullopt,
                      Resolution::kAuto};
  Sum(q);  // caches the nine minutes
  WriteBatch batch;
  batch.AddSamples("svc", kHour + 3 * 60'000 + 20'000, "d", 3, 7);  // a late sample, new host
  batch.AddSamples("svc", kHour + 5 * 60'000, "a", 99, 1);          // a new stack
  CommitOk(&batch);
  ExpectSame(q);
  SampleTotals t = Sum(q);
  EXPECT_EQ(t.hosts, (std::vector<std::string>{"a", "b", "c", "d"}));
  EXPECT_EQ(t.stacks.back(), (StackCount{99, 1}));
}

TEST_F(SumSamplesTest, MinutesPastRetentionAreNotKeptInMemory) {
  options_.now_ms_for_testing = [] { return 10 * kHour; };
  options_.minute_retention_ms = 10 * kHour - (kHour + 5 * 60'000);  // minutes before 1:05
  Reopen();
  Fill();
  const SampleQuery q{"svc", kHour, kHour + 10 * 60'000, std::nullopt, std::nullopt,
                      Resolution::kMinute};
  ExpectSame(q);
  ExpectSame(q);
  // Minutes 0-4 were read each time; minutes 5-9 once, then served from memory.
  EXPECT_EQ(store_->Stats().minute_block_misses, 5u);
  EXPECT_EQ(store_->Stats().minute_block_hits, 5u);
}

TEST_F(SumSamplesTest, ConcurrentLateWritesNeverLeaveAStaleBlock) {
  Fill();
  SumWhileWritingLate({"svc", 0, 4 * kHour, std::nullopt, std::nullopt, Resolution::kHour});
}

// Twelve hours of "svc" but for hour 5, with label sets 0 and 7, rolled up: long enough
// for spans.
void FillTwelveHours(Store* store) {
  WriteBatch batch;
  for (int64_t w = 0; w < 12 * 3'600'000; w += 60'000) {
    if (w / 3'600'000 == 5) continue;
    const int64_t i = w / 60'000;
    batch.AddSamples("svc", w, i % 2 ? "a" : "b", 1 + i % 7, 1 + i % 3, i % 5 == 0 ? 7 : 0);
  }
  ASSERT_TRUE(store->Commit(&batch).ok());
  ASSERT_TRUE(store->RollUp(12 * 3'600'000).ok());
}

TEST_F(SumSamplesTest, LongRangesReadTheirWholeHoursAsOneSpan) {
  FillTwelveHours(store_.get());
  // Hours 1 to 10 whole, minute and raw edges on both sides.
  const SampleQuery q{"svc", kHour - 25'000, 11 * kHour + 95'000, std::nullopt, std::nullopt,
                      Resolution::kAuto};
  ExpectSame(q);
  EXPECT_EQ(store_->Stats().span_misses, 1u);
  const uint64_t blocks = store_->Stats().hour_block_hits + store_->Stats().hour_block_misses;
  EXPECT_EQ(blocks, 10u);  // hours 1 to 10 looked up once each
  ExpectSame(q);
  EXPECT_EQ(store_->Stats().span_hits, 1u);
  EXPECT_EQ(store_->Stats().hour_block_hits + store_->Stats().hour_block_misses, blocks);
  EXPECT_GT(store_->Stats().span_bytes, 0u);
  // Heaviest first, as SumSamples returns them whether from a span or not.
  for (int64_t to : {11 * kHour + 95'000, 2 * kHour}) {
    absl::StatusOr<SampleTotals> raw = store_->samples().SumSamples({"svc", 0, to});
    ASSERT_TRUE(raw.ok()) << raw.status();
    EXPECT_TRUE(std::is_sorted(raw->stacks.begin(), raw->stacks.end(), HeavierFirst));
  }
  // One host, a set of hosts, some label sets, hosts only: each selection a span of its own,
  // read twice.
  SampleQuery one_host = q;
  one_host.host = "a";
  SampleQuery some_hosts = q;
  some_hosts.hosts.emplace({"b", "zz"});
  SampleQuery labelled = q;
  labelled.label_sets = absl::flat_hash_set<uint64_t>{7};
  SampleQuery labelled_host = labelled;
  labelled_host.host = "b";
  for (const SampleQuery& selected : {one_host, some_hosts, labelled, labelled_host}) {
    ExpectSame(selected);
    ExpectSame(selected);
  }
  EXPECT_EQ(store_->Stats().span_misses, 5u);
  EXPECT_EQ(store_->Stats().span_hits, 5u);
  SampleQuery hosts_only = labelled;
  hosts_only.hosts_only = true;
  const SampleTotals want = Expected(hosts_only), got = Sum(hosts_only);
  EXPECT_TRUE(got.stacks.empty());
  EXPECT_EQ(got.hosts, want.hosts);
  EXPECT_EQ(got.host_samples, want.host_samples);
  EXPECT_EQ(store_->Stats().span_hits, 6u);  // the labelled query's span
  // Fewer whole hours than a span is kept for: merged from the blocks.
  ExpectSame({"svc", kHour, 5 * kHour, std::nullopt, std::nullopt, Resolution::kAuto});
  EXPECT_EQ(store_->Stats().span_misses, 5u);
}

TEST_F(SumSamplesTest, LateWritesToAnHourOfASpanDropIt) {
  FillTwelveHours(store_.get());
  const SampleQuery q{"svc", 0, 12 * kHour, std::nullopt, std::nullopt, Resolution::kAuto};
  Sum(q);
  Sum(q);
  EXPECT_EQ(store_->Stats().span_hits, 1u);
  // Another service's hour, or one after the span, leaves it.
  WriteBatch other;
  other.AddSamples("svc2", 3 * kHour, "a", 1, 1);
  other.AddSamples("svc", 12 * kHour, "a", 1, 1);
  CommitOk(&other);
  Sum(q);
  EXPECT_EQ(store_->Stats().span_hits, 2u);
  // A late sample in hour 3, then one in the hour that had none.
  for (int64_t window : {3 * kHour + 20'000, 5 * kHour + 40'000}) {
    WriteBatch late;
    late.AddSamples("svc", window, "d", 99, 5);
    CommitOk(&late);
    ExpectSame(q);
    SampleTotals t = Sum(q);
    EXPECT_EQ(t.hosts, (std::vector<std::string>{"a", "b", "d"}));
  }
  EXPECT_EQ(store_->Stats().span_hits, 4u);
  EXPECT_EQ(store_->Stats().span_misses, 3u);
}

TEST_F(SumSamplesTest, RangesOfManyWholeMinutesReadThemAsOneSpan) {
  FillTwelveHours(store_.get());
  constexpr int64_t kMinute = 60'000;
  // 55 whole minutes (1:10 to 2:05) between raw edges, no whole hour: one minute span.
  const SampleQuery last_hour{"svc", kHour + 10 * kMinute - 5'000, 2 * kHour + 5 * kMinute + 30'000,
                              std::nullopt, std::nullopt, Resolution::kAuto};
  ExpectSame(last_hour);
  EXPECT_EQ(store_->Stats().span_misses, 1u);
  EXPECT_EQ(store_->Stats().minute_block_misses, 55u);
  ExpectSame(last_hour);
  EXPECT_EQ(store_->Stats().span_hits, 1u);
  EXPECT_EQ(store_->Stats().minute_block_misses, 55u);
  // Samples of a minute the span does not hold (as live ones of the current minute) leave
  // it, though they fall in an hour it overlaps; a late one inside it drops it.
  WriteBatch live;
  live.AddSamples("svc", 2 * kHour + 30 * kMinute, "a", 1, 1);
  CommitOk(&live);
  ExpectSame(last_hour);
  EXPECT_EQ(store_->Stats().span_hits, 2u);
  WriteBatch late;
  late.AddSamples("svc", kHour + 20 * kMinute + 10'000, "d", 99, 5);
  CommitOk(&late);
  ExpectSame(last_hour);
  EXPECT_EQ(store_->Stats().span_misses, 2u);
  EXPECT_EQ(Sum(last_hour).hosts, (std::vector<std::string>{"a", "b", "d"}));
  // A range with spans of minutes on both sides of its span of hours: the three merged.
  const SampleQuery day{"svc", 30 * kMinute, 11 * kHour + 40 * kMinute, std::nullopt,
                        std::nullopt, Resolution::kAuto};
  ExpectSame(day);
  ExpectSame(day);
  EXPECT_EQ(store_->Stats().span_misses, 5u);
  EXPECT_EQ(store_->Stats().span_hits, 6u);
  // Fewer whole minutes than a span is kept for: merged from the blocks.
  ExpectSame({"svc", kHour, kHour + 29 * kMinute, std::nullopt, std::nullopt,
              Resolution::kAuto});
  EXPECT_EQ(store_->Stats().span_misses, 5u);
}

TEST_F(SumSamplesTest, SpansOfMinutesNeverPushOutASpanOfHours) {
  FillTwelveHours(store_.get());
  const SampleQuery week_like{"svc", 0, 12 * kHour, std::nullopt, std::nullopt,
                              Resolution::kAuto};
  ExpectSame(week_like);
  EXPECT_EQ(store_->Stats().span_misses, 1u);
  // Far more "last hour" views (each a span of minutes of its own) than spans are kept.
  constexpr int64_t kMinute = 60'000;
  for (int64_t start = 0; start < 200; ++start) {
    const SampleQuery last_hour{"svc", start * kMinute, (start + 45) * kMinute, std::nullopt,
                                std::nullopt, Resolution::kMinute};
    ASSERT_TRUE(store_->samples().SumSamples(last_hour).ok());
  }
  EXPECT_EQ(store_->Stats().span_misses, 201u);
  ExpectSame(week_like);
  EXPECT_EQ(store_->Stats().span_misses, 201u);
  EXPECT_EQ(store_->Stats().span_hits, 1u);
}

TEST_F(SumSamplesTest, ConcurrentLateWritesNeverLeaveAStaleSpan) {
  FillTwelveHours(store_.get());
  SumWhileWritingLate({"svc", 0, 12 * kHour, std::nullopt, std::nullopt, Resolution::kHour});
  // The same for a span of minutes (an hour of them), each minute written in turn.
  const uint64_t spans_built = store_->Stats().span_misses;
  SumWhileWritingLate({"svc", kHour, 2 * kHour, std::nullopt, std::nullopt,
                       Resolution::kMinute},
                      60'000);
  EXPECT_GT(store_->Stats().span_misses, spans_built);
}

TEST_F(SumSamplesTest, DisabledCacheAndSmallCacheStayExact) {
  for (size_t bytes : {size_t{0}, size_t{600}}) {
    options_.hour_block_cache_bytes = bytes;
    Reopen();
    Fill();
    ExpectSame({"svc", 0, 4 * kHour, std::nullopt, std::nullopt, Resolution::kAuto});
    ExpectSame({"svc", 0, 4 * kHour, std::nullopt, std::nullopt, Resolution::kAuto});
    if (bytes == 0) {
      EXPECT_EQ(store_->Stats().hour_block_misses, 0u);
    }
    store_.reset();
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  Reopen();
}

TEST_F(SumSamplesTest, HoursPastRetentionAreNotKeptInMemory) {
  options_.now_ms_for_testing = [] { return 10 * kHour; };
  options_.hour_retention_ms = 8 * kHour;  // hours before 2 h are past retention
  Reopen();
  Fill();
  const SampleQuery q{"svc", 0, 4 * kHour, std::nullopt, std::nullopt, Resolution::kHour};
  ExpectSame(q);
  ExpectSame(q);
  // Hours 0 and 1 were read each time; hours 2 and 3 once, then served from memory.
  EXPECT_EQ(store_->Stats().hour_block_misses, 2u);
  EXPECT_EQ(store_->Stats().hour_block_hits, 2u);
}

TEST_F(SumSamplesTest, AllTimeAndSparseRangesCostTheirRowsNotTheirLength) {
  WriteBatch batch;
  batch.AddSamples("svc", 3 * kHour + 10'000, "a", 1, 2);
  batch.AddSamples("svc", 24 * 365 * kHour, "a", 2, 3);  // a year later
  batch.AddSamples("svc", 24 * 365 * kHour + kHour, "b", 2, 4);
  CommitOk(&batch);
  for (int i = 0; i < 2; ++i) {
    for (int64_t to : {std::numeric_limits<int64_t>::max(), 24 * 366 * kHour}) {
      for (Resolution r : {Resolution::kAuto, Resolution::kHour}) {
        ExpectSame({"svc", 0, to, std::nullopt, std::nullopt, r});
      }
    }
  }
  SampleTotals t = Sum({"svc", 0, std::numeric_limits<int64_t>::max(), std::nullopt,
                        std::nullopt, Resolution::kAuto});
  EXPECT_EQ(t.stacks, (std::vector<StackCount>{{1, 2}, {2, 7}}));
  EXPECT_EQ(t.hosts, (std::vector<std::string>{"a", "b"}));
  // Rolled up, through the minute and hour blocks, from inside a window up to the end of time.
  ASSERT_TRUE(store_->RollUp(24 * 366 * kHour).ok());
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  for (int i = 0; i < 2; ++i) {
    for (int64_t from : {int64_t{0}, 3 * kHour + 5'000, kMax - 5}) {
      for (Resolution r : {Resolution::kAuto, Resolution::kMinute, Resolution::kHour}) {
        ExpectSame({"svc", from, kMax, std::nullopt, std::nullopt, r});
      }
    }
  }
}

TEST_F(SumSamplesTest, CorruptHourRowIsAnErrorNotCached) {
  Fill();
  ASSERT_TRUE(store_
                  ->PutRawForTesting(Column::kRollupHour,
                                     EncodeCellKey("svc", kHour, "a", 1), "bad")
                  .ok());
  const SampleQuery q{"svc", 0, 4 * kHour, std::nullopt, std::nullopt, Resolution::kAuto};
  EXPECT_FALSE(store_->samples().SumSamples(q).ok());
  EXPECT_FALSE(store_->samples().SumSamples(q).ok());
  EXPECT_FALSE(store_->samples().SumSamples({"", 0, 1, std::nullopt, std::nullopt}).ok());
}

}  // namespace
}  // namespace strata::server::store

namespace strata::server::store {
namespace {

// A directory given by mistake is refused before anything is written into it, with the
// reason and the path; a damaged store names the file.
TEST_F(StoreTest, LabelledCellsAreKeptApartAndSelectedBySet) {
  WriteBatch batch;
  const labels::LabelSet v1{{"region", "eu"}, {"version", "1"}};
  const labels::LabelSet v2{{"version", "2"}};
  auto id1 = store_->interner().InternLabelSet("svc", v1, 16, &batch);
  auto id2 = store_->interner().InternLabelSet("svc", v2, 16, &batch);
  auto none = store_->interner().InternLabelSet("svc", {}, 16, &batch);
  ASSERT_TRUE(id1.ok() && id2.ok() && none.ok()) << id1.status() << id2.status();
  EXPECT_NE(*id1, 0u);
  EXPECT_NE(*id1, *id2);
  EXPECT_EQ(*none, 0u);
  // The same content always has the same ID.
  EXPECT_EQ(*store_->interner().InternLabelSet("svc", v1, 16, &batch), *id1);
  const int64_t w = 3'600'000;  // an hour boundary: the hour rollup holds these too
  batch.AddSamples("svc", w, "h", 7, 5, *id1);
  batch.AddSamples("svc", w, "h", 7, 3, *id2);
  batch.AddSamples("svc", w, "h", 7, 2);  // unlabelled, as before labels
  batch.AddSamples("svc", w, "h", 8, 4, *id2);
  batch.AddSamples("svc", w, "g", 8, 1, *id2);  // a host whose first cell has a label set
  CommitOk(&batch);
  Reopen();  // label sets and the per-service index come back from disk

  auto sets = store_->interner().ListLabelSets("svc");
  ASSERT_TRUE(sets.ok()) << sets.status();
  ASSERT_EQ(sets->size(), 3u);
  EXPECT_EQ((*sets)[0], (LabelSetRecord{0, {}}));
  std::map<uint64_t, labels::LabelSet> by_id;
  for (const auto& r : *sets) by_id[r.id] = r.labels;
  EXPECT_EQ(by_id[*id1], v1);
  EXPECT_EQ(by_id[*id2], v2);
  auto other = store_->interner().ListLabelSets("other");
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(other->size(), 1u);  // the empty set only

  for (Resolution r : {Resolution::kRaw, Resolution::kMinute, Resolution::kHour,
                       Resolution::kAuto}) {
    SampleQuery q{"svc", w, w + 3'600'000, std::nullopt, std::nullopt, r};
    auto all = store_->samples().SumSamples(q);
    ASSERT_TRUE(all.ok());
    std::map<uint64_t, uint64_t> counts;
    for (const auto& c : all->stacks) counts[c.stack_id] += c.count;
    EXPECT_EQ(counts, (std::map<uint64_t, uint64_t>{{7, 10}, {8, 5}})) << static_cast<int>(r);
    for (int pass = 0; pass < 2; ++pass) {  // kHour/kAuto: the second pass hits the block cache
      q.label_sets = absl::flat_hash_set<uint64_t>{*id2};
      auto v2_only = store_->samples().SumSamples(q);
      ASSERT_TRUE(v2_only.ok());
      counts.clear();
      for (const auto& c : v2_only->stacks) counts[c.stack_id] += c.count;
      EXPECT_EQ(counts, (std::map<uint64_t, uint64_t>{{7, 3}, {8, 5}})) << static_cast<int>(r);
      q.label_sets = absl::flat_hash_set<uint64_t>{0, *id1};
      auto old_and_v1 = store_->samples().SumSamples(q);
      ASSERT_TRUE(old_and_v1.ok());
      ASSERT_EQ(old_and_v1->stacks.size(), 1u);
      EXPECT_EQ(old_and_v1->stacks[0].count, 7u);
      EXPECT_EQ(old_and_v1->hosts, std::vector<std::string>{"h"});
      q.label_sets = absl::flat_hash_set<uint64_t>{};
      auto nothing = store_->samples().SumSamples(q);
      ASSERT_TRUE(nothing.ok());
      EXPECT_TRUE(nothing->stacks.empty());
      EXPECT_TRUE(nothing->hosts.empty());
      q.label_sets.reset();
    }
  }
  SampleQuery scan{"svc", w, w + 1, std::nullopt, std::nullopt};
  scan.label_sets = absl::flat_hash_set<uint64_t>{*id1};
  std::vector<SampleKey> keys;
  ASSERT_TRUE(store_->samples()
                  .ScanSamples(scan, [&](const SampleKey& k, uint64_t) { keys.push_back(k); })
                  .ok());
  ASSERT_EQ(keys.size(), 1u);
  EXPECT_EQ(keys[0].label_set, *id1);
  EXPECT_EQ(keys[0].stack_id, 7u);
}

TEST_F(StoreTest, LabelSetsPerServiceAreBounded) {
  WriteBatch batch;
  for (int i = 0; i < 3; ++i) {
    auto id = store_->interner().InternLabelSet("svc", {{"pod", absl::StrCat("p", i)}}, 3, &batch);
    ASSERT_TRUE(id.ok()) << id.status();
  }
  auto refused = store_->interner().InternLabelSet("svc", {{"pod", "p3"}}, 3, &batch);
  EXPECT_TRUE(absl::IsResourceExhausted(refused.status())) << refused.status();
  EXPECT_NE(refused.status().message().find("--max-label-sets"), std::string::npos);
  // Known sets, the empty set and other services are not affected.
  EXPECT_TRUE(store_->interner().InternLabelSet("svc", {{"pod", "p1"}}, 3, &batch).ok());
  EXPECT_TRUE(store_->interner().InternLabelSet("svc", {}, 3, &batch).ok());
  EXPECT_TRUE(store_->interner().InternLabelSet("other", {{"pod", "p3"}}, 3, &batch).ok());
  CommitOk(&batch);
  Reopen();
  WriteBatch again;
  EXPECT_TRUE(absl::IsResourceExhausted(
      store_->interner().InternLabelSet("svc", {{"pod", "p9"}}, 3, &again).status()));
  // Unnormalized or invalid sets are refused.
  EXPECT_TRUE(absl::IsInvalidArgument(
      store_->interner().InternLabelSet("svc", {{"b", "1"}, {"a", "2"}}, 9, &again).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      store_->interner().InternLabelSet("svc", {{"a", "x\n"}}, 9, &again).status()));
}

TEST_F(StoreTest, CellKeysWithAndWithoutLabelSetsDecode) {
  const std::string old_key = EncodeCellKey("svc", 10'000, "host", 42);
  auto cell = DecodeCellKey(old_key);
  ASSERT_TRUE(cell.ok());
  EXPECT_EQ(cell->label_set, 0u);
  EXPECT_EQ(cell->stack_id, 42u);
  EXPECT_EQ(cell->host, "host");
  // A stack ID whose last byte is 0 next to a label set: the host still ends at its NUL.
  const std::string key = EncodeCellKey("svc", 10'000, "h", 0x100, 0x2000);
  cell = DecodeCellKey(key);
  ASSERT_TRUE(cell.ok());
  EXPECT_EQ(cell->host, "h");
  EXPECT_EQ(cell->stack_id, 0x100u);
  EXPECT_EQ(cell->label_set, 0x2000u);
  EXPECT_EQ(EncodeCellKey("svc", 1, "h", 5, 0), EncodeCellKey("svc", 1, "h", 5));
  EXPECT_FALSE(DecodeCellKey(key.substr(0, key.size() - 1)).ok());
  EXPECT_FALSE(DecodeCellKey(old_key + std::string(8, '\0')).ok());  // label set 0
}

TEST(StoreDirectoryTest, OlderStoresOpenAndAreMarkedWithTheCurrentVersion) {
  char tmpl[] = "/tmp/strata_store_v1_test.XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  {
    auto store = Store::Open(dir, StoreOptions());
    ASSERT_TRUE(store.ok());
    WriteBatch batch;
    batch.AddSamples("svc", 10'000, "h", 1, 9);
    ASSERT_TRUE((*store)->Commit(&batch).ok());
  }
  std::ofstream(dir + "/STRATA", std::ios::trunc) << "strata-store 1\n";
  {
    auto store = Store::Open(dir, StoreOptions());
    ASSERT_TRUE(store.ok()) << store.status();
    auto totals = (*store)->samples().SumSamples({"svc", 0, 20'000, std::nullopt, std::nullopt});
    ASSERT_TRUE(totals.ok());
    ASSERT_EQ(totals->stacks.size(), 1u);
    EXPECT_EQ(totals->stacks[0].count, 9u);
  }
  auto marker = [&] {
    std::ifstream in(dir + "/STRATA");
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  EXPECT_EQ(marker(), "strata-store 4\n");
  for (const char* older : {"strata-store 2\n", "strata-store 3\n"}) {
    std::ofstream(dir + "/STRATA", std::ios::trunc) << older;
    EXPECT_TRUE(Store::Open(dir, StoreOptions()).ok()) << older;
    EXPECT_EQ(marker(), "strata-store 4\n");
  }
  std::ofstream(dir + "/STRATA", std::ios::trunc) << "strata-store 5\n";
  EXPECT_TRUE(absl::IsFailedPrecondition(Store::Open(dir, StoreOptions()).status()));
  std::filesystem::remove_all(dir);
}

TEST(StoreDirectoryTest, ForeignOrDamagedDirectoriesAreRefusedClearly) {
  char tmpl[] = "/tmp/strata_store_dir_test.XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string root = tmpl;
  namespace fs = std::filesystem;
  {
    fs::create_directories(root + "/foreign");
    std::ofstream(root + "/foreign/notes.txt") << "mine";
    auto store = Store::Open(root + "/foreign", StoreOptions());
    ASSERT_FALSE(store.ok());
    EXPECT_TRUE(absl::IsFailedPrecondition(store.status())) << store.status();
    EXPECT_NE(store.status().message().find("notes.txt"), std::string::npos) << store.status();
    EXPECT_FALSE(fs::exists(root + "/foreign/CURRENT"));
  }
  {
    // A store another process has open: a child holds its LOCK (as RocksDB does, with
    // fcntl; only system calls after the fork) until the pipe closes.
    ASSERT_TRUE(Store::Open(root + "/taken", StoreOptions()).ok());
    int opened[2], done[2];
    ASSERT_EQ(pipe(opened), 0);
    ASSERT_EQ(pipe(done), 0);
    const std::string lock_file = root + "/taken/LOCK";
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      close(opened[0]);
      close(done[1]);
      struct flock lock = {};
      lock.l_type = F_WRLCK;
      lock.l_whence = SEEK_SET;
      const int fd = open(lock_file.c_str(), O_RDWR);
      char c = fd >= 0 && fcntl(fd, F_SETLK, &lock) == 0 ? 'y' : 'n';
      if (write(opened[1], &c, 1) != 1 || read(done[0], &c, 1) < 0) _exit(1);
      _exit(0);
    }
    close(opened[1]);
    close(done[0]);
    char c = 0;
    ASSERT_EQ(read(opened[0], &c, 1), 1);
    ASSERT_EQ(c, 'y');
    auto second = Store::Open(root + "/taken", StoreOptions());
    close(done[1]);
    close(opened[0]);
    int status = 0;
    waitpid(child, &status, 0);
    ASSERT_FALSE(second.ok());
    EXPECT_NE(second.status().message().find("another process has it open"), std::string::npos)
        << second.status();
  }
  {
    std::ofstream(root + "/file") << "x";
    auto store = Store::Open(root + "/file", StoreOptions());
    ASSERT_FALSE(store.ok());
    EXPECT_NE(store.status().message().find("not a directory"), std::string::npos);
  }
  {
    // Another application's RocksDB database.
    rocksdb::Options o;
    o.create_if_missing = true;
    rocksdb::DB* db = nullptr;
    ASSERT_TRUE(rocksdb::DB::Open(o, root + "/other", &db).ok());
    delete db;
    auto store = Store::Open(root + "/other", StoreOptions());
    ASSERT_FALSE(store.ok());
    EXPECT_NE(store.status().message().find("not a Strata store"), std::string::npos)
        << store.status();
  }
  {
    // A new store several directories down: the missing ones are made; one that cannot be
    // made (a file on the way) is refused with the path and the reason.
    const std::string nested = root + "/new/a/b";
    EXPECT_TRUE(Store::Open(nested, StoreOptions()).ok());
    EXPECT_TRUE(fs::exists(nested + "/CURRENT"));
    auto store = Store::Open(root + "/file/store", StoreOptions());
    ASSERT_FALSE(store.ok());
    EXPECT_TRUE(absl::IsFailedPrecondition(store.status())) << store.status();
    EXPECT_NE(store.status().message().find("cannot create the data directory " + root +
                                            "/file/store: Not a directory"),
              std::string::npos)
        << store.status();
  }
  {
    // A store whose MANIFEST was cut short.
    const std::string dir = root + "/damaged";
    ASSERT_TRUE(Store::Open(dir, StoreOptions()).ok());
    std::string manifest;
    for (const auto& e : fs::directory_iterator(dir)) {
      if (e.path().filename().string().rfind("MANIFEST-", 0) == 0) manifest = e.path();
    }
    ASSERT_FALSE(manifest.empty());
    fs::resize_file(manifest, 20);
    auto store = Store::Open(dir, StoreOptions());
    ASSERT_FALSE(store.ok());
    EXPECT_NE(store.status().message().find("MANIFEST-"), std::string::npos) << store.status();
  }
  {
    // A store whose CURRENT file went missing is not opened as a new, empty store over its
    // data; the message says how to restore the file.
    const std::string dir = root + "/no-current";
    {
      auto store = Store::Open(dir, StoreOptions());
      ASSERT_TRUE(store.ok()) << store.status();
      ASSERT_TRUE((*store)->PutRawForTesting(Column::kMeta, "kept", "1").ok());
    }
    std::ifstream in(dir + "/CURRENT");
    std::string current;
    std::getline(in, current);
    fs::remove(dir + "/CURRENT");
    auto store = Store::Open(dir, StoreOptions());
    ASSERT_FALSE(store.ok());
    EXPECT_TRUE(absl::IsFailedPrecondition(store.status())) << store.status();
    EXPECT_NE(store.status().message().find("echo " + current + " > " + dir + "/CURRENT"),
              std::string::npos)
        << store.status();
    EXPECT_FALSE(fs::exists(dir + "/CURRENT"));
    std::ofstream(dir + "/CURRENT") << current << "\n";
    store = Store::Open(dir, StoreOptions());
    ASSERT_TRUE(store.ok()) << store.status();
  }
  fs::remove_all(root);
}

}  // namespace
}  // namespace strata::server::store
