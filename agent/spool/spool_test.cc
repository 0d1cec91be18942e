#include "agent/spool/spool.h"

#include <signal.h>
#include <sys/resource.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "agent/spool/spool_records.h"
#include "common/testing/temp_dir.h"
#include "gtest/gtest.h"

namespace strata::agent::spool {
namespace {

namespace fs = std::filesystem;

v1::SampleBatch Batch(uint64_t sequence, uint64_t epoch, uint64_t count) {
  v1::SampleBatch b;
  b.set_sequence(sequence);
  b.set_epoch(epoch);
  b.set_start_ms(1000 * sequence);
  b.set_end_ms(1000 * sequence + 1000);
  auto* c = b.add_contexts();
  c->set_leaf(2);
  c->add_ids(sequence);
  c->set_count(count);
  return b;
}

// A delta of one node and one edge, continuing a graph of `nodes` nodes and `edges` edges.
v1::GraphDelta Delta(uint32_t nodes, uint64_t edges) {
  v1::GraphDelta d;
  d.set_first_node(nodes);
  auto* n = d.add_nodes();
  n->set_id(nodes);
  n->set_name("f" + std::to_string(nodes));
  n->set_module("/bin/x");
  d.set_first_edge(edges);
  auto* e = d.add_edges();
  e->set_caller(0);
  e->set_callee(nodes);
  return d;
}

class SpoolTest : public ::testing::Test {
 protected:
  SpoolOptions Options() const {
    SpoolOptions o;
    o.dir = dir_.path();
    return o;
  }
  SpoolIdentity Fresh(std::string id, uint64_t graph_id) const { return {id, "host", graph_id}; }
  // Opens, collecting the restored graph deltas.
  std::unique_ptr<Spool> Open(const SpoolOptions& options, const SpoolIdentity& fresh) {
    restored_.clear();
    auto spool = Spool::Open(
        options, fresh,
        [this](const SpoolIdentity&, const v1::GraphDelta& d) {
          if (restore_fails_at_ >= 0 && static_cast<int>(restored_.size()) == restore_fails_at_) {
            return absl::DataLossError("refused");
          }
          restored_.push_back(d);
          return absl::OkStatus();
        },
        &recovery_);
    EXPECT_TRUE(spool.ok()) << spool.status();
    return spool.ok() ? std::move(*spool) : nullptr;
  }
  std::vector<std::string> Segments(const std::string& id) const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(dir_.path() + "/given/" + id)) {
      if (e.path().filename().string().rfind("batches-", 0) == 0) out.push_back(e.path());
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  strata::testing::TempDir dir_{"spool_test"};
  SpoolRecovery recovery_;
  std::vector<v1::GraphDelta> restored_;
  int restore_fails_at_ = -1;
};

TEST_F(SpoolTest, InMemoryKeepsTheNewestBatchesWithinItsBound) {
  SpoolOptions o;
  o.max_memory_batches = 3;
  auto spool = Open(o, Fresh("a", 1));
  for (uint64_t s = 1; s <= 5; ++s) ASSERT_TRUE(spool->Append(Batch(s, 0, 10)).ok());
  ASSERT_EQ(spool->size(), 3u);
  EXPECT_EQ(spool->entry(0).sequence, 3u);
  EXPECT_EQ(spool->stats().batches_dropped, 2u);
  EXPECT_EQ(spool->stats().samples_dropped, 20u);
  auto b = spool->Read(2);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->sequence(), 5u);
}

TEST_F(SpoolTest, ARestartResumesTheIdentityGraphAndUnacknowledgedBatches) {
  {
    auto spool = Open(Options(), Fresh("web-1", 0xabc));
    EXPECT_FALSE(recovery_.resumed);
    ASSERT_TRUE(spool->AppendGraph(Delta(2, 0)).ok());
    ASSERT_TRUE(spool->Append(Batch(1, 1, 5)).ok());
    ASSERT_TRUE(spool->AppendGraph(Delta(3, 1)).ok());
    for (uint64_t s = 2; s <= 4; ++s) ASSERT_TRUE(spool->Append(Batch(s, 2, 7)).ok());
    spool->AckThrough(2);
    EXPECT_EQ(spool->size(), 2u);
  }
  // Restarted with a new identity in mind: the old one comes back, with what it owed.
  auto spool = Open(Options(), Fresh("web-1", 0xdef));
  ASSERT_TRUE(recovery_.resumed);
  EXPECT_EQ(recovery_.identity.agent_id, "web-1");
  EXPECT_EQ(recovery_.identity.graph_id, 0xabcu);
  EXPECT_EQ(recovery_.last_sequence, Spool::kSequenceBlock);
  EXPECT_EQ(recovery_.batches, 2u);
  EXPECT_EQ(recovery_.samples, 14u);
  EXPECT_EQ(recovery_.corrupt_records, 0u);
  ASSERT_EQ(restored_.size(), 2u);
  EXPECT_EQ(restored_[1].first_edge(), 1u);
  ASSERT_EQ(spool->size(), 2u);
  auto b = spool->Read(0);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->SerializeAsString(), Batch(3, 2, 7).SerializeAsString());
  // It goes on where it was: more graph, more batches, and another restart.
  ASSERT_TRUE(spool->AppendGraph(Delta(4, 2)).ok());
  ASSERT_TRUE(spool->Append(Batch(5, 3, 1)).ok());
  spool.reset();
  spool = Open(Options(), Fresh("web-1", 0x123));
  ASSERT_TRUE(recovery_.resumed);
  EXPECT_EQ(recovery_.identity.graph_id, 0xabcu);
  EXPECT_EQ(restored_.size(), 3u);
  EXPECT_EQ(spool->size(), 3u);
}

TEST_F(SpoolTest, NothingOwedStartsOverAsTheFreshIdentity) {
  {
    auto spool = Open(Options(), Fresh("web-1", 1));
    ASSERT_TRUE(spool->AppendGraph(Delta(2, 0)).ok());
    ASSERT_TRUE(spool->Append(Batch(1, 1, 5)).ok());
    spool->AckThrough(1);
    EXPECT_EQ(Segments("web-1").size(), 1u);  // the segment taking appends stays
  }
  auto spool = Open(Options(), Fresh("web-1", 2));
  EXPECT_FALSE(recovery_.resumed);
  EXPECT_EQ(recovery_.identity.graph_id, 2u);
  EXPECT_TRUE(restored_.empty());
  EXPECT_TRUE(spool->empty());
}

TEST_F(SpoolTest, ASpoolTheServerKeepsUpWithAppendsToOneSegment) {
  SpoolOptions options = Options();
  options.segment_bytes = 300;
  auto spool = Open(options, Fresh("web-1", 1));
  ASSERT_TRUE(spool->Append(Batch(1, 0, 5)).ok());
  const std::vector<std::string> first = Segments("web-1");
  ASSERT_EQ(first.size(), 1u);
  spool->AckThrough(1);
  ASSERT_TRUE(spool->Append(Batch(2, 0, 5)).ok());
  EXPECT_EQ(Segments("web-1"), first);  // no file per batch
  // Past segment_bytes a new segment takes the appends; the old one goes once acknowledged.
  uint64_t sequence = 2;
  while (Segments("web-1").size() == 1) ASSERT_TRUE(spool->Append(Batch(++sequence, 0, 5)).ok());
  spool->AckThrough(sequence);
  const std::vector<std::string> now = Segments("web-1");
  ASSERT_EQ(now.size(), 1u);
  EXPECT_NE(now, first);
  EXPECT_TRUE(spool->empty());
}

TEST_F(SpoolTest, WritesAreSyncedOnlyWhileUnacknowledgedPastTheDelay) {
  SpoolOptions options = Options();
  options.sync_delay = absl::Seconds(1);
  {
    auto spool = Open(options, Fresh("web-1", 1));
    EXPECT_EQ(spool->sync_due(), absl::InfiniteFuture());
    const absl::Time before = absl::Now();
    ASSERT_TRUE(spool->AppendGraph(Delta(2, 0)).ok());
    ASSERT_TRUE(spool->Append(Batch(1, 1, 5)).ok());
    EXPECT_GE(spool->sync_due(), before + absl::Seconds(1));
    EXPECT_LE(spool->sync_due(), absl::Now() + absl::Seconds(1));
    // Acknowledged: the server keeps it, nothing waits for the disk.
    spool->AckThrough(1);
    EXPECT_EQ(spool->sync_due(), absl::InfiniteFuture());
    ASSERT_TRUE(spool->Append(Batch(2, 1, 7)).ok());
    const absl::Time due = spool->sync_due();
    ASSERT_NE(due, absl::InfiniteFuture());
    ASSERT_TRUE(spool->SyncIfDue(due - absl::Milliseconds(1)).ok());
    EXPECT_EQ(spool->sync_due(), due);  // not yet
    ASSERT_TRUE(spool->SyncIfDue(due).ok());
    EXPECT_EQ(spool->sync_due(), absl::InfiniteFuture());
    ASSERT_TRUE(spool->Append(Batch(3, 1, 9)).ok());  // left to the destructor's sync
  }
  auto spool = Open(options, Fresh("web-1", 2));
  ASSERT_TRUE(recovery_.resumed);
  EXPECT_EQ(recovery_.batches, 2u);
  EXPECT_EQ(recovery_.samples, 16u);
  EXPECT_EQ(restored_.size(), 1u);
}

// The acknowledgement of a batch read only after the next one was written (a shipper that
// reads them when the next batch goes) leaves the next one its own delay: the spool does not
// sync a batch that was written a moment ago.
TEST_F(SpoolTest, AnAcknowledgementReadLateLeavesTheNewerBatchItsOwnDelay) {
  SpoolOptions options = Options();
  options.sync_delay = absl::Seconds(1);
  auto spool = Open(options, Fresh("web-1", 1));
  ASSERT_TRUE(spool->Append(Batch(1, 0, 5)).ok());
  const absl::Time first_due = spool->sync_due();
  absl::SleepFor(absl::Milliseconds(20));  // the next interval
  const absl::Time second_written = absl::Now();
  ASSERT_TRUE(spool->Append(Batch(2, 0, 5)).ok());
  EXPECT_EQ(spool->sync_due(), first_due);  // the oldest unacknowledged write counts
  spool->AckThrough(1);
  EXPECT_GE(spool->sync_due(), second_written + absl::Seconds(1));
  ASSERT_TRUE(spool->SyncIfDue(first_due).ok());
  EXPECT_NE(spool->sync_due(), absl::InfiniteFuture());  // nothing was due
  // Once synced, a later acknowledgement leaves nothing due.
  ASSERT_TRUE(spool->SyncIfDue(spool->sync_due()).ok());
  EXPECT_EQ(spool->sync_due(), absl::InfiniteFuture());
  ASSERT_TRUE(spool->Append(Batch(3, 0, 5)).ok());
  const absl::Time third_due = spool->sync_due();
  spool->AckThrough(2);
  EXPECT_EQ(spool->sync_due(), third_due);
  spool->AckThrough(3);
  EXPECT_EQ(spool->sync_due(), absl::InfiniteFuture());
}

TEST_F(SpoolTest, ATornTailIsSkippedAndCounted) {
  {
    auto spool = Open(Options(), Fresh("a", 1));
    for (uint64_t s = 1; s <= 3; ++s) ASSERT_TRUE(spool->Append(Batch(s, 0, 1)).ok());
  }
  // A crash in the middle of writing the third record.
  const auto segments = Segments("a");
  ASSERT_EQ(segments.size(), 1u);
  fs::resize_file(segments[0], fs::file_size(segments[0]) - 5);
  {
    auto spool = Open(Options(), Fresh("a", 2));
    ASSERT_TRUE(recovery_.resumed);
    EXPECT_EQ(recovery_.batches, 2u);
    EXPECT_EQ(recovery_.corrupt_records, 1u);
    EXPECT_EQ(recovery_.last_sequence, Spool::kSequenceBlock);
    ASSERT_TRUE(spool->Append(Batch(3, 0, 1)).ok());  // the next run's new batches
  }
  auto spool = Open(Options(), Fresh("a", 3));
  EXPECT_EQ(recovery_.batches, 3u);
  EXPECT_EQ(recovery_.corrupt_records, 1u);  // still there, still skipped
}

// What a kill -9 leaves: the files as they are now, copied while `id`'s spool is open.
// Returns the options that open the copy.
SpoolOptions CrashCopy(const SpoolOptions& options, const std::string& id,
                       const std::string& to) {
  fs::create_directories(to + "/given");
  fs::copy(options.dir + "/given/" + id, to + "/given/" + id, fs::copy_options::recursive);
  SpoolOptions copy = options;
  copy.dir = to;
  return copy;
}

// An acknowledgement costs no write of its own: it goes into the segment with the next
// batch. A kill -9 before that resends what it covered (the server applies each batch once).
TEST_F(SpoolTest, AnAcknowledgementGoesToDiskWithTheNextBatch) {
  auto spool = Open(Options(), Fresh("a", 1));
  for (uint64_t s = 1; s <= 3; ++s) ASSERT_TRUE(spool->Append(Batch(s, 0, 1)).ok());
  spool->AckThrough(2);
  EXPECT_FALSE(fs::exists(dir_.path() + "/given/a/acked"));
  {
    auto copy = Open(CrashCopy(Options(), "a", dir_.path() + "/crash-1"), Fresh("a", 2));
    EXPECT_EQ(recovery_.batches, 3u);
  }
  ASSERT_TRUE(spool->Append(Batch(4, 0, 1)).ok());
  EXPECT_FALSE(fs::exists(dir_.path() + "/given/a/acked"));
  const SpoolOptions crashed = CrashCopy(Options(), "a", dir_.path() + "/crash-2");
  {
    auto copy = Open(crashed, Fresh("a", 3));
    EXPECT_EQ(recovery_.batches, 2u);
    EXPECT_EQ(recovery_.corrupt_records, 0u);
    ASSERT_EQ(copy->size(), 2u);
    EXPECT_EQ(copy->entry(0).sequence, 3u);
    copy->AckThrough(3);
  }
  // Closed with an acknowledgement no batch carried: the acked file has it.
  auto copy = Open(crashed, Fresh("a", 4));
  ASSERT_EQ(copy->size(), 1u);
  EXPECT_EQ(copy->entry(0).sequence, 4u);
}

// An acknowledgement written into a later segment covers the batches of earlier ones.
TEST_F(SpoolTest, AnAcknowledgementInALaterSegmentCoversEarlierOnes) {
  SpoolOptions o = Options();
  o.segment_bytes = 50;  // two of these batches a segment
  auto spool = Open(o, Fresh("a", 1));
  for (uint64_t s = 1; s <= 4; ++s) ASSERT_TRUE(spool->Append(Batch(s, 0, 1)).ok());
  ASSERT_EQ(Segments("a").size(), 2u);
  spool->AckThrough(3);  // the first segment goes; the second keeps batch 4
  ASSERT_TRUE(spool->Append(Batch(5, 0, 1)).ok());
  ASSERT_EQ(Segments("a").size(), 2u);  // batches 3-4, then the acknowledgement and 5
  const SpoolOptions crashed = CrashCopy(o, "a", dir_.path() + "/crash");
  auto copy = Open(crashed, Fresh("a", 2));
  EXPECT_EQ(recovery_.batches, 2u);
  EXPECT_EQ(recovery_.corrupt_records, 0u);
  ASSERT_EQ(copy->size(), 2u);
  EXPECT_EQ(copy->entry(0).sequence, 4u);
  // Kept in the acked file too, so that rewriting or dropping segments cannot lose it.
  EXPECT_TRUE(fs::exists(crashed.dir + "/given/a/acked"));
}

// A damaged acknowledgement file longer than its record is rewritten whole: the next
// acknowledgement holds across a restart (found by the spool fuzzer).
TEST_F(SpoolTest, AnAcknowledgementReplacesADamagedAckedFile) {
  {
    auto spool = Open(Options(), Fresh("a", 1));
    for (uint64_t s = 1; s <= 3; ++s) ASSERT_TRUE(spool->Append(Batch(s, 0, 1)).ok());
  }
  {
    std::ofstream acked(dir_.path() + "/given/a/acked", std::ios::binary | std::ios::trunc);
    acked << std::string(72, 'x');
  }
  {
    auto spool = Open(Options(), Fresh("a", 2));
    ASSERT_EQ(spool->size(), 3u);
    spool->AckThrough(2);
  }
  auto spool = Open(Options(), Fresh("a", 3));
  ASSERT_EQ(spool->size(), 1u);
  EXPECT_EQ(spool->entry(0).sequence, 3u);
}

TEST_F(SpoolTest, AFlippedByteFailsItsChecksum) {
  {
    auto spool = Open(Options(), Fresh("a", 1));
    for (uint64_t s = 1; s <= 3; ++s) ASSERT_TRUE(spool->Append(Batch(s, 0, 1)).ok());
  }
  const auto segments = Segments("a");
  std::fstream f(segments[0], std::ios::in | std::ios::out | std::ios::binary);
  const auto size = fs::file_size(segments[0]);
  f.seekp(static_cast<std::streamoff>(size - 3));  // inside the last record's payload
  f.put('\x5a');
  f.close();
  auto spool = Open(Options(), Fresh("a", 2));
  EXPECT_EQ(recovery_.batches, 2u);
  EXPECT_EQ(recovery_.corrupt_records, 1u);
}

// A graph cut short is behind what the server may have been sent: resumed, the agent would
// number new functions and edges as the server knows others, and the server would decode its
// batches into stacks that never ran. The batches go, counted, and a new graph starts.
// A record failing its checksum in the middle of a segment costs that batch only: the ones
// after it were given up with it, and the next run numbered its batches as theirs.
TEST_F(SpoolTest, ACorruptRecordCostsOnlyItsOwnBatch) {
  std::vector<uint64_t> ends;
  {
    auto spool = Open(Options(), Fresh("a", 1));
    for (uint64_t s = 1; s <= 4; ++s) {
      ASSERT_TRUE(spool->Append(Batch(s, 0, 1)).ok());
      ends.push_back(fs::file_size(Segments("a")[0]));
    }
  }
  const auto segments = Segments("a");
  ASSERT_EQ(segments.size(), 1u);
  std::fstream f(segments[0], std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(static_cast<std::streamoff>(ends[1] - 3));  // inside batch 2's payload
  f.put('\x5a');
  f.close();
  auto spool = Open(Options(), Fresh("a", 2));
  ASSERT_TRUE(recovery_.resumed);
  EXPECT_EQ(recovery_.batches, 3u);
  EXPECT_EQ(recovery_.corrupt_records, 1u);
  EXPECT_EQ(recovery_.last_sequence, Spool::kSequenceBlock);
  ASSERT_EQ(spool->size(), 3u);
  EXPECT_EQ(spool->entry(1).sequence, 3u);
  EXPECT_EQ(spool->entry(2).sequence, 4u);
}

// What a power loss leaves: the records the kernel had not written yet are gone, though the
// server may have applied (and acknowledged) their batches. A restart numbers on above every
// batch ever numbered: the server drops a batch numbered as one it applied.
TEST_F(SpoolTest, SequenceNumbersTheDiskLostAreNotUsedAgain) {
  std::vector<uintmax_t> ends;
  {
    auto spool = Open(Options(), Fresh("a", 1));
    for (uint64_t s = 1; s <= 3; ++s) {
      ASSERT_TRUE(spool->Append(Batch(s, 0, 1)).ok());
      ends.push_back(fs::file_size(Segments("a")[0]));
    }
  }
  fs::resize_file(Segments("a")[0], ends[0]);  // batches 2 and 3 lost, at a record's end
  uint64_t next = 0;
  {
    auto spool = Open(Options(), Fresh("a", 2));
    ASSERT_TRUE(recovery_.resumed);
    EXPECT_EQ(recovery_.batches, 1u);
    EXPECT_EQ(recovery_.corrupt_records, 0u);
    EXPECT_GE(recovery_.last_sequence, 3u);
    next = recovery_.last_sequence + 1;
    ASSERT_TRUE(spool->Append(Batch(next, 0, 1)).ok());  // past the block: another reserved
  }
  // That run's batch is lost too: its number was reserved before the batch was written.
  const auto segments = Segments("a");
  ASSERT_EQ(segments.size(), 2u);
  fs::resize_file(segments[1], sizeof records::kMagic);
  auto spool = Open(Options(), Fresh("a", 3));
  ASSERT_TRUE(recovery_.resumed);
  EXPECT_EQ(recovery_.batches, 1u);
  EXPECT_GE(recovery_.last_sequence, next);
}

// Acknowledged in time, batches are never synced; the graph is, before the server is sent it
// (the shipper calls SyncGraph), or after a power loss a restart would number new nodes and
// edges as the server knows others.
TEST_F(SpoolTest, TheGraphIsSyncedWhenAskedThoughNoBatchWaits) {
  SpoolOptions options = Options();
  options.sync_delay = absl::Hours(1);
  auto spool = Open(options, Fresh("a", 1));
  ASSERT_TRUE(spool->AppendGraph(Delta(2, 0)).ok());
  ASSERT_TRUE(spool->Append(Batch(1, 1, 1)).ok());
  spool->AckThrough(1);  // nothing owed: no batch asks for a sync
  ASSERT_TRUE(spool->SyncIfDue(absl::Now() + absl::Hours(2)).ok());
  EXPECT_EQ(spool->stats().graph_syncs, 0u);
  ASSERT_TRUE(spool->SyncGraph().ok());
  EXPECT_EQ(spool->stats().graph_syncs, 1u);
  ASSERT_TRUE(spool->SyncGraph().ok());  // nothing new: no second sync
  EXPECT_EQ(spool->stats().graph_syncs, 1u);
}

TEST_F(SpoolTest, AGraphCutShortStartsANewIncarnation) {
  {
    auto spool = Open(Options(), Fresh("a", 1));
    ASSERT_TRUE(spool->AppendGraph(Delta(2, 0)).ok());
    ASSERT_TRUE(spool->Append(Batch(1, 1, 1)).ok());
    ASSERT_TRUE(spool->AppendGraph(Delta(3, 1)).ok());
    ASSERT_TRUE(spool->Append(Batch(2, 2, 1)).ok());
  }
  const std::string graph = dir_.path() + "/given/a/graph.log";
  fs::resize_file(graph, fs::file_size(graph) - 2);
  auto spool = Open(Options(), Fresh("a", 2));
  EXPECT_FALSE(recovery_.resumed);
  EXPECT_EQ(recovery_.identity.graph_id, 2u);
  EXPECT_EQ(recovery_.batches, 0u);
  EXPECT_EQ(recovery_.orphaned_batches, 2u);
  EXPECT_EQ(recovery_.corrupt_records, 1u);
  EXPECT_EQ(recovery_.last_sequence, Spool::kSequenceBlock);  // numbered on, not from 1
  EXPECT_EQ(spool->size(), 0u);
  // The new incarnation's graph and batches resume as usual.
  ASSERT_TRUE(spool->AppendGraph(Delta(2, 0)).ok());
  ASSERT_TRUE(spool->Append(Batch(3, 1, 1)).ok());
  spool.reset();
  restored_.clear();
  spool = Open(Options(), Fresh("a", 3));
  EXPECT_TRUE(recovery_.resumed);
  EXPECT_EQ(recovery_.identity.graph_id, 2u);
  EXPECT_EQ(restored_.size(), 1u);
  EXPECT_EQ(recovery_.batches, 1u);
  EXPECT_EQ(recovery_.corrupt_records, 0u);
}

// A delta the agent cannot restore cuts the graph short too.
TEST_F(SpoolTest, AGraphTheAgentRefusesStartsANewIncarnation) {
  {
    auto spool = Open(Options(), Fresh("a", 1));
    ASSERT_TRUE(spool->AppendGraph(Delta(2, 0)).ok());
    ASSERT_TRUE(spool->AppendGraph(Delta(3, 1)).ok());
    ASSERT_TRUE(spool->Append(Batch(1, 1, 1)).ok());
    ASSERT_TRUE(spool->Append(Batch(2, 2, 1)).ok());
  }
  restore_fails_at_ = 1;
  auto spool = Open(Options(), Fresh("a", 2));
  EXPECT_FALSE(recovery_.resumed);
  EXPECT_EQ(recovery_.batches, 0u);
  EXPECT_EQ(recovery_.orphaned_batches, 2u);
}

// A graph the disk would not take, sent on from memory: the log is emptied, so that a restart
// starts over rather than resume a graph behind the server's.
TEST_F(SpoolTest, AnAbandonedGraphStartsANewIncarnationAtTheRestart) {
  {
    auto spool = Open(Options(), Fresh("a", 1));
    ASSERT_TRUE(spool->AppendGraph(Delta(2, 0)).ok());
    ASSERT_TRUE(spool->Append(Batch(1, 1, 1)).ok());
    EXPECT_TRUE(spool->graph_durable());
    spool->AbandonGraph();
    EXPECT_FALSE(spool->graph_durable());
    EXPECT_FALSE(spool->AppendGraph(Delta(3, 1)).ok());
    ASSERT_TRUE(spool->Append(Batch(2, 2, 1)).ok());  // spooled for this run's reconnects
    EXPECT_EQ(spool->size(), 2u);
    EXPECT_EQ(spool->ResumableBatches(), 0u);
  }
  auto spool = Open(Options(), Fresh("a", 2));
  EXPECT_FALSE(recovery_.resumed);
  EXPECT_EQ(recovery_.identity.graph_id, 2u);
  EXPECT_EQ(recovery_.orphaned_batches, 2u);
  EXPECT_TRUE(spool->graph_durable());
}

// Batches that need graph the server refuses (past its limits) are dropped, counted, so that
// the agent's restart starts a new graph rather than resume that one for good.
TEST_F(SpoolTest, DroppedBatchesLeaveNothingForARestart) {
  {
    auto spool = Open(Options(), Fresh("a", 1));
    ASSERT_TRUE(spool->AppendGraph(Delta(2, 0)).ok());
    for (uint64_t s = 1; s <= 2; ++s) ASSERT_TRUE(spool->Append(Batch(s, 1, 5)).ok());
    spool->DropAll();
    EXPECT_TRUE(spool->empty());
    EXPECT_EQ(spool->stats().batches_dropped, 2u);
    EXPECT_EQ(spool->stats().samples_dropped, 10u);
  }
  auto spool = Open(Options(), Fresh("a", 2));
  EXPECT_FALSE(recovery_.resumed);
  EXPECT_EQ(recovery_.identity.graph_id, 2u);
  EXPECT_EQ(recovery_.orphaned_batches, 0u);
}

TEST_F(SpoolTest, OneRunningAgentPerIdentity) {
  auto first = Open(Options(), Fresh("a", 1));
  SpoolRecovery recovery;
  auto second = Spool::Open(
      Options(), Fresh("a", 2),
      [](const SpoolIdentity&, const v1::GraphDelta&) { return absl::OkStatus(); }, &recovery);
  ASSERT_FALSE(second.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(second.status())) << second.status();
  EXPECT_NE(second.status().message().find("--agent-id"), std::string::npos);
}

TEST_F(SpoolTest, AnAgentWithoutAnIdAdoptsAnAbandonedGeneratedOne) {
  SpoolOptions o = Options();
  o.adopt = true;
  {
    auto spool = Open(o, Fresh("host-1111", 1));
    ASSERT_TRUE(spool->Append(Batch(1, 0, 3)).ok());
  }
  {
    // A given identity's batches are not adopted.
    auto given = Open(Options(), Fresh("web-1", 5));
    ASSERT_TRUE(given->Append(Batch(1, 0, 3)).ok());
  }
  auto running = Open(o, Fresh("host-2222", 2));  // adopts host-1111
  ASSERT_TRUE(recovery_.resumed);
  EXPECT_EQ(recovery_.identity.agent_id, "host-1111");
  EXPECT_EQ(recovery_.identity.graph_id, 1u);
  // While it runs, a second agent cannot adopt the same one: it starts as itself.
  auto other = Open(o, Fresh("host-3333", 3));
  EXPECT_FALSE(recovery_.resumed);
  EXPECT_EQ(recovery_.identity.agent_id, "host-3333");
}

TEST_F(SpoolTest, PastItsBoundTheOldestSegmentsGo) {
  SpoolOptions o = Options();
  o.segment_bytes = 1000;
  o.max_bytes = 5000;
  auto spool = Open(o, Fresh("a", 1));
  for (uint64_t s = 1; s <= 200; ++s) ASSERT_TRUE(spool->Append(Batch(s, 0, 2)).ok());
  const SpoolStats stats = spool->stats();
  EXPECT_LE(stats.bytes, o.max_bytes);
  EXPECT_GT(stats.batches_dropped, 0u);
  EXPECT_EQ(stats.batches_dropped + stats.batches, 200u);
  EXPECT_EQ(stats.samples_dropped, 2 * stats.batches_dropped);
  EXPECT_EQ(spool->entry(spool->size() - 1).sequence, 200u);
  // What is left is what a restart finds.
  spool.reset();
  spool = Open(o, Fresh("a", 2));
  EXPECT_EQ(recovery_.batches, stats.batches);
}

TEST_F(SpoolTest, ABatchTheDiskRefusesIsKeptInMemory) {
  auto spool = Open(Options(), Fresh("a", 1));
  ASSERT_TRUE(spool->Append(Batch(1, 0, 1)).ok());
  // The process may not grow files: writes fail with EFBIG (SIGXFSZ ignored).
  struct sigaction ignore = {}, old_action;
  ignore.sa_handler = SIG_IGN;
  sigaction(SIGXFSZ, &ignore, &old_action);
  rlimit old_limit;
  getrlimit(RLIMIT_FSIZE, &old_limit);
  rlimit limit = old_limit;
  limit.rlim_cur = 16;
  setrlimit(RLIMIT_FSIZE, &limit);
  absl::Status st = spool->Append(Batch(2, 0, 1));
  setrlimit(RLIMIT_FSIZE, &old_limit);
  sigaction(SIGXFSZ, &old_action, nullptr);
  EXPECT_FALSE(st.ok());
  EXPECT_EQ(spool->stats().write_errors, 1u);
  ASSERT_EQ(spool->size(), 2u);
  EXPECT_EQ(spool->ResumableBatches(), 1u);  // a restart would not find the second
  auto b = spool->Read(1);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->sequence(), 2u);
  // The segment holds whole records only: a restart finds batch 1 and nothing torn.
  spool.reset();
  spool = Open(Options(), Fresh("a", 2));
  EXPECT_EQ(recovery_.batches, 1u);
  EXPECT_EQ(recovery_.corrupt_records, 0u);
}

}  // namespace
}  // namespace strata::agent::spool
