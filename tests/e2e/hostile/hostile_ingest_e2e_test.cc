// What a hostile or broken agent can do to a running strata-server, one case per test:
// every case must end with a clear error for the client, the server alive and serving
// others, its memory within its configuration, and nothing it acknowledged lost.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/base/clock.h"
#include "common/base/unique_fd.h"
#include "common/encoding/graph.h"
#include "common/encoding/graph_delta_edges.h"
#include "common/encoding/numbering.h"
#include "common/encoding/packed_edges.h"
#include "common/testing/temp_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "strata/v1/ingest.grpc.pb.h"
#include "strata/v1/query.grpc.pb.h"
#include "tests/e2e/harness.h"

namespace strata::e2e {
namespace {

constexpr int64_t kWindowMs = 10'000;

// Resident memory of a process, in MiB.
double RssMiB(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) {
      uint64_t kb = 0;
      std::string digits;
      for (char c : line) {
        if (c >= '0' && c <= '9') digits.push_back(c);
      }
      (void)absl::SimpleAtoi(digits, &kb);
      return kb / 1024.0;
    }
  }
  return -1;
}

// One agent stream spoken by hand. The graph is one function, "main", called from the root;
// every context is that path.
class RawAgent {
 public:
  RawAgent(const std::shared_ptr<grpc::Channel>& channel, std::string agent_id,
           uint64_t graph_id)
      : stub_(v1::Ingest::NewStub(channel)), agent_id_(std::move(agent_id)), graph_id_(graph_id) {
    context_.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
    stream_ = stub_->Connect(&context_);
    main_ = graph_.AddNode();
    std::vector<encoding::PathFrame> path{{main_, 0x10}};
    std::shared_ptr<const encoding::Numbering> numbering;
    auto encoded = encoding::EncodePath(graph_, path, false, &numbering);
    EXPECT_TRUE(encoded.ok()) << encoded.status();
    leaf_ = encoded->leaf;
    ids_ = encoded->ids;
  }

  v1::Hello MakeHello() const {
    v1::Hello h;
    h.set_agent_id(agent_id_);
    h.set_host("host-" + agent_id_);
    h.set_arch("x86_64");
    h.set_version("hostile");
    h.set_graph_id(graph_id_);
    return h;
  }
  // Hello (MakeHello() unless given) and the Welcome; false if the server refused.
  bool Connect(const v1::Hello* hello = nullptr) {
    v1::AgentMessage m;
    *m.mutable_hello() = hello ? *hello : MakeHello();
    if (!stream_->Write(m)) return false;
    v1::ServerMessage welcome;
    if (!stream_->Read(&welcome) || !welcome.has_welcome()) return false;
    welcome_ = welcome.welcome();
    return true;
  }
  // `packed`: the edges in packed_edges, as strata-agent sends them.
  bool SendGraph(bool packed = false) { return stream_->Write(GraphMessage(welcome_, packed)); }
  // The part of the graph that `welcome` says the server does not know.
  v1::AgentMessage GraphMessage(const v1::Welcome& welcome, bool packed = false) const {
    v1::AgentMessage m;
    v1::GraphDelta* d = m.mutable_graph_delta();
    d->set_first_node(welcome.known_nodes());
    for (uint32_t n = std::max<uint32_t>(welcome.known_nodes(), 2); n < graph_.num_nodes(); ++n) {
      auto* node = d->add_nodes();
      node->set_id(n);
      node->set_name("main");
      node->set_module("/bin/hostile");
    }
    d->set_first_edge(welcome.known_edges());
    for (uint64_t e = welcome.known_edges(); e < graph_.num_edges(); ++e) {
      auto* edge = d->add_edges();
      edge->set_caller(graph_.edge(e).caller);
      edge->set_call_site(graph_.edge(e).call_site);
      edge->set_callee(graph_.edge(e).callee);
    }
    if (packed) encoding::PackDeltaEdges(d);
    return m;
  }
  // A batch with one context of `count` per service.
  v1::AgentMessage Batch(uint64_t sequence, const std::vector<std::string>& services,
                         uint64_t count) const {
    v1::AgentMessage m;
    v1::SampleBatch* b = m.mutable_sample_batch();
    b->set_sequence(sequence);
    b->set_epoch(graph_.num_edges());
    b->set_start_ms(base::NowMs() - 1000);
    b->set_end_ms(base::NowMs());
    for (size_t i = 0; i < services.size(); ++i) {
      v1::Target* t = b->add_targets();
      t->set_id(static_cast<uint32_t>(i + 1));
      t->set_service(services[i]);
      t->set_pid(static_cast<uint32_t>(1000 + i));
      v1::ContextCount* c = b->add_contexts();
      c->set_target_id(static_cast<uint32_t>(i + 1));
      c->set_leaf(leaf_);
      for (uint64_t id : ids_) c->add_ids(id);
      c->set_count(count);
    }
    return m;
  }
  bool Write(const v1::AgentMessage& m) { return stream_->Write(m); }
  // The server's answer to the last message: an Ack or an IngestError (Resyncs skipped).
  // False when the stream ended.
  bool Answer(v1::ServerMessage* out) {
    while (stream_->Read(out)) {
      if (out->has_ack() || out->has_error()) return true;
    }
    return false;
  }
  // Sends a batch and returns the server's answer.
  v1::ServerMessage Send(const v1::AgentMessage& batch) {
    v1::ServerMessage answer;
    EXPECT_TRUE(Write(batch));
    EXPECT_TRUE(Answer(&answer)) << "stream ended: " << Finish().error_message();
    return answer;
  }
  // gRPC delivers the status only after every message has been read.
  grpc::Status Finish() {
    stream_->WritesDone();
    v1::ServerMessage unread;
    while (stream_->Read(&unread)) {
    }
    return stream_->Finish();
  }
  const v1::Welcome& welcome() const { return welcome_; }

 private:
  std::unique_ptr<v1::Ingest::Stub> stub_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::AgentMessage, v1::ServerMessage>> stream_;
  std::string agent_id_;
  uint64_t graph_id_;
  encoding::CallGraph graph_;
  encoding::NodeId main_ = 0;
  uint32_t leaf_ = 0;
  std::vector<uint64_t> ids_;
  v1::Welcome welcome_;
};

// The samples a stopped strata-agent says it took ("stopping: N samples"); 0 if absent.
std::vector<std::string> ServiceNames(const std::string& prefix, int n) {
  std::vector<std::string> out;
  for (int i = 0; i < n; ++i) out.push_back(absl::StrCat(prefix, i));
  return out;
}

class HostileIngestTest : public ::testing::Test {
 protected:
  void Start(std::vector<std::string> args = {}, std::vector<std::string> launcher = {}) {
    server_ = std::make_unique<ServerProcess>(dir_.path() + "/data", dir_.path() + "/server.log",
                                              std::move(args), std::move(launcher));
    ASSERT_NE(server_->port(), 0) << server_->process().Output();
    channel_ = server_->Channel();
  }
  // Sum of the service's samples as the query API reports it (0 if unknown).
  uint64_t Total(const std::string& service) {
    auto stub = v1::Query::NewStub(channel_);
    grpc::ClientContext ctx;
    v1::ListServicesRequest req;
    v1::ListServicesResponse resp;
    const grpc::Status status = stub->ListServices(&ctx, req, &resp);
    EXPECT_TRUE(status.ok()) << status.error_code() << " " << status.error_message();
    for (const auto& s : resp.services()) {
      if (s.name() == service) return s.total_samples();
    }
    return 0;
  }
  void ExpectAlive() {
    ASSERT_TRUE(server_->process().running()) << server_->process().Output();
    RawAgent probe(channel_, "probe-" + std::to_string(probes_++), 99);
    ASSERT_TRUE(probe.Connect());
    ASSERT_TRUE(probe.SendGraph());
    v1::ServerMessage answer = probe.Send(probe.Batch(1, {"probe"}, 1));
    EXPECT_TRUE(answer.has_ack()) << answer.DebugString();
  }

  strata::testing::TempDir dir_{"hostile_ingest"};
  std::unique_ptr<ServerProcess> server_;
  std::shared_ptr<grpc::Channel> channel_;
  int probes_ = 0;
};

// 1. One small batch naming many services used to create a 4.4 MB table for each, never
// released: 500 services grew the server by 2.2 GB, 20,000 got it OOM-killed. Tables now
// start small and share a budget; past it a batch is refused with RESOURCE_EXHAUSTED.
TEST_F(HostileIngestTest, ManyServicesStayWithinTheTableBudget) {
  Start({"--table-memory", "64MiB", "--max-batch-services", "100000", "--max-batch-targets",
         "100000"});
  const double base = RssMiB(server_->process().pid());
  {
    RawAgent agent(channel_, "many-500", 1);
    ASSERT_TRUE(agent.Connect());
    ASSERT_TRUE(agent.SendGraph());
    v1::ServerMessage answer = agent.Send(agent.Batch(1, ServiceNames("svc-", 500), 1));
    EXPECT_TRUE(answer.has_ack()) << answer.DebugString();
  }
  const double after_500 = RssMiB(server_->process().pid());
  {
    RawAgent agent(channel_, "many-20000", 1);
    ASSERT_TRUE(agent.Connect());
    ASSERT_TRUE(agent.SendGraph());
    v1::ServerMessage answer = agent.Send(agent.Batch(1, ServiceNames("more-", 20000), 1));
    ASSERT_TRUE(answer.has_error()) << answer.DebugString();
    EXPECT_EQ(answer.error().code(), static_cast<int>(grpc::StatusCode::RESOURCE_EXHAUSTED));
    EXPECT_TRUE(answer.error().fatal());
    EXPECT_GT(answer.error().retry_after_ms(), 0u);
    EXPECT_EQ(agent.Finish().error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  }
  const double after_20000 = RssMiB(server_->process().pid());
  std::printf("server RSS: %.1f MiB at start, %.1f MiB after the 500-service batch, %.1f MiB "
              "after the 20,000-service batch (table budget 64 MiB)\n",
              base, after_500, after_20000);
  EXPECT_LT(after_20000 - base, 64 + 64);  // the budget plus decoding and gRPC buffers
  EXPECT_EQ(Total("svc-7"), 1u);
  EXPECT_EQ(Total("more-7"), 0u);
  ExpectAlive();
}

TEST_F(HostileIngestTest, TooManyServicesInOneBatchAreRefusedByDefault) {
  Start();
  RawAgent agent(channel_, "many", 1);
  ASSERT_TRUE(agent.Connect());
  ASSERT_TRUE(agent.SendGraph());
  v1::ServerMessage answer = agent.Send(agent.Batch(1, ServiceNames("svc-", 500), 1));
  ASSERT_TRUE(answer.has_error());
  EXPECT_EQ(answer.error().code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_NE(answer.error().message().find("--max-batch-services"), std::string::npos);
  // The stream goes on for well-formed batches.
  answer = agent.Send(agent.Batch(2, {"svc-1"}, 3));
  EXPECT_TRUE(answer.has_ack()) << answer.DebugString();
  EXPECT_EQ(Total("svc-1"), 3u);
}

// 2. Unbounded messages: a 33 MB graph delta, a 5 MB version string, 200,000 labels.
TEST_F(HostileIngestTest, OversizedMessagesAreRefused) {
  Start();
  const double base = RssMiB(server_->process().pid());
  {
    RawAgent agent(channel_, "huge-delta", 1);
    ASSERT_TRUE(agent.Connect());
    v1::AgentMessage m;
    v1::GraphDelta* d = m.mutable_graph_delta();
    d->set_first_node(2);
    for (uint32_t n = 0; n < 1'000'000; ++n) {
      auto* node = d->add_nodes();
      node->set_id(2 + n);
      node->set_name(absl::StrCat("function_number_", n));
      auto* edge = d->add_edges();
      edge->set_caller(0);
      edge->set_callee(2 + n);
      edge->set_call_site(n);
    }
    agent.Write(m);
    v1::ServerMessage answer;
    EXPECT_FALSE(agent.Answer(&answer));
    EXPECT_EQ(agent.Finish().error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  }
  const double after_huge = RssMiB(server_->process().pid());
  double after_max = 0;
  {
    // The largest delta the limits allow: 65,536 nodes with 150-byte names and 262,144
    // edges, just under the 16 MiB message limit. Accepted and stored.
    RawAgent agent(channel_, "max-delta", 1);
    ASSERT_TRUE(agent.Connect());
    v1::AgentMessage m;
    v1::GraphDelta* d = m.mutable_graph_delta();
    d->set_first_node(2);
    for (uint32_t n = 0; n < 65'536; ++n) {
      auto* node = d->add_nodes();
      node->set_id(2 + n);
      node->set_name(absl::StrCat(std::string(140, 'f'), "_", n));
      node->set_module("/usr/lib/x86_64-linux-gnu/libhostile.so");
    }
    d->set_first_edge(0);
    for (uint32_t e = 0; e < 262'144; ++e) {
      auto* edge = d->add_edges();
      edge->set_caller(e < 65'536 ? 0 : 2 + (e * 7919) % 65'536);
      edge->set_callee(2 + e % 65'536);
      edge->set_call_site(e);
    }
    ASSERT_LT(m.ByteSizeLong(), 16u << 20);
    ASSERT_TRUE(agent.Write(m));
    // The server applies the delta before it sees the end of the stream.
    EXPECT_TRUE(agent.Finish().ok());
    after_max = RssMiB(server_->process().pid());
    RawAgent again(channel_, "max-delta", 1);
    ASSERT_TRUE(again.Connect());
    EXPECT_EQ(again.welcome().known_nodes(), 2u + 65'536u);
    EXPECT_EQ(again.welcome().known_edges(), 262'144u);
  }
  const double after_reload = RssMiB(server_->process().pid());
  std::printf("server RSS: %.1f MiB at start, %.1f MiB after a 1,000,000-node delta (refused), "
              "%.1f MiB after a maximum-size delta (65,536 nodes, 262,144 edges), %.1f MiB "
              "after a second stream reloaded that graph\n",
              base, after_huge, after_max, after_reload);
  EXPECT_LT(after_reload, 1024);
  {
    RawAgent agent(channel_, "big-version", 1);
    v1::Hello hello = agent.MakeHello();
    hello.set_version(std::string(5 << 20, 'v'));
    EXPECT_FALSE(agent.Connect(&hello));
    EXPECT_EQ(agent.Finish().error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  }
  {
    RawAgent agent(channel_, "many-labels", 1);
    v1::Hello hello = agent.MakeHello();
    for (int i = 0; i < 200'000; ++i) (*hello.mutable_labels())[absl::StrCat("k", i)] = "v";
    EXPECT_FALSE(agent.Connect(&hello));
    EXPECT_EQ(agent.Finish().error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  }
  ExpectAlive();
}

// 3. Sequence numbers: a restarted agent (same agent ID, new graph) numbering from 1 again
// was acknowledged without being stored; one batch numbered 2^64-1 made every later batch
// of the agent ID look like a replay, for good.
TEST_F(HostileIngestTest, SequenceNumbersCannotLoseData) {
  Start();
  uint64_t sent = 0;
  for (uint64_t incarnation = 1; incarnation <= 3; ++incarnation) {
    RawAgent agent(channel_, "restarting", incarnation);
    ASSERT_TRUE(agent.Connect());
    EXPECT_EQ(agent.welcome().last_applied_sequence(), 0u);
    ASSERT_TRUE(agent.SendGraph());
    for (uint64_t seq = 1; seq <= 5; ++seq) {
      v1::ServerMessage answer = agent.Send(agent.Batch(seq, {"restarts"}, seq));
      ASSERT_TRUE(answer.has_ack()) << answer.DebugString();
      sent += seq;
    }
  }
  EXPECT_EQ(Total("restarts"), sent);

  RawAgent agent(channel_, "poisoner", 1);
  ASSERT_TRUE(agent.Connect());
  ASSERT_TRUE(agent.SendGraph());
  v1::ServerMessage answer = agent.Send(agent.Batch(UINT64_MAX, {"poison"}, 7));
  ASSERT_TRUE(answer.has_error()) << answer.DebugString();
  EXPECT_EQ(answer.error().code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
  for (uint64_t seq = 1; seq <= 3; ++seq) {
    answer = agent.Send(agent.Batch(seq, {"poison"}, 2));
    EXPECT_TRUE(answer.has_ack()) << answer.DebugString();
  }
  // A resend is acknowledged without counting twice.
  answer = agent.Send(agent.Batch(3, {"poison"}, 2));
  EXPECT_TRUE(answer.has_ack());
  EXPECT_EQ(Total("poison"), 6u);
}

// The same with the real agent: restarted with the same --agent-id, it numbers its batches
// from 1 again (55 % of a 40 s run was lost that way). Every sample of both runs is stored.
TEST_F(HostileIngestTest, RealAgentRestartedWithTheSameIdLosesNothing) {
  Start();
  ChildProcess demo({BinPath("demo_service")}, dir_.path() + "/demo.log",
                    {{"STRATA_SERVICE", "demo"}});
  ASSERT_TRUE(demo.WaitForOutput("ready", 30)) << demo.Output();
  uint64_t counted = 0;
  for (int run = 0; run < 2; ++run) {
    const uint64_t before = Total("demo");
    ChildProcess agent({BinPath("strata-agent"), "--server", server_->address(), "--pid",
                        std::to_string(demo.pid()), "--interval", "1", "--agent-id",
                        "same-id", "--spool-dir", dir_.path() + "/spool"},
                       dir_.path() + "/agent" + std::to_string(run) + ".log");
    // Wait for this run's samples to arrive, by condition (a loaded machine may be slow).
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (Total("demo") < before + 100 && std::chrono::steady_clock::now() < deadline) {
      ASSERT_TRUE(agent.running()) << agent.Output();
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    ASSERT_GE(Total("demo"), before + 100) << agent.Output();
    EXPECT_EQ(agent.Stop(SIGTERM, 30), 0) << agent.Output();
    const uint64_t samples = AgentSampleCount(agent.Output());
    ASSERT_GT(samples, 0u) << agent.Output();
    counted += samples;
  }
  EXPECT_EQ(Total("demo"), counted);
}

// gRPC 1.51 stops listening for good once accept4() fails for want of open files
// (server/app/grpc_log.h): agents that reconnect and queries then hung while the process ran
// on. The server now shuts down cleanly, keeping what it acknowledged, and exits with status 1
// for its supervisor to restart it.
TEST_F(HostileIngestTest, AServerOutOfOpenFilesExitsToBeRestartedAndKeepsItsData) {
  Start({}, {"/usr/bin/prlimit", "--nofile=256"});
  {
    RawAgent agent(channel_, "before-the-flood", 1);
    ASSERT_TRUE(agent.Connect());
    ASSERT_TRUE(agent.SendGraph());
    ASSERT_TRUE(agent.Send(agent.Batch(1, {"kept"}, 5)).has_ack());
  }
  // Connections that never speak: each one gRPC accepts takes a file of the server's.
  std::vector<base::UniqueFd> flood;
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(server_->port()));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  for (int i = 0; i < 400; ++i) {
    base::UniqueFd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    ASSERT_GE(fd.get(), 0);
    ASSERT_EQ(connect(fd.get(), reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
    flood.push_back(std::move(fd));
  }
  EXPECT_EQ(server_->process().Wait(60), 1) << server_->process().Output();
  EXPECT_THAT(server_->process().Output(), ::testing::HasSubstr("gRPC stopped taking"));
  flood.clear();
  // The same data directory; a new log, which the restarted server's port is read from.
  ASSERT_EQ(std::rename((dir_.path() + "/server.log").c_str(),
                        (dir_.path() + "/server-flooded.log").c_str()), 0);
  Start();
  EXPECT_EQ(Total("kept"), 5u) << server_->process().Output();
}

// A message that is not an AgentMessage ends its stream with INVALID_ARGUMENT saying so (it
// ended with OK, as if the agent had closed its side); what the stream sent before is kept.
TEST_F(HostileIngestTest, AMessageThatDoesNotParseEndsItsStreamWithAClearError) {
  Start();
  RawAgent agent(channel_, "garbler", 1);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  // The stream as bytes, as the generated stub opens it typed.
  using BytesStream = grpc::internal::ClientReaderWriterFactory<grpc::ByteBuffer, grpc::ByteBuffer>;
  std::unique_ptr<grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>> stream(
      BytesStream::Create(channel_.get(),
                          grpc::internal::RpcMethod("/strata.v1.Ingest/Connect",
                                                    grpc::internal::RpcMethod::BIDI_STREAMING,
                                                    channel_),
                          &context));
  auto write = [&](const v1::AgentMessage& m) {
    grpc::ByteBuffer bytes;
    bool own = false;
    ASSERT_TRUE(grpc::SerializationTraits<v1::AgentMessage>::Serialize(m, &bytes, &own).ok());
    ASSERT_TRUE(stream->Write(bytes));
  };
  v1::AgentMessage hello;
  *hello.mutable_hello() = agent.MakeHello();
  write(hello);
  grpc::ByteBuffer reply;
  v1::ServerMessage answer;
  auto read_until = [&](bool (v1::ServerMessage::*has)() const) {
    while (!(answer.*has)() && stream->Read(&reply)) {
      ASSERT_TRUE(grpc::SerializationTraits<v1::ServerMessage>::Deserialize(&reply, &answer).ok());
    }
    ASSERT_TRUE((answer.*has)()) << answer.DebugString();
  };
  read_until(&v1::ServerMessage::has_welcome);
  write(agent.GraphMessage(answer.welcome()));
  write(agent.Batch(1, {"before-garbage"}, 3));
  read_until(&v1::ServerMessage::has_ack);
  // Field 1 as 127 bytes long, and 3 bytes: no protobuf message parses from it.
  const grpc::Slice garbage(std::string("\x0a\x7f" "abc"));
  grpc::ByteBuffer bytes(&garbage, 1);
  ASSERT_TRUE(stream->Write(bytes));
  stream->WritesDone();
  while (stream->Read(&reply)) {
  }
  const grpc::Status status = stream->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
      << status.error_message() << server_->process().Output();
  EXPECT_THAT(status.error_message(),
              ::testing::HasSubstr("message 4 of the stream is not a strata.v1.AgentMessage"));
  EXPECT_EQ(Total("before-garbage"), 3u);
  ExpectAlive();
}

// Names are an agent's to choose. The CLI prints their control characters escaped, so a
// hostile agent cannot drive an operator's terminal (clear it, retitle it, fake its output).
TEST_F(HostileIngestTest, ControlCharactersInNamesDoNotReachTheOperatorsTerminal) {
  Start();
  const std::string service = "esc\x1b[2J\x1b]0;owned\x07" "ape";
  RawAgent agent(channel_, "escaper", 1);
  ASSERT_TRUE(agent.Connect());
  ASSERT_TRUE(agent.SendGraph());
  ASSERT_TRUE(agent.Send(agent.Batch(1, {service}, 3)).has_ack());
  for (const std::vector<std::string>& command :
       {std::vector<std::string>{"services"},
        std::vector<std::string>{"top", "--service", service, "--since", "1h"}}) {
    std::vector<std::string> argv{BinPath("strata"), "--server", server_->address()};
    argv.insert(argv.end(), command.begin(), command.end());
    const CommandResult r = RunCommand(argv);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(r.output.find('\x1b'), std::string::npos) << command[0];
    EXPECT_EQ(r.output.find('\x07'), std::string::npos) << command[0];
    EXPECT_THAT(r.output, ::testing::HasSubstr("esc\\x1b[2J\\x1b]0;owned\\x07ape"))
        << command[0];
  }
}

// Past --max-agents new streams are refused with RESOURCE_EXHAUSTED and a retry delay; they
// get in when others leave. The real agent backs off and then delivers everything.
TEST_F(HostileIngestTest, AgentsOverTheLimitAreRefusedAndGetInLater) {
  Start({"--max-agents", "2"});
  auto first = std::make_unique<RawAgent>(channel_, "first", 1);
  ASSERT_TRUE(first->Connect());
  RawAgent second(channel_, "second", 1);
  ASSERT_TRUE(second.Connect());
  {
    RawAgent third(channel_, "third", 1);
    v1::AgentMessage hello;
    *hello.mutable_hello() = third.MakeHello();
    third.Write(hello);
    v1::ServerMessage answer;
    ASSERT_TRUE(third.Answer(&answer));
    ASSERT_TRUE(answer.has_error()) << answer.DebugString();
    EXPECT_EQ(answer.error().code(), static_cast<int>(grpc::StatusCode::RESOURCE_EXHAUSTED));
    EXPECT_TRUE(answer.error().fatal());
    EXPECT_GT(answer.error().retry_after_ms(), 0u);
    EXPECT_EQ(third.Finish().error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  }
  ChildProcess demo({BinPath("demo_service")}, dir_.path() + "/demo.log",
                    {{"STRATA_SERVICE", "demo"}});
  ASSERT_TRUE(demo.WaitForOutput("ready", 30)) << demo.Output();
  ChildProcess agent({BinPath("strata-agent"), "--server", server_->address(), "--pid",
                      std::to_string(demo.pid()), "--interval", "1", "--spool-dir",
                      dir_.path() + "/spool"},
                     dir_.path() + "/agent.log");
  ASSERT_TRUE(agent.WaitForOutput("cannot connect", 60))
      << agent.Output() << "\nserver:\n" << server_->process().Output();
  EXPECT_EQ(Total("demo"), 0u);
  // One leaves: the agent gets in after its backoff and ships what it had spooled.
  ASSERT_TRUE(first->Finish().ok());
  first.reset();
  ASSERT_TRUE(agent.WaitForOutput("connected to strata-server", 60)) << agent.Output();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (Total("demo") == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  EXPECT_EQ(agent.Stop(SIGTERM, 30), 0) << agent.Output();
  const uint64_t samples = AgentSampleCount(agent.Output());
  EXPECT_GT(samples, 0u) << agent.Output();
  EXPECT_EQ(Total("demo"), samples);
}

// 4. A count of 2^64-1 followed by 2 made the service total 1.
TEST_F(HostileIngestTest, CountsNeverWrap) {
  Start();
  RawAgent agent(channel_, "counter", 1);
  ASSERT_TRUE(agent.Connect());
  ASSERT_TRUE(agent.SendGraph());
  v1::ServerMessage answer = agent.Send(agent.Batch(1, {"wrap"}, UINT64_MAX));
  ASSERT_TRUE(answer.has_error()) << answer.DebugString();
  EXPECT_EQ(answer.error().code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
  const uint64_t largest = (uint64_t{1} << 32) - 1;
  answer = agent.Send(agent.Batch(2, {"wrap"}, largest));
  EXPECT_TRUE(answer.has_ack()) << answer.DebugString();
  answer = agent.Send(agent.Batch(3, {"wrap"}, 2));
  EXPECT_TRUE(answer.has_ack()) << answer.DebugString();
  EXPECT_EQ(Total("wrap"), largest + 2);
}

// A graph delta's packed edges are decoded before anything of the delta is applied: a field
// that does not decode, a delta with both forms of its edges, or more edges than a delta may
// carry end the stream with INVALID_ARGUMENT, and what was accepted before stays.
TEST_F(HostileIngestTest, PackedEdgesAreCheckedBeforeAnythingIsStored) {
  Start();
  {
    RawAgent agent(channel_, "packed", 1);
    ASSERT_TRUE(agent.Connect());
    ASSERT_TRUE(agent.SendGraph(/*packed=*/true));
    v1::ServerMessage answer = agent.Send(agent.Batch(1, {"packed"}, 5));
    ASSERT_TRUE(answer.has_ack()) << answer.DebugString();
    EXPECT_TRUE(agent.Finish().ok());
  }
  ASSERT_EQ(Total("packed"), 5u);
  uint32_t known_nodes = 0;
  uint64_t known_edges = 0;
  {
    RawAgent agent(channel_, "packed", 1);
    ASSERT_TRUE(agent.Connect());
    known_nodes = agent.welcome().known_nodes();
    known_edges = agent.welcome().known_edges();
    ASSERT_GT(known_edges, 0u);
  }
  auto delta = [&](auto fill) {
    v1::AgentMessage m;
    v1::GraphDelta* d = m.mutable_graph_delta();
    d->set_first_node(known_nodes);
    d->set_first_edge(known_edges);
    fill(d);
    return m;
  };
  ASSERT_GT(known_nodes, 2u);
  std::vector<encoding::CallEdge> too_many;  // call sites scattered: about 4 bytes an edge
  for (uint32_t e = 0; e < (1u << 18) + 1; ++e) {
    too_many.push_back({2 + e % (known_nodes - 2), (e * 2654435761ull) % (1ull << 32),
                        2 + (e / 3) % (known_nodes - 2)});
  }
  const std::optional<std::string> too_many_packed =
      encoding::EncodePackedEdges(too_many, known_nodes);
  ASSERT_TRUE(too_many_packed.has_value());  // about 4 bytes an edge: within the per-byte bound
  const struct {
    const char* what;
    v1::AgentMessage message;
    const char* error;
  } hostile[] = {
      {"garbage", delta([](v1::GraphDelta* d) { d->set_packed_edges("\x01garbage"); }),
       "packed edges"},
      {"unknown version", delta([](v1::GraphDelta* d) { d->set_packed_edges("\x09\x10"); }),
       "unknown version"},
      {"both forms", delta([](v1::GraphDelta* d) {
         d->set_packed_edges(*encoding::EncodePackedEdges({{{0, 0, 2}}}, 2));
         auto* e = d->add_edges();
         e->set_callee(2);
       }),
       "both"},
      {"too many edges",
       delta([&](v1::GraphDelta* d) { d->set_packed_edges(*too_many_packed); }),
       "edges in"},
  };
  for (const auto& h : hostile) {
    RawAgent agent(channel_, "packed", 1);
    ASSERT_TRUE(agent.Connect()) << h.what;
    ASSERT_TRUE(agent.Write(h.message)) << h.what;
    const grpc::Status status = agent.Finish();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << h.what;
    EXPECT_THAT(status.error_message(), ::testing::HasSubstr(h.error)) << h.what;
  }
  RawAgent agent(channel_, "packed", 1);
  ASSERT_TRUE(agent.Connect());
  EXPECT_EQ(agent.welcome().known_nodes(), known_nodes);
  EXPECT_EQ(agent.welcome().known_edges(), known_edges);
  EXPECT_EQ(Total("packed"), 5u);
  ExpectAlive();
}

}  // namespace
}  // namespace strata::e2e
