// A Strata cluster on loopback: one real etcd, three (then four) strata-server nodes with
// replication factor 2, and strata-loadgen's agents spread over the nodes. strata-loadgen
// compares what the cluster answers (a fan-out query through the first node) with what it
// delivered, per service, and exits non-zero on any loss or double count.
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/rpc/client_security.h"
#include "common/testing/temp_dir.h"
#include "gtest/gtest.h"
#include "opentelemetry/proto/collector/profiles/v1development/profiles_service.grpc.pb.h"
#include "server/cluster/etcd/etcd_test_server.h"
#include "strata/v1/capture.grpc.pb.h"
#include "strata/v1/cluster.grpc.pb.h"
#include "strata/v1/debuginfo.grpc.pb.h"
#include "strata/v1/ingest.grpc.pb.h"
#include "strata/v1/regress.grpc.pb.h"
#include "tests/e2e/harness.h"
#include "tests/e2e/http_client.h"

namespace strata::e2e {
namespace {

using server::cluster::EtcdTestServer;
using server::cluster::EtcdTestTls;

int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    close(fd);
    return 0;
  }
  close(fd);
  return ntohs(addr.sin_port);
}

// A number from strata-loadgen's JSON line.
double JsonField(const std::string& json, const std::string& name) {
  std::smatch m;
  double v = -1;
  if (std::regex_search(json, m, std::regex("\"" + name + "\":([-0-9.]+)"))) {
    (void)absl::SimpleAtod(m[1].str(), &v);
  }
  return v;
}

// A value of Prometheus text (the first line starting with `name`); -1 when absent.
double MetricIn(const std::string& body, const std::string& name) {
  const size_t at = body.find("\n" + name + " ");
  if (at == std::string::npos) return -1;
  const size_t from = at + name.size() + 2;
  double v = -1;
  (void)absl::SimpleAtod(body.substr(from, body.find('\n', from) - from), &v);
  return v;
}

// The value of `name` in the /metrics of the server with HTTP on `port`; -1 when absent.
double Metric(int port, const std::string& name) {
  auto [status, body] = strata::testing::HttpGet(port, "/metrics");
  return status == 200 ? MetricIn(body, name) : -1;
}

// Waits until `done` holds, checking every 100 ms; false after `timeout`.
template <typename Pred>
bool WaitFor(Pred done, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (done()) return true;
    absl::SleepFor(absl::Milliseconds(100));
  }
  return done();
}

class ClusterTest : public ::testing::Test {
 protected:
  struct Node {
    std::string id;
    int port = 0;
    int http_port = 0;
    std::string address() const { return absl::StrCat("127.0.0.1:", port); }
    std::unique_ptr<ChildProcess> process;
  };

  void SetUp() override {
    if (!EtcdTestServer::Available()) {
      GTEST_SKIP() << "no " << EtcdTestServer::kEtcdBinary << " (Debian package etcd-server)";
    }
    auto etcd = EtcdTestServer::Start(absl::Seconds(60), "127.0.0.1", EtcdTls());
    ASSERT_TRUE(etcd.ok()) << etcd.status();
    etcd_ = *std::move(etcd);
  }

  // etcd's TLS (none: plain text on loopback).
  virtual EtcdTestTls EtcdTls() { return {}; }

  // Adds a node (and starts it): lease TTL 3 s, so a killed node leaves the ring soon.
  Node& AddNode(std::vector<std::string> extra = {}) {
    auto node = std::make_unique<Node>();
    node->id = absl::StrCat("n", nodes_.size() + 1);
    node->port = FreePort();
    node->http_port = FreePort();
    nodes_.push_back(std::move(node));
    extra_args_.push_back(std::move(extra));
    Start(nodes_.size() - 1);
    return *nodes_.back();
  }

  void Start(size_t i) {
    Node& n = *nodes_[i];
    std::vector<std::string> argv{BinPath("strata-server"),
                                  "--listen", n.address(),
                                  "--http", absl::StrCat("127.0.0.1:", n.http_port),
                                  "--data", dir_.path() + "/" + n.id,
                                  "--cluster-etcd", etcd_->endpoint(),
                                  "--node-id", n.id,
                                  "--cluster-lease-ttl", lease_ttl_,
                                  "--cluster-replica-timeout", "2s"};
    const std::vector<std::string> security = SecurityArgs(n.id);
    argv.insert(argv.end(), security.begin(), security.end());
    argv.insert(argv.end(), extra_args_[i].begin(), extra_args_[i].end());
    n.process = std::make_unique<ChildProcess>(
        argv, absl::StrCat(dir_.path(), "/", n.id, ".", ++starts_, ".log"));
    ASSERT_TRUE(n.process->WaitForOutput("ready on port", 60)) << n.process->Output();
  }

  std::string Addresses() const {
    std::vector<std::string> out;
    for (const auto& n : nodes_) out.push_back(n->address());
    return absl::StrJoin(out, ",");
  }

  // A node's TLS and authentication flags (none: plaintext, open, on loopback).
  virtual std::vector<std::string> SecurityArgs(const std::string& node_id) { return {}; }
  // strata-loadgen's TLS and token flags.
  virtual std::vector<std::string> LoadSecurityArgs() { return {}; }
  // A node's /metrics text.
  virtual std::string MetricsText(const Node& n) {
    auto [status, body] = strata::testing::HttpGet(n.http_port, "/metrics");
    return status == 200 ? body : "";
  }
  double Metric(const Node& n, const std::string& name) { return MetricIn(MetricsText(n), name); }

  // `servers`: the nodes the agents and the final query go to (empty: every node).
  std::unique_ptr<ChildProcess> StartLoad(int duration_s, const std::string& prefix,
                                          int agents = 30, std::vector<std::string> extra = {},
                                          const std::string& servers = "") {
    std::vector<std::string> argv{BinPath("strata-loadgen"), "--server",
                                  servers.empty() ? Addresses() : servers,
                                  "--agents", std::to_string(agents), "--interval", "2",
                                  "--duration", std::to_string(duration_s),
                                  "--ramp-up", "2", "--rate", "99", "--max-backoff", "3",
                                  "--drain-timeout", "90", "--service-prefix", prefix,
                                  "--services", "3", "--json"};
    const std::vector<std::string> security = LoadSecurityArgs();
    argv.insert(argv.end(), security.begin(), security.end());
    argv.insert(argv.end(), extra.begin(), extra.end());
    return std::make_unique<ChildProcess>(
        argv, absl::StrCat(dir_.path(), "/loadgen-", prefix, "-", ++loads_, ".log"));
  }

  // Waits for strata-loadgen and checks its verdict: every sample delivered is in the
  // cluster's answer exactly once.
  void ExpectExact(ChildProcess& load, double timeout_s) {
    const int code = load.Wait(timeout_s);
    const std::string out = load.Output();
    std::printf("%s\n", out.c_str());
    EXPECT_EQ(code, 0) << out << Logs();
    EXPECT_NE(out.find("\"ok\":true"), std::string::npos) << out;
    EXPECT_EQ(JsonField(out, "lost"), 0) << out;
    EXPECT_EQ(JsonField(out, "extra"), 0) << out;
    EXPECT_EQ(JsonField(out, "unacknowledged"), 0) << out;
    EXPECT_GT(JsonField(out, "samples"), 0) << out;
  }

  std::string Logs() {
    std::string out;
    for (const auto& n : nodes_) {
      if (n->process == nullptr) continue;
      std::string log = n->process->Output();
      if (log.size() > 3000) log = log.substr(log.size() - 3000);
      absl::StrAppend(&out, "\n--- ", n->id, " ---\n", log);
    }
    return out;
  }

  // Waits until every running node sees all of them live. A request placed while some node
  // still misses a member is stored by the owners on that node's ring: a host's samples are
  // then split between two replicas, and with a node stopped a query (which takes each host
  // from one replica) finds only part of them.
  void WaitForRing() {
    const double n = static_cast<double>(nodes_.size());
    for (const auto& node : nodes_) {
      ASSERT_TRUE(WaitFor(
          [&] { return Metric(*node, "strata_cluster_nodes{state=\"live\"}") == n; },
          absl::Seconds(30)))
          << node->id << Logs();
    }
  }

  bool LoadFlowing() {
    double replicated = 0;
    for (const auto& n : nodes_) {
      if (n->process != nullptr && n->process->running()) {
        replicated += std::max(0.0, Metric(*n, "strata_cluster_batches_replicated_total"));
      }
    }
    return replicated >= 30;
  }

  std::unique_ptr<EtcdTestServer> etcd_;
  std::vector<std::unique_ptr<Node>> nodes_;
  std::vector<std::vector<std::string>> extra_args_;
  std::string lease_ttl_ = "3s";
  int starts_ = 0;
  int loads_ = 0;
  strata::testing::TempDir dir_{"cluster_e2e"};
};

// A node killed with SIGKILL in the middle of a minute of load, restarted later: its agents
// move to the other nodes, its hosts' replicas answer queries meanwhile, and the totals are
// exact.
TEST_F(ClusterTest, KilledNodeRestartedUnderLoadLosesAndDoublesNothing) {
  for (int i = 0; i < 3; ++i) AddNode();
  auto load = StartLoad(60, "kill");
  ASSERT_TRUE(WaitFor([&] { return LoadFlowing(); }, absl::Seconds(60))) << Logs();
  absl::SleepFor(absl::Seconds(5));
  Node& victim = *nodes_[1];
  victim.process->Stop(SIGKILL);
  Node& n1 = *nodes_[0];
  ASSERT_TRUE(WaitFor([&] { return Metric(n1, "strata_cluster_nodes{state=\"down\"}") == 1; },
                      absl::Seconds(30)))
      << Logs();
  // Queries during the outage are complete from the replicas: nothing is named unreachable.
  absl::SleepFor(absl::Seconds(3));
  auto query = v1::Query::NewStub(
      grpc::CreateChannel(n1.address(), grpc::InsecureChannelCredentials()));
  {
    grpc::ClientContext ctx;
    v1::ListServicesResponse services;
    ASSERT_TRUE(query->ListServices(&ctx, {}, &services).ok());
    EXPECT_EQ(services.unreachable_nodes_size(), 0);
    ASSERT_GT(services.services_size(), 0);
    grpc::ClientContext hot_ctx;
    v1::HotPathsRequest request;
    request.mutable_filter()->set_service(services.services(0).name());
    v1::HotPathsResponse paths;
    grpc::Status s = query->HotPaths(&hot_ctx, request, &paths);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_GT(paths.total_samples(), 0u);
    EXPECT_EQ(paths.unreachable_nodes_size(), 0) << paths.unreachable_nodes(0);
  }
  absl::SleepFor(absl::Seconds(10));
  Start(1);
  ASSERT_TRUE(WaitFor([&] { return Metric(n1, "strata_cluster_nodes{state=\"live\"}") == 3; },
                      absl::Seconds(30)))
      << Logs();
  ExpectExact(*load, 240);
  // The survivors forwarded batches to the owners that replaced the dead node.
  EXPECT_GT(Metric(n1, "strata_cluster_graph_catch_ups_total") +
                Metric(*nodes_[2], "strata_cluster_graph_catch_ups_total"),
            0);
}

// A node that hangs (SIGSTOP: its connections stay open, nothing answers) under load: the
// first batch for it waits the replica timeout, later ones are refused at once until it has
// passed again, so the other nodes' ingest workers keep acknowledging every other host's
// batches instead of each waiting out the timeout. Once it resumes, the totals are exact.
TEST_F(ClusterTest, HungNodeStallsNoAcknowledgementsOfOtherHosts) {
  lease_ttl_ = "30s";  // the hung node stays on the ring for the whole test
  for (int i = 0; i < 3; ++i) AddNode();
  auto load = StartLoad(45, "hung", 300);
  ASSERT_TRUE(WaitFor([&] { return LoadFlowing(); }, absl::Seconds(60))) << Logs();
  Node& n1 = *nodes_[0];
  Node& n2 = *nodes_[1];
  Node& hung = *nodes_[2];
  auto sum = [&](const std::string& metric) { return Metric(n1, metric) + Metric(n2, metric); };
  ASSERT_EQ(kill(hung.process->pid(), SIGSTOP), 0);
  const double failures0 = sum("strata_cluster_replica_failures_total");
  const double acks0 = sum("strata_ingest_acks_total");
  absl::SleepFor(absl::Seconds(10));
  const double failures = sum("strata_cluster_replica_failures_total") - failures0;
  const double skipped = sum("strata_cluster_replica_skipped_total");
  const double acks = sum("strata_ingest_acks_total") - acks0;
  ASSERT_EQ(kill(hung.process->pid(), SIGCONT), 0);
  std::printf("10 s with a hung node: %.0f batches waited the 2 s replica timeout, %.0f were "
              "refused at once, %.0f acknowledged\n",
              failures, skipped, acks);
  // A first wait by each batch in flight on the two nodes' ingest workers (8 each), then
  // at most one per node and timeout.
  EXPECT_LE(failures, 30) << Logs();
  EXPECT_GT(skipped, 0) << Logs();
  // The hosts owned by n1 and n2 alone (about a third) kept being acknowledged: 300 agents
  // at 2 s intervals send 1,500 batches in 10 s.
  EXPECT_GE(acks, 250) << Logs();
  ExpectExact(*load, 240);
}

// A fourth node joins under load: it takes its token ranges (agents of its hosts move to it
// and their graphs follow), and the totals stay exact, asked through any node.
TEST_F(ClusterTest, FourthNodeJoinsUnderLoad) {
  for (int i = 0; i < 3; ++i) AddNode();
  auto load = StartLoad(40, "join");
  ASSERT_TRUE(WaitFor([&] { return LoadFlowing(); }, absl::Seconds(60))) << Logs();
  absl::SleepFor(absl::Seconds(5));
  Node& n4 = AddNode();
  ASSERT_TRUE(WaitFor([&] { return Metric(*nodes_[0], "strata_cluster_nodes{state=\"live\"}") == 4; },
                      absl::Seconds(30)))
      << Logs();
  ExpectExact(*load, 240);
  // Its share of the hosts arrived: it applied batches and took streams or replicas.
  EXPECT_GT(Metric(n4, "strata_ingest_batches_total"), 0) << Logs();
  // Any node answers with the same totals.
  auto totals = [&](const Node& n) {
    auto stub = v1::Query::NewStub(
        grpc::CreateChannel(n.address(), grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    v1::ListServicesResponse services;
    EXPECT_TRUE(stub->ListServices(&ctx, {}, &services).ok());
    std::map<std::string, uint64_t> out;
    for (const auto& s : services.services()) out[s.name()] = s.total_samples();
    return out;
  };
  EXPECT_EQ(totals(*nodes_[0]), totals(n4));
  // strata cluster shows the four nodes and their shares.
  CommandResult status =
      RunCommand({BinPath("strata"), "--server", n4.address(), "cluster"}, 30);
  EXPECT_EQ(status.exit_code, 0) << status.output;
  for (const auto& n : nodes_) EXPECT_NE(status.output.find(n->id), std::string::npos) << status.output;
  std::printf("%s\n", status.output.c_str());
}

// etcd itself goes away under load and comes back: the nodes keep ingesting on the cached
// ring (their leases outlive the outage), and the ring recovers from a new watch.
TEST_F(ClusterTest, EtcdRestartUnderLoad) {
  lease_ttl_ = "10s";
  for (int i = 0; i < 3; ++i) AddNode();
  auto load = StartLoad(40, "etcd");
  ASSERT_TRUE(WaitFor([&] { return LoadFlowing(); }, absl::Seconds(60))) << Logs();
  auto batches = [&] {
    double sum = 0;
    for (const auto& n : nodes_) sum += Metric(*n, "strata_ingest_batches_total");
    return sum;
  };
  etcd_->Kill();
  const double before = batches();
  // Ingestion goes on without etcd.
  EXPECT_TRUE(WaitFor([&] { return batches() >= before + 30; }, absl::Seconds(5)))
      << before << " -> " << batches() << Logs();
  ASSERT_TRUE(etcd_->Restart().ok()) << etcd_->LogTail();
  for (const auto& n : nodes_) {
    EXPECT_TRUE(WaitFor([&] { return Metric(*n, "strata_cluster_watch_restarts_total") >= 1; },
                        absl::Seconds(30)))
        << n->id << Logs();
    EXPECT_EQ(Metric(*n, "strata_cluster_nodes{state=\"live\"}"), 3) << n->id;
    EXPECT_EQ(Metric(*n, "strata_cluster_lease_held"), 1) << n->id;
  }
  ExpectExact(*load, 240);
}

// Two nodes, one ingest worker each, many agents: each node's worker waits for the other
// node's replica of its batch, so replica streams must not queue behind agent streams (two
// nodes whose workers all wait on each other would stall until the replica timeout).
TEST_F(ClusterTest, BusyNodesReplicatingToEachOtherDoNotStall) {
  for (int i = 0; i < 2; ++i) AddNode({"--ingest-threads", "1"});
  std::vector<std::string> argv{BinPath("strata-loadgen"), "--server", Addresses(),
                                "--agents", "200", "--interval", "1", "--duration", "15",
                                "--ramp-up", "2", "--rate", "99", "--max-backoff", "3",
                                "--drain-timeout", "90", "--service-prefix", "busy", "--json"};
  ChildProcess load(argv, dir_.path() + "/loadgen-busy.log");
  ExpectExact(load, 180);
  for (const auto& n : nodes_) {
    EXPECT_EQ(Metric(*n, "strata_cluster_replica_failures_total"), 0) << n->id << Logs();
    EXPECT_GT(Metric(*n, "strata_cluster_batches_replicated_total"), 100) << n->id;
  }
}

// A real agent given every node: it ends up on an owner of its host (redirected if need
// be), and a capture of its target works through any node: the capture is routed to the node
// holding the agent's stream, and its samples are read back by a fan-out query.
TEST_F(ClusterTest, RealAgentIsPlacedAndCapturesWorkFromAnyNode) {
  for (int i = 0; i < 3; ++i) AddNode();
  ChildProcess demo({BinPath("demo_service")}, dir_.path() + "/demo.log",
                    {{"STRATA_SERVICE", "demo"}});
  ASSERT_TRUE(demo.WaitForOutput("ready", 30)) << demo.Output();
  ChildProcess agent({BinPath("strata-agent"), "--server", Addresses(), "--pid",
                      std::to_string(demo.pid()), "--interval", "1", "--frequency", "99",
                      "--host", "cluster-host", "--spool-dir", dir_.path() + "/spool"},
                     dir_.path() + "/agent.log");
  // Connected, with its target, on exactly one node (an owner of its host): each node's own
  // agents (Cluster.LocalAgents) say where the stream is; every node's merged list
  // (Query.ListAgents) shows it connected.
  auto connected_on = [&] {
    std::vector<std::string> on;
    for (const auto& n : nodes_) {
      auto channel = grpc::CreateChannel(n->address(), grpc::InsecureChannelCredentials());
      grpc::ClientContext local_ctx;
      v1::ListAgentsResponse local;
      if (!v1::Cluster::NewStub(channel)->LocalAgents(&local_ctx, {}, &local).ok()) continue;
      for (const auto& a : local.agents()) {
        if (a.connected() && a.targets_size() > 0) on.push_back(n->id);
      }
      grpc::ClientContext merged_ctx;
      v1::ListAgentsResponse merged;
      if (!v1::Query::NewStub(channel)->ListAgents(&merged_ctx, {}, &merged).ok() ||
          merged.agents_size() != 1 || !merged.agents(0).connected()) {
        return std::vector<std::string>{};
      }
    }
    return on;
  };
  ASSERT_TRUE(WaitFor([&] { return connected_on().size() == 1; }, absl::Seconds(40)))
      << agent.Output() << Logs();
  for (const auto& n : nodes_) {
    CommandResult capture = RunCommand(
        {BinPath("strata"), "--server", n->address(), "capture", "--service", "demo",
         "--duration", "3s", "--frequency", "199", "--format", "hot-paths", "--limit", "3"},
        60);
    EXPECT_EQ(capture.exit_code, 0) << n->id << ": " << capture.output << agent.Output();
    EXPECT_NE(capture.output.find("Hot paths of capture cap-"), std::string::npos)
        << n->id << ": " << capture.output;
    EXPECT_EQ(capture.output.find("not reached"), std::string::npos) << capture.output;
  }
  // `strata agents` through any node shows the agent connected (it is, on one of them).
  for (const auto& n : nodes_) {
    CommandResult agents =
        RunCommand({BinPath("strata"), "--server", n->address(), "agents"}, 30);
    EXPECT_EQ(agents.exit_code, 0) << agents.output;
    EXPECT_NE(agents.output.find("cluster-host"), std::string::npos) << n->id << agents.output;
    EXPECT_NE(agents.output.find("connected"), std::string::npos) << n->id << agents.output;
    EXPECT_EQ(agents.output.find("gone"), std::string::npos) << n->id << agents.output;
  }
  // The continuous profile reads the same through every node.
  std::vector<uint64_t> totals;
  ASSERT_TRUE(WaitFor([&] { return ServiceTotal(nodes_[0]->address(), "demo") > 0; },
                      absl::Seconds(30)));
  agent.Stop(SIGTERM, 20);
  for (const auto& n : nodes_) totals.push_back(ServiceTotal(n->address(), "demo"));
  EXPECT_GT(totals[0], 0u);
  EXPECT_EQ(totals[0], totals[1]);
  EXPECT_EQ(totals[0], totals[2]);
  // So do the other views, each merged from every node: stored captures (kept where they
  // ran), label sets, phase changes, and the agents' unwinding counters (counted once,
  // though both owners of the host store them).
  std::vector<std::string> answers;
  for (const auto& n : nodes_) {
    auto channel = grpc::CreateChannel(n->address(), grpc::InsecureChannelCredentials());
    grpc::ClientContext captures_ctx, labels_ctx, phases_ctx, quality_ctx;
    v1::ListCapturesResponse captures;
    ASSERT_TRUE(v1::Capture::NewStub(channel)->List(&captures_ctx, {}, &captures).ok());
    EXPECT_EQ(captures.captures_size(), 3) << n->id;
    EXPECT_EQ(captures.unreachable_nodes_size(), 0) << n->id;
    auto query = v1::Query::NewStub(channel);
    v1::ListLabelsRequest labels_request;
    labels_request.set_service("demo");
    v1::ListLabelsResponse labels;
    ASSERT_TRUE(query->ListLabels(&labels_ctx, labels_request, &labels).ok());
    EXPECT_GT(labels.label_sets(), 0u) << n->id;
    v1::PhasesRequest phases_request;
    phases_request.mutable_filter()->set_service("demo");
    v1::PhasesResponse phases;
    ASSERT_TRUE(query->Phases(&phases_ctx, phases_request, &phases).ok());
    v1::QualityRequest quality_request;
    quality_request.mutable_filter()->set_service("demo");
    v1::QualityResponse quality;
    ASSERT_TRUE(query->Quality(&quality_ctx, quality_request, &quality).ok());
    EXPECT_GT(quality.agent_stacks(), 0u) << n->id;
    EXPECT_EQ(quality.samples(), totals[0]) << n->id;
    // The agent's counters count its stacks once (both owners store them).
    EXPECT_LE(quality.agent_stacks(), quality.samples() + quality.lost_samples()) << n->id;
    answers.push_back(absl::StrCat(captures.DebugString(), labels.DebugString(),
                                   phases.DebugString(), quality.DebugString()));
  }
  EXPECT_EQ(answers[0], answers[1]);
  EXPECT_EQ(answers[0], answers[2]);
  // A debug file uploaded through one node is on every node (each names the frames of its
  // own hosts).
  CommandResult upload = RunCommand({BinPath("strata"), "--server", nodes_[1]->address(),
                                     "debuginfo", "upload", BinPath("demo_service")},
                                    60);
  EXPECT_EQ(upload.exit_code, 0) << upload.output;
  EXPECT_EQ(upload.output.find("not copied"), std::string::npos) << upload.output;
  for (const auto& n : nodes_) {
    auto channel = grpc::CreateChannel(n->address(), grpc::InsecureChannelCredentials());
    grpc::ClientContext ctx;
    v1::ListDebugInfoResponse files;
    ASSERT_TRUE(v1::DebugInfo::NewStub(channel)->List(&ctx, {}, &files).ok());
    ASSERT_EQ(files.uploaded_size(), 1) << n->id << files.DebugString();
    EXPECT_NE(files.uploaded(0).file_name().find("demo_service"), std::string::npos);
  }
  // Source lines read the same through every node: each node resolves the lines of the
  // hosts it was given, with the debug file it now has.
  std::vector<std::string> by_line, flame_lines;
  for (const auto& n : nodes_) {
    CommandResult top = RunCommand({BinPath("strata"), "--server", n->address(), "top", "-s",
                                    "demo", "--by", "line", "--limit", "5"},
                                   60);
    EXPECT_EQ(top.exit_code, 0) << top.output;
    EXPECT_EQ(top.output.find("not reached"), std::string::npos) << top.output;
    by_line.push_back(top.output);
    CommandResult flame = RunCommand({BinPath("strata"), "--server", n->address(), "flamegraph",
                                      "-s", "demo", "--lines", "-f", "folded"},
                                     60);
    EXPECT_EQ(flame.exit_code, 0) << flame.output;
    flame_lines.push_back(flame.output);
  }
  std::printf("%s\n", by_line[0].c_str());
  EXPECT_NE(by_line[0].find("demo_service.c"), std::string::npos) << by_line[0];
  EXPECT_NE(flame_lines[0].find("demo_service.c"), std::string::npos) << flame_lines[0];
  EXPECT_EQ(by_line[0], by_line[1]);
  EXPECT_EQ(by_line[0], by_line[2]);
  EXPECT_EQ(flame_lines[0], flame_lines[1]);
  EXPECT_EQ(flame_lines[0], flame_lines[2]);
  // So do the exports built from leaf addresses and call sites: the LLVM sample profile, and
  // the pprof profile's lines.
  std::vector<std::string> llvm;
  for (const auto& n : nodes_) {
    const std::string llvm_file = absl::StrCat(dir_.path(), "/", n->id, ".llvm.txt");
    const std::string pprof_file = absl::StrCat(dir_.path(), "/", n->id, ".pb.gz");
    for (const auto& [format, file] : {std::pair{"llvm-sample", llvm_file},
                                       std::pair{"pprof", pprof_file}}) {
      CommandResult exported = RunCommand({BinPath("strata"), "--server", n->address(), "export",
                                           "-s", "demo", "-f", format, "-o", file},
                                          60);
      EXPECT_EQ(exported.exit_code, 0) << n->id << ": " << exported.output;
      EXPECT_EQ(exported.output.find("not reached"), std::string::npos) << exported.output;
    }
    std::ifstream in(llvm_file);
    llvm.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    CommandResult strings =
        RunCommand({"/bin/sh", "-c", absl::StrCat("gzip -dc ", pprof_file, " | grep -c -a ",
                                                  "workloads/demo_service.cc")},
                   30);
    EXPECT_EQ(strings.exit_code, 0) << n->id << ": no source file in the pprof profile";
  }
  EXPECT_NE(llvm[0].find("tokenize"), std::string::npos) << llvm[0];
  EXPECT_EQ(llvm[0], llvm[1]);
  EXPECT_EQ(llvm[0], llvm[2]);
}

// A stopped node is listed as down, also by a node restarted since (from its record in
// etcd), until `strata-server forget-node` removes it for good; a live node cannot be
// forgotten.
TEST_F(ClusterTest, StoppedNodeIsListedDownUntilForgotten) {
  for (int i = 0; i < 3; ++i) AddNode();
  nodes_[2]->process->Stop(SIGTERM, 30);
  nodes_[0]->process->Stop(SIGTERM, 30);
  Start(0);
  auto cluster = [&](const Node& n) {
    CommandResult r = RunCommand({BinPath("strata"), "--server", n.address(), "cluster"}, 30);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return r.output;
  };
  const std::string before = cluster(*nodes_[0]);
  EXPECT_TRUE(std::regex_search(before, std::regex("n3 .*down"))) << before;
  auto forget = [&](const std::string& id) {
    return RunCommand({BinPath("strata-server"), "forget-node", id, "--cluster-etcd",
                       etcd_->endpoint()},
                      30);
  };
  CommandResult live = forget("n2");
  EXPECT_EQ(live.exit_code, 1) << live.output;
  EXPECT_NE(live.output.find("is live"), std::string::npos) << live.output;
  CommandResult gone = forget("n3");
  EXPECT_EQ(gone.exit_code, 0) << gone.output;
  for (int i : {0, 1}) {
    EXPECT_TRUE(WaitFor([&] { return cluster(*nodes_[i]).find("n3") == std::string::npos; },
                        absl::Seconds(20)))
        << cluster(*nodes_[i]);
  }
  EXPECT_EQ(forget("n3").exit_code, 1);  // no such node any more
}

// Fan-out queries through a node while others are away. A hung node (on the ring, answering
// nothing) is named unreachable, and the answer comes from the replicas that answered; a
// stopped node is named too once, with the hung one, as many nodes are away as there are
// replicas (2). A wrong request fails as a whole (every node refuses it), and a service no
// node knows is NotFound, as on a single server.
TEST_F(ClusterTest, FanOutQueriesNameTheNodesThatDidNotAnswer) {
  lease_ttl_ = "60s";  // the hung node stays on the ring for the whole test
  for (int i = 0; i < 3; ++i) AddNode({"--cluster-query-timeout", "2s"});
  WaitForRing();
  auto load = StartLoad(10, "away");
  ExpectExact(*load, 120);
  Node& n1 = *nodes_[0];
  Node& n2 = *nodes_[1];
  Node& n3 = *nodes_[2];
  auto query = v1::Query::NewStub(
      grpc::CreateChannel(n1.address(), grpc::InsecureChannelCredentials()));
  auto hot_paths = [&](const std::string& service, const std::string& focus,
                       v1::HotPathsResponse* paths) {
    grpc::ClientContext ctx;
    v1::HotPathsRequest request;
    request.mutable_filter()->set_service(service);
    request.mutable_filter()->set_focus(focus);
    return query->HotPaths(&ctx, request, paths);
  };
  // The timeline per host: each host's samples from one node, every sample once.
  auto series_by_host = [&](const std::string& service, v1::SeriesResponse* series) {
    grpc::ClientContext ctx;
    v1::SeriesRequest request;
    request.mutable_filter()->set_service(service);
    request.set_group_by("host");
    request.set_limit(100);
    return query->Series(&ctx, request, series);
  };
  std::string service;
  uint64_t all = 0;
  {
    grpc::ClientContext ctx;
    v1::ListServicesResponse services;
    ASSERT_TRUE(query->ListServices(&ctx, {}, &services).ok());
    ASSERT_GT(services.services_size(), 0);
    EXPECT_EQ(services.unreachable_nodes_size(), 0);
    service = services.services(0).name();
    v1::HotPathsResponse paths;
    ASSERT_TRUE(hot_paths(service, "", &paths).ok());
    EXPECT_EQ(paths.unreachable_nodes_size(), 0);
    all = paths.total_samples();
    ASSERT_GT(all, 0u);
    v1::SeriesResponse series;
    ASSERT_TRUE(series_by_host(service, &series).ok());
    EXPECT_EQ(series.total_samples(), all);
    EXPECT_GT(series.series_size(), 1) << series.DebugString();  // several hosts
    EXPECT_EQ(series.unreachable_nodes_size(), 0);
  }
  {
    v1::HotPathsResponse paths;
    grpc::Status wrong = hot_paths(service, "(", &paths);
    EXPECT_EQ(wrong.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << wrong.error_message();
    EXPECT_NE(wrong.error_message().find("invalid --focus regex"), std::string::npos)
        << wrong.error_message();
    grpc::Status unknown = hot_paths("no-such-service", "", &paths);
    EXPECT_EQ(unknown.error_code(), grpc::StatusCode::NOT_FOUND) << unknown.error_message();
    EXPECT_EQ(unknown.error_message(), "unknown service 'no-such-service'");
  }
  ASSERT_EQ(kill(n3.process->pid(), SIGSTOP), 0);
  const std::string n3_name = absl::StrCat("n3 (", n3.address(), "): ");
  auto only_n3 = [&](const auto& unreachable) {
    return unreachable.size() == 1 && unreachable[0].rfind(n3_name, 0) == 0;
  };
  {
    // Every host has a replica on n1 or n2: the profile is whole, n3 is named all the same.
    v1::HotPathsResponse paths;
    ASSERT_TRUE(hot_paths(service, "", &paths).ok());
    EXPECT_EQ(paths.total_samples(), all);
    EXPECT_TRUE(only_n3(paths.unreachable_nodes())) << paths.DebugString();
    v1::SeriesResponse series;
    ASSERT_TRUE(series_by_host(service, &series).ok());
    EXPECT_EQ(series.total_samples(), all);
    EXPECT_TRUE(only_n3(series.unreachable_nodes())) << series.DebugString();
    grpc::ClientContext services_ctx, agents_ctx, labels_ctx;
    v1::ListServicesResponse services;
    ASSERT_TRUE(query->ListServices(&services_ctx, {}, &services).ok());
    EXPECT_TRUE(only_n3(services.unreachable_nodes())) << services.DebugString();
    v1::ListAgentsResponse agents;
    ASSERT_TRUE(query->ListAgents(&agents_ctx, {}, &agents).ok());
    EXPECT_GT(agents.agents_size(), 0);
    EXPECT_TRUE(only_n3(agents.unreachable_nodes())) << agents.unreachable_nodes_size();
    v1::ListLabelsRequest labels_request;
    labels_request.set_service(service);
    v1::ListLabelsResponse labels;
    ASSERT_TRUE(query->ListLabels(&labels_ctx, labels_request, &labels).ok());
    EXPECT_TRUE(only_n3(labels.unreachable_nodes())) << labels.DebugString();
  }
  n2.process->Stop(SIGTERM, 30);  // leaves the ring at once: down
  ASSERT_TRUE(WaitFor([&] { return Metric(n1, "strata_cluster_nodes{state=\"down\"}") == 1; },
                      absl::Seconds(20)))
      << Logs();
  {
    v1::HotPathsResponse paths;
    ASSERT_TRUE(hot_paths(service, "", &paths).ok());
    EXPECT_LE(paths.total_samples(), all);
    ASSERT_EQ(paths.unreachable_nodes_size(), 2) << paths.DebugString();
    EXPECT_EQ(paths.unreachable_nodes(0).rfind(n3_name, 0), 0u) << paths.DebugString();
    EXPECT_EQ(paths.unreachable_nodes(1),
              absl::StrCat("n2 (", n2.address(), "): down (lease expired)"));
  }
  ASSERT_EQ(kill(n3.process->pid(), SIGCONT), 0);
}

// OTLP exports are stored by every owner of their hosts, whichever node they reach (the load
// generator's senders spread over the three nodes): nothing is lost or doubled, the nodes
// forward what they do not own, and with one node stopped the other two still hold every
// sample.
TEST_F(ClusterTest, OtlpExportsAreStoredByEveryOwnerOfTheirHosts) {
  lease_ttl_ = "60s";  // the stopped node stays on the ring
  for (int i = 0; i < 3; ++i) AddNode({"--cluster-query-timeout", "2s"});
  WaitForRing();
  auto load = StartLoad(8, "otlp", 30, {"--protocol", "otlp"});
  ExpectExact(*load, 120);
  double forwarded = 0;
  for (const auto& n : nodes_) forwarded += std::max(0.0, Metric(*n, "strata_otlp_forwarded_total"));
  EXPECT_GT(forwarded, 0) << Logs();

  auto query = v1::Query::NewStub(
      grpc::CreateChannel(nodes_[1]->address(), grpc::InsecureChannelCredentials()));
  auto total = [&](const std::string& service, v1::HotPathsResponse* paths) {
    grpc::ClientContext ctx;
    v1::HotPathsRequest request;
    request.mutable_filter()->set_service(service);
    return query->HotPaths(&ctx, request, paths);
  };
  std::map<std::string, uint64_t> all;
  for (int s = 0; s < 3; ++s) {
    const std::string service = absl::StrCat("otlp-svc-", s);
    v1::HotPathsResponse paths;
    ASSERT_TRUE(total(service, &paths).ok()) << service;
    all[service] = paths.total_samples();
    EXPECT_GT(all[service], 0u);
  }
  ASSERT_EQ(kill(nodes_[0]->process->pid(), SIGSTOP), 0);
  for (const auto& [service, samples] : all) {
    v1::HotPathsResponse paths;
    ASSERT_TRUE(total(service, &paths).ok()) << service;
    EXPECT_EQ(paths.total_samples(), samples) << service << " without n1";
    EXPECT_EQ(paths.unreachable_nodes_size(), 1) << paths.DebugString();
  }
  ASSERT_EQ(kill(nodes_[0]->process->pid(), SIGCONT), 0);
}

// A new release is compared by the node first in the ring, reading every node's samples, and
// its verdict is listed by every node.
// The requests agents report (strata-agent --requests-metric) come through the fan-out with
// each host's profile: compared through any node, both versions' requests are the cluster's
// totals, and the rows are compared per request.
TEST_F(ClusterTest, RequestsComeThroughTheFanOut) {
  for (int i = 0; i < 3; ++i) AddNode();
  auto load = StartLoad(8, "req", 12, {"--label", "version=a|b", "--requests", "100"});
  ExpectExact(*load, 120);
  const uint64_t batches = static_cast<uint64_t>(JsonField(load->Output(), "batches"));
  ASSERT_GT(batches, 0u);
  uint64_t requests = 0;
  for (int s = 0; s < 3; ++s) {
    auto query = v1::Query::NewStub(
        grpc::CreateChannel(nodes_[1]->address(), grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    v1::CompareRequest request;
    request.set_service(absl::StrCat("req-svc-", s));
    request.mutable_baseline()->set_selector("version=a");
    request.mutable_candidate()->set_selector("version=b");
    v1::CompareResponse response;
    grpc::Status status = query->Compare(&ctx, request, &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
    EXPECT_FALSE(response.per_request_unit().empty()) << response.DebugString();
    EXPECT_GT(response.baseline_requests(), 0u);
    EXPECT_GT(response.candidate_requests(), 0u);
    requests += response.baseline_requests() + response.candidate_requests();
  }
  EXPECT_EQ(requests, 100 * batches);
}

TEST_F(ClusterTest, ReleaseVerdictsAreListedByEveryNode) {
  for (int i = 0; i < 2; ++i) AddNode({"--regression-interval", "1s"});
  Node& n1 = *nodes_[0];
  Node& n2 = *nodes_[1];
  ExpectExact(*StartLoad(8, "rel", 8, {"--label", "version=1"}), 120);
  // The checking node meets the service with release 1 (recorded, not compared).
  const double checks = Metric(n1, "strata_regression_checks_total");
  ASSERT_TRUE(WaitFor([&] { return Metric(n1, "strata_regression_checks_total") >= checks + 2; },
                      absl::Seconds(30)))
      << Logs();
  EXPECT_EQ(Metric(n2, "strata_regression_checks_total"), 0) << "only n1 checks";
  // The same agents restarted (new graphs: another seed) with release 2; the totals are no
  // longer the run's alone.
  auto release2 = StartLoad(8, "rel", 8, {"--label", "version=2", "--seed", "2"});
  EXPECT_NE(release2->Wait(120), -1) << release2->Output();
  auto list = [](const Node& n) {
    auto stub = v1::Regressions::NewStub(
        grpc::CreateChannel(n.address(), grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    v1::ListRegressionsRequest request;
    request.set_service("rel-svc-0");
    v1::ListRegressionsResponse response;
    grpc::Status s = stub->ListRegressions(&ctx, request, &response);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return response;
  };
  ASSERT_TRUE(WaitFor([&] { return list(n2).verdicts_size() > 0; }, absl::Seconds(30)))
      << Logs();
  for (const Node* n : {&n1, &n2}) {
    const v1::ListRegressionsResponse r = list(*n);
    ASSERT_EQ(r.verdicts_size(), 1) << n->id << ": " << r.DebugString();
    EXPECT_EQ(r.verdicts(0).baseline(), "1");
    EXPECT_EQ(r.verdicts(0).candidate(), "2");
    EXPECT_EQ(r.unreachable_nodes_size(), 0) << r.DebugString();
  }
}

// The release verdicts of `service` as the node at `address` lists them.
v1::ListRegressionsResponse ListRegressions(const std::string& address,
                                            const std::string& service) {
  auto stub = v1::Regressions::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  v1::ListRegressionsRequest request;
  request.set_service(service);
  v1::ListRegressionsResponse response;
  grpc::Status s = stub->ListRegressions(&ctx, request, &response);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return response;
}

// The verdict of `candidate` in `r`, or null.
const v1::ReleaseVerdict* VerdictOf(const v1::ListRegressionsResponse& r,
                                    const std::string& candidate) {
  for (const v1::ReleaseVerdict& v : r.verdicts()) {
    if (v.candidate() == candidate) return &v;
  }
  return nullptr;
}

// The checking node copies its release records to the others: stopped, its verdict is still
// listed by every node, the next node in the ring checks on from the copies (release 2 is
// compared again, not met anew), and a release that appears afterwards is compared with
// release 2.
TEST_F(ClusterTest, ReleaseVerdictsOutliveTheCheckingNode) {
  const absl::Time began = absl::Now();
  for (int i = 0; i < 3; ++i) AddNode({"--regression-interval", "1s"});
  Node& n1 = *nodes_[0];
  Node& n2 = *nodes_[1];
  Node& n3 = *nodes_[2];
  const std::string service = "takeover-svc-0";
  ExpectExact(*StartLoad(4, "takeover", 6, {"--label", "version=1"}), 120);
  const double checks = Metric(n1, "strata_regression_checks_total");
  ASSERT_TRUE(WaitFor([&] { return Metric(n1, "strata_regression_checks_total") >= checks + 2; },
                      absl::Seconds(30)))
      << Logs();
  // A comparison reads whole 10 s windows from the candidate's first sighting on: release 2
  // runs into the next one.
  auto release2 = StartLoad(15, "takeover", 6, {"--label", "version=2", "--seed", "2"});
  EXPECT_NE(release2->Wait(120), -1) << release2->Output();
  // Compared twice: the record of the first comparison went to n2 and n3 after that check.
  ASSERT_TRUE(WaitFor(
      [&] {
        const v1::ReleaseVerdict* v = VerdictOf(ListRegressions(n1.address(), service), "2");
        return v != nullptr && v->comparisons() >= 2;
      },
      absl::Seconds(30)))
      << Logs();
  EXPECT_EQ(Metric(n2, "strata_regression_checks_total"), 0) << "only n1 checks";
  EXPECT_GT(Metric(n2, "strata_regression_copies_kept_total"), 0);
  EXPECT_GT(Metric(n3, "strata_regression_copies_kept_total"), 0);

  n1.process->Stop(SIGTERM, 30);  // leaves the ring at once
  uint32_t comparisons_by_n1 = 0;
  for (const Node* n : {&n2, &n3}) {
    v1::ListRegressionsResponse r;
    ASSERT_TRUE(WaitFor(
        [&] {
          r = ListRegressions(n->address(), service);
          return r.unreachable_nodes_size() == 0 && VerdictOf(r, "2") != nullptr;
        },
        absl::Seconds(10)))
        << n->id << ": " << r.DebugString() << Logs();
    EXPECT_EQ(VerdictOf(r, "2")->baseline(), "1");
    EXPECT_GE(VerdictOf(r, "2")->comparisons(), 1u);
    comparisons_by_n1 = std::max(comparisons_by_n1, VerdictOf(r, "2")->comparisons());
  }
  // Release 3, to the nodes still up, while n2, first in the ring now, takes over.
  auto release3 = StartLoad(4, "takeover", 6, {"--label", "version=3", "--seed", "3"},
                            absl::StrCat(n2.address(), ",", n3.address()));
  // n2 compares release 2 on, from the copies.
  ASSERT_TRUE(WaitFor(
      [&] {
        const v1::ReleaseVerdict* v = VerdictOf(ListRegressions(n2.address(), service), "2");
        return v != nullptr && v->comparisons() > comparisons_by_n1 + 1;
      },
      absl::Seconds(30)))
      << Logs();
  EXPECT_GT(Metric(n2, "strata_regression_checks_total"), 0);
  EXPECT_NE(release3->Wait(120), -1) << release3->Output();
  // n2 compares release 3 with release 2 (a release met without a comparison is not listed).
  for (const Node* n : {&n2, &n3}) {
    v1::ListRegressionsResponse r;
    ASSERT_TRUE(WaitFor(
        [&] {
          r = ListRegressions(n->address(), service);
          return VerdictOf(r, "3") != nullptr;
        },
        absl::Seconds(30)))
        << n->id << ": " << r.DebugString() << Logs();
    const v1::ReleaseVerdict& v3 = *VerdictOf(r, "3");
    EXPECT_EQ(v3.baseline(), "2") << r.DebugString();
    EXPECT_EQ(v3.label(), "version");
    // Its comparison ran (NotFound until a whole window of release 3 is stored).
    EXPECT_TRUE(v3.comparisons() >= 1 || !v3.error().empty()) << r.DebugString();
    EXPECT_EQ(r.verdicts_size(), 2) << r.DebugString();  // 1 -> 2 and 2 -> 3
  }
  std::printf("release verdicts across the loss of the checking node: %.1f s\n",
              absl::ToDoubleSeconds(absl::Now() - began));
}

// A debug file uploaded while a node is down reaches it when it is back, and reaches a node
// that joins later: the nodes compare their uploads (every second here) and the holder with
// the smallest ID sends the missing ones.
TEST_F(ClusterTest, DebugFilesReachNodesThatMissedTheUpload) {
  for (int i = 0; i < 3; ++i) AddNode({"--cluster-debuginfo-sync", "1s"});
  nodes_[2]->process->Stop(SIGTERM, 30);  // leaves the ring at once
  CommandResult upload = RunCommand({BinPath("strata"), "--server", nodes_[1]->address(),
                                     "debuginfo", "upload", BinPath("demo_service")},
                                    60);
  ASSERT_EQ(upload.exit_code, 0) << upload.output;
  auto uploaded = [&](const Node& n) {
    auto channel = grpc::CreateChannel(n.address(), grpc::InsecureChannelCredentials());
    grpc::ClientContext ctx;
    v1::ListDebugInfoResponse files;
    return v1::DebugInfo::NewStub(channel)->List(&ctx, {}, &files).ok() &&
           files.uploaded_size() == 1 &&
           files.uploaded(0).file_name().find("demo_service") != std::string::npos;
  };
  EXPECT_TRUE(uploaded(*nodes_[0]));
  Start(2);
  EXPECT_TRUE(WaitFor([&] { return uploaded(*nodes_[2]); }, absl::Seconds(60))) << Logs();
  Node& fourth = AddNode({"--cluster-debuginfo-sync", "1s"});
  EXPECT_TRUE(WaitFor([&] { return uploaded(fourth); }, absl::Seconds(60))) << Logs();
  // Sent once to each: by n1, the holder with the smallest ID.
  double sent = 0;
  for (const auto& n : nodes_) sent += Metric(*n, "strata_cluster_debuginfo_sent_total");
  EXPECT_EQ(sent, 2) << Logs();
  EXPECT_EQ(Metric(*nodes_[0], "strata_cluster_debuginfo_sent_total"), 2);
}

// Nodes that serve TLS and authenticate every caller, as a fleet runs them: each node has a
// certificate (deploy/gen-certs.sh --node) that it serves with and presents to the other
// nodes, listed with role node in the tokens file; agents ship with a token of role agent,
// people query with tokens of role reader and operator. etcd serves TLS and requires client
// certificates; the nodes present theirs.
class ClusterSecurityTest : public ClusterTest {
 protected:
  void SetUp() override {
    pki_ = dir_.path() + "/pki";
    CommandResult certs =
        RunCommand({std::string(STRATA_SOURCE_DIR) + "/deploy/gen-certs.sh", "--out", pki_,
                    "--node", "n1,n2,n3,n4", "--node-address", "127.0.0.1", "--client",
                    "intruder"},
                   60);
    ASSERT_EQ(certs.exit_code, 0) << certs.output;
    std::string auth = "cert n1 node\ncert n2 node\ncert n3 node\ncert n4 node\n";
    for (const auto& [name, role] : std::vector<std::pair<std::string, std::string>>{
             {"fleet", "agent"}, {"alice", "reader"}, {"ops", "operator"}}) {
      const std::string token = TokenFile(name);
      std::ofstream(token) << name << "-" << getpid() << "-secret\n";
      CommandResult line =
          RunCommand({"/bin/sh", "-c",
                      absl::StrCat(BinPath("strata-server"), " hash-token --name ", name,
                                   " --role ", role, " < ", token)},
                     30);
      ASSERT_EQ(line.exit_code, 0) << line.output;
      auth += line.output;
    }
    auth_file_ = dir_.path() + "/auth";
    std::ofstream(auth_file_) << auth;
    ClusterTest::SetUp();
  }

  // etcd serves TLS and takes only clients with a certificate of the CA: the nodes present
  // their node certificates.
  EtcdTestTls EtcdTls() override {
    return {.cert_file = Pki("server.pem"), .key_file = Pki("server.key"),
            .ca_file = Pki("ca.pem"), .client_cert_file = Pki("nodes/n1.pem"),
            .client_key_file = Pki("nodes/n1.key")};
  }

  std::string TokenFile(const std::string& name) const {
    return dir_.path() + "/" + name + ".token";
  }
  std::string Pki(const std::string& name) const { return pki_ + "/" + name; }

  std::vector<std::string> SecurityArgs(const std::string& id) override {
    return {"--tls-cert", Pki("nodes/" + id + ".pem"), "--tls-key", Pki("nodes/" + id + ".key"),
            "--tls-client-ca", Pki("ca.pem"), "--tls-client-role", "none",
            "--auth-file", auth_file_, "--cluster-etcd-ca", Pki("ca.pem"),
            "--cluster-tls-ca", Pki("ca.pem")};
  }
  std::vector<std::string> LoadSecurityArgs() override {
    return {"--tls-ca", Pki("ca.pem"), "--token-file", TokenFile("fleet"),
            "--query-token-file", TokenFile("alice")};
  }
  std::string MetricsText(const Node& n) override {
    CommandResult r = RunCommand(
        {"/usr/bin/curl", "-s", "-m", "5", "--cacert", Pki("ca.pem"), "-H",
         absl::StrCat("Authorization: Bearer alice-", getpid(), "-secret"),
         absl::StrCat("https://127.0.0.1:", n.http_port, "/metrics")},
        10);
    return r.exit_code == 0 ? r.output : "";
  }

  // The strata CLI through `node` with `token`'s credentials.
  CommandResult Cli(const Node& node, const std::string& token, std::vector<std::string> args) {
    std::vector<std::string> argv{BinPath("strata"), "--server", node.address(), "--tls-ca",
                                  Pki("ca.pem"), "--token-file", TokenFile(token)};
    argv.insert(argv.end(), args.begin(), args.end());
    return RunCommand(argv, 60);
  }

  // A channel to `node` over TLS; `client` names a client certificate under clients/ (or
  // none), and calls made with it carry `token` (or none).
  std::shared_ptr<grpc::Channel> Channel(const Node& node, const std::string& client = "") {
    rpc::ClientSecurityOptions options{.ca_file = Pki("ca.pem")};
    if (!client.empty()) {
      options.cert_file = Pki("clients/" + client + ".pem");
      options.key_file = Pki("clients/" + client + ".key");
    }
    auto security = rpc::ClientSecurity::Load(options);
    EXPECT_TRUE(security.ok()) << security.status();
    return security->CreateChannel(node.address());
  }
  static void AddToken(grpc::ClientContext* context, const std::string& name) {
    context->AddMetadata("authorization", absl::StrCat("Bearer ", name, "-", getpid(), "-secret"));
  }

  std::string pki_, auth_file_;
};

// Three nodes over mutual TLS with authentication everywhere: batches are replicated between
// nodes (each calling the others with its node certificate), fan-out queries are exact, and a
// capture started with an operator's token through any node is routed to the node that holds
// the agent's stream.
TEST_F(ClusterSecurityTest, NodesReplicateAndAnswerAsNodesOverMutualTls) {
  for (int i = 0; i < 3; ++i) AddNode();
  auto load = StartLoad(20, "secure");
  ExpectExact(*load, 180);
  double replicated = 0;
  for (const auto& n : nodes_) {
    replicated += Metric(*n, "strata_cluster_batches_replicated_total");
    EXPECT_EQ(Metric(*n, "strata_cluster_replica_failures_total"), 0) << n->id << Logs();
  }
  EXPECT_GT(replicated, 30) << Logs();

  ChildProcess demo({BinPath("demo_service")}, dir_.path() + "/demo.log",
                    {{"STRATA_SERVICE", "demo"}});
  ASSERT_TRUE(demo.WaitForOutput("ready", 30)) << demo.Output();
  ChildProcess agent({BinPath("strata-agent"), "--server", Addresses(), "--tls-ca",
                      Pki("ca.pem"), "--token-file", TokenFile("fleet"), "--pid",
                      std::to_string(demo.pid()), "--interval", "1", "--frequency", "99",
                      "--host", "secure-host", "--spool-dir", dir_.path() + "/spool"},
                     dir_.path() + "/agent.log");
  // Connected, with its target, somewhere: every node's agents list says so.
  ASSERT_TRUE(WaitFor(
      [&] {
        auto query = v1::Query::NewStub(Channel(*nodes_[0]));
        grpc::ClientContext ctx;
        AddToken(&ctx, "alice");
        v1::ListAgentsResponse agents;
        if (!query->ListAgents(&ctx, {}, &agents).ok()) return false;
        for (const auto& a : agents.agents()) {
          if (a.host() == "secure-host" && a.connected() && a.targets_size() > 0) return true;
        }
        return false;
      },
      absl::Seconds(40)))
      << agent.Output() << Logs();
  for (const auto& n : nodes_) {
    CommandResult capture = Cli(*n, "ops", {"capture", "--service", "demo", "--duration", "2s",
                                            "--frequency", "199", "--format", "hot-paths",
                                            "--limit", "3"});
    EXPECT_EQ(capture.exit_code, 0) << n->id << ": " << capture.output << Logs();
    EXPECT_NE(capture.output.find("Hot paths of capture cap-"), std::string::npos)
        << n->id << ": " << capture.output << agent.Output();
  }
  // A reader may not start captures, through any node.
  CommandResult refused = Cli(*nodes_[1], "alice", {"capture", "--service", "demo",
                                                     "--duration", "2s"});
  EXPECT_NE(refused.exit_code, 0) << refused.output;
  EXPECT_NE(refused.output.find("needs role operator"), std::string::npos) << refused.output;
  CommandResult status = Cli(*nodes_[2], "alice", {"cluster"});
  EXPECT_EQ(status.exit_code, 0) << status.output;
  EXPECT_NE(status.output.find("n1"), std::string::npos) << status.output;
}

// What only nodes may do: an agent's token cannot open a replica stream (which would store
// batches past placement and the agent limits), a reader or a client certificate the tokens
// file does not list cannot call the nodes' internal calls; a node refuses to start without
// the credentials the other nodes will ask of it.
TEST_F(ClusterSecurityTest, OnlyNodesReplicateOrCallNodeInternals) {
  for (int i = 0; i < 2; ++i) AddNode();
  const Node& n1 = *nodes_[0];
  {
    auto ingest = v1::Ingest::NewStub(Channel(n1));
    grpc::ClientContext ctx;
    AddToken(&ctx, "fleet");
    ctx.AddMetadata("x-strata-replica-of", "n2");
    auto stream = ingest->Connect(&ctx);
    v1::AgentMessage hello;
    hello.mutable_hello()->set_agent_id("forged");
    hello.mutable_hello()->set_host("forged-host");
    stream->Write(hello);
    stream->WritesDone();
    v1::ServerMessage m;
    std::string errors;
    while (stream->Read(&m)) {
      EXPECT_FALSE(m.has_welcome()) << m.DebugString();
      if (m.has_error()) errors += m.error().message();
    }
    grpc::Status s = stream->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
    EXPECT_NE((s.error_message() + errors).find("role node"), std::string::npos)
        << s.error_message() << errors;
  }
  {
    // An agent's credentials cannot make an OTLP replica call (which stores hosts it names
    // without placing them) either.
    namespace otlp = opentelemetry::proto::collector::profiles::v1development;
    auto profiles = otlp::ProfilesService::NewStub(Channel(n1));
    grpc::ClientContext ctx;
    AddToken(&ctx, "fleet");
    ctx.AddMetadata("x-strata-replica-of", "n2");
    otlp::ExportProfilesServiceRequest export_request;
    otlp::ExportProfilesServiceResponse answer;
    grpc::Status s = profiles->Export(&ctx, export_request, &answer);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
    EXPECT_NE(s.error_message().find("role node"), std::string::npos) << s.error_message();
  }
  v1::LocalProfileRequest request;
  request.mutable_filter()->set_service("any");
  {
    auto cluster = v1::Cluster::NewStub(Channel(n1));
    grpc::ClientContext ctx;
    AddToken(&ctx, "alice");
    v1::HostTotalsResponse totals;
    grpc::Status s = cluster->HostTotals(&ctx, request, &totals);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
    EXPECT_NE(s.error_message().find("needs role node"), std::string::npos) << s.error_message();
  }
  {
    // Nor may an operator plant release verdicts.
    auto cluster = v1::Cluster::NewStub(Channel(n1));
    grpc::ClientContext ctx;
    AddToken(&ctx, "ops");
    v1::ReleaseRecords records;
    records.add_releases()->set_service("any");
    v1::KeepReleaseRecordsResponse kept;
    grpc::Status s = cluster->KeepReleaseRecords(&ctx, records, &kept);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  }
  {
    auto cluster = v1::Cluster::NewStub(Channel(n1, "intruder"));
    grpc::ClientContext ctx;
    v1::LocalProfileResponse profile;
    grpc::Status s = cluster->LocalProfile(&ctx, request, &profile);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << s.error_message();
  }
  {
    auto cluster = v1::Cluster::NewStub(Channel(n1));
    grpc::ClientContext ctx;
    AddToken(&ctx, "alice");
    v1::ClusterStatusResponse status;
    grpc::Status s = cluster->Status(&ctx, {}, &status);
    EXPECT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(status.nodes_size(), 2);
  }
  // A node that would call the others without TLS, or with a token they would refuse.
  auto start = [&](std::vector<std::string> args) {
    std::vector<std::string> argv{BinPath("strata-server"), "--listen", "127.0.0.1:0",
                                  "--data", dir_.path() + "/n4", "--cluster-etcd",
                                  etcd_->endpoint(), "--node-id", "n4"};
    argv.insert(argv.end(), args.begin(), args.end());
    return RunCommand(argv, 30);
  };
  std::vector<std::string> args = SecurityArgs("n4");
  args.erase(args.end() - 2, args.end());  // no --cluster-tls-ca
  CommandResult no_ca = start(args);
  EXPECT_EQ(no_ca.exit_code, 2) << no_ca.output;
  EXPECT_NE(no_ca.output.find("--cluster-tls-ca"), std::string::npos) << no_ca.output;
  CommandResult reader = start({"--tls-cert", Pki("nodes/n4.pem"), "--tls-key",
                                Pki("nodes/n4.key"), "--auth-file", auth_file_,
                                "--cluster-tls-ca", Pki("ca.pem"), "--cluster-token-file",
                                TokenFile("alice")});
  EXPECT_EQ(reader.exit_code, 2) << reader.output;
  EXPECT_NE(reader.output.find("nodes need role node"), std::string::npos) << reader.output;
  CommandResult nothing = start({"--tls-cert", Pki("nodes/n4.pem"), "--tls-key",
                                 Pki("nodes/n4.key"), "--auth-file", auth_file_,
                                 "--cluster-tls-ca", Pki("ca.pem")});
  EXPECT_EQ(nothing.exit_code, 2) << nothing.output;
  EXPECT_NE(nothing.output.find("--cluster-token-file"), std::string::npos) << nothing.output;
  // etcd over TLS needs its CA; a CA given for a plain-text endpoint is a mistake too.
  args = SecurityArgs("n4");
  const auto etcd_ca = std::find(args.begin(), args.end(), "--cluster-etcd-ca");
  ASSERT_NE(etcd_ca, args.end());
  args.erase(etcd_ca, etcd_ca + 2);
  CommandResult no_etcd_ca = start(args);
  EXPECT_EQ(no_etcd_ca.exit_code, 2) << no_etcd_ca.output;
  EXPECT_NE(no_etcd_ca.output.find("--cluster-etcd-ca"), std::string::npos) << no_etcd_ca.output;
  std::vector<std::string> plain{BinPath("strata-server"), "--listen", "127.0.0.1:0", "--data",
                                 dir_.path() + "/n4", "--cluster-etcd", "http://127.0.0.1:2379",
                                 "--node-id", "n4"};
  args = SecurityArgs("n4");
  plain.insert(plain.end(), args.begin(), args.end());
  CommandResult ca_for_http = RunCommand(plain, 30);
  EXPECT_EQ(ca_for_http.exit_code, 2) << ca_for_http.output;
  EXPECT_NE(ca_for_http.output.find("https://"), std::string::npos) << ca_for_http.output;
}

// A network namespace joined to the host by a veth pair, for partitions: `Cut()` takes the
// link down, so the namespace reaches neither etcd nor the other nodes.
class NetworkNamespace {
 public:
  NetworkNamespace() {
    const int id = getpid() % 200 + 20;
    name_ = absl::StrCat("strata-part-", getpid());
    host_if_ = absl::StrCat("sp", getpid() % 100000, "h");
    ns_if_ = absl::StrCat("sp", getpid() % 100000, "n");
    host_ip_ = absl::StrCat("10.77.", id, ".1");
    ns_ip_ = absl::StrCat("10.77.", id, ".2");
    for (const std::vector<std::string>& cmd : std::vector<std::vector<std::string>>{
             {"/usr/sbin/ip", "netns", "add", name_},
             {"/usr/sbin/ip", "link", "add", host_if_, "type", "veth", "peer", "name", ns_if_},
             {"/usr/sbin/ip", "link", "set", ns_if_, "netns", name_},
             {"/usr/sbin/ip", "addr", "add", host_ip_ + "/24", "dev", host_if_},
             {"/usr/sbin/ip", "link", "set", host_if_, "up"},
             {"/usr/sbin/ip", "netns", "exec", name_, "/usr/sbin/ip", "addr", "add",
              ns_ip_ + "/24", "dev", ns_if_},
             {"/usr/sbin/ip", "netns", "exec", name_, "/usr/sbin/ip", "link", "set", ns_if_, "up"},
             {"/usr/sbin/ip", "netns", "exec", name_, "/usr/sbin/ip", "link", "set", "lo", "up"}}) {
      CommandResult r = RunCommand(cmd, 20);
      if (r.exit_code != 0) {
        error_ = absl::StrCat(absl::StrJoin(cmd, " "), ": ", r.output);
        return;
      }
    }
  }
  ~NetworkNamespace() {
    RunCommand({"/usr/sbin/ip", "link", "del", host_if_}, 20);
    RunCommand({"/usr/sbin/ip", "netns", "del", name_}, 20);
  }
  const std::string& error() const { return error_; }
  const std::string& host_ip() const { return host_ip_; }
  const std::string& ns_ip() const { return ns_ip_; }
  // `argv` run inside the namespace.
  std::vector<std::string> Inside(std::vector<std::string> argv) const {
    argv.insert(argv.begin(), {"/usr/sbin/ip", "netns", "exec", name_});
    return argv;
  }
  bool Cut() { return RunCommand(Inside({"/usr/sbin/ip", "link", "set", ns_if_, "down"})).exit_code == 0; }
  bool Heal() { return RunCommand(Inside({"/usr/sbin/ip", "link", "set", ns_if_, "up"})).exit_code == 0; }

 private:
  std::string name_, host_if_, ns_if_, host_ip_, ns_ip_, error_;
};

// A node cut off from etcd and the other nodes (its network namespace's link goes down) with
// agents still reaching it: it acknowledges nothing while it cannot replicate (its own lease
// runs out, the others move its hosts), and once the link is back everything the agents held
// arrives, exactly once.
TEST(ClusterPartitionTest, PartitionedNodeAcknowledgesNothingItCannotReplicate) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root for network namespaces";
  NetworkNamespace ns;
  ASSERT_TRUE(ns.error().empty()) << ns.error();
  strata::testing::TempDir dir("cluster_partition");
  auto etcd = EtcdTestServer::Start(absl::Seconds(60), ns.host_ip());
  ASSERT_TRUE(etcd.ok()) << etcd.status();
  const std::string etcd_url = (*etcd)->endpoint();

  struct Node {
    std::string id, address;
    int http_port;
    std::unique_ptr<ChildProcess> process;
  };
  std::vector<Node> nodes;
  for (int i = 1; i <= 3; ++i) {
    const bool cut_off = i == 3;
    Node n{absl::StrCat("n", i),
           absl::StrCat(cut_off ? ns.ns_ip() : ns.host_ip(), ":", FreePort()), FreePort(),
           nullptr};
    std::vector<std::string> argv{BinPath("strata-server"), "--listen", n.address,
                                  "--http", absl::StrCat("127.0.0.1:", n.http_port),
                                  "--insecure", "--data", dir.path() + "/" + n.id,
                                  "--cluster-etcd", etcd_url, "--node-id", n.id,
                                  "--cluster-lease-ttl", "3s", "--cluster-replica-timeout", "2s"};
    n.process = std::make_unique<ChildProcess>(cut_off ? ns.Inside(argv) : argv,
                                               dir.path() + "/" + n.id + ".log");
    ASSERT_TRUE(n.process->WaitForOutput("ready on port", 60)) << n.process->Output();
    nodes.push_back(std::move(n));
  }
  // n3's metrics, read from inside its namespace.
  auto n3_metric = [&](const std::string& name) {
    CommandResult r = RunCommand(
        ns.Inside({"/usr/bin/curl", "-s", "-m", "5",
                   absl::StrCat("http://127.0.0.1:", nodes[2].http_port, "/metrics")}),
        10);
    return MetricIn(r.output, name);
  };
  // The agents live in the namespace and know only n3.
  ChildProcess load(ns.Inside({BinPath("strata-loadgen"), "--server", nodes[2].address,
                               "--agents", "20", "--interval", "1", "--duration", "30",
                               "--ramp-up", "2", "--rate", "99", "--max-backoff", "2",
                               "--drain-timeout", "120", "--service-prefix", "part",
                               "--services", "2", "--json"}),
                    dir.path() + "/loadgen.log");
  ASSERT_TRUE(WaitFor([&] { return n3_metric("strata_ingest_acks_total") >= 20; },
                      absl::Seconds(60)))
      << load.Output() << nodes[2].process->Output();
  ASSERT_TRUE(ns.Cut());
  // n3 notices it cannot renew its lease; the others see it leave.
  EXPECT_TRUE(WaitFor([&] { return n3_metric("strata_cluster_lease_held") == 0; },
                      absl::Seconds(20)))
      << nodes[2].process->Output();
  EXPECT_TRUE(WaitFor([&] { return Metric(nodes[0].http_port, "strata_cluster_nodes{state=\"down\"}") == 1; },
                      absl::Seconds(20)));
  const double acks_cut = n3_metric("strata_ingest_acks_total");
  absl::SleepFor(absl::Seconds(6));  // agents keep sending to n3 all along
  EXPECT_EQ(n3_metric("strata_ingest_acks_total"), acks_cut)
      << "a node that cannot replicate acknowledged batches";
  EXPECT_GT(n3_metric("strata_ingest_rejected_messages_total"), 0);
  ASSERT_TRUE(ns.Heal());
  const int code = load.Wait(240);
  const std::string out = load.Output();
  std::printf("%s\n", out.c_str());
  EXPECT_EQ(code, 0) << out << nodes[2].process->Output();
  EXPECT_NE(out.find("\"ok\":true"), std::string::npos) << out;
  EXPECT_EQ(JsonField(out, "lost"), 0) << out;
  EXPECT_EQ(JsonField(out, "extra"), 0) << out;
}

}  // namespace
}  // namespace strata::e2e
