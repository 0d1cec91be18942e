// Fan-out queries of a cluster: answers through any node merged from every node's part, each
// host read from one replica; nodes that are away or fail to answer are named, and the hosts
// of a node that fails between the two phases are read from their other replicas.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "server/cluster/membership.h"
#include "strata/v1/cluster.grpc.pb.h"
#include "strata/v1/query.grpc.pb.h"
#include "tests/e2e/cluster/cluster_fixture.h"
#include "tests/e2e/harness.h"

namespace strata::e2e {
namespace {

// The whole fan-out answer of hot paths of `service` (with `focus`), asked of the node at
// `address`.
grpc::Status HotPaths(const std::string& address, const std::string& service,
                      v1::HotPathsResponse* paths, const std::string& focus = "") {
  auto query = v1::Query::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  v1::HotPathsRequest request;
  request.mutable_filter()->set_service(service);
  request.mutable_filter()->set_focus(focus);
  return query->HotPaths(&ctx, request, paths);
}

// The samples of the load's three services ("PREFIX-svc-0" ...) in the answers of the node at
// `address`: each more than 0.
void ExpectServiceSamples(const std::string& address, const std::string& prefix,
                          std::map<std::string, uint64_t>* samples) {
  for (int s = 0; s < 3; ++s) {
    const std::string service = absl::StrCat(prefix, "-svc-", s);
    v1::HotPathsResponse paths;
    ASSERT_TRUE(HotPaths(address, service, &paths).ok()) << service;
    (*samples)[service] = paths.total_samples();
    ASSERT_GT(paths.total_samples(), 0u) << service;
  }
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
    return HotPaths(n1.address(), service, paths, focus);
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
  ASSERT_TRUE(n3.process->Pause());
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
  n3.process->Resume();
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
  for (const auto& n : nodes_) {
    forwarded += std::max(0.0, Metric(*n, "strata_otlp_forwarded_total"));
  }
  EXPECT_GT(forwarded, 0) << Logs();

  const std::string n2 = nodes_[1]->address();
  std::map<std::string, uint64_t> all;
  ASSERT_NO_FATAL_FAILURE(ExpectServiceSamples(n2, "otlp", &all));
  ASSERT_TRUE(nodes_[0]->process->Pause());
  for (const auto& [service, samples] : all) {
    v1::HotPathsResponse paths;
    ASSERT_TRUE(HotPaths(n2, service, &paths).ok()) << service;
    EXPECT_EQ(paths.total_samples(), samples) << service << " without n1";
    EXPECT_EQ(paths.unreachable_nodes_size(), 1) << paths.DebugString();
  }
  nodes_[0]->process->Resume();
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

// A node that counts its hosts' samples (phase 1) but fails to send their profiles (phase 2),
// as one that stops or times out between the two. It claims one sample more of every host
// than their replica on `replica`, so the fan-out takes every host from it.
class FailingBetweenPhases final : public v1::Cluster::Service {
 public:
  explicit FailingBetweenPhases(const std::string& replica)
      : replica_(v1::Cluster::NewStub(
            grpc::CreateChannel(replica, grpc::InsecureChannelCredentials()))) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(this);
    server_ = builder.BuildAndStart();
  }
  ~FailingBetweenPhases() override { server_->Shutdown(); }

  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }
  int profiles_asked() {
    absl::MutexLock lock(&mu_);
    return profiles_asked_;
  }

  grpc::Status HostTotals(grpc::ServerContext*, const v1::LocalProfileRequest* request,
                          v1::HostTotalsResponse* response) override {
    grpc::ClientContext ctx;
    grpc::Status status = replica_->HostTotals(&ctx, *request, response);
    for (auto& [host, samples] : *response->mutable_hosts()) ++samples;
    return status;
  }
  grpc::Status LocalProfile(grpc::ServerContext*, const v1::LocalProfileRequest*,
                            v1::LocalProfileResponse*) override {
    absl::MutexLock lock(&mu_);
    ++profiles_asked_;
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "stopped between the phases");
  }

 private:
  const std::unique_ptr<v1::Cluster::Stub> replica_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  absl::Mutex mu_;
  int profiles_asked_ ABSL_GUARDED_BY(mu_) = 0;
};

// The hosts a node was given in phase 1 are read from their other replicas when it fails in
// phase 2: the answer is whole, and the node is named.
TEST_F(ClusterTest, HostsOfANodeFailingBetweenThePhasesComeFromTheirReplicas) {
  for (int i = 0; i < 2; ++i) AddNode({"--cluster-query-timeout", "5s"});
  WaitForRing();
  auto load = StartLoad(4, "between", 12);
  ExpectExact(*load, 120);
  // Two nodes, two replicas: both hold every host.
  const std::string n1 = nodes_[0]->address();
  std::map<std::string, uint64_t> all;
  ASSERT_NO_FATAL_FAILURE(ExpectServiceSamples(n1, "between", &all));

  FailingBetweenPhases n3(nodes_[1]->address());
  absl::StatusOr<std::unique_ptr<server::cluster::Membership>> joined =
      server::cluster::Membership::Join({.etcd_endpoints = etcd_->endpoint(),
                                         .node_id = "n3",
                                         .advertise = n3.address(),
                                         .lease_ttl = absl::Seconds(60)});
  ASSERT_TRUE(joined.ok()) << joined.status();
  ASSERT_TRUE(WaitFor(
      [&] { return Metric(*nodes_[0], "strata_cluster_nodes{state=\"live\"}") == 3; },
      absl::Seconds(30)))
      << Logs();
  const std::string n3_name = absl::StrCat("n3 (", n3.address(), "): ");
  for (const auto& [service, samples] : all) {
    v1::HotPathsResponse paths;
    ASSERT_TRUE(HotPaths(n1, service, &paths).ok()) << service;
    EXPECT_EQ(paths.total_samples(), samples) << service;
    ASSERT_EQ(paths.unreachable_nodes_size(), 1) << paths.DebugString();
    EXPECT_EQ(paths.unreachable_nodes(0).rfind(n3_name, 0), 0u) << paths.unreachable_nodes(0);
  }
  EXPECT_EQ(n3.profiles_asked(), 3);  // given every host of each query in phase 1
}

}  // namespace
}  // namespace strata::e2e
