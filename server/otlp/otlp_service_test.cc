#include "server/otlp/otlp_service.h"

#include <cstdint>
#include <memory>

#include "common/base/clock.h"
#include "common/testing/temp_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/otlp/otlp_builder.h"
#include "server/query/profile.h"

namespace strata::server::otlp {
namespace {

using strata::testing::TempDir;

class OtlpServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s = store::Store::Open(dir_.path(), {});
    ASSERT_TRUE(s.ok()) << s.status();
    store_ = std::move(*s);
    service_ = std::make_unique<OtlpService>(store_.get(), OtlpService::Options{});
  }

  // Two hosts of service "api", 3 + 4 samples of main -> handle.
  RequestBuilder::Request TwoHosts() {
    RequestBuilder b;
    const int32_t bin = b.Mapping("/usr/bin/api");
    const int32_t stack = b.Stack({b.Location(bin, 0, {{"handle", "h.go"}}, "go"),
                                   b.Location(bin, 0, {{"main", "m.go"}}, "go")});
    const uint64_t now_ns = static_cast<uint64_t>(base::NowMs()) * 1'000'000;
    for (const char* host : {"host-1", "host-2"}) {
      auto* r = b.AddResource({{"service.name", "api"}, {"host.name", host}});
      auto* p = b.AddProfile(r, "samples", "count", now_ns);
      b.AddSample(p, stack, {}, host[5] == '1' ? 3 : 4);
    }
    return b.Take();
  }

  static query::ProfileQuery AllTime(const std::string& service, const std::string& host = "") {
    query::ProfileQuery q;
    q.service = service;
    q.to_ms = INT64_MAX;
    q.host = host;
    return q;
  }

  // Samples of `service` over all time; 0 for a service the store does not know.
  uint64_t Total(const std::string& service) {
    query::ProfileReader reader(store_.get());
    auto p = reader.Load(AllTime(service));
    EXPECT_TRUE(p.ok() || absl::IsNotFound(p.status())) << p.status();
    return p.ok() ? p->total : 0;
  }

  TempDir dir_;
  std::unique_ptr<store::Store> store_;
  std::unique_ptr<OtlpService> service_;
};

TEST_F(OtlpServiceTest, StoresSamplesOnceAcrossRetries) {
  const auto request = TwoHosts();
  ASSERT_TRUE(service_->Apply(request, "").ok());
  EXPECT_EQ(Total("api"), 7u);
  // The sender did not get the answer and sends the same request again.
  ASSERT_TRUE(service_->Apply(request, "").ok());
  EXPECT_EQ(Total("api"), 7u);
  EXPECT_EQ(service_->metrics().duplicate_commits.load(), 2u);
  query::ProfileReader reader(store_.get());
  auto p = reader.Load(AllTime("api", "host-2"));
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_EQ(p->stacks.size(), 1u);
  EXPECT_EQ(p->stacks[0].count, 4u);
  ASSERT_EQ(p->stacks[0].frames.size(), 2u);
  EXPECT_EQ(p->functions[p->stacks[0].frames[0]].name, "main");
  EXPECT_EQ(p->functions[p->stacks[0].frames[1]].name, "handle");
}

TEST_F(OtlpServiceTest, RetriesBeyondTheBoundAreStoredAgain) {
  OtlpService::Options options;
  options.dedup_window = absl::ZeroDuration();
  service_ = std::make_unique<OtlpService>(store_.get(), options);
  const auto request = TwoHosts();
  ASSERT_TRUE(service_->Apply(request, "").ok());
  absl::SleepFor(absl::Milliseconds(2));
  ASSERT_TRUE(service_->Apply(request, "").ok());
  EXPECT_EQ(Total("api"), 14u);
}

TEST_F(OtlpServiceTest, RefusedRequestStoresNothing) {
  auto request = TwoHosts();
  // The second resource's sample points outside the stack table: the first one, valid, is
  // not stored either.
  request.mutable_resource_profiles(1)->mutable_scope_profiles(0)->mutable_profiles(0)
      ->mutable_samples(0)->set_stack_index(77);
  absl::Status s = service_->Apply(request, "");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(Total("api"), 0u);
  auto services = query::ListServices(store_.get(), nullptr);
  ASSERT_TRUE(services.ok());
  EXPECT_TRUE(services->empty());
  // A certificate of host-1 may not write host-2's samples.
  s = service_->Apply(TwoHosts(), "host-1");
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_EQ(Total("api"), 0u);
}

// A cluster where this node owns host-1 and another node host-2: host-1 is stored here, the
// request goes to the other node for host-2, and its failure is the sender's UNAVAILABLE
// (its retry is recognized for host-1).
class TwoNodePlacement : public OtlpPlacement {
 public:
  absl::StatusOr<Plan> PlanHosts(const std::vector<std::string>& hosts) override {
    Plan plan;
    for (const std::string& host : hosts) {
      if (host == "host-1") {
        plan.here.push_back(host);
      } else {
        plan.elsewhere["10.0.0.2:7070"].push_back(host);
      }
    }
    return plan;
  }
  absl::Status Forward(const std::string& address, const otlp_v1::ExportProfilesServiceRequest&,
                       const std::vector<std::string>& hosts) override {
    forwards.push_back({address, hosts});
    return fail ? absl::DeadlineExceededError("no answer") : absl::OkStatus();
  }
  std::vector<std::pair<std::string, std::vector<std::string>>> forwards;
  bool fail = false;
};

TEST_F(OtlpServiceTest, InAClusterEachHostIsStoredByItsOwners) {
  TwoNodePlacement placement;
  OtlpService::Options options;
  options.placement = &placement;
  service_ = std::make_unique<OtlpService>(store_.get(), options);
  const auto request = TwoHosts();
  placement.fail = true;
  absl::Status s = service_->Apply(request, "");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_THAT(s.message(), ::testing::HasSubstr("10.0.0.2:7070"));
  EXPECT_EQ(Total("api"), 3u);  // host-1's, stored here
  placement.fail = false;
  ASSERT_TRUE(service_->Apply(request, "").ok());
  EXPECT_EQ(Total("api"), 3u);  // the retry stored nothing twice here
  ASSERT_EQ(placement.forwards.size(), 2u);
  EXPECT_EQ(placement.forwards[1].first, "10.0.0.2:7070");
  EXPECT_EQ(placement.forwards[1].second, std::vector<std::string>{"host-2"});
  EXPECT_EQ(service_->metrics().forwarded.load(), 1u);
  EXPECT_EQ(service_->metrics().forward_failures.load(), 1u);
}

TEST_F(OtlpServiceTest, AReplicaCallStoresOnlyTheHostsItNames) {
  ASSERT_TRUE(service_->ApplyReplica(TwoHosts(), {"host-2"}).ok());
  EXPECT_EQ(Total("api"), 4u);
  query::ProfileReader reader(store_.get());
  auto host1 = reader.Load(AllTime("api", "host-1"));
  ASSERT_TRUE(host1.ok()) << host1.status();
  EXPECT_EQ(host1->total, 0u);
}

}  // namespace
}  // namespace strata::server::otlp
