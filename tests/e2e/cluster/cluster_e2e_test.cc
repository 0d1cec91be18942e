// A Strata cluster on loopback: one real etcd, three (then four) strata-server nodes with
// replication factor 2, and strata-loadgen's agents spread over the nodes. strata-loadgen
// compares what the cluster answers (a fan-out query through the first node) with what it
// delivered, per service, and exits non-zero on any loss or double count.
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/testing/http_get.h"
#include "common/testing/temp_dir.h"
#include "gtest/gtest.h"
#include "server/cluster/etcd/etcd_test_server.h"
#include "strata/v1/cluster.grpc.pb.h"
#include "tests/e2e/harness.h"

namespace strata::e2e {
namespace {

using server::cluster::EtcdTestServer;

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
    auto etcd = EtcdTestServer::Start();
    ASSERT_TRUE(etcd.ok()) << etcd.status();
    etcd_ = *std::move(etcd);
  }

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

  double Metric(const Node& n, const std::string& name) {
    return e2e::Metric(n.http_port, name);
  }

  std::unique_ptr<ChildProcess> StartLoad(int duration_s, const std::string& prefix) {
    std::vector<std::string> argv{BinPath("strata-loadgen"), "--server", Addresses(),
                                  "--agents", "30", "--interval", "2",
                                  "--duration", std::to_string(duration_s),
                                  "--ramp-up", "2", "--rate", "99", "--max-backoff", "3",
                                  "--drain-timeout", "90", "--service-prefix", prefix,
                                  "--services", "3", "--json"};
    return std::make_unique<ChildProcess>(argv, dir_.path() + "/loadgen-" + prefix + ".log");
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
  // Connected, with its target, on exactly one node (an owner of its host).
  auto connected_on = [&] {
    std::vector<std::string> on;
    for (const auto& n : nodes_) {
      auto stub = v1::Query::NewStub(
          grpc::CreateChannel(n->address(), grpc::InsecureChannelCredentials()));
      grpc::ClientContext ctx;
      v1::ListAgentsResponse agents;
      if (!stub->ListAgents(&ctx, {}, &agents).ok()) continue;
      for (const auto& a : agents.agents()) {
        if (a.connected() && a.targets_size() > 0) on.push_back(n->id);
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
  const int etcd_port = FreePort(), etcd_peer = FreePort();
  const std::string etcd_url = absl::StrCat("http://", ns.host_ip(), ":", etcd_port);
  const std::string peer_url = absl::StrCat("http://", ns.host_ip(), ":", etcd_peer);
  ChildProcess etcd({EtcdTestServer::kEtcdBinary, "--name", "part", "--data-dir",
                     dir.path() + "/etcd", "--listen-client-urls", etcd_url,
                     "--advertise-client-urls", etcd_url, "--listen-peer-urls", peer_url,
                     "--initial-advertise-peer-urls", peer_url, "--initial-cluster",
                     "part=" + peer_url},
                    dir.path() + "/etcd.log");
  ASSERT_TRUE(etcd.WaitForOutput("ready to serve client requests", 60)) << etcd.Output();

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
