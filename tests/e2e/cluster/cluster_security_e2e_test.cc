// Cluster nodes over mutual TLS with authenticated callers: replication, fan-out queries and
// node internals between nodes that present their certificates, and what agents, readers and
// operators may call.
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/rpc/client_security.h"
#include "gtest/gtest.h"
#include "opentelemetry/proto/collector/profiles/v1development/profiles_service.grpc.pb.h"
#include "strata/v1/cluster.grpc.pb.h"
#include "strata/v1/ingest.grpc.pb.h"
#include "strata/v1/regress.grpc.pb.h"
#include "tests/e2e/cluster/cluster_fixture.h"
#include "tests/e2e/harness.h"

namespace strata::e2e {
namespace {

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
             {"fleet", "agent"}, {"other", "agent"}, {"alice", "reader"},
             {"ops", "operator"}}) {
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

  // What `node` answers an agent's Hello sent with `token`: "welcome", "redirect", or the
  // stream's error.
  std::string Hello(const Node& node, const std::string& token, const std::string& agent_id,
                    const std::string& host) {
    auto ingest = v1::Ingest::NewStub(Channel(node));
    grpc::ClientContext ctx;
    AddToken(&ctx, token);
    auto stream = ingest->Connect(&ctx);
    v1::AgentMessage hello;
    hello.mutable_hello()->set_agent_id(agent_id);
    hello.mutable_hello()->set_host(host);
    hello.mutable_hello()->set_graph_id(1);
    stream->Write(hello);
    stream->WritesDone();
    std::string answer;
    v1::ServerMessage m;
    while (stream->Read(&m)) {
      if (m.has_welcome()) answer = "welcome";
      if (m.has_redirect()) answer = "redirect";
    }
    grpc::Status s = stream->Finish();
    return answer.empty() ? s.error_message() : answer;
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

// An agent ID belongs to the first principal that wrote as it on any node. A node records the
// owner of its own hosts' agents only, so another agent's credentials, naming a host that
// another node owns, are refused there too: each host has one owner here (replication factor
// 1), and some of the squatter's hosts fall on nodes that never saw the agent.
TEST_F(ClusterSecurityTest, AnAgentIdTakenOnOneNodeIsRefusedToOthersOnEveryNode) {
  for (int i = 0; i < 3; ++i) AddNode({"--replication-factor", "1"});
  WaitForRing();
  std::string owner_of_host_a;
  for (const auto& n : nodes_) {
    if (Hello(*n, "fleet", "web-1", "host-a") == "welcome") owner_of_host_a += n->id;
  }
  ASSERT_TRUE(owner_of_host_a == "n1" || owner_of_host_a == "n2" || owner_of_host_a == "n3")
      << owner_of_host_a << Logs();

  int refused = 0, refused_elsewhere = 0;
  for (int h = 0; h < 8; ++h) {
    const std::string host = absl::StrCat("squat-", h);
    for (const auto& n : nodes_) {
      const std::string answer = Hello(*n, "other", "web-1", host);
      EXPECT_NE(answer, "welcome") << n->id << " took web-1 for " << host << Logs();
      if (answer == "redirect") continue;
      EXPECT_NE(answer.find("belongs to token fleet"), std::string::npos) << answer;
      ++refused;
      refused_elsewhere += n->id != owner_of_host_a;
    }
  }
  EXPECT_GT(refused_elsewhere, 0) << "every squatting host fell on host-a's node";
  double counted = 0;
  for (const auto& n : nodes_) counted += Metric(*n, "strata_cluster_agent_ids_refused_total");
  EXPECT_EQ(counted, refused) << Logs();
  // The agent and the other principal's own agent IDs are taken as before.
  int welcomed = 0;
  for (const auto& n : nodes_) welcomed += Hello(*n, "fleet", "web-1", "host-a") == "welcome";
  EXPECT_EQ(welcomed, 1);
  welcomed = 0;
  for (const auto& n : nodes_) welcomed += Hello(*n, "other", "web-2", "squat-0") == "welcome";
  EXPECT_EQ(welcomed, 1);
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

}  // namespace
}  // namespace strata::e2e
