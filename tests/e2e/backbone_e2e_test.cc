// The backbone end to end on loopback: real strata-server (RocksDB in a temp dir), the demo
// workload, real strata-agent with perf events, and the strata CLI.
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "strata/v1/ingest.grpc.pb.h"
#include "strata/v1/query.grpc.pb.h"
#include "tests/e2e/harness.h"

namespace strata::e2e {
namespace {

using ::testing::HasSubstr;

class BackboneTest : public ::testing::Test {
 protected:
  strata::testing::TempDir dir_{"strata_e2e"};
};

TEST_F(BackboneTest, DemoHotPathsSurviveRestart) {
  const std::string data = dir_.File("data");
  auto server = std::make_unique<ServerProcess>(data, dir_.File("server.log"));
  ASSERT_GT(server->port(), 0) << server->process().Output();

  ChildProcess demo({BinPath("demo_service")}, dir_.File("demo.log"), {{"STRATA_SERVICE", "demo"}});
  ASSERT_TRUE(demo.WaitForOutput("ready", 30)) << demo.Output();
  ChildProcess agent({BinPath("strata-agent"), "--server", server->address(), "--pid",
                      std::to_string(demo.pid()), "--interval", "2", "--spool-dir",
                      dir_.File("spool")},
                     dir_.File("agent.log"));
  std::this_thread::sleep_for(std::chrono::seconds(15));
  ASSERT_TRUE(agent.running()) << agent.Output();
  const double agent_cpu_s = ProcessCpuSeconds(agent.pid());
  // SIGTERM: the agent ships its last interval and waits for the acknowledgement.
  EXPECT_EQ(agent.Stop(SIGTERM, 15), 0) << agent.Output();
  std::printf("C++ demo: %s\n", AgentCostReport(agent_cpu_s, agent.Output()).c_str());
  demo.Stop(SIGTERM);
  const std::optional<DemoShares> truth = DemoSharesFrom(demo.Output());
  ASSERT_TRUE(truth.has_value()) << demo.Output();

  v1::HotPathsResponse paths = QueryHotPaths(server->address(), "demo");
  // 2 busy threads at 99 Hz for ~15 s is ~3,000 samples of CPU time; a loaded CI machine
  // gives the demo less CPU, so only a floor is checked.
  EXPECT_GT(paths.total_samples(), 300u);
  RecordProperty("samples", std::to_string(paths.total_samples()));
  EXPECT_THAT(paths.archs(), ::testing::ElementsAre("x86_64"));
  std::map<DemoPath, uint64_t> by_path;
  uint64_t main_thread_samples = 0;
  for (const auto& p : paths.paths()) {
    const auto names = UserFrameNames(p);
    const DemoPath kind = ClassifyDemoPath(names);
    by_path[kind] += p.samples();
    if (kind != DemoPath::kOther && !p.truncated()) {
      // Frames run outermost first; the main thread's paths go through main.
      auto main_at = std::find(names.begin(), names.end(), "main");
      if (main_at != names.end()) {
        EXPECT_LT(main_at - names.begin(),
                  std::find(names.begin(), names.end(), "serve_forever") - names.begin());
        main_thread_samples += p.samples();
      }
    }
  }
  const double total = static_cast<double>(paths.total_samples());
  const double tokenize = 100 * by_path[DemoPath::kTokenize] / total;
  const double deflate = 100 * by_path[DemoPath::kDeflate] / total;
  const double fib = 100 * by_path[DemoPath::kFib] / total;
  // On a miss, the paths themselves: which one took the share the others lack.
  std::string listing;
  for (const auto& p : paths.paths()) {
    absl::StrAppend(&listing, "\n  ", p.samples(), p.truncated() ? " [truncated]" : "");
    for (const std::string& name : FrameNames(p)) absl::StrAppend(&listing, " ", name);
  }
  // Against the demo's own account of its CPU time per path.
  EXPECT_NEAR(tokenize, truth->tokenize, 6) << listing;
  EXPECT_NEAR(deflate, truth->deflate, 6) << listing;
  EXPECT_NEAR(fib, truth->fib, 6) << listing;
  EXPECT_GT(main_thread_samples, paths.total_samples() / 4);
  RecordProperty("tokenize_pct", std::to_string(tokenize));
  RecordProperty("deflate_pct", std::to_string(deflate));
  RecordProperty("fib_pct", std::to_string(fib));

  // The human CLI output shows the hottest path with a percentage.
  CommandResult cli = RunCommand({BinPath("strata"), "--server", server->address(), "hot-paths",
                                  "--service", "demo", "--limit", "3"});
  EXPECT_EQ(cli.exit_code, 0) << cli.output;
  EXPECT_THAT(cli.output, HasSubstr("serve_forever > handle_request > parse_request > tokenize"));
  EXPECT_THAT(cli.output, HasSubstr("%"));
  CommandResult top = RunCommand(
      {BinPath("strata"), "--server", server->address(), "--json", "top", "--service", "demo"});
  EXPECT_EQ(top.exit_code, 0) << top.output;
  EXPECT_THAT(top.output, HasSubstr("\"tokenize\""));

  // Restart on the same directory: every acknowledged sample is still there.
  EXPECT_EQ(server->process().Stop(SIGTERM, 15), 0) << server->process().Output();
  server = std::make_unique<ServerProcess>(data, dir_.File("server2.log"));
  ASSERT_GT(server->port(), 0) << server->process().Output();
  v1::HotPathsResponse again = QueryHotPaths(server->address(), "demo");
  EXPECT_EQ(again.total_samples(), paths.total_samples());
  ASSERT_EQ(again.paths_size(), paths.paths_size());
  EXPECT_EQ(FrameNames(again.paths(0)), FrameNames(paths.paths(0)));
}

// A raw ingest client speaking the protocol by hand.
class RawAgent {
 public:
  RawAgent(const std::shared_ptr<grpc::Channel>& channel, const std::string& agent_id)
      : stub_(v1::Ingest::NewStub(channel)) {
    stream_ = stub_->Connect(&context_);
    agent_id_ = agent_id;
  }
  bool Hello() {
    v1::AgentMessage m;
    m.mutable_hello()->set_agent_id(agent_id_);
    m.mutable_hello()->set_host("test-host");
    m.mutable_hello()->set_arch("x86_64");
    m.mutable_hello()->set_graph_id(1);
    v1::ServerMessage welcome;
    return stream_->Write(m) && stream_->Read(&welcome) && welcome.has_welcome();
  }
  bool Send(const v1::AgentMessage& m) { return stream_->Write(m); }
  v1::ServerMessage Read() {
    v1::ServerMessage m;
    EXPECT_TRUE(stream_->Read(&m));
    return m;
  }
  grpc::Status Finish() {
    stream_->WritesDone();
    return stream_->Finish();
  }

  // A graph with root -> main -> work and a batch of `count` samples of that path.
  static v1::AgentMessage Graph() {
    v1::AgentMessage m;
    auto* d = m.mutable_graph_delta();
    d->set_first_node(2);
    for (const char* name : {"main", "work"}) {
      auto* n = d->add_nodes();
      n->set_id(2 + d->nodes_size() - 1);
      n->set_name(name);
      n->set_module("/bin/raw");
    }
    d->set_first_edge(0);
    auto* e0 = d->add_edges();
    e0->set_caller(0);
    e0->set_callee(2);
    auto* e1 = d->add_edges();
    e1->set_caller(2);
    e1->set_call_site(0x10);
    e1->set_callee(3);
    return m;
  }
  static v1::AgentMessage Batch(uint64_t seq, uint64_t count, uint32_t leaf = 3,
                                uint64_t id = 0, uint64_t epoch = 2) {
    v1::AgentMessage m;
    auto* b = m.mutable_sample_batch();
    b->set_sequence(seq);
    b->set_epoch(epoch);
    b->set_start_ms(1'700'000'000'000);
    b->set_end_ms(1'700'000'010'000);
    auto* t = b->add_targets();
    t->set_id(1);
    t->set_service("raw");
    t->set_pid(1);
    auto* c = b->add_contexts();
    c->set_target_id(1);
    c->set_leaf(leaf);
    c->add_ids(id);
    c->set_count(count);
    return m;
  }

 private:
  std::unique_ptr<v1::Ingest::Stub> stub_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::AgentMessage, v1::ServerMessage>> stream_;
  std::string agent_id_;
};

// Batches a quarter of a second apart: the agent reads each acknowledgement when it sends
// the next batch (Shipper::Session), never later, so nothing waits in its spool for the disk.
TEST_F(BackboneTest, AnAgentShippingOftenReadsEachAcknowledgementWithTheNextBatch) {
  ServerProcess server(dir_.File("data"), dir_.File("server.log"));
  ASSERT_GT(server.port(), 0) << server.process().Output();
  ChildProcess demo({BinPath("demo_service")}, dir_.File("demo.log"), {{"STRATA_SERVICE", "demo"}});
  ASSERT_TRUE(demo.WaitForOutput("ready", 30)) << demo.Output();
  ChildProcess agent({BinPath("strata-agent"), "--server", server.address(), "--pid",
                      std::to_string(demo.pid()), "--interval", "0.25", "--spool-dir",
                      dir_.File("spool"), "--log-level", "debug"},
                     dir_.File("agent.log"));
  ASSERT_TRUE(agent.WaitForOutput("spooled batch 12 ", 60)) << agent.Output();
  // Read as batch 12 goes, or a later one if the server was slow; a shipper that read them
  // only once batches stop coming (2.5 s after the last) never would while they flow.
  EXPECT_TRUE(agent.WaitForOutput("acknowledged through batch 11\n", 5)) << agent.Output();
  EXPECT_EQ(agent.Stop(SIGTERM, 15), 0) << agent.Output();
  // A first start on a new data directory is not an error.
  EXPECT_EQ(server.process().Output().find("[error]"), std::string::npos)
      << server.process().Output();
}

TEST_F(BackboneTest, BadInputGetsClearErrorsAndOthersKeepServing) {
  ServerProcess server(dir_.File("data"), dir_.File("server.log"));
  ASSERT_GT(server.port(), 0) << server.process().Output();
  auto channel = server.Channel();

  // A stream that does not start with Hello is refused.
  {
    RawAgent bad(channel, "bad-0");
    ASSERT_TRUE(bad.Send(RawAgent::Batch(1, 1)));
    grpc::Status status = bad.Finish();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(status.error_message(), HasSubstr("Hello"));
  }

  RawAgent good(channel, "good");
  ASSERT_TRUE(good.Hello());
  ASSERT_TRUE(good.Send(RawAgent::Graph()));
  ASSERT_TRUE(good.Send(RawAgent::Batch(1, 5)));
  EXPECT_EQ(good.Read().ack().sequence(), 1u);

  RawAgent bad(channel, "bad-1");
  ASSERT_TRUE(bad.Hello());
  ASSERT_TRUE(bad.Send(RawAgent::Graph()));
  // Unknown leaf node.
  ASSERT_TRUE(bad.Send(RawAgent::Batch(1, 7, /*leaf=*/99)));
  v1::ServerMessage reply = bad.Read();
  ASSERT_TRUE(reply.has_error()) << reply.DebugString();
  EXPECT_EQ(reply.error().code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_EQ(reply.error().sequence(), 1u);
  // ID out of range for the leaf.
  ASSERT_TRUE(bad.Send(RawAgent::Batch(2, 7, 3, /*id=*/1'000'000)));
  reply = bad.Read();
  ASSERT_TRUE(reply.has_error());
  EXPECT_THAT(reply.error().message(), HasSubstr("undecodable"));
  // Epoch beyond the graph the server has: Resync, then an error for the batch.
  ASSERT_TRUE(bad.Send(RawAgent::Batch(3, 7, 3, 0, /*epoch=*/50)));
  reply = bad.Read();
  EXPECT_TRUE(reply.has_resync()) << reply.DebugString();
  EXPECT_TRUE(bad.Read().has_error());
  // A delta with an edge to a node that does not exist: the agent's graph and the server's
  // now differ, so the stream ends with the error (the agent starts over after reconnecting).
  v1::AgentMessage broken = RawAgent::Graph();
  broken.mutable_graph_delta()->set_first_node(4);
  broken.mutable_graph_delta()->mutable_nodes(0)->set_id(4);
  broken.mutable_graph_delta()->mutable_nodes(1)->set_id(5);
  broken.mutable_graph_delta()->set_first_edge(2);
  broken.mutable_graph_delta()->mutable_edges(0)->set_callee(77);
  ASSERT_TRUE(bad.Send(broken));
  reply = bad.Read();
  ASSERT_TRUE(reply.has_error()) << reply.DebugString();
  EXPECT_THAT(reply.error().message(), HasSubstr("unknown node"));
  EXPECT_TRUE(reply.error().fatal());

  // The well-behaved agent is unaffected and its data is intact.
  ASSERT_TRUE(good.Send(RawAgent::Batch(2, 3)));
  EXPECT_EQ(good.Read().ack().sequence(), 2u);
  // A resent batch is acknowledged but not counted twice.
  ASSERT_TRUE(good.Send(RawAgent::Batch(2, 3)));
  EXPECT_EQ(good.Read().ack().sequence(), 2u);
  EXPECT_TRUE(good.Finish().ok());
  EXPECT_EQ(bad.Finish().error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  auto stub = v1::Query::NewStub(channel);
  v1::HotPathsRequest request;
  request.mutable_filter()->set_service("raw");
  grpc::ClientContext context;
  v1::HotPathsResponse response;
  ASSERT_TRUE(stub->HotPaths(&context, request, &response).ok());
  EXPECT_EQ(response.total_samples(), 8u);
  ASSERT_EQ(response.paths_size(), 1);
  EXPECT_EQ(FrameNames(response.paths(0)), (std::vector<std::string>{"main", "work"}));
  EXPECT_TRUE(server.process().running());
}

TEST_F(BackboneTest, CliReportsUnreachableServerAndBadFlags) {
  // A port nobody listens on: bind-and-release would race; port 1 is privileged and unused.
  CommandResult r = RunCommand({BinPath("strata"), "--server", "127.0.0.1:1", "--timeout", "5",
                                "services"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("cannot reach strata-server at 127.0.0.1:1"));
  // No wait at all would fail every call as if the server were unreachable.
  r = RunCommand({BinPath("strata"), "--server", "127.0.0.1:1", "--timeout", "0", "services"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("--timeout: Value 0 not in range 1 to 86400"));

  ServerProcess server(dir_.File("data"), dir_.File("server.log"));
  ASSERT_GT(server.port(), 0);
  // A second server on the same port, with a store of its own, does not start (gRPC's
  // SO_REUSEPORT would have let it share the port, and the data, with the first).
  r = RunCommand({BinPath("strata-server"), "--listen", server.address(), "--http", "",
                  "--data", dir_.File("data2")});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("cannot listen on " + server.address()));
  r = RunCommand({BinPath("strata"), "--server", server.address(), "top", "--service", "nope"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("unknown service 'nope'"));
  // Commands whose answer may be empty say so too: a mistyped name is not "nothing to report".
  for (const char* command : {"regressions", "labels", "phases"}) {
    r = RunCommand({BinPath("strata"), "--server", server.address(), command, "-s", "nope"});
    EXPECT_NE(r.exit_code, 0) << command;
    EXPECT_THAT(r.output, HasSubstr("unknown service 'nope'")) << command;
  }
  // A port past 65535 would reach another server (gRPC takes it modulo 65536).
  r = RunCommand({BinPath("strata"), "--server", server.address() + "0", "services"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("is out of range"));
  // An address without a port would be dialled on the scheme's default port.
  r = RunCommand({BinPath("strata"), "--server", "127.0.0.1", "services"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("has no port"));
  r = RunCommand({BinPath("strata"), "--server", server.address(), "frobnicate"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("unknown command 'frobnicate'"));
  r = RunCommand({BinPath("strata"), "--server", server.address(), "hot-paths", "--service", "x",
                  "--since", "ten minutes"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("invalid duration"));
  // --from instead of --since, not beside it (--since was dropped unsaid).
  r = RunCommand({BinPath("strata"), "--server", server.address(), "top", "--service", "x",
                  "--since", "1h", "--from", "2026-01-01T00:00:00Z"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("--since excludes --from"));
  r = RunCommand({BinPath("strata"), "--server", server.address(), "diff", "--service", "x",
                  "--base-since", "1h", "--base-from", "2026-01-01T00:00:00Z"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("--base-since excludes --base-from"));
  // Further back than 1970 is everything (it was a "negative time range").
  r = RunCommand({BinPath("strata"), "--server", server.address(), "top", "--service", "nope",
                  "--since", "100000d"});
  EXPECT_THAT(r.output, HasSubstr("unknown service 'nope'"));
  r = RunCommand({BinPath("strata-agent"), "--server", server.address()});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("nothing to profile"));
  r = RunCommand({BinPath("strata-agent"), "--server", server.address(), "--pid", "999999999"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("no such process"));
}

}  // namespace
}  // namespace strata::e2e
