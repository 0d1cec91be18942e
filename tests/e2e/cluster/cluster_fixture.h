// The cluster end-to-end tests' fixture: one real etcd (Debian's etcd-server), strata-server
// nodes started as child processes on loopback (replication factor 2), strata-loadgen's
// agents spread over them, and the helpers the tests share (/metrics values, loadgen's
// verdict). Each test owns its fixture's etcd, nodes and temp dir.
#ifndef STRATA_TESTS_E2E_CLUSTER_CLUSTER_FIXTURE_H_
#define STRATA_TESTS_E2E_CLUSTER_CLUSTER_FIXTURE_H_

#include <algorithm>
#include <chrono>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/testing/free_port.h"
#include "common/testing/temp_dir.h"
#include "common/testing/wait_for.h"
#include "gtest/gtest.h"
#include "server/cluster/etcd/etcd_test_server.h"
#include "tests/e2e/harness.h"
#include "tests/e2e/http_client.h"

namespace strata::e2e {

using server::cluster::EtcdTestServer;
using server::cluster::EtcdTestTls;

// A number from strata-loadgen's JSON line.
inline double JsonField(const std::string& json, const std::string& name) {
  std::smatch m;
  double v = -1;
  if (std::regex_search(json, m, std::regex("\"" + name + "\":([-0-9.]+)"))) {
    (void)absl::SimpleAtod(m[1].str(), &v);
  }
  return v;
}

// A value of Prometheus text (the first line starting with `name`); -1 when absent.
inline double MetricIn(const std::string& body, const std::string& name) {
  const size_t at = body.find("\n" + name + " ");
  if (at == std::string::npos) return -1;
  const size_t from = at + name.size() + 2;
  double v = -1;
  (void)absl::SimpleAtod(body.substr(from, body.find('\n', from) - from), &v);
  return v;
}

// The value of `name` in the /metrics of the server with HTTP on `port`; -1 when absent.
inline double Metric(int port, const std::string& name) {
  auto [status, body] = strata::testing::HttpGet(port, "/metrics");
  return status == 200 ? MetricIn(body, name) : -1;
}

// Waits until `done` holds, checking every 100 ms (each check asks a node); false after
// `timeout`.
template <typename Pred>
bool WaitFor(Pred done, absl::Duration timeout) {
  return strata::testing::WaitFor(done, absl::ToChronoMilliseconds(timeout),
                                  std::chrono::milliseconds(100));
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
    node->port = strata::testing::FreeLoopbackPort();
    node->http_port = strata::testing::FreeLoopbackPort();
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

}  // namespace strata::e2e

#endif  // STRATA_TESTS_E2E_CLUSTER_CLUSTER_FIXTURE_H_
