// A Strata cluster on loopback: one real etcd, three (then four) strata-server nodes with
// replication factor 2, and strata-loadgen's agents spread over the nodes. strata-loadgen
// compares what the cluster answers (a fan-out query through the first node) with what it
// delivered, per service, and exits non-zero on any loss or double count.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/rpc/client_security.h"
#include "gtest/gtest.h"
#include "strata/v1/capture.grpc.pb.h"
#include "strata/v1/cluster.grpc.pb.h"
#include "strata/v1/debuginfo.grpc.pb.h"
#include "strata/v1/regress.grpc.pb.h"
#include "tests/e2e/cluster/cluster_fixture.h"
#include "tests/e2e/harness.h"
#include "tests/e2e/http_client.h"

namespace strata::e2e {
namespace {

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
  ASSERT_TRUE(hung.process->Pause());
  const double failures0 = sum("strata_cluster_replica_failures_total");
  const double acks0 = sum("strata_ingest_acks_total");
  absl::SleepFor(absl::Seconds(10));
  const double failures = sum("strata_cluster_replica_failures_total") - failures0;
  const double skipped = sum("strata_cluster_replica_skipped_total");
  const double acks = sum("strata_ingest_acks_total") - acks0;
  hung.process->Resume();
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
  // A capture is cancelled through a node that does not run it (it runs where the agent's
  // stream is): the node asked passes the cancel on.
  {
    const std::string holder = connected_on()[0];
    const auto other = std::find_if(nodes_.begin(), nodes_.end(),
                                    [&](const auto& n) { return n->id != holder; });
    ChildProcess long_capture({BinPath("strata"), "--server", (*other)->address(), "capture",
                               "--service", "demo", "--duration", "60s", "--format", "top"},
                              dir_.path() + "/long_capture.log");
    std::string capture_id;
    ASSERT_TRUE(WaitFor(
        [&] {
          const std::string out = long_capture.Output();
          std::smatch id;
          // Once it has samples: a capture cancelled before any has no result to show.
          const std::regex progress("capture (cap-[0-9a-f-]+): .*s  [1-9][0-9,]* samples");
          if (!std::regex_search(out, id, progress)) return false;
          capture_id = id[1];
          return true;
        },
        absl::Seconds(30)))
        << long_capture.Output();
    CommandResult cancel = RunCommand(
        {BinPath("strata"), "--server", (*other)->address(), "capture", "cancel", capture_id}, 30);
    EXPECT_EQ(cancel.exit_code, 0) << cancel.output;
    EXPECT_NE(cancel.output.find("cancelled"), std::string::npos) << cancel.output;
    // As on one server: the capture ends, and its result says how much of it ran.
    EXPECT_EQ(long_capture.Wait(30), 1) << long_capture.Output();
    EXPECT_TRUE(std::regex_search(long_capture.Output(), std::regex("s of 60s at ")))
        << long_capture.Output();
    // Its profile is read through every node; a mistyped capture ID is refused by every
    // node, as by one server, not answered as an empty capture.
    for (const auto& n : nodes_) {
      auto [status, body] =
          strata::testing::HttpGet(n->http_port, "/api/v1/top?capture=" + capture_id);
      EXPECT_EQ(status, 200) << n->id << ": " << body;
      std::tie(status, body) =
          strata::testing::HttpGet(n->http_port, "/api/v1/top?capture=" + capture_id + "x");
      EXPECT_EQ(status, 404) << n->id << ": " << body;
      EXPECT_NE(body.find("unknown capture"), std::string::npos) << body;
    }
  }
  // As on one server: a --host that matches none of the service's hosts, and a range that
  // may have no window starting in it, are answered (with no samples), not refused.
  for (const std::vector<std::string>& narrow :
       {std::vector<std::string>{"--host", "no-such-host"}, {"--since", "5s"}}) {
    std::vector<std::string> argv{BinPath("strata"), "--server", nodes_[0]->address(), "top",
                                  "--service", "demo"};
    argv.insert(argv.end(), narrow.begin(), narrow.end());
    CommandResult top = RunCommand(argv, 30);
    EXPECT_EQ(top.exit_code, 0) << narrow[0] << ": " << top.output;
    if (narrow[0] == "--host") EXPECT_NE(top.output.find("No samples"), std::string::npos);
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
    EXPECT_EQ(captures.captures_size(), 4) << n->id;
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
    const int port = strata::testing::FreeLoopbackPort();
    Node n{absl::StrCat("n", i), absl::StrCat(cut_off ? ns.ns_ip() : ns.host_ip(), ":", port),
           strata::testing::FreeLoopbackPort(), nullptr};
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
