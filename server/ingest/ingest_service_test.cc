#include "server/ingest/ingest_service.h"

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/base/clock.h"
#include "common/testing/temp_dir.h"
#include "common/testing/wait_for.h"
#include "gtest/gtest.h"
#include "server/aggregate/window_aggregator.h"
#include "server/ingest/fake_agent.h"
#include "server/registry/agent_registry.h"

namespace strata::server::ingest {
namespace {

using Channel = grpc::ClientReaderWriter<v1::AgentMessage, v1::ServerMessage>;

// An IngestService on a loopback port, with a real store in a temporary directory.
class IngestServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto store = store::Store::Open(dir_.path(), {});
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
  }
  void TearDown() override { StopServer(); }

  void StartServer(IngestService::Options options = {}) {
    options.worker_threads = 2;
    service_ = std::make_unique<IngestService>(store_.get(), &registry_, &metrics_, options);
    service_->AddBatchObserver([this](const AppliedBatch& b) {
      if (!b.duplicate) observed_capture_ids_.push_back(b.batch->capture_id());
    });
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_NE(port, 0);
    address_ = absl::StrCat("127.0.0.1:", port);
    stub_ = v1::Ingest::NewStub(grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
  }
  void StopServer() {
    if (server_ != nullptr) server_->Shutdown();
    server_.reset();
    service_.reset();  // joins the workers: after every stream is done
  }

  struct Stream {
    std::unique_ptr<grpc::ClientContext> context = std::make_unique<grpc::ClientContext>();
    std::unique_ptr<Channel> channel;
  };
  Stream Connect() {
    Stream s;
    s.channel = stub_->Connect(s.context.get());
    return s;
  }
  static v1::AgentMessage HelloMessage(uint64_t graph_id = 7) {
    v1::AgentMessage m;
    v1::Hello* hello = m.mutable_hello();
    hello->set_agent_id("agent-1");
    hello->set_host("host-a");
    hello->set_arch("x86_64");
    hello->set_version("test");
    hello->set_graph_id(graph_id);
    hello->set_frequency_hz(99);
    return m;
  }
  static v1::ServerMessage Read(Stream& s) {
    v1::ServerMessage m;
    EXPECT_TRUE(s.channel->Read(&m));
    return m;
  }
  // Sends a message and reads the reply.
  static v1::ServerMessage Send(Stream& s, const v1::AgentMessage& m) {
    EXPECT_TRUE(s.channel->Write(m));
    return Read(s);
  }
  static v1::AgentMessage Message(const v1::GraphDelta& delta) {
    v1::AgentMessage m;
    *m.mutable_graph_delta() = delta;
    return m;
  }
  static v1::AgentMessage Message(const v1::SampleBatch& batch) {
    v1::AgentMessage m;
    *m.mutable_sample_batch() = batch;
    return m;
  }
  static grpc::Status Finish(Stream& s) {
    s.channel->WritesDone();
    return s.channel->Finish();
  }

  // Samples of service "demo" in the store, all time.
  uint64_t Stored() {
    store::SampleQuery q;
    q.service = "demo";
    q.from_ms = 0;
    q.to_ms = int64_t{1} << 50;
    auto totals = store_->samples().SumSamples(q);
    EXPECT_TRUE(totals.ok()) << totals.status();
    uint64_t sum = 0;
    if (totals.ok()) {
      for (const store::StackCount& c : totals->stacks) sum += c.count;
    }
    return sum;
  }

  strata::testing::TempDir dir_{"ingest_service_test"};
  std::unique_ptr<store::Store> store_;
  registry::AgentRegistry registry_;
  IngestMetrics metrics_;
  std::unique_ptr<IngestService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  std::unique_ptr<v1::Ingest::Stub> stub_;
  std::vector<std::string> observed_capture_ids_;  // observers run before the Ack is sent
};

TEST_F(IngestServiceTest, BatchIsAcknowledgedOnceStoredAndTheAgentIsListed) {
  StartServer();
  FakeAgent agent;
  auto c1 = agent.Context({"main", "work"}, 30);
  auto c2 = agent.Context({"main", "idle"}, 12);

  Stream s = Connect();
  v1::ServerMessage welcome = Send(s, HelloMessage());
  ASSERT_TRUE(welcome.has_welcome()) << welcome.DebugString();
  EXPECT_EQ(welcome.welcome().known_nodes(), 2u);  // the root and the truncation marker
  EXPECT_EQ(welcome.welcome().last_applied_sequence(), 0u);
  ASSERT_TRUE(s.channel->Write(Message(agent.Delta(2, 0))));  // no reply to a good delta
  v1::ServerMessage ack = Send(s, Message(Batch(1, agent.graph.num_edges(), {c1, c2},
                                                Form::kPacked)));
  ASSERT_TRUE(ack.has_ack()) << ack.DebugString();
  EXPECT_EQ(ack.ack().sequence(), 1u);
  // Acknowledged means stored.
  EXPECT_EQ(Stored(), 42u);
  EXPECT_EQ(metrics_.batches.load(), 1u);
  EXPECT_EQ(metrics_.samples.load(), 42u);
  EXPECT_EQ(metrics_.contexts.load(), 2u);
  EXPECT_EQ(observed_capture_ids_, std::vector<std::string>{""});

  std::vector<registry::AgentStatus> agents = registry_.List();
  ASSERT_EQ(agents.size(), 1u);
  EXPECT_EQ(agents[0].agent_id, "agent-1");
  EXPECT_EQ(agents[0].host, "host-a");
  EXPECT_TRUE(agents[0].connected);
  EXPECT_EQ(agents[0].batches, 1u);
  ASSERT_EQ(agents[0].targets.size(), 1u);
  EXPECT_EQ(agents[0].targets[0].service, "demo");
  EXPECT_EQ(agents[0].targets[0].pid, 42u);
  EXPECT_EQ(registry_.FindAgents("demo", "", 0), std::vector<std::string>{"agent-1"});

  EXPECT_TRUE(Finish(s).ok());
  StopServer();  // the stream is done when the server is
  EXPECT_FALSE(registry_.List()[0].connected);
}

TEST_F(IngestServiceTest, ResentBatchIsAcknowledgedAgainButStoredOnce) {
  StartServer();
  FakeAgent agent;
  auto c = agent.Context({"main", "work"}, 5);
  {
    Stream s = Connect();
    ASSERT_TRUE(Send(s, HelloMessage()).has_welcome());
    ASSERT_TRUE(s.channel->Write(Message(agent.Delta(2, 0))));
    const v1::SampleBatch batch = Batch(1, agent.graph.num_edges(), {c});
    ASSERT_TRUE(Send(s, Message(batch)).has_ack());
    v1::ServerMessage again = Send(s, Message(batch));
    ASSERT_TRUE(again.has_ack()) << again.DebugString();
    EXPECT_EQ(again.ack().sequence(), 1u);
    EXPECT_TRUE(Finish(s).ok());
  }
  EXPECT_EQ(Stored(), 5u);
  EXPECT_EQ(metrics_.duplicate_batches.load(), 1u);

  // A reconnecting agent learns what the server has: its graph and the last batch.
  Stream s = Connect();
  v1::ServerMessage welcome = Send(s, HelloMessage());
  ASSERT_TRUE(welcome.has_welcome());
  EXPECT_EQ(welcome.welcome().known_nodes(), agent.graph.num_nodes());
  EXPECT_EQ(welcome.welcome().known_edges(), agent.graph.num_edges());
  EXPECT_EQ(welcome.welcome().last_applied_sequence(), 1u);
  ASSERT_TRUE(Send(s, Message(Batch(2, agent.graph.num_edges(), {c}))).has_ack());
  EXPECT_EQ(Stored(), 10u);
  EXPECT_TRUE(Finish(s).ok());
}

// An agent that reconnects before the server saw its old stream end (a reconnect storm, a
// connection that broke one way) stays connected when the old stream's end is seen.
TEST_F(IngestServiceTest, OldStreamEndingAfterTheAgentReconnectedLeavesItConnected) {
  StartServer();
  Stream old_stream = Connect();
  ASSERT_TRUE(Send(old_stream, HelloMessage()).has_welcome());
  Stream new_stream = Connect();
  ASSERT_TRUE(Send(new_stream, HelloMessage()).has_welcome());
  ASSERT_EQ(metrics_.connected.load(), 2);
  EXPECT_TRUE(Finish(old_stream).ok());
  // The old stream's end has been handled once the server counts one stream.
  ASSERT_TRUE(strata::testing::WaitFor([&] { return metrics_.connected.load() == 1; }));
  std::vector<registry::AgentStatus> agents = registry_.List();
  ASSERT_EQ(agents.size(), 1u);
  EXPECT_TRUE(agents[0].connected);
  // Control messages still reach the agent, on its new stream.
  v1::ServerMessage control;
  control.mutable_stop_capture()->set_capture_id("c-1");
  ASSERT_TRUE(registry_.Send("agent-1", control));
  v1::ServerMessage received = Read(new_stream);
  EXPECT_EQ(received.stop_capture().capture_id(), "c-1") << received.DebugString();
  EXPECT_TRUE(Finish(new_stream).ok());
  ASSERT_TRUE(strata::testing::WaitFor([&] { return metrics_.connected.load() == 0; }));
  EXPECT_FALSE(registry_.List()[0].connected);
}

TEST_F(IngestServiceTest, GraphsUnusedPastTheRetentionGoUnlessAStreamHoldsThem) {
  IngestService::Options options;
  options.graph_retention = absl::Hours(24);
  StartServer(options);
  const int64_t now_ms = base::NowMs();
  constexpr int64_t kHourMs = 3'600'000;
  // A graph stored before use marks were kept.
  {
    store::WriteBatch wb;
    wb.AppendGraphNodes("agent-0", 1, {{2, "f", "", "", 0}});
    ASSERT_TRUE(store_->Commit(&wb).ok());
  }
  FakeAgent agent;
  auto c = agent.Context({"main", "work"}, 5);
  Stream first = Connect();  // incarnation 7
  ASSERT_TRUE(Send(first, HelloMessage(7)).has_welcome());
  ASSERT_TRUE(first.channel->Write(Message(agent.Delta(2, 0))));
  ASSERT_TRUE(Send(first, Message(Batch(1, agent.graph.num_edges(), {c}))).has_ack());
  Stream second = Connect();  // incarnation 8, open throughout
  ASSERT_TRUE(Send(second, HelloMessage(8)).has_welcome());
  ASSERT_TRUE(second.channel->Write(Message(agent.Delta(2, 0))));
  ASSERT_TRUE(Send(second, Message(Batch(1, agent.graph.num_edges(), {c}))).has_ack());
  EXPECT_TRUE(Finish(first).ok());
  ASSERT_TRUE(strata::testing::WaitFor([&] { return metrics_.connected.load() == 1; }));

  absl::StatusOr<IngestService::GraphSweep> sweep = service_->SweepGraphs(now_ms);
  ASSERT_TRUE(sweep.ok()) << sweep.status();
  EXPECT_EQ(sweep->graphs, 3u);
  EXPECT_EQ(sweep->marked, 1u);  // agent-0's: its day starts now
  EXPECT_EQ(sweep->deleted, 0u);

  sweep = service_->SweepGraphs(now_ms + 25 * kHourMs);
  ASSERT_TRUE(sweep.ok()) << sweep.status();
  EXPECT_EQ(sweep->deleted, 2u);  // agent-0's and incarnation 7's; 8 is held
  EXPECT_EQ(metrics_.graphs_deleted.load(), 2u);
  absl::StatusOr<std::vector<store::StoredGraph>> left = store_->meta().ListGraphs();
  ASSERT_TRUE(left.ok()) << left.status();
  ASSERT_EQ(left->size(), 1u);
  EXPECT_EQ(left->front().graph_id, 8u);
  EXPECT_TRUE(store_->meta().LoadGraph("agent-1", 7)->edges.empty());

  // Incarnation 7 comes back: the server knows none of its graph, but still which batches
  // it applied.
  Stream again = Connect();
  v1::ServerMessage welcome = Send(again, HelloMessage(7));
  ASSERT_TRUE(welcome.has_welcome()) << welcome.DebugString();
  EXPECT_EQ(welcome.welcome().known_nodes(), 2u);
  EXPECT_EQ(welcome.welcome().known_edges(), 0u);
  EXPECT_EQ(welcome.welcome().last_applied_sequence(), 1u);
  ASSERT_TRUE(again.channel->Write(Message(agent.Delta(2, 0))));
  ASSERT_TRUE(Send(again, Message(Batch(1, agent.graph.num_edges(), {c}))).has_ack());
  ASSERT_TRUE(Send(again, Message(Batch(2, agent.graph.num_edges(), {c}))).has_ack());
  EXPECT_EQ(Stored(), 15u);  // batch 1 of 7 once, batch 1 of 8, batch 2 of 7
  EXPECT_EQ(store_->meta().LoadGraph("agent-1", 7)->edges.size(), agent.graph.num_edges());

  // Both streams open: nothing goes, however old the marks.
  sweep = service_->SweepGraphs(now_ms + 100 * kHourMs);
  ASSERT_TRUE(sweep.ok()) << sweep.status();
  EXPECT_EQ(sweep->graphs, 2u);
  EXPECT_EQ(sweep->deleted, 0u);
  EXPECT_TRUE(Finish(again).ok());
  EXPECT_TRUE(Finish(second).ok());
}

TEST_F(IngestServiceTest, BatchBeyondTheGraphGetsResyncAndNothingIsStored) {
  StartServer();
  FakeAgent agent;
  auto c = agent.Context({"main", "work"}, 5);
  Stream s = Connect();
  ASSERT_TRUE(Send(s, HelloMessage()).has_welcome());
  // The graph was never sent.
  v1::ServerMessage resync = Send(s, Message(Batch(1, agent.graph.num_edges(), {c})));
  ASSERT_TRUE(resync.has_resync()) << resync.DebugString();
  EXPECT_EQ(resync.resync().from_node(), 2u);
  EXPECT_EQ(resync.resync().from_edge(), 0u);
  v1::ServerMessage error = Read(s);
  ASSERT_TRUE(error.has_error()) << error.DebugString();
  EXPECT_EQ(error.error().sequence(), 1u);
  EXPECT_FALSE(error.error().fatal());
  EXPECT_EQ(metrics_.resyncs.load(), 1u);

  ASSERT_TRUE(s.channel->Write(Message(agent.Delta(2, 0))));
  ASSERT_TRUE(Send(s, Message(Batch(1, agent.graph.num_edges(), {c}))).has_ack());
  EXPECT_EQ(Stored(), 5u);
  EXPECT_TRUE(Finish(s).ok());
}

TEST_F(IngestServiceTest, StreamMustStartWithAValidHello) {
  StartServer();
  Stream s = Connect();
  v1::AgentMessage heartbeat;
  heartbeat.mutable_heartbeat();
  ASSERT_TRUE(s.channel->Write(heartbeat));
  grpc::Status st = Finish(s);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(st.error_message().find("must be Hello"), std::string::npos) << st.error_message();

  Stream bad = Connect();
  v1::AgentMessage hello = HelloMessage();
  hello.mutable_hello()->set_agent_id(std::string("a\0b", 3));
  ASSERT_TRUE(bad.channel->Write(hello));
  EXPECT_EQ(Finish(bad).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(registry_.List().empty());
  EXPECT_EQ(metrics_.rejected_messages.load(), 2u);
}

// A client that sends without reading its replies: once they back up the server stops
// reading it, so that its writes stall instead of the server holding every reply; once it
// reads again, so does the server.
TEST_F(IngestServiceTest, AClientThatDoesNotReadItsRepliesIsHeldNotBuffered) {
  StartServer();
  // A client whose transport takes no more than HTTP/2's initial window of replies it has
  // not read (with its default estimate of the link's bandwidth, megabytes of them).
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  auto stub = v1::Ingest::NewStub(
      grpc::CreateCustomChannel(address_, grpc::InsecureChannelCredentials(), args));
  Stream s;
  s.channel = stub->Connect(s.context.get());
  ASSERT_TRUE(s.channel->Write(HelloMessage()));
  ASSERT_TRUE(Read(s).has_welcome());
  constexpr uint64_t kSent = 100'000;
  std::atomic<uint64_t> written{0};
  std::thread writer([&] {
    v1::AgentMessage unexpected = HelloMessage();  // refused, not fatal, on a live session
    for (uint64_t i = 0; i < kSent && s.channel->Write(unexpected); ++i) ++written;
  });
  // Held once the replies fill what the transports and sockets buffer.
  EXPECT_TRUE(strata::testing::WaitFor([&] { return metrics_.reads_held.load() > 0; },
                                       std::chrono::seconds(60)));
  // The window's worth (about 1,100 replies of this size) and the outbox, not the 100,000.
  const uint64_t answered = metrics_.rejected_messages.load();
  EXPECT_LT(answered, 20'000u);
  std::printf("held after %llu messages answered, %llu written\n",
              static_cast<unsigned long long>(answered),
              static_cast<unsigned long long>(written.load()));
  for (int i = 0; i < 1000; ++i) {
    v1::ServerMessage reply;
    ASSERT_TRUE(s.channel->Read(&reply)) << i;
    ASSERT_TRUE(reply.has_error()) << i;
  }
  EXPECT_TRUE(strata::testing::WaitFor(
      [&] { return metrics_.rejected_messages.load() > answered; }));
  s.context->TryCancel();
  writer.join();
}

// Every batch commits through the configured committer: continuous-profile counts go to
// the aggregation tables (and the journal), captured samples to the captures column family.
TEST_F(IngestServiceTest, BatchesCommitThroughTheCommitter) {
  auto aggregator = aggregate::WindowAggregator::Create(store_.get(), {});
  ASSERT_TRUE(aggregator.ok()) << aggregator.status();
  StartServer({.committer = aggregator->get()});
  FakeAgent agent;
  auto c = agent.Context({"main", "work"}, 7);
  Stream s = Connect();
  ASSERT_TRUE(Send(s, HelloMessage()).has_welcome());
  ASSERT_TRUE(s.channel->Write(Message(agent.Delta(2, 0))));
  ASSERT_TRUE(Send(s, Message(Batch(1, agent.graph.num_edges(), {c}))).has_ack());
  EXPECT_EQ((*aggregator)->stats().journal_records, 1u);
  EXPECT_EQ(Stored(), 0u);  // in the open window's table

  v1::SampleBatch capture = Batch(2, agent.graph.num_edges(), {c});
  capture.set_capture_id("cap-1");
  ASSERT_TRUE(Send(s, Message(capture)).has_ack());
  EXPECT_EQ((*aggregator)->stats().journal_records, 1u);
  EXPECT_EQ(observed_capture_ids_, (std::vector<std::string>{"", "cap-1"}));
  store::SampleQuery q;
  q.service = "demo";
  q.capture_id = "cap-1";
  q.from_ms = 0;
  q.to_ms = int64_t{1} << 50;
  auto captured = store_->samples().SumSamples(q);
  ASSERT_TRUE(captured.ok()) << captured.status();
  ASSERT_EQ(captured->stacks.size(), 1u);
  EXPECT_EQ(captured->stacks[0].count, 7u);
  EXPECT_EQ(*store_->meta().AppliedSequence("agent-1", 7), 2u);

  EXPECT_TRUE(Finish(s).ok());
  StopServer();
  ASSERT_TRUE((*aggregator)->FlushAll().ok());
  EXPECT_EQ(Stored(), 7u);
}

// A cluster placement whose answers the test sets: redirect or take the stream, and whether
// the other owners confirm a batch.
class ScriptedPlacement final : public StreamPlacement {
 public:
  std::optional<v1::Redirect> redirect;
  absl::Status replication = absl::OkStatus();
  std::vector<uint64_t> replicated;  // sequences handed to the replica, in order
  int deltas = 0;

  absl::StatusOr<std::optional<v1::Redirect>> Place(const AgentIdentity&) override {
    return redirect;
  }
  std::unique_ptr<StreamReplica> Replicate(const v1::Hello&, const std::string&) override {
    return std::make_unique<Replica>(this);
  }
  absl::Status ClaimAgentId(const AgentIdentity&, bool) override { return absl::OkStatus(); }

 private:
  class Replica final : public StreamReplica {
   public:
    explicit Replica(ScriptedPlacement* p) : p_(p) {}
    void OnGraphDelta(const v1::GraphDelta&) override { ++p_->deltas; }
    absl::Status OnBatch(const v1::SampleBatch& batch, const AgentSession&,
                         v1::Redirect*) override {
      p_->replicated.push_back(batch.sequence());
      return p_->replication;
    }

   private:
    ScriptedPlacement* p_;
  };
};

TEST_F(IngestServiceTest, NodeThatDoesNotOwnTheHostRedirectsBeforeStoringAnything) {
  ScriptedPlacement placement;
  placement.redirect.emplace();
  placement.redirect->add_servers("10.0.0.2:7070");
  placement.redirect->add_servers("10.0.0.3:7070");
  placement.redirect->set_reason("host host-a is owned by other nodes");
  StartServer({.placement = &placement});
  Stream s = Connect();
  v1::ServerMessage reply = Send(s, HelloMessage());
  ASSERT_TRUE(reply.has_redirect()) << reply.DebugString();
  EXPECT_EQ(reply.redirect().servers(0), "10.0.0.2:7070");
  EXPECT_EQ(reply.redirect().servers_size(), 2);
  v1::ServerMessage more;
  EXPECT_FALSE(s.channel->Read(&more));  // the stream ends after the Redirect
  EXPECT_FALSE(s.channel->Finish().ok());
  EXPECT_EQ(metrics_.redirects.load(), 1u);
  EXPECT_TRUE(registry_.List().empty());  // never attached
}

TEST_F(IngestServiceTest, BatchIsAcknowledgedOnlyOnceTheOtherOwnersHaveIt) {
  ScriptedPlacement placement;
  StartServer({.placement = &placement});
  FakeAgent agent;
  auto c1 = agent.Context({"main", "work"}, 30);
  Stream s = Connect();
  ASSERT_TRUE(Send(s, HelloMessage()).has_welcome());
  ASSERT_TRUE(s.channel->Write(Message(agent.Delta(2, 0))));
  v1::ServerMessage ack = Send(s, Message(Batch(1, agent.graph.num_edges(), {c1}, Form::kPacked)));
  ASSERT_TRUE(ack.has_ack()) << ack.DebugString();
  EXPECT_EQ(placement.deltas, 1);
  EXPECT_EQ(placement.replicated, std::vector<uint64_t>{1});
  EXPECT_EQ(metrics_.acks.load(), 1u);

  // An owner does not confirm batch 2: it is stored here but not acknowledged, and the stream
  // ends so that the agent sends it again.
  placement.replication = absl::UnavailableError("owner n2 did not confirm");
  v1::ServerMessage refused =
      Send(s, Message(Batch(2, agent.graph.num_edges(), {c1}, Form::kPacked)));
  ASSERT_TRUE(refused.has_error()) << refused.DebugString();
  EXPECT_EQ(refused.error().code(), static_cast<int>(absl::StatusCode::kUnavailable));
  EXPECT_TRUE(refused.error().fatal());
  EXPECT_EQ(refused.error().sequence(), 2u);
  EXPECT_GT(refused.error().retry_after_ms(), 0u);
  EXPECT_FALSE(s.channel->Finish().ok());
  EXPECT_EQ(metrics_.acks.load(), 1u);
  EXPECT_EQ(metrics_.replication_failures.load(), 1u);
  EXPECT_EQ(Stored(), 60u);

  // Resent after a reconnect: a duplicate here, handed to the owners again, acknowledged.
  placement.replication = absl::OkStatus();
  Stream again = Connect();
  v1::ServerMessage welcome = Send(again, HelloMessage());
  ASSERT_TRUE(welcome.has_welcome());
  EXPECT_EQ(welcome.welcome().last_applied_sequence(), 2u);
  ack = Send(again, Message(Batch(2, agent.graph.num_edges(), {c1}, Form::kPacked)));
  ASSERT_TRUE(ack.has_ack()) << ack.DebugString();
  EXPECT_EQ(placement.replicated, (std::vector<uint64_t>{1, 2, 2}));
  EXPECT_EQ(Stored(), 60u);  // once
  EXPECT_TRUE(Finish(again).ok());
}

// A replica stream (from the node that took the agent) is applied here without placement or
// replication, and does not count as an agent connected here.
TEST_F(IngestServiceTest, ReplicaStreamIsAppliedWithoutPlacement) {
  ScriptedPlacement placement;
  placement.redirect.emplace();  // this node would redirect the agent itself
  placement.redirect->add_servers("10.0.0.2:7070");
  StartServer({.placement = &placement});
  FakeAgent agent;
  auto c1 = agent.Context({"main", "work"}, 5);
  Stream s;
  s.context->AddMetadata(kReplicaMetadata, "n1");
  s.channel = stub_->Connect(s.context.get());
  ASSERT_TRUE(Send(s, HelloMessage()).has_welcome());
  ASSERT_TRUE(s.channel->Write(Message(agent.Delta(2, 0))));
  ASSERT_TRUE(Send(s, Message(Batch(1, agent.graph.num_edges(), {c1}, Form::kPacked))).has_ack());
  EXPECT_TRUE(placement.replicated.empty());
  EXPECT_EQ(metrics_.replica_streams.load(), 1u);
  EXPECT_EQ(metrics_.acks.load(), 0u);  // not an agent's acknowledgement
  EXPECT_TRUE(registry_.List().empty());
  EXPECT_EQ(Stored(), 5u);
  EXPECT_TRUE(Finish(s).ok());
}

}  // namespace
}  // namespace strata::server::ingest
