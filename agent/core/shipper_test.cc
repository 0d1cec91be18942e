// The shipper against a real gRPC ingest server on loopback (a scripted stand-in for
// strata-server's Ingest service): batches go out in sequence order and leave the spool when
// acknowledged, refused batches are resent, and batches spooled while the server is away go
// out after it comes back. With a list of servers, a dead one is passed over and a stream that
// ends moves to the next; a cluster node's Redirect moves every batch to the owners it names,
// and redirects that loop back off. Batches that come often cost the shipper one wake-up each.
#include "agent/core/shipper.h"

#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "agent/core/context_graph.h"
#include "agent/spool/spool.h"
#include "common/testing/temp_dir.h"
#include "common/testing/emulation.h"
#include "common/testing/wait_for.h"
#include "gtest/gtest.h"
#include "strata/v1/ingest.grpc.pb.h"

namespace strata::agent {
namespace {

// Applies batches in sequence order like strata-server: the next one is applied and
// acknowledged, one already applied is acknowledged again, one past a gap is refused as
// FAILED_PRECONDITION (resend). What it applied survives a restart (the store's record).
// Like a cluster node that does not own the agent's host, it can answer with a Redirect and
// end the stream.
class FakeIngest final : public v1::Ingest::Service {
 public:
  grpc::Status Connect(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<v1::ServerMessage, v1::AgentMessage>* stream) override {
    v1::AgentMessage hello;
    if (!stream->Read(&hello) || !hello.has_hello()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "no hello");
    }
    v1::ServerMessage welcome;
    {
      absl::MutexLock lock(&mu_);
      agent_id_ = hello.hello().agent_id();
      if (redirect_at_ == 0 && !redirect_to_.empty()) {
        ++redirects_;
        *welcome.mutable_redirect() = RedirectMessage();
      } else {
        ++connects_;
        welcome.mutable_welcome()->set_last_applied_sequence(applied_.empty() ? 0
                                                                           : applied_.back());
        welcome.mutable_welcome()->set_max_graph_edges(max_graph_edges_);
        welcome.mutable_welcome()->set_known_nodes(known_nodes_);
      }
    }
    // A Redirect ends the stream.
    if (!stream->Write(welcome) || welcome.has_redirect()) return grpc::Status::OK;
    v1::AgentMessage m;
    while (stream->Read(&m)) {
      if (m.has_heartbeat()) {
        absl::MutexLock lock(&mu_);
        kinds_ += 'H';
      }
      if (m.has_graph_delta()) {
        absl::MutexLock lock(&mu_);
        const v1::GraphDelta& d = m.graph_delta();
        graph_nodes_ = std::max<uint32_t>(graph_nodes_, d.first_node() + d.nodes_size());
      }
      if (!m.has_sample_batch()) continue;
      const uint64_t sequence = m.sample_batch().sequence();
      v1::ServerMessage reply;
      bool end_stream = false;
      {
        absl::MutexLock lock(&mu_);
        received_.push_back(sequence);
        kinds_ += 'B';
        const uint64_t last = applied_.empty() ? 0 : applied_.back();
        if (redirect_at_ == sequence && !redirect_to_.empty()) {
          ++redirects_;
          *reply.mutable_redirect() = RedirectMessage();
          end_stream = true;
        } else if (refuse_ != nullptr && refuse_->sequence == sequence && refuse_->times > 0) {
          --refuse_->times;
          v1::IngestError* error = reply.mutable_error();
          error->set_sequence(sequence);
          error->set_code(static_cast<int>(refuse_->code));
          error->set_message("refused by the test");
          error->set_fatal(refuse_->fatal);
          error->set_retry_after_ms(refuse_->retry_after_ms);
          end_stream = refuse_->fatal;
        } else if (sequence == last + 1 || sequence <= last) {
          if (sequence == last + 1) applied_.push_back(sequence);
          reply.mutable_ack()->set_sequence(sequence);
        } else {
          v1::IngestError* error = reply.mutable_error();
          error->set_sequence(sequence);
          error->set_code(static_cast<int>(grpc::StatusCode::FAILED_PRECONDITION));
          error->set_message("waits for an earlier batch");
        }
      }
      if (!stream->Write(reply)) break;
      if (end_stream && reply.has_redirect()) {
        return grpc::Status(grpc::StatusCode::UNAVAILABLE, "not an owner of the host");
      }
      if (end_stream) return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "refused");
    }
    (void)context;
    return grpc::Status::OK;
  }

  struct Refusal {
    uint64_t sequence;
    grpc::StatusCode code;
    bool fatal;
    uint32_t retry_after_ms;
    int times;
  };
  void Refuse(Refusal refusal) {
    absl::MutexLock lock(&mu_);
    refusal_storage_ = refusal;
    refuse_ = &refusal_storage_;
  }

  // Answers the Hello (at_sequence 0) or the batch `at_sequence` with a Redirect to
  // `servers`, and ends the stream; an empty list stops redirecting.
  void RedirectTo(std::vector<std::string> servers, uint64_t at_sequence = 0) {
    absl::MutexLock lock(&mu_);
    redirect_to_ = std::move(servers);
    redirect_at_ = at_sequence;
  }

  std::vector<uint64_t> applied() const {
    absl::MutexLock lock(&mu_);
    return applied_;
  }
  std::vector<uint64_t> received() const {
    absl::MutexLock lock(&mu_);
    return received_;
  }
  // What the Welcome says the server holds of the agent's graph (as if a node had been told
  // `nodes` by this incarnation before) and has applied (`sequence` and those before it).
  void PretendKnown(uint32_t nodes, uint64_t sequence) {
    absl::MutexLock lock(&mu_);
    known_nodes_ = nodes;
    for (uint64_t s = applied_.empty() ? 1 : applied_.back() + 1; s <= sequence; ++s) {
      applied_.push_back(s);
    }
  }
  // The graph limit the Welcome names (0: none, as from an older server).
  void SetMaxGraphEdges(uint64_t edges) {
    absl::MutexLock lock(&mu_);
    max_graph_edges_ = edges;
  }
  uint32_t graph_nodes() const {
    absl::MutexLock lock(&mu_);
    return graph_nodes_;
  }
  int connects() const {
    absl::MutexLock lock(&mu_);
    return connects_;
  }
  // What the streams carried, in order: B a batch, H a heartbeat.
  std::string kinds() const {
    absl::MutexLock lock(&mu_);
    return kinds_;
  }
  std::string agent_id() const {
    absl::MutexLock lock(&mu_);
    return agent_id_;
  }
  int redirects() const {
    absl::MutexLock lock(&mu_);
    return redirects_;
  }

 private:
  v1::Redirect RedirectMessage() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    v1::Redirect r;
    for (const std::string& s : redirect_to_) r.add_servers(s);
    r.set_reason("the test's ring gives the host to other nodes");
    return r;
  }

  mutable absl::Mutex mu_;
  std::vector<uint64_t> applied_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> received_ ABSL_GUARDED_BY(mu_);
  std::string kinds_ ABSL_GUARDED_BY(mu_);
  uint32_t graph_nodes_ ABSL_GUARDED_BY(mu_) = 0;  // nodes sent in graph deltas
  uint32_t known_nodes_ ABSL_GUARDED_BY(mu_) = 0;  // PretendKnown()
  int connects_ ABSL_GUARDED_BY(mu_) = 0;  // Welcomes sent
  uint64_t max_graph_edges_ ABSL_GUARDED_BY(mu_) = 0;
  int redirects_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::string> redirect_to_ ABSL_GUARDED_BY(mu_);
  uint64_t redirect_at_ ABSL_GUARDED_BY(mu_) = 0;
  std::string agent_id_ ABSL_GUARDED_BY(mu_);
  Refusal refusal_storage_ ABSL_GUARDED_BY(mu_){};
  Refusal* refuse_ ABSL_GUARDED_BY(mu_) = nullptr;
};

// A gRPC server for `service` at `address`.
std::unique_ptr<grpc::Server> Serve(FakeIngest* service, const std::string& address) {
  grpc::ServerBuilder builder;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials());
  builder.RegisterService(service);
  return builder.BuildAndStart();
}

std::vector<uint64_t> Range(uint64_t first, uint64_t last) {
  std::vector<uint64_t> out;
  for (uint64_t s = first; s <= last; ++s) out.push_back(s);
  return out;
}

class ShipperTest : public ::testing::Test {
 protected:
  void SetUp() override {
    spool::SpoolIdentity identity{"shipper-test", "test-host", 0x5eed};
    spool::SpoolRecovery recovery;
    auto opened = spool::Spool::Open(
        spool::SpoolOptions{}, identity,
        [](const spool::SpoolIdentity&, const v1::GraphDelta&) { return absl::OkStatus(); },
        &recovery);
    ASSERT_TRUE(opened.ok()) << opened.status();
    spool_ = std::move(*opened);
  }

  void TearDown() override {
    if (shipper_ != nullptr) shipper_->Stop();
    if (server_ != nullptr) StopServer();
    if (server2_ != nullptr) {
      server2_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
      server2_->Wait();
    }
  }

  // The ingest server at address_. A Unix socket of the test's own: a restarted server gets
  // the same address back, which a TCP port freed in between might not be.
  void StartServer() {
    server_ = Serve(&ingest_, address_);
    ASSERT_NE(server_, nullptr);
  }
  void StopServer() {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
    server_->Wait();
    server_.reset();
  }

  // A second node, ingest2_ at address2_.
  void StartSecondServer() {
    server2_ = Serve(&ingest2_, address2_);
    ASSERT_NE(server2_, nullptr);
  }

  // A spool in `dir` in place of the in-memory one (no sync for the batches' sake within an
  // hour).
  void SpoolOnDisk(const std::string& dir) {
    spool::SpoolOptions options;
    options.dir = dir;
    options.sync_delay = absl::Hours(1);
    spool::SpoolRecovery recovery;
    auto opened = spool::Spool::Open(
        options, {"shipper-test", "test-host", 0x5eed},
        [](const spool::SpoolIdentity&, const v1::GraphDelta&) { return absl::OkStatus(); },
        &recovery);
    ASSERT_TRUE(opened.ok()) << opened.status();
    spool_ = std::move(*opened);
  }

  // The shipper with `servers` (default: address_).
  void StartShipper(std::vector<std::string> servers = {},
                    absl::Duration heartbeat = absl::Seconds(10)) {
    ShipperOptions options;
    options.heartbeat = heartbeat;
    options.servers = servers.empty() ? std::vector<std::string>{address_} : std::move(servers);
    options.agent_id = "shipper-test";
    options.host = "test-host";
    options.arch = "x86_64";
    options.max_backoff = absl::Seconds(1);
    shipper_ = std::make_unique<Shipper>(std::move(options), &graph_, spool_.get());
    shipper_->Start();
  }

  static v1::SampleBatch Batch(uint64_t sequence) {
    v1::SampleBatch batch;
    batch.set_sequence(sequence);
    batch.set_start_ms(static_cast<int64_t>(sequence) * 1000);
    batch.set_end_ms(static_cast<int64_t>(sequence + 1) * 1000);
    return batch;
  }

  void Enqueue(uint64_t first, uint64_t last) {
    for (uint64_t s = first; s <= last; ++s) shipper_->Enqueue(Batch(s));
  }

  static std::string SocketAddress(const std::string& suffix) {
    return absl::StrCat("unix:", ::testing::TempDir(), "shipper_test_", getpid(), "_",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name(), suffix,
                        ".sock");
  }

  ContextGraph graph_{0x5eed};
  std::unique_ptr<spool::Spool> spool_;
  FakeIngest ingest_;  // keeps what it applied across server restarts, like the store
  FakeIngest ingest2_;
  const std::string address_ = SocketAddress("");
  const std::string address2_ = SocketAddress("_2");
  const std::string dead_address_ = SocketAddress("_dead");  // nothing listens there
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<grpc::Server> server2_;
  std::unique_ptr<Shipper> shipper_;
};

constexpr absl::Duration kFlushTimeout = absl::Seconds(30);

using strata::testing::WaitFor;

TEST_F(ShipperTest, ShipsBatchesInOrderAndForgetsThemOnceAcknowledged) {
  StartServer();
  StartShipper();
  Enqueue(1, 5);
  ASSERT_TRUE(shipper_->Flush(kFlushTimeout));
  EXPECT_EQ(ingest_.applied(), Range(1, 5));
  EXPECT_EQ(ingest_.received(), Range(1, 5));
  EXPECT_EQ(ingest_.agent_id(), "shipper-test");
  EXPECT_TRUE(spool_->empty());
  const ShipperStats stats = shipper_->stats();
  EXPECT_EQ(stats.batches_acked, 5u);
  EXPECT_EQ(stats.connects, 1u);
}

// A new graph is due once the connected server named its limits and the graph passed half of
// them, while the server is caught up; never from a server that names none, or when away.
TEST_F(ShipperTest, ANewGraphIsDueOnlyPastHalfOfTheLimitsTheServerNamed) {
  std::vector<encoding::PathFrame> path;
  for (int i = 0; i < 6; ++i) {
    path.push_back({graph_.NodeFor({absl::StrCat("f", i), "/bin/app", "", 0x100u * i}), 0x10});
  }
  ASSERT_TRUE(graph_.AddPath(path, false).ok());  // 6 edges, the root's included
  StartServer();
  StartShipper();
  ASSERT_TRUE(WaitFor([&] { return shipper_->stats().connected; }, std::chrono::seconds(30)));
  EXPECT_FALSE(shipper_->NewGraphDue());  // no limits named
  StopServer();
  ASSERT_TRUE(WaitFor([&] { return !shipper_->stats().connected; }, std::chrono::seconds(30)));
  ingest_.SetMaxGraphEdges(12);
  StartServer();
  ASSERT_TRUE(WaitFor([&] { return ingest_.connects() == 2; }, std::chrono::seconds(30)));
  ASSERT_TRUE(WaitFor([&] { return shipper_->stats().server_max_graph_edges == 12; },
                      std::chrono::seconds(30)));
  EXPECT_FALSE(shipper_->NewGraphDue());  // 6 of 12: not past half
  path.insert(path.begin(), {graph_.NodeFor({"main", "/bin/app", "", 0x900}), 0x20});
  ASSERT_TRUE(graph_.AddPath(path, false).ok());
  EXPECT_TRUE(shipper_->NewGraphDue());
  // The server away: not due; back, with what was enqueued meanwhile acknowledged: due.
  StopServer();
  ASSERT_TRUE(WaitFor([&] { return !shipper_->stats().connected; }, std::chrono::seconds(30)));
  EXPECT_FALSE(shipper_->NewGraphDue());
  Enqueue(1, 3);
  StartServer();
  ASSERT_TRUE(WaitFor([&] { return ingest_.connects() == 3; }, std::chrono::seconds(30)));
  ASSERT_TRUE(shipper_->Flush(kFlushTimeout));
  EXPECT_TRUE(shipper_->NewGraphDue());
  EXPECT_FALSE(shipper_->GraphPastServerLimits());
  // Past the limit itself the server refuses the graph: the batches behind cannot go, and
  // waiting for them would wait for good. Due at once, away or behind.
  StopServer();
  ASSERT_TRUE(WaitFor([&] { return !shipper_->stats().connected; }, std::chrono::seconds(30)));
  Enqueue(4, 6);
  for (int i = 0; i < 6; ++i) {
    path.push_back({graph_.NodeFor({absl::StrCat("g", i), "/bin/app", "", 0x2000u + i}), 0x10});
  }
  ASSERT_TRUE(graph_.AddPath(path, false).ok());
  ASSERT_GT(graph_.num_edges(), 12u);
  EXPECT_TRUE(shipper_->GraphPastServerLimits());
  EXPECT_TRUE(shipper_->NewGraphDue());
}

// An agent shipping more often than its heartbeat period sends each heartbeat with a batch
// (the writer wakes for no heartbeat of its own); an idle one still sends one a period.
TEST_F(ShipperTest, HeartbeatsGoWithBatchesAndAloneOnlyWhenNoneFlow) {
  StartServer();
  StartShipper({}, absl::Seconds(1));
  const absl::Time start = absl::Now();
  for (uint64_t s = 1; s <= 12; ++s) {
    shipper_->Enqueue(Batch(s));
    absl::SleepFor(absl::Milliseconds(300));
  }
  ASSERT_TRUE(shipper_->Flush(kFlushTimeout));
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  const std::string during = ingest_.kinds();
  const size_t first_batch = during.find('B');
  ASSERT_NE(first_batch, std::string::npos);
  int heartbeats = 0;
  for (size_t i = first_batch; i < during.size(); ++i) {
    if (during[i] != 'H') continue;
    ++heartbeats;
    EXPECT_EQ(during[i - 1], 'B') << "a heartbeat went alone while batches flowed: " << during;
  }
  // Each rides with the first batch after half a period: more than one a second, which
  // heartbeats that each wait a whole period cannot be.
  EXPECT_GT(heartbeats, seconds) << during;
  // Batches stop: heartbeats go on alone.
  EXPECT_TRUE(WaitFor([&] { return ingest_.kinds().size() > during.size(); },
                      std::chrono::seconds(15)));
  EXPECT_EQ(ingest_.kinds().substr(during.size(), 1), "H");
}

TEST_F(ShipperTest, ResendsABatchRefusedAsUnavailable) {
  ingest_.Refuse({.sequence = 2, .code = grpc::StatusCode::UNAVAILABLE, .fatal = false,
                  .retry_after_ms = 0, .times = 1});
  StartServer();
  StartShipper();
  Enqueue(1, 4);
  ASSERT_TRUE(shipper_->Flush(kFlushTimeout));
  EXPECT_EQ(ingest_.applied(), Range(1, 4));
  const std::vector<uint64_t> received = ingest_.received();
  EXPECT_EQ(std::count(received.begin(), received.end(), 2u), 2)
      << ::testing::PrintToString(received);
  EXPECT_EQ(shipper_->stats().batches_rejected, 0u);
  EXPECT_EQ(shipper_->stats().connects, 1u);  // the stream stayed open
}

TEST_F(ShipperTest, ReconnectsAndResendsAfterTheServerEndsTheStreamForResources) {
  ingest_.Refuse({.sequence = 3, .code = grpc::StatusCode::RESOURCE_EXHAUSTED, .fatal = true,
                  .retry_after_ms = 100, .times = 1});
  StartServer();
  StartShipper();
  Enqueue(1, 5);
  ASSERT_TRUE(shipper_->Flush(kFlushTimeout));
  EXPECT_EQ(ingest_.applied(), Range(1, 5));
  EXPECT_GE(ingest_.connects(), 2);
  EXPECT_GE(shipper_->stats().connects, 2u);
  EXPECT_EQ(shipper_->stats().batches_rejected, 0u);
}

TEST_F(ShipperTest, DropsABatchTheServerRejectsPermanently) {
  ingest_.Refuse({.sequence = 2, .code = grpc::StatusCode::INVALID_ARGUMENT, .fatal = false,
                  .retry_after_ms = 0, .times = 1});
  StartServer();
  StartShipper();
  Enqueue(1, 2);
  ASSERT_TRUE(shipper_->Flush(kFlushTimeout));
  EXPECT_EQ(ingest_.applied(), Range(1, 1));
  EXPECT_EQ(shipper_->stats().batches_rejected, 1u);
}

TEST_F(ShipperTest, SpoolsWhileTheServerIsAwayAndDeliversWhenItIsBack) {
  StartShipper();
  Enqueue(1, 3);
  EXPECT_FALSE(shipper_->Flush(absl::Milliseconds(300)));
  EXPECT_EQ(spool_->size(), 3u);
  EXPECT_EQ(shipper_->stats().spool.batches, 3u);
  EXPECT_FALSE(shipper_->stats().connected);

  StartServer();
  ASSERT_TRUE(shipper_->Flush(kFlushTimeout));
  EXPECT_EQ(ingest_.applied(), Range(1, 3));
  EXPECT_TRUE(spool_->empty());
}

TEST_F(ShipperTest, ResumesAfterTheServerRestarts) {
  StartServer();
  StartShipper();
  Enqueue(1, 2);
  ASSERT_TRUE(shipper_->Flush(kFlushTimeout));
  StopServer();

  Enqueue(3, 4);
  StartServer();
  ASSERT_TRUE(shipper_->Flush(kFlushTimeout));
  EXPECT_EQ(ingest_.applied(), Range(1, 4));
  EXPECT_EQ(ingest_.connects(), 2);
  EXPECT_GE(shipper_->stats().connects, 2u);
}

// Batches spooled while the server was away go out in one round, and each gets its
// acknowledgement. With batches coming often the shipper reads what arrived when the next one
// goes; it read one message a round, so the spool stayed as far behind as the backlog had been
// (and never shrank, nor let a new graph start).
TEST_F(ShipperTest, AfterAnOutageBatchesComingOftenAreAcknowledgedAsTheyGo) {
  StartShipper();
  constexpr uint64_t kBacklog = 10;
  for (uint64_t s = 1; s <= kBacklog; ++s) {
    shipper_->Enqueue(Batch(s));
    absl::SleepFor(absl::Milliseconds(50));  // the interval
  }
  StartServer();
  ASSERT_TRUE(WaitFor([&] { return ingest_.applied().size() == kBacklog; }));
  uint64_t sequence = kBacklog;
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (sequence - shipper_->stats().batches_acked > 2 && absl::Now() < deadline) {
    shipper_->Enqueue(Batch(++sequence));
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_LE(sequence - shipper_->stats().batches_acked, 2u)
      << sequence << " batches enqueued, " << spool_->size() << " in the spool";
  ASSERT_TRUE(shipper_->Flush(kFlushTimeout));
  EXPECT_EQ(ingest_.applied(), Range(1, sequence));
}

// The server is sent the graph only as far as the spool recorded it: a restart resumes the
// spool's graph, and nodes the server knew beyond it would be numbered again, as other
// functions, by the resumed agent (its stacks then named wrongly).
TEST_F(ShipperTest, TheServerIsSentOnlyTheGraphTheSpoolRecorded) {
  std::vector<encoding::PathFrame> path;
  for (int i = 0; i < 3; ++i) {
    path.push_back({graph_.NodeFor({absl::StrCat("f", i), "/bin/app", "", 0x100u * i}), 0x10});
  }
  ASSERT_TRUE(graph_.AddPath(path, false).ok());
  StartShipper();
  v1::SampleBatch first = Batch(1);
  first.set_epoch(graph_.num_edges());
  shipper_->Enqueue(first);  // spools the graph so far
  const uint32_t spooled = graph_.num_nodes();
  graph_.NodeFor({"found-later", "/bin/app", "", 0x900});  // not in the spool yet
  StartServer();
  ASSERT_TRUE(WaitFor([&] { return ingest_.applied().size() == 1; }));
  EXPECT_EQ(ingest_.graph_nodes(), spooled);
  v1::SampleBatch second = Batch(2);
  second.set_epoch(graph_.num_edges());
  shipper_->Enqueue(second);
  ASSERT_TRUE(shipper_->Flush(kFlushTimeout));
  EXPECT_EQ(ingest_.graph_nodes(), spooled + 1);
}

// Acknowledged within the spool's sync delay, batches are never synced; the graph they need is,
// before the server is sent it: a restart after a power loss resumes the graph on disk, and
// must not number new nodes as the server knows others.
TEST_F(ShipperTest, TheGraphIsSyncedBeforeTheServerIsSentIt) {
  strata::testing::TempDir dir("shipper_test");
  SpoolOnDisk(dir.path());
  StartServer();
  StartShipper();
  std::vector<encoding::PathFrame> path = {{graph_.NodeFor({"main", "/bin/app", "", 0x100}), 0x10}};
  ASSERT_TRUE(graph_.AddPath(path, false).ok());
  v1::SampleBatch batch = Batch(1);
  batch.set_epoch(graph_.num_edges());
  shipper_->Enqueue(batch);
  ASSERT_TRUE(shipper_->Flush(kFlushTimeout));
  EXPECT_EQ(ingest_.graph_nodes(), graph_.num_nodes());
  EXPECT_EQ(shipper_->stats().spool.graph_syncs, 1u);
}

// A server that holds more of the agent's incarnation than the agent (its spool restored from
// an older copy: a VM snapshot, a backup) would decode the agent's new nodes, edges and batches
// as others: nothing more is sent under that graph, and a new one is due at once.
TEST_F(ShipperTest, AServerAheadOfTheAgentsGraphIsSentNothingMoreOfIt) {
  ingest_.PretendKnown(graph_.num_nodes() + 5, 0);
  StartServer();
  StartShipper();
  Enqueue(1, 2);
  ASSERT_TRUE(WaitFor([&] { return shipper_->ServerAhead(); }));
  EXPECT_TRUE(shipper_->NewGraphDue());
  EXPECT_FALSE(shipper_->Flush(kFlushTimeout));  // at once: nothing will be acknowledged
  EXPECT_TRUE(ingest_.received().empty());
  EXPECT_EQ(spool_->size(), 2u);  // for the agent to drop, counted
}

TEST_F(ShipperTest, AServerAheadOfTheAgentsSequenceNumbersIsSentNothingMore) {
  strata::testing::TempDir dir("shipper_test");
  SpoolOnDisk(dir.path());  // numbers up to Spool::kSequenceBlock reserved
  ingest_.PretendKnown(0, spool::Spool::kSequenceBlock + 1);
  StartServer();
  StartShipper();
  Enqueue(1, 2);
  ASSERT_TRUE(WaitFor([&] { return shipper_->ServerAhead(); }));
  EXPECT_FALSE(shipper_->Flush(kFlushTimeout));
  EXPECT_TRUE(ingest_.received().empty());
  EXPECT_EQ(spool_->size(), 2u);  // not taken as acknowledged by the server's number
}

TEST_F(ShipperTest, ARedirectAnsweringTheHelloMovesEveryBatchToTheOwner) {
  StartServer();
  StartSecondServer();
  ingest_.RedirectTo({address2_});
  StartShipper({address_});
  Enqueue(1, 5);
  ASSERT_TRUE(shipper_->Flush(kFlushTimeout));
  EXPECT_EQ(ingest2_.applied(), Range(1, 5));
  EXPECT_EQ(ingest2_.received(), Range(1, 5));  // each once: none lost, none resent
  EXPECT_TRUE(ingest_.received().empty());       // nothing went to the node that redirected
  EXPECT_EQ(ingest_.redirects(), 1);
  EXPECT_EQ(ingest_.connects(), 0);
  EXPECT_EQ(ingest2_.connects(), 1);
  EXPECT_TRUE(spool_->empty());
  const ShipperStats stats = shipper_->stats();
  EXPECT_EQ(stats.redirects, 1u);
  EXPECT_EQ(stats.connects, 1u);
  EXPECT_EQ(stats.batches_acked, 5u);
}

TEST_F(ShipperTest, ARedirectMidStreamMovesTheRestToTheOwner) {
  StartServer();
  StartSecondServer();
  ingest_.RedirectTo({address2_}, /*at_sequence=*/1);
  StartShipper({address_});
  Enqueue(1, 1);
  // The agent leaves the stream that redirected it before it ships the next batches.
  ASSERT_TRUE(WaitFor([&] { return shipper_->stats().redirects == 1; }));
  Enqueue(2, 5);
  ASSERT_TRUE(shipper_->Flush(kFlushTimeout));
  EXPECT_EQ(ingest_.received(), Range(1, 1));
  EXPECT_TRUE(ingest_.applied().empty());
  EXPECT_EQ(ingest2_.applied(), Range(1, 5));
  EXPECT_TRUE(spool_->empty());
  EXPECT_EQ(shipper_->stats().batches_acked, 5u);
}

TEST_F(ShipperTest, ARedirectFallsBackToTheNextOwnerNamed) {
  StartServer();
  StartSecondServer();
  ingest_.RedirectTo({dead_address_, address2_});
  StartShipper({address_});
  Enqueue(1, 3);
  ASSERT_TRUE(shipper_->Flush(kFlushTimeout));
  EXPECT_EQ(ingest2_.applied(), Range(1, 3));
  EXPECT_TRUE(ingest_.received().empty());
  EXPECT_EQ(shipper_->stats().redirects, 1u);
}

TEST_F(ShipperTest, PassesOverADeadServerOfTheList) {
  StartSecondServer();
  StartShipper({dead_address_, address2_});
  Enqueue(1, 5);
  ASSERT_TRUE(shipper_->Flush(kFlushTimeout));
  EXPECT_EQ(ingest2_.applied(), Range(1, 5));
  EXPECT_TRUE(spool_->empty());
  EXPECT_EQ(shipper_->stats().connects, 1u);
  EXPECT_EQ(shipper_->stats().redirects, 0u);
}

TEST_F(ShipperTest, AStreamThatEndsMovesToTheNextServerOfTheList) {
  ingest_.Refuse({.sequence = 1, .code = grpc::StatusCode::RESOURCE_EXHAUSTED, .fatal = true,
                  .retry_after_ms = 100, .times = 1});
  StartServer();
  StartSecondServer();
  StartShipper({address_, address2_});
  Enqueue(1, 3);
  ASSERT_TRUE(shipper_->Flush(kFlushTimeout));
  EXPECT_TRUE(ingest_.applied().empty());
  EXPECT_EQ(ingest2_.applied(), Range(1, 3));
  EXPECT_EQ(ingest_.connects(), 1);
  EXPECT_EQ(ingest2_.connects(), 1);
  EXPECT_EQ(shipper_->stats().connects, 2u);
}

TEST_F(ShipperTest, RedirectsThatLoopBackOffAndStillDeliver) {
  // Two nodes that each say the other owns the host.
  StartServer();
  StartSecondServer();
  ingest_.RedirectTo({address2_});
  ingest2_.RedirectTo({address_});
  const absl::Time start = absl::Now();
  StartShipper({address_});
  // Redirects up to rpc::kMaxRedirectsInARow are followed at once; each later one waits at least
  // half the backoff (500 ms, then 1 s): at least 250 + 500 ms before the sixth.
  ASSERT_TRUE(WaitFor([&] { return shipper_->stats().redirects >= 6; }));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(700));
  EXPECT_EQ(shipper_->stats().connects, 0u);

  ingest2_.RedirectTo({});  // the nodes agree again: the second owns the host
  Enqueue(1, 3);
  ASSERT_TRUE(shipper_->Flush(kFlushTimeout));
  EXPECT_EQ(ingest2_.applied(), Range(1, 3));
  EXPECT_TRUE(ingest_.received().empty());
}

// This process's thread named `name`, or 0.
pid_t ThreadNamed(const std::string& name) {
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(task.path() / "comm");
    std::string line;
    if (std::getline(comm, line) && line == name) {
      return static_cast<pid_t>(std::stol(task.path().filename().string()));
    }
  }
  return 0;
}

// Times thread `tid` of this process gave up its CPU to wait.
uint64_t VoluntarySwitches(pid_t tid) {
  std::ifstream status(absl::StrCat("/proc/self/task/", tid, "/status"));
  const std::string key = "voluntary_ctxt_switches:";
  for (std::string line; std::getline(status, line);) {
    if (line.rfind(key, 0) == 0) return std::stoull(line.substr(key.size()));
  }
  return 0;
}

// The TCP socket of this process connected to port `port` (the shipper's), or -1. gRPC's
// sockets are IPv6 ones where it can (127.0.0.1 as ::ffff:127.0.0.1).
int SocketConnectedTo(int port) {
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    const int fd = std::atoi(entry.path().filename().c_str());
    sockaddr_storage peer{};
    socklen_t size = sizeof(peer);
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &size) != 0) continue;
    const in_port_t peer_port =
        peer.ss_family == AF_INET    ? reinterpret_cast<sockaddr_in&>(peer).sin_port
        : peer.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6&>(peer).sin6_port
                                     : 0;
    if (ntohs(peer_port) == port) return fd;
  }
  return -1;
}

// TCP segments with data sent on `fd` so far (each write of a stream with TCP_NODELAY, as
// gRPC's, leaves in its own on loopback), or nullopt where TCP_INFO is not available.
std::optional<uint64_t> DataSegmentsSent(int fd) {
  tcp_info info{};
  socklen_t size = sizeof(info);
  if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &size) != 0 ||
      size < offsetof(tcp_info, tcpi_data_segs_out) + sizeof(info.tcpi_data_segs_out)) {
    return std::nullopt;
  }
  return info.tcpi_data_segs_out;
}

// Batches a second or less apart (short intervals): the shipper sleeps between them rather
// than on the stream, so the acknowledgement of each is read when the next goes instead of
// waking it. Waiting on the stream, each batch costs at least two wake-ups (the batch's and
// its acknowledgement's), and a few more where the enqueuing thread still holds gRPC's queue.
// And one write: the window the acknowledgement took is announced in the next batch's write,
// not in one of its own just before it (a read posted too soon after the last one ended).
TEST_F(ShipperTest, BatchesComingOftenCostTheShipperOneWakeUpAndOneWriteEach) {
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&ingest_);
  server_ = builder.BuildAndStart();
  ASSERT_NE(server_, nullptr);
  StartShipper({absl::StrCat("127.0.0.1:", port)});
  Enqueue(1, 1);
  ASSERT_TRUE(WaitFor([&] { return shipper_->stats().batches_acked == 1; }));
  const pid_t shipper = ThreadNamed("strata-shipper");
  ASSERT_NE(shipper, 0);
  const int socket = SocketConnectedTo(port);
  ASSERT_GE(socket, 0);
  constexpr int kBatches = 20;
  const uint64_t before = VoluntarySwitches(shipper);
  const std::optional<uint64_t> segments_before = DataSegmentsSent(socket);
  for (uint64_t s = 2; s <= 1 + kBatches; ++s) {
    shipper_->Enqueue(Batch(s));
    absl::SleepFor(absl::Milliseconds(50));  // the interval
  }
  const uint64_t switches = VoluntarySwitches(shipper) - before;
  const std::optional<uint64_t> segments_after = DataSegmentsSent(socket);
  if (segments_before.has_value() && segments_after.has_value()) {
    // One each, and the acks of the test server's bandwidth probes (24 here); two each when
    // every read posted announced its window at once (41-42).
    EXPECT_LE(*segments_after - *segments_before, kBatches * 3u / 2)
        << "TCP segments for " << kBatches << " batches";
  } else {
    // qemu user mode does not pass TCP_INFO through.
    EXPECT_TRUE(strata::testing::RunningUnderQemuUser()) << "no TCP_INFO: " << strerror(errno);
    std::printf("writes not checked: no TCP_INFO\n");
  }
  if (strata::testing::RunningUnderQemuUser()) {
    // The emulator's own locks and futex calls run on the thread too.
    std::printf("wake-ups not checked under qemu user mode: %llu for %d batches\n",
                static_cast<unsigned long long>(switches), kBatches);
  } else {
    // One each here (20); 35 under ASan, whose runtime takes locks of its own; about 120
    // waiting on the stream.
    EXPECT_LT(switches, kBatches * 5 / 2) << switches << " wake-ups for " << kBatches
                                          << " batches";
  }
  // Acknowledged without a Flush. (This process's server threads poll the client's socket
  // too; BackboneTest.AnAgentShippingOftenReadsEachAcknowledgementWithTheNextBatch checks the
  // shipper's own reads against a server process.)
  EXPECT_TRUE(WaitFor([&] { return shipper_->stats().batches_acked >= kBatches; }));
  ASSERT_TRUE(shipper_->Flush(kFlushTimeout));
  EXPECT_EQ(ingest_.applied(), Range(1, 1 + kBatches));
}

TEST(ShipperServerListTest, SplitsOnCommas) {
  EXPECT_EQ(*ParseServerList("127.0.0.1:7070"), std::vector<std::string>{"127.0.0.1:7070"});
  EXPECT_EQ(*ParseServerList("n1:7070,n2:7070, n3:7070"),
            (std::vector<std::string>{"n1:7070", "n2:7070", "n3:7070"}));
  EXPECT_FALSE(ParseServerList("").ok());
  EXPECT_FALSE(ParseServerList("n1:7070,").ok());
  EXPECT_FALSE(ParseServerList("n1:7070,,n2:7070").ok());
}

}  // namespace
}  // namespace strata::agent
